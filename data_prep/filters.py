"""Pair filters of `data_prep.prepare`: the reject reasons, duplicate keys and the length / ratio rules.

The ratio rule compares piece counts after scaling by the corpus' own typical ratio: the median of
len(tgt pieces) / len(src pieces) over a sample of the training pairs. Raw piece counts are not comparable
across scripts and vocabularies (a small Japanese vocabulary yields ~2.4 pieces per English piece on
small_parallel_enja, and a raw 3.0 limit rejected a fifth of its correct pairs); the median is robust to the
misaligned pairs the filter is for. Pairs whose longer side has fewer than `RATIO_MIN_PIECES` pieces are not
ratio-checked: short segments ("Fig. 1" / "図１") have noisy ratios, and misaligned pairs are rarely short
on both sides.
"""
from __future__ import annotations

import hashlib
import statistics
from dataclasses import dataclass
from typing import Iterable, Optional

# In the order they are checked: a pair is counted under the first reason that applies. The text rules
# (empty .. near_duplicate) are data_prep.clean's, the piece rules (too_long, too_short, ratio) these below.
# The readers' reasons (malformed .. ipc) are data_prep.readers' (base.READER_REASONS).
REASONS = ("malformed", "invalid_utf8", "oversized", "missing_lang", "other_pair", "low_score", "ipc",
           "empty", "too_long_text", "copy", "wrong_script", "duplicate",
           "near_duplicate", "too_long", "too_short", "ratio")
RATIO_MIN_PIECES = 10
MAX_PIECES = 200  # prepare --max-len default; the translator cuts longer inputs (data_prep.segment)
RATIO_SAMPLE = 10_000


def pair_key(src: str, tgt: str) -> int:
    """8-byte hash of a normalised pair (which holds no tab, so the join is unambiguous)."""
    return int.from_bytes(hashlib.blake2b(f"{src}\t{tgt}".encode(), digest_size=8).digest(), "little")


def median_ratio(lengths: Iterable[tuple[int, int]]) -> float:
    """Median of n_tgt / n_src over (n_src, n_tgt) piece counts; 1.0 when there are none."""
    ratios = [t / s for s, t in lengths if s > 0 and t > 0]
    return float(statistics.median(ratios)) if ratios else 1.0


@dataclass(frozen=True)
class LengthFilter:
    max_len: int
    min_len: int
    max_ratio: float
    expected_ratio: float = 1.0  # median tgt/src pieces of the corpus

    def reason(self, n_src: int, n_tgt: int) -> Optional[str]:
        if max(n_src, n_tgt) > self.max_len:
            return "too_long"
        if min(n_src, n_tgt) < self.min_len:
            return "too_short"
        if max(n_src, n_tgt) >= RATIO_MIN_PIECES and min(n_src, n_tgt) > 0:
            scaled_src = n_src * self.expected_ratio
            if max(n_tgt / scaled_src, scaled_src / n_tgt) > self.max_ratio:
                return "ratio"
        return None
