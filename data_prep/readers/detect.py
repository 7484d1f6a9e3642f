"""`--format auto`: tell a file's format from its name and first bytes, only where that is unambiguous."""
from __future__ import annotations

import os
import re
from typing import Optional

from .. import files
from .base import InputError, PrepareError, looks_utf16
from .lines import PARAPAT_HEADER, langs_in_name
from .tmx import head_bytes, is_gzip

_NTCIR_LINE = re.compile(r"^[^\t ]+-[^\t ]+\t[^\t]*$")
ASK = "give --format moses|tsv|aspec|aspec-jc|tmx|parapat|ntcir|opus-zip"


def detect_format(src: str, tgt: Optional[str] = None) -> str:
    """The format of the file(s) of one split, or `PrepareError` naming the file when it is not clear.

    Two files: "ntcir" when the first lines of both are `ID-N<TAB>text`, else "moses". One file: "opus-zip"
    (zip magic or .zip), "tmx" (.tmx / .tmx.gz, or XML content), "parapat" (the type-1 header, or a two-column
    TSV named like en_ja.tsv), "aspec-jc" / "aspec" (3 / 4-5 ' ||| ' fields), "tsv" (two tab-separated
    columns). Anything else (e.g. a single plain-text file) is ambiguous.
    """
    if tgt is not None:
        return "ntcir" if ntcir_like(src) and ntcir_like(tgt) else "moses"
    name = os.path.basename(src).lower()
    with files.open_read(src, "an input file") as f:
        magic = f.read(4)
    if magic == b"PK\x03\x04" or name.endswith(".zip"):
        return "opus-zip"
    head = head_bytes(src, 4096)
    if name.endswith((".tmx", ".tmx.gz")) or xml_like(head):
        return "tmx"
    if is_gzip(src):
        raise PrepareError(f"{src}: a gzip file that is not TMX: cannot tell its format; decompress it or {ASK}")
    if looks_utf16(head):
        raise InputError(f"{src}:1: the file looks like UTF-16 and is not TMX; line formats are read as UTF-8 "
                         f"(convert it, e.g. iconv -f UTF-16 -t UTF-8)")
    if not head:
        raise PrepareError(f"{src}: empty file: cannot tell its format; {ASK}")
    first = head.split(b"\n", 1)[0].rstrip(b"\r").decode("utf-8", errors="replace")
    if first == PARAPAT_HEADER:
        return "parapat"
    if " ||| " in first:
        n = len(first.split(" ||| "))
        if n == 3:
            return "aspec-jc"
        if n in (4, 5):
            return "aspec"
    elif first.count("\t") == 1:
        return "parapat" if langs_in_name(src) else "tsv"
    raise PrepareError(f"{src}: cannot tell the format (line 1 is not XML, not a ParaPat header, has "
                       f"{first.count(chr(9))} tabs and {first.count(' ||| ')} ' ||| '); {ASK}")


def xml_like(head: bytes) -> bool:
    utf16 = looks_utf16(head)
    if utf16 == "with BOM":
        text = head.decode("utf-16", errors="ignore")
    elif utf16:
        text = head.decode("utf-16-le" if head[1:2] == b"\0" else "utf-16-be", errors="ignore")
    else:
        text = head.decode("utf-8-sig", errors="ignore")
    return text.lstrip().startswith(("<?xml", "<tmx", "<!DOCTYPE tmx"))


def ntcir_like(path: str, n: int = 5) -> bool:
    with files.open_read(path, "an input file") as f:
        lines = [f.readline(1 << 16) for _ in range(n)]  # bounded: a file may be one endless line
    lines = [x.rstrip(b"\r\n").decode("utf-8", errors="replace") for x in lines if x.strip()]
    return bool(lines) and all(_NTCIR_LINE.match(x) for x in lines)
