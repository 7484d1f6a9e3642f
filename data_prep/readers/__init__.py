"""Parallel-corpus readers: one class per input format, looked up by name in `READERS`.

A reader yields one record per input line (or TMX <tu>, or row): a `Pair(src, tgt, origin, doc, meta)` when
it parses, a `Malformed(reason, origin, message, src, tgt)` when it does not, so the caller decides whether
bad input stops the run (`--on-error fail`: raise `Malformed.error()` when `fatal`) or is counted and logged.
Non-fatal reasons are always counted: "oversized" (a line or TMX segment over `InputLimits.max_line_bytes`) and
the selections "missing_lang" (a TMX <tu> without one of the languages),
"other_pair" (a ParaPat type-1 row of another language pair), "low_score" / "ipc" (`MetaFilter`).
`origin` is "file:line" (1-based), "file:TU#n" for TMX, "zip:member:line" for OPUS zips. `doc` is the
document id where the format has one, `meta` the TMX <prop>s / ParaPat ids.

Formats (`--format`, `cli.FORMATS_HELP`): moses, ntcir (lines.py); tsv, parapat, aspec, aspec-jc (lines.py);
tmx (tmx.py); opus-zip (opus.py); `auto` is `detect.detect_format`. `--split-by-doc` is docsplit.py.

Line formats read bytes and decode one line at a time, so invalid UTF-8 is reported with its line. Only "\\n"
and "\\r\\n" end a line (never U+2028, U+0085, ... as `str.splitlines` would), a missing final newline is fine,
and a UTF-16 file is an error rather than text full of NULs. A line longer than `InputLimits.max_line_bytes` is
never read whole: it becomes an "oversized" record (counted and logged under any --on-error, like the selections).

Adding a format is one `Reader` subclass (implementing `records()`) plus one line in `READERS`.
"""
from __future__ import annotations

from dataclasses import asdict
from typing import Optional

from .base import (DEFAULT_LIMITS, FATAL_REASONS, READER_REASONS, ExpansionGuard, InputError, InputLimits, Line,
                   Malformed, MetaFilter, Pair, PrepareError, Reader, Record, check_files_exist, count_lines,
                   lang_matches, lines_of, read_lines)
from .cli import FORMATS_HELP, add_reader_arguments
from .detect import detect_format
from .docsplit import DocSplit, DocSplitView
from .lines import AspecJcReader, AspecReader, MosesReader, NtcirReader, ParaPatReader, TsvReader
from .opus import OpusZipReader
from .tmx import TmxReader, write_tmx

READERS: dict[str, type[Reader]] = {r.name: r for r in (
    MosesReader, TsvReader, AspecReader, AspecJcReader, NtcirReader, ParaPatReader, TmxReader, OpusZipReader)}


def open_reader(fmt: str, src_path: str, tgt_path: Optional[str] = None, **options) -> Reader:
    """The reader for `fmt` on these files; raises `PrepareError` for an unknown format or a missing file.
    `options`: src_lang, tgt_lang, inline (TMX: "drop" | "text"), meta_filter (`MetaFilter`), limits
    (`InputLimits`: line / segment cap, decompression ratio)."""
    if fmt not in READERS:
        raise PrepareError(f"unknown format {fmt!r} (known: {', '.join(sorted(READERS))})")
    reader = READERS[fmt](src_path, tgt_path, **options)
    check_files_exist(reader.paths)
    return reader


def readers_manifest(readers: dict[str, Reader]) -> dict:
    """What the manifest says about the readers, after they were read: the format of each split, its number of
    distinct documents (None: no document ids), the metadata filters, and the document split if any."""
    split = next((r.source.info for r in readers.values() if isinstance(r, DocSplitView)), None)
    train = readers.get("train")
    meta_filter = train.source.reader.meta_filter if isinstance(train, DocSplitView) else getattr(
        train, "meta_filter", None)
    return {"formats": {s: r.name for s, r in readers.items()},
            "documents": {s: r.documents for s, r in readers.items()},
            "metadata_filters": asdict(meta_filter) if meta_filter else None,
            "split_by_doc": split}


__all__ = ["DEFAULT_LIMITS", "ExpansionGuard", "InputLimits", "FATAL_REASONS", "FORMATS_HELP", "READER_REASONS",
           "READERS", "DocSplit", "DocSplitView", "InputError",
           "Line", "Malformed", "MetaFilter", "Pair", "PrepareError", "Reader", "Record", "add_reader_arguments",
           "check_files_exist", "count_lines", "detect_format", "lang_matches", "lines_of", "open_reader",
           "read_lines", "readers_manifest", "write_tmx"]
