"""Line-based formats: Moses pairs of files, TSV, ASPEC-JE, ASPEC-JC, NTCIR PatentMT and ParaPat."""
from __future__ import annotations

import os
import re
from itertools import zip_longest
from typing import Iterator, Optional, Union

from .base import (DEFAULT_LIMITS, InputLimits, Line, Malformed, Pair, PrepareError, Reader, Record,
                   check_lang_pair, count_lines, lang_matches, read_lines, unusable_line)


class MosesReader(Reader):
    """Two plain-text files, sentence i of the source on line i, its translation on line i of the target.
    JPC / WAT line-aligned files are read this way."""

    name = "moses"
    two_files = True

    def check(self) -> None:
        n_src, n_tgt = count_lines(self.src_path), count_lines(self.tgt_path)
        if n_src != n_tgt:
            raise PrepareError(f"line counts differ: {self.src_path} has {n_src} lines but "
                               f"{self.tgt_path} has {n_tgt}; {self.name} pair files must be line-aligned")

    def aligned_lines(self) -> Iterator[tuple[Line, Line]]:
        cap = self.limits.max_line_bytes
        for s, t in zip_longest(read_lines(self.src_path, cap), read_lines(self.tgt_path, cap)):
            if s is None or t is None:  # the files changed since check()
                raise PrepareError(f"{self.src_path} and {self.tgt_path} have different line counts")
            yield s, t

    def unusable(self, s: Line, t: Line) -> Optional[Malformed]:
        """The record for a line pair with an oversized or non-UTF-8 side (a good source is kept beside a bad
        target in rejects.tsv), None if both sides are text."""
        if s.text is not None and t.text is not None:  # the common case, first (either problem means no text)
            return None
        return (unusable_line(f"{self.src_path}:{s.number}", s, "src", limits=self.limits)
                or unusable_line(f"{self.tgt_path}:{t.number}", t, "tgt", other=s.text, limits=self.limits))

    def records(self) -> Iterator[Record]:
        for s, t in self.aligned_lines():
            if s.text is not None and t.text is not None:
                yield Pair(s.text, t.text, f"{self.src_path}:{s.number}")
            else:
                yield self.unusable(s, t)


class NtcirReader(MosesReader):
    """NTCIR PatentMT: two line-aligned files, each line `DOCID-SENTID<TAB>sentence`; the IDs of a line must
    agree. The document id is DOCID (the ID up to its last "-")."""

    name = "ntcir"

    def records(self) -> Iterator[Record]:
        for s, t in self.aligned_lines():
            origin = f"{self.src_path}:{s.number}"
            bad = self.unusable(s, t)
            if bad:
                yield bad
                continue
            src, tgt = s.text.split("\t"), t.text.split("\t")
            for fields, path, line in ((src, self.src_path, s), (tgt, self.tgt_path, t)):
                if len(fields) != 2:
                    yield Malformed("malformed", f"{path}:{line.number}",
                                    f"expected DOCID-SENTID<TAB>sentence, found {len(fields)} tab-separated fields",
                                    src=s.text, tgt=t.text)
                    break
            else:
                if src[0] != tgt[0]:
                    yield Malformed("malformed", origin, f"IDs differ: {src[0]!r} here but {tgt[0]!r} at "
                                    f"{self.tgt_path}:{t.number}", src=s.text, tgt=t.text)
                else:
                    yield Pair(src[1], tgt[1], origin, doc=src[0].rsplit("-", 1)[0])


class TsvReader(Reader):
    """`src<TAB>tgt` per line, no header and no quoting (a quote character is text)."""

    name = "tsv"
    swap = False  # True: the file's first column is the target

    def records(self) -> Iterator[Record]:
        for rec in split_lines(self.src_path, self.lines(), "\t", (2,), "2 tab-separated fields", self.limits):
            if isinstance(rec, Malformed):
                yield rec
            else:
                origin, fields = rec
                yield Pair(*fields[::-1] if self.swap else fields, origin)


class AspecReader(Reader):
    """ASPEC-JE: train `score ||| docid ||| n ||| ja ||| en`, dev/test `docid ||| n ||| ja ||| en`."""

    name = "aspec"
    LANGS = ("ja", "en")
    FIELDS = (4, 5)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for lang in (self.src_lang, self.tgt_lang):
            if lang not in self.LANGS:
                raise PrepareError(f"{self.name.upper()} holds only {'/'.join(self.LANGS)}, not {lang!r}")
        check_lang_pair(self.src_lang, self.tgt_lang)

    def records(self) -> Iterator[Record]:
        expected = f"{' or '.join(map(str, self.FIELDS))} ' ||| '-separated fields"
        for rec in split_lines(self.src_path, self.lines(), " ||| ", self.FIELDS, expected, self.limits):
            if isinstance(rec, Malformed):
                yield rec
                continue
            origin, fields = rec
            text = dict(zip(self.LANGS, fields[-2:]))
            yield Pair(text[self.src_lang], text[self.tgt_lang], origin, doc=self.doc_id(fields))

    def doc_id(self, fields: list[str]) -> Optional[str]:
        return fields[-4]


class AspecJcReader(AspecReader):
    """ASPEC-JC: `id ||| ja ||| zh`; the document id is the id up to its last "-" (the sentence number)."""

    name = "aspec-jc"
    LANGS = ("ja", "zh")
    FIELDS = (3,)

    def doc_id(self, fields: list[str]) -> Optional[str]:
        return fields[0].rsplit("-", 1)[0]


PARAPAT_HEADER = "index\tfamily_id\tsrc_lang\tsrc_abs\ttgt_lang\ttgt_abs"
_PAIR_IN_NAME = re.compile(r"^([A-Za-z]{2,3})[_-]([A-Za-z]{2,3})(?:\.|$)")


def langs_in_name(path: str) -> Optional[tuple[str, str]]:
    """("en", "ja") for ParaPat-style names such as en_ja.tsv or cs-en.type1.tsv."""
    m = _PAIR_IN_NAME.match(os.path.basename(path))
    return (m.group(1), m.group(2)) if m else None


class ParaPatReader(TsvReader):
    """ParaPat (Soares et al. 2020), read without quote processing (a `"` is text, as csv.QUOTE_NONE).

    Type 2 (sentence-aligned): `l1<TAB>l2`, no header. The columns are in the order of the file name when it
    names the pair (en_ja.tsv: English first), so `--src-lang ja --tgt-lang en` swaps them; otherwise source
    first. Type 1 (abstract-aligned), told by its header `index family_id src_lang src_abs tgt_lang tgt_abs`:
    several language pairs per file; rows of the requested pair are kept in either direction (swapped when
    reversed), other rows are rejected as "other_pair". The document id is the family id.
    """

    name = "parapat"

    def check(self) -> None:
        check_lang_pair(self.src_lang, self.tgt_lang)
        self.type1 = first_line(self.src_path) == PARAPAT_HEADER
        named = langs_in_name(self.src_path)
        if self.type1 or named is None:
            return
        if lang_matches(named[0], self.tgt_lang) and lang_matches(named[1], self.src_lang):
            self.swap = True
        elif not (lang_matches(named[0], self.src_lang) and lang_matches(named[1], self.tgt_lang)):
            raise PrepareError(f"{self.src_path}: the file name says {named[0]}-{named[1]}, not "
                               f"{self.src_lang}-{self.tgt_lang} (--src-lang/--tgt-lang); rename the file or "
                               f"read it with --format tsv (source column first)")

    def records(self) -> Iterator[Record]:
        if not hasattr(self, "type1"):
            self.check()
        yield from (self.type1_records() if self.type1 else super().records())

    def type1_records(self) -> Iterator[Record]:
        lines = self.lines()
        next(lines)  # the header
        expected = "6 tab-separated fields (index, family_id, src_lang, src_abs, tgt_lang, tgt_abs)"
        for rec in split_lines(self.src_path, lines, "\t", (6,), expected, self.limits):
            if isinstance(rec, Malformed):
                yield rec
                continue
            origin, (index, family, l1, text1, l2, text2) = rec
            meta = {"index": index, "family_id": family}
            if lang_matches(l1, self.src_lang) and lang_matches(l2, self.tgt_lang):
                yield Pair(text1, text2, origin, doc=family, meta=meta)
            elif lang_matches(l1, self.tgt_lang) and lang_matches(l2, self.src_lang):
                yield Pair(text2, text1, origin, doc=family, meta=meta)
            else:
                yield Malformed("other_pair", origin, f"language pair {l1}-{l2}, not {self.src_lang}-{self.tgt_lang}",
                                src=text1, tgt=text2)


def split_lines(path: str, lines: Iterator[Line], sep: str, counts: tuple, expected: str,
                limits: InputLimits = DEFAULT_LIMITS) -> Iterator[Union[tuple[str, list[str]], Malformed]]:
    """(origin, fields) of each line split on `sep`; an oversized line, invalid UTF-8 or a field count not in
    `counts` is a `Malformed` record ("expected <expected>, found N")."""
    for line in lines:
        origin = f"{path}:{line.number}"
        if line.text is None:
            yield unusable_line(origin, line, limits=limits)
            continue
        fields = line.text.split(sep)
        if len(fields) in counts:
            yield origin, fields
        else:
            yield Malformed("malformed", origin, f"expected {expected}, found {len(fields)}", src=line.text)


def first_line(path: str) -> Optional[str]:
    for line in read_lines(path):
        return line.text
    return None

