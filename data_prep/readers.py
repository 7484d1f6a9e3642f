"""Parallel-corpus readers: one class per input format, looked up by name in `READERS`.

A reader yields one record per input line (or record): a `Pair(src, tgt, origin)` when the
line parses, a `Malformed(reason, origin, message, src, tgt)` when it does not, so the caller
decides whether bad input stops the run (`--on-error fail`: raise `Malformed.error()`) or is
counted and logged (`--on-error skip`). `origin` is always "file:line" (1-based).

Lines are read as bytes and decoded one at a time, so invalid UTF-8 is reported with its
line. Only "\\n" and "\\r\\n" end a line (never U+2028, U+0085, ... as `str.splitlines` would),
and a missing final newline is fine.

Adding a format is one `Reader` subclass plus one line in `READERS`.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from itertools import zip_longest
from typing import ClassVar, Iterator, Optional, Union


class PrepareError(Exception):
    """A user error (bad input, bad option): reported as one line, exit code 2, no traceback."""


class InputError(PrepareError):
    """Malformed input; the message starts with "file:line"."""


@dataclass(frozen=True)
class Pair:
    src: str
    tgt: str
    origin: str


@dataclass(frozen=True)
class Malformed:
    reason: str  # "malformed" or "invalid_utf8"
    origin: str
    message: str
    src: str = ""  # the raw text, as far as it could be decoded (for rejects.tsv)
    tgt: str = ""

    def error(self) -> InputError:
        return InputError(f"{self.origin}: {self.message}")


Record = Union[Pair, Malformed]


@dataclass(frozen=True)
class Line:
    number: int  # 1-based
    text: Optional[str]  # None when the bytes are not valid UTF-8
    raw: bytes

    def lossy(self) -> str:
        return self.raw.decode("utf-8", errors="backslashreplace")


def read_lines(path: str) -> Iterator[Line]:
    """Lines of `path` without their "\\n" / "\\r\\n" ending, decoded as UTF-8 one by one."""
    with open(path, "rb") as f:
        for number, raw in enumerate(f, start=1):  # binary iteration splits on b"\n" only
            raw = raw[:-2] if raw.endswith(b"\r\n") else raw[:-1] if raw.endswith(b"\n") else raw
            try:
                text: Optional[str] = raw.decode("utf-8")
            except UnicodeDecodeError:
                text = None
            yield Line(number, text, raw)


def count_lines(path: str) -> int:
    """Same count as `read_lines` yields (a last line without newline counts)."""
    n, last = 0, b"\n"
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            n += chunk.count(b"\n")
            last = chunk[-1:]
    return n + (last != b"\n")


def _invalid_utf8(path: str, line: Line, side: str = "src") -> Malformed:
    text = line.lossy()
    return Malformed("invalid_utf8", f"{path}:{line.number}", "invalid UTF-8",
                     src=text if side == "src" else "", tgt=text if side == "tgt" else "")


class Reader:
    """Base class. `paths` are the input files; `check()` runs before any output is written."""

    name: ClassVar[str]
    two_files: ClassVar[bool] = False  # True: source and target are separate, line-aligned files

    def __init__(self, src_path: str, tgt_path: Optional[str] = None, *, src_lang: str = "en",
                 tgt_lang: str = "ja"):
        if self.two_files != (tgt_path is not None):
            need = "a source and a target file" if self.two_files else "one file holding both sides"
            raise PrepareError(f"format {self.name!r} takes {need}")
        self.src_path, self.tgt_path = src_path, tgt_path
        self.src_lang, self.tgt_lang = src_lang, tgt_lang

    @property
    def paths(self) -> list[str]:
        return [p for p in (self.src_path, self.tgt_path) if p is not None]

    def check(self) -> None:
        """Cheap whole-file consistency checks; raise `PrepareError`."""

    def __iter__(self) -> Iterator[Record]:
        raise NotImplementedError


class MosesReader(Reader):
    """Two plain-text files, sentence i of the source on line i, its translation on line i of the target."""

    name = "moses"
    two_files = True

    def check(self) -> None:
        n_src, n_tgt = count_lines(self.src_path), count_lines(self.tgt_path)
        if n_src != n_tgt:
            raise PrepareError(f"line counts differ: {self.src_path} has {n_src} lines but "
                               f"{self.tgt_path} has {n_tgt}; Moses pair files must be line-aligned")

    def __iter__(self) -> Iterator[Record]:
        for s, t in zip_longest(read_lines(self.src_path), read_lines(self.tgt_path)):
            if s is None or t is None:  # the files changed since check()
                raise PrepareError(f"{self.src_path} and {self.tgt_path} have different line counts")
            if s.text is None:
                yield _invalid_utf8(self.src_path, s, "src")
            elif t.text is None:
                yield _invalid_utf8(self.tgt_path, t, "tgt")
            else:
                yield Pair(s.text, t.text, f"{self.src_path}:{s.number}")


class TsvReader(Reader):
    """`src<TAB>tgt` per line, no header and no quoting (a quote character is text)."""

    name = "tsv"

    def __iter__(self) -> Iterator[Record]:
        for line in read_lines(self.src_path):
            origin = f"{self.src_path}:{line.number}"
            if line.text is None:
                yield _invalid_utf8(self.src_path, line)
                continue
            fields = line.text.split("\t")
            if len(fields) != 2:
                yield Malformed("malformed", origin, f"expected 2 tab-separated fields, found {len(fields)}",
                                src=line.text)
            else:
                yield Pair(fields[0], fields[1], origin)


class AspecReader(Reader):
    """ASPEC-JE: train `score ||| id ||| n ||| ja ||| en`, dev/test `id ||| n ||| ja ||| en`."""

    name = "aspec"
    LANGS = ("ja", "en")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for lang in (self.src_lang, self.tgt_lang):
            if lang not in self.LANGS:
                raise PrepareError(f"ASPEC holds only {'/'.join(self.LANGS)}, not {lang!r}")
        if self.src_lang == self.tgt_lang:
            raise PrepareError(f"source and target language are both {self.src_lang!r}")

    def __iter__(self) -> Iterator[Record]:
        for line in read_lines(self.src_path):
            origin = f"{self.src_path}:{line.number}"
            if line.text is None:
                yield _invalid_utf8(self.src_path, line)
                continue
            fields = line.text.split(" ||| ")
            if len(fields) not in (4, 5):
                yield Malformed("malformed", origin, f"expected 4 or 5 ' ||| '-separated fields, found {len(fields)}",
                                src=line.text)
                continue
            text = {"ja": fields[-2], "en": fields[-1]}
            yield Pair(text[self.src_lang], text[self.tgt_lang], origin)


READERS: dict[str, type[Reader]] = {
    "moses": MosesReader,
    "tsv": TsvReader,
    "aspec": AspecReader,
}


def open_reader(fmt: str, src_path: str, tgt_path: Optional[str] = None, **options) -> Reader:
    """The reader for `fmt` on these files; raises `PrepareError` for an unknown format or a missing file."""
    if fmt not in READERS:
        raise PrepareError(f"unknown format {fmt!r} (known: {', '.join(sorted(READERS))})")
    reader = READERS[fmt](src_path, tgt_path, **options)
    for path in reader.paths:
        if not os.path.isfile(path):
            raise PrepareError(f"{path}: {'not a regular file' if os.path.exists(path) else 'no such file'}")
    return reader
