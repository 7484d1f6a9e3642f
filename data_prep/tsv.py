"""The escaped TSV of the temporary kept-pairs file and of rejects.tsv: tabs, line breaks and backslashes in
a field are written as \\t, \\n, \\r and \\\\, so every record is one line."""
from __future__ import annotations

import re
from typing import Iterable

_UNESCAPE = {"t": "\t", "n": "\n", "r": "\r", "\\": "\\"}
_ESCAPED = re.compile(r"\\(.)", re.DOTALL)


def escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")


def unescape(text: str) -> str:
    return _ESCAPED.sub(lambda m: _UNESCAPE[m.group(1)], text) if "\\" in text else text


def tsv_line(fields: Iterable[str]) -> str:
    return "\t".join(map(escape, fields)) + "\n"


def parse_tsv_line(line: str) -> tuple[str, ...]:
    return tuple(unescape(x) for x in line.rstrip("\n").split("\t"))
