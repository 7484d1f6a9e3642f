"""The console's ETA: the training steps left at the run's pace, plus the validations left.

    ETA = seconds per training step x steps left + validations left x seconds per validation

The pace is counted from the first logged row on (the run's first step builds and warms everything up:
`ETA -` until it is done), with the validations' own seconds (the rows' `validation_s`) taken out, so that
they are counted once, where they happen. Validations left: every train.eval_every steps and at
train.max_steps. Seconds per validation: the last one's, measured; before the first, an estimate from the
dev set's size (the dev sentences decoded x the training seconds per pair x VALIDATION_PER_PAIR), said as
`estimated` beside the ETA.
"""
from __future__ import annotations

# A validation (the dev loss, then a greedy decode of each dev sentence) costs about this many training pairs' time
# per dev sentence: measured 3.3 for the demo model (200 dev sentences, step 400) and 7.2 for a 16-wide test model
# (40 sentences), single process on an Intel Xeon's 2 cores (docs/training.md#the-console). An estimate for the
# minutes before the first validation, said as one; every later ETA takes the last validation's own seconds.
VALIDATION_PER_PAIR = 4.0


def duration(seconds: float) -> str:
    seconds = int(max(0, seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s"


class Eta:
    """`total_steps`: train.max_steps; `eval_every`: train.eval_every; `dev_sentences`: the dev pairs each
    validation decodes (None: no dev set, no validation)."""

    def __init__(self, total_steps: int, eval_every: int = 0, dev_sentences: int | None = None):
        self.total, self.eval_every, self.dev = total_steps, eval_every, dev_sentences
        self._validated = 0.0  # seconds of validation so far
        self._last: float | None = None  # the last validation's seconds
        self._since: tuple | None = None  # (training seconds, step, sentences seen) at the first logged row

    def validations_left(self, step: int) -> int:
        """Validations after `step` up to train.max_steps (every eval_every steps, and at the last step)."""
        if not self.dev or not self.eval_every or step >= self.total:
            return 0
        every = self.total // self.eval_every - step // self.eval_every
        return every + (self.total % self.eval_every != 0)

    def after(self, row: dict, elapsed: float) -> str:
        """The ETA once the row of `row['step']` is logged, `elapsed` seconds into the run; call it for every
        logged row, in order."""
        step = row["step"]
        if row.get("validation_s") is not None:
            self._validated += row["validation_s"]
            self._last = row["validation_s"]
        training = elapsed - self._validated
        if self._since is None:
            self._since = (training, step, row.get("sentences_seen"))
            return "-"
        t0, s0, n0 = self._since
        per_step = (training - t0) / max(1, step - s0)
        left = per_step * (self.total - step)
        count = self.validations_left(step)
        if not count:
            return duration(left)
        each, estimated = self._last, False
        if each is None:
            seen = row.get("sentences_seen")
            if seen is None or n0 is None or seen <= n0:
                return f"{duration(left)} (+{count} validation{'s' if count > 1 else ''}, not yet timed)"
            each, estimated = self.dev * per_step * (step - s0) / (seen - n0) * VALIDATION_PER_PAIR, True
        return (f"{duration(left + count * each)} (with {count} validation{'s' if count > 1 else ''}: "
                f"{duration(count * each)}{' estimated' if estimated else ''})")
