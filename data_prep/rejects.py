"""What prepare counts and keeps of every split: pairs read, kept and rejected by reason (SplitStats), and
rejects.tsv, one line per rejected pair with its reason and origin (RejectLog)."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from . import files
from .binary import SIDES
from .filters import REASONS
from .normalize import REPAIRS
from .tsv import escape

EXCERPT_CHARS = 1000  # of each field in rejects.tsv: its size stays proportional to the number of rejects


@dataclass
class SplitStats:
    pairs_read: int = 0
    pairs_kept: int = 0
    rejected: Counter = field(default_factory=Counter)
    tokens: Counter = field(default_factory=Counter)  # side -> ids written
    unk: Counter = field(default_factory=Counter)  # side -> <unk> ids written
    repaired: Counter = field(default_factory=Counter)  # repair (data_prep.normalize) -> pairs it changed
    long_split: Counter = field(default_factory=Counter)  # --long split: "pairs" split into "segments"

    def as_dict(self) -> dict:
        return {"pairs_read": self.pairs_read, "pairs_kept": self.pairs_kept,
                "rejected": {r: self.rejected[r] for r in REASONS},
                "tokens": {s: self.tokens[s] for s in SIDES}, "unk": {s: self.unk[s] for s in SIDES},
                "repaired": {r: self.repaired[r] for r in REPAIRS},
                "long_split": {k: self.long_split[k] for k in ("pairs", "segments")}}


class RejectLog:
    """rejects.tsv: `reason<TAB>origin<TAB>src<TAB>tgt`, header first, tabs and line breaks escaped."""

    def __init__(self, path: str):
        self._f = files.create(path, "the rejects")
        self._f.write("reason\torigin\tsrc\ttgt\n")

    def add(self, stats: SplitStats, reason: str, origin: str, src: str, tgt: str) -> None:
        stats.rejected[reason] += 1
        self._f.write("\t".join(escape(excerpt(x)) for x in (reason, origin, src, tgt)) + "\n")

    def close(self) -> None:
        self._f.close()


def excerpt(text: str, limit: int = EXCERPT_CHARS) -> str:
    """`text`, or its first `limit` characters and how many more there were."""
    return text if len(text) <= limit else f"{text[:limit]}…[{len(text) - limit} more characters]"
