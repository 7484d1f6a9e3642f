"""What every reader shares: errors, the records a reader yields, line splitting, languages, metadata filters."""
from __future__ import annotations

import hashlib
import io
import os
import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import BinaryIO, Callable, ClassVar, Iterable, Iterator, NamedTuple, Optional, Union

from .. import files


class PrepareError(Exception):
    """A user error (bad input, bad option): reported as one line, exit code 2, no traceback."""


class InputError(PrepareError):
    """Malformed input; the message starts with "file:line" (or "file:line:col", "file:TU#n")."""


@dataclass(frozen=True)
class Pair:
    src: str
    tgt: str
    origin: str
    # Annotations, not part of equality (a Pair equals Pair(src, tgt, origin) as before they existed):
    doc: Optional[str] = field(default=None, compare=False)  # document id: patent number, family id, DOCID
    meta: Optional[dict] = field(default=None, compare=False)  # e.g. TMX <prop>s: {"score-bicleaner": "0.71"}


# Reasons a reader gives for a record that is not a usable pair. Only the first two mean broken input and stop
# the run under `--on-error fail`; the others are always counted and logged: "oversized" (a line or TMX segment
# longer than --max-line-bytes, never read whole) and the selections (a TU without the language, another
# language pair of a multi-pair file, a metadata filter).
FATAL_REASONS = ("malformed", "invalid_utf8")
READER_REASONS = (*FATAL_REASONS, "oversized", "missing_lang", "other_pair", "low_score", "ipc")


@dataclass(frozen=True)
class InputLimits:
    """What one input may make prepare hold or unpack (every file is possibly hostile).

    max_line_bytes   a line (or TMX <seg> / <prop>) longer than this is rejected as "oversized" and skipped
                     in pieces, never held whole (--max-line-bytes; real sentences and patent abstracts are a
                     few kilobytes);
    max_expansion    a compressed input (OPUS zip member, gzipped TMX) may decompress to at most this many
                     times its compressed size, plus `expansion_slack` bytes; more is refused as a likely
                     decompression bomb before it fills memory or disk (--max-expansion; text compresses 3-10x).
    """

    max_line_bytes: int = 1 << 16
    max_expansion: float = 100.0
    expansion_slack: int = 16 << 20

    def oversized(self, origin: str, size: int, what: str = "line", src: str = "", tgt: str = "") -> "Malformed":
        return Malformed("oversized", origin, f"{what} of {size} bytes, longer than --max-line-bytes "
                         f"{self.max_line_bytes}", src=src, tgt=tgt)


DEFAULT_LIMITS = InputLimits()


@dataclass(frozen=True)
class Malformed:
    reason: str  # one of READER_REASONS
    origin: str
    message: str
    src: str = ""  # the raw text, as far as it could be decoded (for rejects.tsv)
    tgt: str = ""

    @property
    def fatal(self) -> bool:
        return self.reason in FATAL_REASONS

    def error(self) -> InputError:
        return InputError(f"{self.origin}: {self.message}")


Record = Union[Pair, Malformed]


class Line(NamedTuple):  # a tuple: two of these are made per line pair, and a frozen dataclass costs 3x more
    number: int  # 1-based
    text: Optional[str]  # None when the bytes are not valid UTF-8, or the line is oversized
    raw: bytes  # of an oversized line: only its first bytes
    size: int = -1  # bytes of an oversized line (> InputLimits.max_line_bytes); -1 otherwise

    @property
    def oversized(self) -> bool:
        return self.size >= 0

    def lossy(self) -> str:
        return self.raw.decode("utf-8", errors="backslashreplace")


def looks_utf16(head: bytes) -> Optional[str]:
    """"with BOM" / "without BOM" when the first bytes of a file are UTF-16, else None."""
    if head[:2] in (b"\xff\xfe", b"\xfe\xff"):
        return "with BOM"
    pairs = len(head) // 2
    if pairs >= 2:
        zeros_even, zeros_odd = head[0:2 * pairs:2].count(0), head[1:2 * pairs:2].count(0)
        if max(zeros_even, zeros_odd) >= 0.9 * pairs and min(zeros_even, zeros_odd) == 0:
            return "without BOM"
    return None


def lines_of(f: BinaryIO, max_bytes: int = DEFAULT_LIMITS.max_line_bytes) -> Iterator[Line]:
    """Lines of a binary stream without their "\\n" / "\\r\\n" ending, decoded as UTF-8 one by one. A line longer
    than `max_bytes` is not read whole: it is skipped in pieces and yielded as oversized (`Line.size`)."""
    number, cap = 0, max_bytes + 2  # room for the "\r\n" of a line exactly at the cap
    while raw := f.readline(cap):  # splits on b"\n" only
        number += 1
        size = -1
        if len(raw) == cap and not raw.endswith(b"\n"):  # longer still: skip to its end, piece by piece
            size, tail = len(raw), raw[-1:]
            while (piece := f.readline(cap)) and not piece.endswith(b"\n"):
                size, tail = size + len(piece), piece[-1:]
            size += len(piece) - (0 if not piece else 2 if (tail + piece).endswith(b"\r\n") else 1)
        body = raw[:-2] if raw.endswith(b"\r\n") else raw[:-1] if raw.endswith(b"\n") else raw
        if size >= 0 or len(body) > max_bytes:
            yield Line(number, None, body[:max_bytes], size if size >= 0 else len(body))
            continue
        try:
            text: Optional[str] = body.decode("utf-8")
        except UnicodeDecodeError:
            text = None
        yield Line(number, text, body)


def read_lines(path: str, max_bytes: int = DEFAULT_LIMITS.max_line_bytes) -> Iterator[Line]:
    """`lines_of` a UTF-8 file; a UTF-16 file is an `InputError` (it would decode as UTF-8 with NULs)."""
    with files.open_read(path, "an input file") as f:
        utf16 = looks_utf16(f.read(512))
        if utf16:
            raise InputError(f"{path}:1: the file looks like UTF-16 ({utf16}); this format is read as UTF-8 "
                             f"(convert it, e.g. iconv -f UTF-16 -t UTF-8)")
        f.seek(0)
        yield from lines_of(f, max_bytes)


class ExpansionGuard(io.RawIOBase):
    """A decompressing stream that stops with an `InputError` once it has produced more than
    `limits.max_expansion` x the compressed bytes consumed so far (`consumed()`) + `limits.expansion_slack`:
    a decompression bomb is refused after a bounded amount of work, whatever it would unpack to."""

    def __init__(self, inner: BinaryIO, consumed: Callable[[], int], what: str, limits: InputLimits,
                 also_close: Optional[BinaryIO] = None):
        self.inner, self.consumed, self.what, self.limits = inner, consumed, what, limits
        self.also_close = also_close  # the compressed file, when `inner` does not own it
        self.produced = 0

    def close(self) -> None:
        if not self.closed:
            self.inner.close()
            if self.also_close is not None:
                self.also_close.close()
        super().close()

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        data = self.inner.read(len(buffer))
        n = len(data)
        buffer[:n] = data
        self.produced += n
        packed = self.consumed()
        if self.produced > self.limits.max_expansion * packed + self.limits.expansion_slack:
            raise InputError(f"{self.what}: decompresses to more than {self.limits.max_expansion:g} times its "
                             f"compressed size ({self.produced} bytes from the first {packed}): refused as a likely "
                             f"decompression bomb (if the file is genuine, raise --max-expansion)")
        return n


def count_lines(path: str) -> int:
    """Same count as `read_lines` yields (a last line without newline counts)."""
    n, last = 0, b"\n"
    with files.open_read(path, "an input file") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            n += chunk.count(b"\n")
            last = chunk[-1:]
    return n + (last != b"\n")


def invalid_utf8(origin: str, line: Line, side: str = "src", other: str = "") -> Malformed:
    """`line` (of `side`) is not UTF-8; `other` is the other side's text where it is known (for rejects.tsv)."""
    text = line.lossy()
    return Malformed("invalid_utf8", origin, "invalid UTF-8",
                     src=text if side == "src" else other, tgt=text if side == "tgt" else other)


def unusable_line(origin: str, line: Line, side: str = "src", other: str = "",
                  limits: InputLimits = DEFAULT_LIMITS) -> Optional[Malformed]:
    """The record for a line that is oversized or not UTF-8 (both have no text); None for a good line."""
    if line.oversized:
        text = line.lossy()
        return limits.oversized(origin, line.size, src=text if side == "src" else other,
                                tgt=text if side == "tgt" else other)
    return invalid_utf8(origin, line, side, other) if line.text is None else None


# --- languages ------------------------------------------------------------------------------------------------

@lru_cache(maxsize=1024)
def lang_tag(code: str) -> tuple[str, ...]:
    """"EN_us" -> ("en", "us"): BCP 47-ish subtags, lowercased, "_" read as "-"."""
    return tuple(code.strip().lower().replace("_", "-").split("-"))


@lru_cache(maxsize=1024)
def lang_matches(code: str, wanted: str) -> bool:
    """`code` (from a file) is language `wanted`: same primary subtag, and the same region etc. where both
    name one ("en-US" ~ "en" ~ "EN_us", but "en-US" !~ "en-GB")."""
    a, b = lang_tag(code), lang_tag(wanted)
    return a[0] == b[0] and a[1:len(b)] == b[1:len(a)]


def check_lang_pair(src_lang: str, tgt_lang: str) -> None:
    if lang_matches(src_lang, tgt_lang) or lang_matches(tgt_lang, src_lang):
        raise PrepareError(f"source and target language are both {src_lang!r}"
                           + (f" / {tgt_lang!r}" if src_lang != tgt_lang else ""))


# --- metadata filters -----------------------------------------------------------------------------------------

_IPC_SPLIT = re.compile(r"[;,|]")


@dataclass(frozen=True)
class MetaFilter:
    """`--min-score` / `--ipc`: selections on a pair's metadata (TMX <prop>s). A pair without the score prop
    passes the score filter; a pair without an "ipc" prop fails the IPC filter (its class is unknown)."""

    min_score: Optional[float] = None
    score_prop: str = "score-bicleaner"
    ipc: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return self.min_score is not None or bool(self.ipc)

    def check(self, pair: Pair) -> Optional[Malformed]:
        meta = pair.meta or {}
        if self.min_score is not None and meta.get(self.score_prop) is not None:
            value = meta[self.score_prop]
            try:
                score = float(value)
            except ValueError:
                return Malformed("malformed", pair.origin, f"{self.score_prop} {value!r} is not a number",
                                 pair.src, pair.tgt)
            if not score >= self.min_score:  # NaN fails too
                return Malformed("low_score", pair.origin, f"{self.score_prop} {score} < {self.min_score}",
                                 pair.src, pair.tgt)
        if self.ipc:
            codes = [ipc_key(c) for c in _IPC_SPLIT.split(meta.get("ipc") or "")]
            if not any(c.startswith(ipc_key(p)) for c in codes if c for p in self.ipc):
                return Malformed("ipc", pair.origin, f"IPC {meta.get('ipc')!r} matches none of {list(self.ipc)}",
                                 pair.src, pair.tgt)
        return None


def ipc_key(code: str) -> str:
    """IPC codes compare without spaces and case: "g06f 3/01" ~ "G06F3/01"."""
    return "".join(code.split()).upper()


def doc_key(doc: str, seed: int = 0) -> int:
    """Seeded 8-byte hash of a document id: a set of these counts documents; sorting them shuffles documents."""
    return int.from_bytes(hashlib.blake2b(doc.encode("utf-8", "surrogatepass"), digest_size=8,
                                          key=seed.to_bytes(8, "little", signed=True)).digest(), "little")


# --- the reader interface -------------------------------------------------------------------------------------

class Reader:
    """Base class. `paths` are the input files; `check()` runs before any output is written.

    Subclasses implement `records()`; iterating a reader applies the metadata filter and counts distinct
    document ids (`documents`, None when no pair had one).
    """

    name: ClassVar[str]
    two_files: ClassVar[bool] = False  # True: source and target are separate, line-aligned files

    def __init__(self, src_path: str, tgt_path: Optional[str] = None, *, src_lang: str = "en",
                 tgt_lang: str = "ja", inline: str = "drop", meta_filter: Optional[MetaFilter] = None,
                 limits: InputLimits = DEFAULT_LIMITS):
        if self.two_files != (tgt_path is not None):
            need = "a source and a target file" if self.two_files else "one file holding both sides"
            raise PrepareError(f"format {self.name!r} takes {need}")
        self.src_path, self.tgt_path = src_path, tgt_path
        self.src_lang, self.tgt_lang = src_lang, tgt_lang
        self.inline = inline
        self.meta_filter = meta_filter or None
        self.limits = limits
        self.documents: Optional[int] = None

    @property
    def paths(self) -> list[str]:
        return [p for p in (self.src_path, self.tgt_path) if p is not None]

    def check(self) -> None:
        """Cheap whole-file consistency checks; raise `PrepareError`."""

    def lines(self) -> Iterator[Line]:
        """The lines of the (single) input file, capped at `limits.max_line_bytes`."""
        return read_lines(self.src_path, self.limits.max_line_bytes)

    def records(self) -> Iterator[Record]:
        raise NotImplementedError

    def __iter__(self) -> Iterator[Record]:
        docs: set[int] = set()
        self.documents = None
        for rec in self.records():
            if isinstance(rec, Pair):
                rejected = self.meta_filter and self.meta_filter.check(rec)
                if rejected:
                    yield rejected
                    continue
                if rec.doc is not None:
                    docs.add(doc_key(rec.doc))
                    self.documents = len(docs)
            yield rec


def check_files_exist(paths: Iterable[str]) -> None:
    for path in paths:
        if not os.path.isfile(path):
            raise PrepareError(f"{path}: {'not a regular file' if os.path.exists(path) else 'no such file'}")
