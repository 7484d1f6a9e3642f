"""Long inputs at translation time: cut into segments the model was trained on, translate, rejoin.

Training keeps only pairs whose sides have at most `--max-words` words (`clean.count_words`: each Han or
kana character counts one) and at most `--max-len` SentencePiece pieces; the manifest records both under
"filters". A model has never seen a longer source, so the translator cuts one with `segment` against the
same `TrainingLimits`, read from the same manifest: at sentence ends first (`clean.sentence_cuts`), then
at clause boundaries (; : , and their CJK forms), then, for a clause still too long, at the word (or CJK
character) in the middle, recursively. Neighbouring pieces are merged again while they fit, so a segment
keeps as much context as the limits allow. The translations are joined with a space, or with nothing
for a Chinese or Japanese target.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

from .clean import MAX_WORDS, count_words, sentence_cuts
from .filters import MAX_PIECES
UNSPACED_LANGS = frozenset({"ja", "zh"})  # written without spaces between words

_CLAUSE_END = re.compile(r"[;:,]\s+|[、，；：]\s*")


@dataclass(frozen=True)
class TrainingLimits:
    """The longest source side a model was trained on (0 words: no word limit)."""

    max_words: int = MAX_WORDS
    max_pieces: int = MAX_PIECES

    @classmethod
    def from_manifest(cls, manifest: dict) -> "TrainingLimits":
        filters = manifest.get("filters") or {}
        return cls(int(filters.get("max_words", MAX_WORDS)), int(filters.get("max_len", MAX_PIECES)))

    def as_dict(self) -> dict:
        return {"max_words": self.max_words, "max_len": self.max_pieces}

    def fits(self, text: str, pieces: int) -> bool:
        return pieces <= self.max_pieces and (self.max_words == 0 or count_words(text) <= self.max_words)


def clause_cuts(text: str) -> list[int]:
    """Offsets after clause-ending punctuation (; : , followed by a space; 、，；：)."""
    return [m.end() for m in _CLAUSE_END.finditer(text) if m.end() < len(text)]


def middle_cut(text: str) -> list[int]:
    """The offset of the space nearest the middle of `text`, or of its middle character if it has none."""
    spaces = [m.start() for m in re.finditer(" ", text.strip())]
    offset = len(text) - len(text.lstrip())
    if spaces:
        return [offset + min(spaces, key=lambda i: abs(i - len(text) // 2))]
    return [len(text) // 2] if len(text) > 1 else []


LEVELS = (sentence_cuts, clause_cuts, middle_cut)  # where a too-long text is cut, first choice first


def segment(text: str, count_pieces: Callable[[str], int], limits: TrainingLimits) -> list[str]:
    """`text` as one or more segments that each fit `limits` (`count_pieces` counts a text's pieces);
    a text that fits is returned whole. The segments are stripped slices of `text`, in order."""
    def fits(a: int, b: int) -> bool:
        t = text[a:b].strip()
        return limits.fits(t, count_pieces(t))

    def cut(a: int, b: int) -> list[tuple[int, int]]:
        if fits(a, b):
            return [(a, b)]
        for level in LEVELS:
            cuts = [a + c for c in level(text[a:b]) if 0 < c < b - a]
            if cuts:
                spans = [span for x, y in zip([a, *cuts], [*cuts, b]) for span in cut(x, y)]
                merged = [spans[0]]  # neighbours merged again while they fit: as much context as allowed
                for x, y in spans[1:]:
                    merged[-1:] = [(merged[-1][0], y)] if fits(merged[-1][0], y) else [merged[-1], (x, y)]
                return merged
        return [(a, b)]  # one character: nothing left to cut

    return [t for t in (text[a:b].strip() for a, b in cut(0, len(text))) if t]


def join_segments(parts: list[str], lang: str | None) -> str:
    """Translations of consecutive segments as one line of the target language."""
    sep = "" if lang in UNSPACED_LANGS else " "
    return sep.join(p for p in parts if p)
