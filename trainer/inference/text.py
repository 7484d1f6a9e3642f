"""The text side of translation: an input line to the piece ids the model reads, and the model's pieces
back to a line of text, with everything `prepare` did to the training data done the same way.

1. normalised as the training data was (`manifest["normalize"]`); each formula the markup step replaces by
   "⟨formula⟩" is remembered;
2. an empty line has no segments (no decoding: a model would invent a translation);
3. with number placeholders (`manifest["numbers"]`, data_prep.numbers) the numbers are masked;
4. a line longer than the training data allowed (`data_prep.segment.TrainingLimits`, from the manifest) is cut
   at sentence, then clause boundaries into segments, translated independently and rejoined;
5. the placeholders of the translation get the source's numbers and formulas back, in order.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from data_prep.dataformat import (PLACEHOLDER, TrainingLimits, files, join_segments, normalize, numbers, repair,
                                  restore_formulas, segment)
from trainer.model.search import Hypothesis


@dataclass
class Translated:
    """One hypothesis of one input line."""

    text: str
    score: float  # log-prob / (pieces + segments)^length_penalty (log-prob and pieces summed over segments)
    logprob: float  # natural log, over all segments, end-of-sentence included
    pieces: int  # target pieces, end-of-sentence not included
    alignment: list[tuple[int, int]] = field(default_factory=list)  # (source piece, target piece) pairs


def one_line(text: str) -> str:
    """Output text never breaks the one-line-per-input contract: byte fallback can spell a control
    character, a tab or a line break, and a restored formula may hold one. `normalize` without flags
    deletes control characters and makes every whitespace run one space."""
    return normalize(text)


def read_lines(path: str, flag: str | None = None) -> list[str]:
    """One segment per '\\n'-terminated line (not str.splitlines, which also splits on U+2028) of a regular file
    (the file layer; `flag`: the option that named it, for its errors)."""
    with files.text_reader(files.open_read(path, "a text file", flag=flag)) as f:
        return [line.rstrip("\n").rstrip("\r") for line in f]


class TextPipeline:
    """What the data's manifest says about its text, applied to input lines and to translations."""

    def __init__(self, src_sp, tgt_sp, norm: dict, *, tgt_lang: str | None = None,
                 limits: TrainingLimits | None = None, norm_tgt: dict | None = None, number_slots: dict | None = None):
        self.src_sp, self.tgt_sp, self.norm = src_sp, tgt_sp, norm
        self.norm_tgt = norm_tgt if norm_tgt is not None else {}
        self.tgt_lang, self.limits = tgt_lang, limits or TrainingLimits()
        self.numbers = number_slots  # manifest["numbers"]: None, or {"slots": N, "fullwidth": bool}

    def source(self, line: str) -> tuple[list[list[int]], tuple[list[str], list[str]]]:
        """A line's segments as piece ids (none for an empty line) and what its placeholders stand for:
        (formulas, numbers)."""
        formulas: list[str] = []
        text = repair(line, **self.norm, formulas=formulas)[0]
        if not self.norm.get("markup"):  # placeholders typed into the input stand for themselves
            formulas = [PLACEHOLDER] * text.count(PLACEHOLDER)
        text, nums = self.mask(text)
        if not text:
            return [], (formulas, nums)
        ids = self.src_sp.encode(text)
        if self.limits.fits(text, len(ids)):
            return [ids], (formulas, nums)
        parts = segment(text, lambda t: len(self.src_sp.encode(t)), self.limits)
        return [self.src_sp.encode(p) for p in parts], (formulas, nums)

    def mask(self, text: str) -> tuple[str, list[str]]:
        """Normalised input text with its numbers as placeholders, if the data had them, and the numbers."""
        return numbers.mask_source(text, self.numbers["slots"]) if self.numbers else (text, [])

    def encode(self, line: str) -> list[int]:
        return self.src_sp.encode(self.mask(normalize(line, **self.norm))[0])

    def pair(self, src: str, tgt: str) -> tuple[list[int], list[int]]:
        """A (source, reference) pair as piece ids, the reference's numbers masked as the source's were."""
        text, nums = self.mask(normalize(src, **self.norm))
        masked = numbers.mask_target(normalize(tgt, **self.norm_tgt), nums, numbers.slot_counts(text, len(nums)))[0]
        return self.src_sp.encode(text), self.tgt_sp.encode(masked)

    def join(self, segments: list[list[int]], hyps: list[Hypothesis], held: tuple[list[str], list[str]],
             alpha: float, alignments: bool) -> Translated:
        """The segments' hypotheses as one translation of the line, its placeholders filled back."""
        text = join_segments([self.tgt_sp.decode(h.tokens) for h in hyps], self.tgt_lang)
        logprob, pieces = sum(h.logprob for h in hyps), sum(len(h.tokens) for h in hyps)
        score = logprob / max(pieces + len(hyps), 1) ** alpha if hyps else 0.0
        links, src_off, tgt_off = [], 0, 0
        if alignments:
            for ids, h in zip(segments, hyps):
                links += [(src_off + min(s, len(ids) - 1), tgt_off + t) for t, s in enumerate(h.alignment)]
                src_off, tgt_off = src_off + len(ids), tgt_off + len(h.tokens)
        formulas, nums = held
        if self.numbers:
            text = numbers.restore(text, nums, self.numbers["fullwidth"])
        return Translated(one_line(restore_formulas(text, formulas)), score, logprob, pieces, links)
