"""Text normalisation shared by `data_prep.prepare` and the trainer's translation input.

The manifest records the flags (`manifest["normalize"]`); whoever feeds text to a model
trained on that data calls `normalize(text, **manifest["normalize"])` so both see the same
strings. SentencePiece is trained with its own normalisation switched off
(`normalization_rule_name="identity"`), so this function is the only one that rewrites text
and `decode(encode(normalize(x))) == normalize(x)` for text without unknown characters.
"""
from __future__ import annotations

import unicodedata

# C0/C1 control characters and DEL are deleted, except the ones Python counts as whitespace
# (tab, line/paragraph separators, ...), which become spaces so that words never fuse.
# U+FEFF (byte-order mark, often left at the start of files) is deleted as well.
_DELETE = {c: None for c in (*range(0x00, 0x20), *range(0x7F, 0xA0), 0xFEFF) if not chr(c).isspace()}


def normalize(text: str, *, nfkc: bool = False, lowercase: bool = False) -> str:
    """Optional NFKC and lowercasing, control characters removed, whitespace runs -> one space, stripped.

    Every Unicode whitespace character counts (including U+2028, U+0085 and the ideographic
    space U+3000), so the result never holds a tab or a line break.
    """
    if nfkc:
        text = unicodedata.normalize("NFKC", text)
    if lowercase:
        text = text.lower()
    return " ".join(text.translate(_DELETE).split())
