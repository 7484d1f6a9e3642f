"""OPUS Moses zips: `Corpus.l1-l2.l1` and `Corpus.l1-l2.l2` (line-aligned) inside one .zip, read in place."""
from __future__ import annotations

import io
import re
import zipfile
import zlib
from contextlib import ExitStack, contextmanager
from itertools import zip_longest
from typing import BinaryIO, Iterator, Optional

from .. import files
from .base import (InputError, Pair, PrepareError, Reader, Record, check_lang_pair, lang_matches, lines_of,
                   unusable_line)

# What zipfile can unpack (bz2 / lzma only when Python was built with them: else zf.open raises RuntimeError).
_METHODS = {zipfile.ZIP_STORED: "stored", zipfile.ZIP_DEFLATED: "deflate", zipfile.ZIP_BZIP2: "bzip2",
            zipfile.ZIP_LZMA: "lzma"}

_MEMBER = re.compile(r"^(?P<stem>(?:.*/)?[^/]+\.(?P<l1>[^./-]+)-(?P<l2>[^./-]+))\.(?P<lang>[^./-]+)$")


class OpusZipReader(Reader):
    """A .zip from OPUS in Moses format. The two members are picked by `--src-lang/--tgt-lang` (region variants
    matched: OPUS writes pt_BR, zh_CN); the zip's other files (README, LICENSE, ...) are ignored. When the zip
    holds `Corpus.l1-l2.ids` (OPUS: the source documents of every line), its first column is the document id.
    Origins are "zip:member:line".

    The members it reads are checked before anything is unpacked: an encrypted member or an unsupported
    compression method is an error naming the member, and so is a member whose (zip-enforced) uncompressed
    size exceeds `limits.max_expansion` x its compressed size + slack (a zip bomb)."""

    name = "opus-zip"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        check_lang_pair(self.src_lang, self.tgt_lang)
        self.members: Optional[dict[str, str]] = None

    def check(self) -> None:
        self.members = self.find_members()

    def find_members(self) -> dict[str, str]:
        try:
            with open_zip(self.src_path) as zf:
                names = [i.filename for i in zf.infolist() if not i.is_dir()]
        except zipfile.BadZipFile as e:
            raise InputError(f"{self.src_path}: not a readable zip file ({e})") from None
        candidates = {}
        for name in names:
            m = _MEMBER.match(name)
            if not m:
                continue
            pair_ok = ((lang_matches(m["l1"], self.src_lang) and lang_matches(m["l2"], self.tgt_lang))
                       or (lang_matches(m["l1"], self.tgt_lang) and lang_matches(m["l2"], self.src_lang)))
            if pair_ok:
                side = next((side for side, lang in (("src", self.src_lang), ("tgt", self.tgt_lang))
                             if lang_matches(m["lang"], lang)), None)
                if side:
                    candidates.setdefault(m["stem"], {})[side] = name
        complete = {stem: sides for stem, sides in candidates.items() if len(sides) == 2}
        if len(complete) != 1:
            pair = f"{self.src_lang}-{self.tgt_lang}"
            expected = (f"'Corpus.{pair}.{self.src_lang}' and 'Corpus.{pair}.{self.tgt_lang}' "
                        f"(or {self.tgt_lang}-{self.src_lang})")
            found = ", ".join(names[:20]) + (", ..." if len(names) > 20 else "") or "nothing"
            problem = "holds no member pair" if not complete else f"holds {len(complete)} member pairs"
            raise PrepareError(f"{self.src_path}: the zip {problem} for {self.src_lang}->{self.tgt_lang}: expected "
                               f"{expected}; it holds: {found}")
        stem, sides = complete.popitem()
        if f"{stem}.ids" in names:
            sides["ids"] = f"{stem}.ids"
        self.check_members(sides.values())
        return sides

    def check_members(self, names) -> None:
        with open_zip(self.src_path) as zf:
            for name in names:
                info = zf.getinfo(name)
                where = f"{self.src_path}:{name}"
                if info.flag_bits & 0x1:
                    raise InputError(f"{where}: the member is encrypted; unpack it yourself and give the text files "
                                     f"(--format moses)")
                if info.compress_type not in _METHODS:
                    raise InputError(f"{where}: compression method {info.compress_type} is not supported (only "
                                     f"{', '.join(_METHODS.values())}); repack the zip with deflate")
                limit = self.limits.max_expansion * info.compress_size + self.limits.expansion_slack
                if info.file_size > limit:
                    raise InputError(f"{where}: unpacks to {info.file_size} bytes from {info.compress_size} "
                                     f"({info.file_size / max(info.compress_size, 1):.0f}x, more than "
                                     f"--max-expansion {self.limits.max_expansion:g}): refused as a likely zip bomb "
                                     f"(if the file is genuine, raise --max-expansion)")

    def member_lines(self, stack: ExitStack, zf: zipfile.ZipFile, name: str):
        member: BinaryIO = stack.enter_context(zf.open(name))
        buffered = io.BufferedReader(member, buffer_size=1 << 20)  # a C readline with a size cap
        return lines_of(buffered, self.limits.max_line_bytes)

    def records(self) -> Iterator[Record]:
        members = self.members or self.find_members()
        src_name, tgt_name = members["src"], members["tgt"]
        try:
            with ExitStack() as stack:
                zf = stack.enter_context(open_zip(self.src_path))
                fs, ft = (self.member_lines(stack, zf, name) for name in (src_name, tgt_name))
                ids = self.member_lines(stack, zf, members["ids"]) if "ids" in members else iter(())
                for s, t in zip_longest(fs, ft):
                    if s is None or t is None:
                        longer, line = (src_name, s) if t is None else (tgt_name, t)
                        raise InputError(f"{self.src_path}:{longer}:{line.number}: {longer} has more lines than "
                                         f"{tgt_name if t is None else src_name}; the members must be line-aligned")
                    origin = f"{self.src_path}:{src_name}:{s.number}"
                    id_line = next(ids, None)
                    doc = id_line.text.split("\t")[0] if id_line is not None and id_line.text else None
                    if s.text is not None and t.text is not None:
                        yield Pair(s.text, t.text, origin, doc=doc)
                    else:  # oversized or not UTF-8 (a good source is kept beside a bad target)
                        yield (unusable_line(origin, s, "src", limits=self.limits)
                               or unusable_line(f"{self.src_path}:{tgt_name}:{t.number}", t, "tgt", other=s.text,
                                                limits=self.limits))
        except (zipfile.BadZipFile, zlib.error, EOFError) as e:
            raise InputError(f"{self.src_path}: corrupt zip data: {e}") from None
        except (RuntimeError, NotImplementedError) as e:  # encrypted / unsupported, if the zip changed since check()
            raise InputError(f"{self.src_path}: cannot unpack: {e}") from None


@contextmanager
def open_zip(path: str) -> Iterator[zipfile.ZipFile]:
    """The zip archive at `path`, a regular file opened through the file layer (data_prep.files)."""
    with files.open_read(path, "a zip file") as f, zipfile.ZipFile(f) as zf:
        yield zf
