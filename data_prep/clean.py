"""Pair cleaning, pass 1 of `data_prep.prepare`: repairs that rewrite text, rules that drop pairs.

Every split (train, dev, test) and the trainer's translation input get the same repairs
(`data_prep.normalize`, counted per rule under "repaired" in the manifest; a repair never drops a pair):
entity unescaping (--no-entities), patent markup -> "⟨formula⟩" or plain text (--no-markup), optional NFKC
(--nfkc) and lowercasing (--lowercase), control / invalid-XML characters deleted and all whitespace
(U+2028, U+0085, ...) made single spaces (always), spaces between CJK characters on a ja/zh side
(--cjk-spaces auto|collapse|keep, default auto: only text that does not look pre-tokenized).

Then pairs are dropped, each under the first reason that applies, in this order (`filters.REASONS`);
dev and test pairs only under "empty" -- they are evaluation sets, and dropping their hard cases would
flatter the model:

  empty          a side is empty after normalisation                                   (always)
  too_long_text  a side has more than --max-words words (whitespace-separated tokens, each Han or kana
                 character counting as a word; 0: off). With --long split, a too-long pair is split at
                 sentence ends instead when both sides split into the same number of sentences (each
                 sentence pair then meets the later rules on its own, origin "file:line#k", and counts
                 as one pair read, so pairs_read == pairs_kept + sum(rejected) still holds; the manifest's
                 "long_split" says how many pairs became how many); otherwise it is dropped.
  copy           source and target are the same text up to case, punctuation, spaces and width
                 (their normalised keys, below, are equal)                              (--keep-copies)
  wrong_script   too few of a side's letters are in its language's script: under half for alphabetic
                 languages (en, de, ru, el, ar, ...), under 10% for ja (Han + kana), zh (Han) and ko
                 (Hangul), where a Latin abbreviation has more letters than the CJK word next to it.
                 Sides with fewer than 3 letters and languages not in `SCRIPTS` are not checked
                 (region variants count: en-US is en).                                 (--no-script-filter)
  duplicate      the exact (normalised) pair was kept before                            (--no-dedup)
  near_duplicate the pair's normalised key was kept before: NFKC, casefolded, every character that is not
                 a letter or digit removed (punctuation, symbols, spaces) -- "The cat." and "the cat" are
                 near duplicates; digits still count, so "claim 1" and "claim 2" are not.
                                                                    (--no-near-dedup; --no-dedup: both)

The content rules come before the duplicate rules, so that a repeated bad pair is counted under what is
wrong with it, and only kept pairs are remembered (as 8-byte hashes, data_prep.dedup). The piece-level
rules (too_long, too_short, ratio; `data_prep.filters`) follow in pass 2.
"""
from __future__ import annotations

import argparse
import re
import unicodedata
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Iterator, Optional

import numpy as np

from .dedup import Deduplicator, hash64
from .normalize import CJK_SPACES, repair

LONG_MODES = ("drop", "split")
MAX_WORDS = 250  # --max-words default; the translator cuts longer inputs (data_prep.segment)
EVAL_REASONS = ("empty",)
SCRIPT_MIN_LETTERS = 3

_HAN = "\u3005\u3007\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0003134f"
_KANA = "\u3040-\u309f\u30a0-\u30fa\u30fc-\u30ff\u31f0-\u31ff\uff66-\uff9f"
_ALPHABETS = {
    "latin": "A-Za-z\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u024f\u1e00-\u1eff\uff21-\uff3a\uff41-\uff5a",
    "cyrillic": "\u0400-\u052f",
    "greek": "\u0370-\u03ff\u1f00-\u1fff",
    "arabic": "\u0600-\u06ff\u0750-\u077f\u08a0-\u08ff\ufb50-\ufdff\ufe70-\ufeff",
    "hebrew": "\u0590-\u05ff",
    "thai": "\u0e00-\u0e7f",
    "devanagari": "\u0900-\u097f",
    "han+kana": _HAN + _KANA,
    "han": _HAN,
    "hangul": "\u1100-\u11ff\u3130-\u318f\uac00-\ud7af",
}
_LANGS = {
    "latin": "af ca cs cy da de en eo es et eu fi fr ga gl hr hu id is it lt lv ms mt nl nb nn no pl pt ro sk "
             "sl sq sv sw tl tr vi",
    "cyrillic": "be bg kk ky mk mn ru tg uk",
    "greek": "el",
    "arabic": "ar fa ps ur",
    "hebrew": "he iw yi",
    "thai": "th",
    "devanagari": "hi mr ne",
    "han+kana": "ja",
    "han": "zh",
    "hangul": "ko",
}
# language -> (script, the least fraction of the side's letters that must be in it)
SCRIPTS: dict[str, tuple[str, float]] = {
    lang: (script, 0.1 if script in ("han+kana", "han", "hangul") else 0.5)
    for script, langs in _LANGS.items() for lang in langs.split()}
_LETTER = re.compile(r"[^\W\d_]")
_ASCII_LETTER = re.compile("[A-Za-z]")
_IN_SCRIPT = {name: re.compile(f"[{chars}]") for name, chars in _ALPHABETS.items()}  # all letters

_WORD = re.compile(rf"[{_HAN}{_KANA}]|[^\s{_HAN}{_KANA}]+")
_NOT_ALNUM = re.compile(r"[\W_]+")
_ASCII_NOT_ALNUM = bytes(c for c in range(128) if not chr(c).isalnum())
_LATIN_END = re.compile(r"[.!?]+[\"')\]]*\s+(?=[\"'(\[]?[A-Z])")
_CJK_END = re.compile(r"[。！？]+[」』）)]*\s*(?=\S)")
_ABBREVIATIONS = frozenset("al approx art ca cf co corp dr e.g eq eqs etc fig figs i.e inc jr ltd mr mrs no nos "
                           "pp prof ref resp sr st u.s vol vs".split())


def base_lang(code: Optional[str]) -> str:
    """"en-US" / "en_GB" / "EN" -> "en"."""
    return re.split(r"[-_]", code or "", maxsplit=1)[0].lower()


def script_of(lang: Optional[str]) -> Optional[tuple[str, float]]:
    return SCRIPTS.get(base_lang(lang))


def in_script(text: str, script: tuple[str, float]) -> bool:
    """Whether at least the script's fraction of the letters of `text` are in it (True below 3 letters)."""
    name, least = script
    if text.isascii():
        return name == "latin" or len(_ASCII_LETTER.findall(text)) < SCRIPT_MIN_LETTERS
    expected = len(_IN_SCRIPT[name].findall(text))
    if expected >= least * len(text):  # there are at most len(text) letters: no need to count them
        return True
    letters = len(_LETTER.findall(text))
    return letters < SCRIPT_MIN_LETTERS or expected >= least * letters


def count_words(text: str) -> int:
    return len(text.split()) if text.isascii() else len(_WORD.findall(text))


def sentence_cuts(text: str) -> list[int]:
    """Offsets where a new sentence of `text` starts: after . ! ? followed by a space and a capital (not after
    an abbreviation or a single letter: "Fig. 2", "e.g. A", "J. Smith"), and after 。！？ (with closing
    brackets). Sorted, without 0."""
    cuts = [m.end() for m in _CJK_END.finditer(text)]
    for m in _LATIN_END.finditer(text):
        before = text[:m.start()].rsplit(maxsplit=1)
        word = before[-1].lstrip("([\"'").lower() if before else ""
        if len(word) > 1 and word not in _ABBREVIATIONS:
            cuts.append(m.end())
    return sorted(set(cuts) - {0})


def split_at(text: str, cuts: list[int]) -> list[str]:
    """The non-empty, stripped pieces of `text` between the offsets `cuts`."""
    starts = [0, *cuts]
    pieces = (text[a:b].strip() for a, b in zip(starts, [*cuts, len(text)]))
    return [p for p in pieces if p]


def split_sentences(text: str) -> list[str]:
    """Sentences of `text` (see `sentence_cuts`)."""
    return split_at(text, sentence_cuts(text))


def text_key(text: str) -> str:
    """The near-duplicate key of one side: NFKC, casefolded, only letters and digits."""
    if text.isascii():  # NFKC changes no ASCII text, and bytes.translate is ~5x faster than the regex
        return text.lower().encode("ascii").translate(None, _ASCII_NOT_ALNUM).decode("ascii")
    return _NOT_ALNUM.sub("", unicodedata.normalize("NFKC", text).casefold())


@dataclass(frozen=True)
class CleaningOptions:
    nfkc: bool = False
    lowercase: bool = False
    entities: bool = True
    markup: bool = True
    cjk_spaces: str = "auto"
    src_lang: Optional[str] = None
    tgt_lang: Optional[str] = None
    max_words: int = MAX_WORDS
    long: str = "drop"
    dedup: bool = True
    near_dedup: bool = True
    copy: bool = True
    script: bool = True

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "CleaningOptions":
        return cls(nfkc=args.nfkc, lowercase=args.lowercase, entities=args.entities, markup=args.markup,
                   cjk_spaces=args.cjk_spaces, src_lang=args.src_lang, tgt_lang=args.tgt_lang,
                   max_words=args.max_words, long=args.long, dedup=not args.no_dedup,
                   near_dedup=not (args.no_dedup or args.no_near_dedup), copy=not args.keep_copies,
                   script=not args.no_script_filter)

    def normalize_flags(self, side: str) -> dict:
        """`normalize()` keyword arguments for "src" or "tgt" (CJK spaces are only touched on ja/zh sides)."""
        lang = base_lang(self.src_lang if side == "src" else self.tgt_lang)
        return {"nfkc": self.nfkc, "lowercase": self.lowercase, "entities": self.entities, "markup": self.markup,
                "cjk_spaces": self.cjk_spaces if lang in ("ja", "zh") else "keep"}

    def scripts(self) -> dict[str, Optional[tuple[str, float]]]:
        return {"src": script_of(self.src_lang) if self.script else None,
                "tgt": script_of(self.tgt_lang) if self.script else None}

    def manifest(self) -> dict:
        """What ran on the training split, for manifest["filters"]."""
        return {"max_words": self.max_words, "long": self.long, "copy": self.copy,
                "near_dedup": self.near_dedup,
                "wrong_script": {side: s and {"script": s[0], "min_fraction": s[1]} for side, s in self.scripts().items()},
                "eval_rules": ["malformed", "invalid_utf8", "oversized", *EVAL_REASONS]}


@dataclass(frozen=True)
class Outcome:
    origin: str
    src: str
    tgt: str
    reason: Optional[str] = None  # None: kept
    near_key: Optional[str] = field(default=None, compare=False)  # training pairs the text rules kept: dedup key


@dataclass
class Cleaner:
    """Cleans the pairs of one split; `train=False` applies the repairs and the "empty" rule only.

    `clean_text` applies every rule but the duplicate ones and keeps no state besides the counters, so chunks of
    pairs can be cleaned in any process (data_prep.pipeline). The duplicate rules need every earlier kept pair
    and run in one place, in input order (`dedup_outcomes`); `clean` does both for one pair."""

    options: CleaningOptions
    train: bool
    repaired: Counter = field(default_factory=Counter)  # repair -> pairs it changed
    long_split: Counter = field(default_factory=Counter)  # "pairs" split into "segments"
    deduplicate: bool = True  # False: `clean` leaves the duplicate rules to the caller

    def __post_init__(self):
        self._norm = {side: self.options.normalize_flags(side) for side in ("src", "tgt")}
        self._scripts = self.options.scripts()
        dedup = self.deduplicate and self.train and (self.options.dedup or self.options.near_dedup)
        self.dedup = Deduplicator(self.options.dedup, self.options.near_dedup) if dedup else None

    def clean(self, origin: str, src: str, tgt: str) -> list[Outcome]:
        """The outcomes of one read pair: one, or one per sentence pair with --long split."""
        return dedup_outcomes(self.dedup, self.clean_text(origin, src, tgt))

    def clean_text(self, origin: str, src: str, tgt: str) -> list[Outcome]:
        """`clean` without the duplicate rules: their candidates have reason None and a `near_key`."""
        src, src_repairs = repair(src, **self._norm["src"])
        tgt, tgt_repairs = repair(tgt, **self._norm["tgt"])
        if src_repairs or tgt_repairs:
            self.repaired.update(src_repairs | tgt_repairs)
        if not src or not tgt:
            return [Outcome(origin, src, tgt, "empty")]
        if not self.train:
            return [Outcome(origin, src, tgt)]
        if self.too_long(src, tgt):
            return list(self.split_long(origin, src, tgt))
        return [self.check(origin, src, tgt)]

    def too_long(self, src: str, tgt: str) -> bool:
        limit = self.options.max_words  # a text has at most as many words as characters: count only long ones
        return limit > 0 and any(len(text) > limit and count_words(text) > limit for text in (src, tgt))

    def split_long(self, origin: str, src: str, tgt: str) -> Iterator[Outcome]:
        if self.options.long == "split":
            src_parts, tgt_parts = split_sentences(src), split_sentences(tgt)
            if len(src_parts) == len(tgt_parts) > 1:
                self.long_split.update(pairs=1, segments=len(src_parts))
                for k, (s, t) in enumerate(zip(src_parts, tgt_parts), start=1):
                    sub = f"{origin}#{k}"
                    yield Outcome(sub, s, t, "too_long_text") if self.too_long(s, t) else self.check(sub, s, t)
                return
        yield Outcome(origin, src, tgt, "too_long_text")

    def check(self, origin: str, src: str, tgt: str) -> Outcome:
        """The text rules after too_long_text, in order; a pair they keep carries its near-duplicate key."""
        src_key, tgt_key = text_key(src), text_key(tgt)
        if self.options.copy and src_key == tgt_key:
            return Outcome(origin, src, tgt, "copy")
        if not all(s is None or in_script(text, s) for text, s in ((src, self._scripts["src"]),
                                                                    (tgt, self._scripts["tgt"]))):
            return Outcome(origin, src, tgt, "wrong_script")
        return Outcome(origin, src, tgt, near_key=f"{src_key}\t{tgt_key}")


def dedup_keys(outcomes: list[Outcome]) -> tuple[list[int], np.ndarray, np.ndarray]:
    """Which of `outcomes` the duplicate rules judge, and their exact and near keys (`filters.pair_key` hashes of
    the pair and of its sides' `text_key`s)."""
    which = [i for i, o in enumerate(outcomes) if o.reason is None and o.near_key is not None]
    return (which, hash64(f"{outcomes[i].src}\t{outcomes[i].tgt}" for i in which),
            hash64(outcomes[i].near_key for i in which))


def dedup_outcomes(dedup: Optional[Deduplicator], outcomes: list[Outcome]) -> list[Outcome]:
    """`outcomes` with the duplicate rules applied, in order (None: no duplicate rules, as for dev/test)."""
    if dedup is None:
        return outcomes
    which, exact, near = dedup_keys(outcomes)
    out = list(outcomes)
    for i, reason in zip(which, dedup.reasons(exact, near)):
        if reason:
            out[i] = replace(out[i], reason=reason)
    return out


def add_cleaning_arguments(p: argparse.ArgumentParser) -> None:
    """The cleaning options of `python -m data_prep.prepare` (--nfkc, --lowercase, --no-dedup stay in prepare)."""
    g = p.add_argument_group("cleaning (see data_prep/clean.py)")
    g.add_argument("--entities", action=argparse.BooleanOptionalAction, default=True,
                   help="unescape HTML/XML character and entity references, twice when double-escaped")
    g.add_argument("--markup", action=argparse.BooleanOptionalAction, default=True,
                   help="replace patent maths/chemistry/image markup by ⟨formula⟩, strip <sub>/<sup>/<i>/<b> tags")
    g.add_argument("--cjk-spaces", choices=CJK_SPACES, default="auto",
                   help="spaces between CJK characters on a ja/zh side: remove (collapse), keep, or remove "
                        "unless the text looks pre-tokenized (auto)")
    g.add_argument("--max-words", type=int, default=MAX_WORDS,
                   help="drop training pairs with a side of more words (Han/kana characters count one each; 0: off)")
    g.add_argument("--long", choices=LONG_MODES, default="drop",
                   help="pairs over --max-words: drop, or split at sentence ends when both sides have as many")
    g.add_argument("--keep-copies", action="store_true", help="keep training pairs whose source equals the target")
    g.add_argument("--no-script-filter", action="store_true",
                   help="keep training pairs whose side is not in the script of --src-lang/--tgt-lang")
    g.add_argument("--no-near-dedup", action="store_true",
                   help="keep pairs equal to a kept one up to case, punctuation, spaces and width")
