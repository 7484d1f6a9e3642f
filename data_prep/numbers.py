"""Number placeholders: numbers are copied, not translated.

Patents are full of numbers -- claim references ("according to claim 3" / "請求項３に記載の"), reference
numerals ("the housing 12"), values -- and a translation with a wrong one is a wrong translation. Spelt
digit by digit (SentencePiece's split_digits), a number has to be learnt as something to copy, and a corpus
whose claims only ever refer to claims 1-20 teaches those twenty as words instead: the quickstart's model
kept 0.8% of claim numbers it had not seen (docs/BENCHMARKS.md 6.5).

With placeholders (`prepare --number-placeholders N`, recorded as `manifest["numbers"]`):
- source side: each distinct digit run (ASCII or full-width, compared by value, "１２" == "12") of a
  normalised line, in order of first appearance, becomes `⟨n1⟩` ... `⟨nN⟩`; runs after the N-th distinct
  value stay digits;
- target side (training data, and references scored by forced decoding): a digit run whose value is one
  of the source's becomes that value's placeholder, as many times as the source has that value (the
  first ones in the target); the rest stay digits. So "claim 1 ... the first electrode" /
  "請求項１に記載の…第１の電極" masks 請求項１ only: the ordinal 第１ is a word to translate, not the
  claim number, and masking it too taught the model to write 第⟨n1⟩ for "first" (docs/BENCHMARKS.md
  6.5). Any other number stays digits (the model still learns to write numbers it must not copy);
- the placeholders are SentencePiece user symbols: always one piece each;
- translation (trainer.inference.translator) masks the input the same way and puts each placeholder of the output
  back as its source number, in the target's digit width (`fullwidth`: the width most matched target
  numbers had in the training sample); a placeholder the source has no number for is dropped.
A number is one digit run: "2.5" is two ("⟨n1⟩.⟨n2⟩"), each copied.
"""
from __future__ import annotations

import re

MAX_SLOTS = 8
SLOT = "⟨n[1-9][0-9]*⟩"  # a placeholder, as a pattern without groups (data_prep.vocab keeps them whole)
SLOT_RE = re.compile(r"⟨n([1-9][0-9]*)⟩")
DIGIT_RUN = re.compile(r"[0-9]+|[０-９]+")  # one width per run: "1２" is two runs (never seen in real text)
_TO_ASCII = str.maketrans("０１２３４５６７８９", "0123456789")
_TO_FULL = str.maketrans("0123456789", "０１２３４５６７８９")


def slot_pieces(slots: int) -> list[str]:
    """The placeholders `⟨n1⟩` ... `⟨n{slots}⟩` (SentencePiece user symbols)."""
    return [f"⟨n{i}⟩" for i in range(1, slots + 1)]


def value(run: str) -> str:
    return run.translate(_TO_ASCII)


def mask_source(text: str, slots: int) -> tuple[str, list[str]]:
    """`text` with its first `slots` distinct numbers replaced by placeholders, and those numbers (ASCII
    digits, in slot order)."""
    numbers: list[str] = []

    def sub(m: re.Match) -> str:
        v = value(m.group(0))
        if v not in numbers:
            if len(numbers) == slots:
                return m.group(0)
            numbers.append(v)
        return f"⟨n{numbers.index(v) + 1}⟩"

    return (DIGIT_RUN.sub(sub, text) if slots else text), numbers


def slot_counts(masked: str, slots: int) -> list[int]:
    """How often each placeholder ⟨n1⟩ .. ⟨n{slots}⟩ occurs in a masked source: how many target runs of its
    value `mask_target` may replace."""
    found = [0] * slots
    for m in SLOT_RE.finditer(masked):
        i = int(m.group(1)) - 1
        if i < slots:
            found[i] += 1
    return found


def mask_target(text: str, numbers: list[str], counts: list[int]) -> tuple[str, int, int]:
    """`text` with the first `counts[i]` runs of each number `numbers[i]` replaced by its placeholder; also
    how many runs were replaced and how many of those were full-width (the manifest's `fullwidth` comes
    from these counts)."""
    replaced = full = 0
    left = dict(zip(numbers, counts))

    def sub(m: re.Match) -> str:
        nonlocal replaced, full
        v = value(m.group(0))
        if not left.get(v):
            return m.group(0)
        left[v] -= 1
        replaced += 1
        full += m.group(0) != v
        return f"⟨n{numbers.index(v) + 1}⟩"

    return (DIGIT_RUN.sub(sub, text) if numbers else text), replaced, full


def mask_pair(src: str, tgt: str, slots: int) -> tuple[str, str]:
    masked_src, numbers = mask_source(src, slots)
    return masked_src, mask_target(tgt, numbers, slot_counts(masked_src, len(numbers)))[0]


def restore(text: str, numbers: list[str], fullwidth: bool = False) -> str:
    """Each placeholder of a translation -> its source number (full-width digits if `fullwidth`); a
    placeholder with no source number is dropped."""
    if "⟨n" not in text:
        return text

    def sub(m: re.Match) -> str:
        i = int(m.group(1)) - 1
        if i >= len(numbers):
            return ""
        return numbers[i].translate(_TO_FULL) if fullwidth else numbers[i]

    return SLOT_RE.sub(sub, text)


def check_config(data, where: str) -> dict | None:
    """`manifest["numbers"]` (or an exported model's): None (off) or {"slots": 1..MAX_SLOTS, "fullwidth": bool};
    raises ValueError naming `where` otherwise."""
    if data is None:
        return None
    if not isinstance(data, dict) or set(data) != {"slots", "fullwidth"}:
        raise ValueError(f"{where}: numbers: expected {{\"slots\": N, \"fullwidth\": true|false}} or null")
    slots, fullwidth = data["slots"], data["fullwidth"]
    if type(slots) is not int or not 1 <= slots <= MAX_SLOTS or type(fullwidth) is not bool:
        raise ValueError(f"{where}: numbers: slots must be an integer 1-{MAX_SLOTS} and fullwidth true or false, "
                         f"not {slots!r} / {fullwidth!r}")
    return {"slots": slots, "fullwidth": fullwidth}
