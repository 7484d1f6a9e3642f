"""Runs OpenNMT-py's own entry points inside the peer's virtual environment (started by opennmt_peer.py).

    VENV/bin/python benchmarks/peers/opennmt_runner.py check
    VENV/bin/python benchmarks/peers/opennmt_runner.py build_vocab -config CONFIG ...
    VENV/bin/python benchmarks/peers/opennmt_runner.py train -config CONFIG ... --threads N --steps-file FILE
                                                        [--profile-from S --profile-steps N --profile-out FILE]
                                                        [--budget-s SECONDS]
    VENV/bin/python benchmarks/peers/opennmt_runner.py translate -config CONFIG ... --threads N

Imports nothing from this repository: it runs under the venv's interpreter, next to OpenNMT-py 3.5.1.
What it adds around `onmt.bin.train.main`, all outside the training arithmetic:

* torch's thread count (OpenNMT-py has no option for it on CPU; translate gets it too);
* a clock around `Trainer._gradient_accumulation` (forward, loss, backward and the optimizer step of one
  training step: what our trainer's `step_time_s` covers), one JSON line per step to FILE, so both
  trainers are timed over the same part of a step. Each line also has the wall time since the end of the
  previous step, which adds OpenNMT-py's batch preparation and reporting, and the wall time since the training
  loop (`Trainer.train`) had its first batch (`train_s`) and since it began (`loop_s`: its reading of the
  corpus before the first batch added);
* with --budget-s, a wall-clock stop, which OpenNMT-py lacks: once SECONDS have passed since the loop's first
  batch, the loop is handed no further batch, so it ends as at its last step and saves its checkpoint
  (`model_step_N.pt`, N the steps taken) as it always does at the end (`_Budget`). The check comes before
  each batch is fetched, after the previous step and its reporting: the run overshoots by less than a step.

With --profile-steps N, torch.profiler runs over steps S+1 .. S+N and FILE gets what our trainer's
`train.profile_steps` writes (trainer/observe/profiling.py: wall and self CPU ms per step, and each operator's
self CPU ms and calls per step), plus `phases`: the CPU ms per step inside the model's forward, the loss (the
generator's projection and softmax, forward), the backward and the optimizer step, each marked with
torch.profiler.record_function.

OpenNMT-py imports every transform at start-up, and `onmt/transforms/terminology.py` imports spacy at
module level for a transform this benchmark never uses; spacy and its ~40 dependencies are not installed,
so an empty stand-in module takes its name and fails loudly if anything does use it.
"""
from __future__ import annotations

import importlib.util
import json
import sys
import time
import types


def _stand_in_for_spacy() -> None:
    if importlib.util.find_spec("spacy") is not None:
        return

    def unavailable(name):
        if name.startswith("__"):  # module introspection (inspect, warnings), not a use
            raise AttributeError(name)
        raise RuntimeError(f"spacy.{name}: spacy is not installed in the peer's environment (only the unused "
                           f"terminology transform needs it)")

    module = types.ModuleType("spacy")
    module.__getattr__ = unavailable
    sys.modules["spacy"] = module


PHASES = (("onmt.models.model", "NMTModel", "forward", "forward"),
          ("onmt.utils.loss", "LossCompute", "forward", "loss"),
          ("onmt.utils.optimizers", "Optimizer", "backward", "backward"),
          ("onmt.utils.optimizers", "Optimizer", "step", "optimizer_step"))


def _mark_phases() -> None:
    """Each phase of a step inside a record_function range named "phase: NAME"."""
    import importlib

    from torch.profiler import record_function

    for module, cls, method, name in PHASES:
        owner = getattr(importlib.import_module(module), cls)
        inner = getattr(owner, method)

        def marked(*args, _inner=inner, _name=f"phase: {name}", **kwargs):
            with record_function(_name):
                return _inner(*args, **kwargs)

        setattr(owner, method, marked)


class _Window:
    """torch.profiler over steps first .. last (1-based); writes `out` after the last."""

    def __init__(self, first: int, steps: int, out: str):
        self.first, self.last, self.out = first, first + steps - 1, out
        self.prof = None

    def before(self, step: int) -> None:
        if step == self.first:
            from torch.profiler import ProfilerActivity, profile

            self.prof = profile(activities=[ProfilerActivity.CPU])
            self.prof.__enter__()
            self.started = time.perf_counter()

    def after(self, step: int) -> None:
        if step != self.last or self.prof is None:
            return
        wall = time.perf_counter() - self.started
        self.prof.__exit__(None, None, None)
        steps = self.last - self.first + 1
        events = self.prof.key_averages()
        ops = {e.key: {"self_ms": e.self_cpu_time_total / 1000 / steps, "calls": e.count / steps}
               for e in events if not e.key.startswith("phase: ")}
        phases = {e.key[len("phase: "):]: e.cpu_time_total / 1000 / steps for e in events
                  if e.key.startswith("phase: ")}
        with open(self.out, "w") as f:
            json.dump({"steps": [self.first, self.last], "wall_ms_per_step": 1000 * wall / steps,
                       "self_cpu_ms_per_step": sum(o["self_ms"] for o in ops.values()), "phases": phases,
                       "ops": dict(sorted(ops.items(), key=lambda kv: -kv[1]["self_ms"]))}, f, indent=1)
        self.prof = None


class _Budget:
    """The training loop's clocks: `loop_start` when `Trainer.train` starts reading batches, `start` once its first
    batch is in hand (what the budget counts: OpenNMT-py reads and sorts the corpus before its first batch, start-up
    as our trainer's loading of its data before its loop is); with `seconds`, no batch is fetched once that much
    time has passed since `start` (None: the clocks only)."""

    def __init__(self, seconds: float | None = None, clock=time.perf_counter):
        self.seconds, self.clock = seconds, clock
        self.loop_start = self.start = None

    def since(self, mark: float | None) -> float | None:
        return None if mark is None else self.clock() - mark

    def spent(self) -> bool:
        return self.seconds is not None and self.start is not None and self.clock() - self.start >= self.seconds

    def batches(self, source):
        """`source`'s items until the budget is spent, checked before each is fetched."""
        self.loop_start = self.clock()
        items = iter(source)
        while not self.spent():
            try:
                item = next(items)
            except StopIteration:
                return
            if self.start is None:
                self.start = self.clock()
            yield item


def _clock_training(budget: _Budget) -> None:
    """`Trainer.train` reads its batches through `budget.batches`."""
    import onmt.trainer

    inner = onmt.trainer.Trainer.train

    def train(self, train_iter, *args, **kwargs):
        return inner(self, budget.batches(train_iter), *args, **kwargs)

    onmt.trainer.Trainer.train = train


def _clock_steps(path: str, window: _Window | None, budget: _Budget | None = None) -> None:
    import onmt.trainer

    inner = onmt.trainer.Trainer._gradient_accumulation
    out = open(path, "w", buffering=1)
    last_end = [None]

    def timed(self, true_batches, normalization, total_stats, report_stats):
        src_before, tgt_before = total_stats.n_src_words, total_stats.n_words
        step = self.optim.training_step
        if window:
            window.before(step)
        start = time.perf_counter()
        inner(self, true_batches, normalization, total_stats, report_stats)
        end = time.perf_counter()
        if window:
            window.after(step)
        wall = None if last_end[0] is None else end - last_end[0]
        last_end[0] = end
        out.write(json.dumps({"step": self.optim.training_step - 1,
                              "pairs": sum(int(b["src"].size(0)) for b in true_batches),
                              "src_tokens": total_stats.n_src_words - src_before,
                              "tgt_tokens": total_stats.n_words - tgt_before,
                              "step_time_s": end - start, "wall_s": wall,
                              "train_s": budget.since(budget.start) if budget else None,
                              "loop_s": budget.since(budget.loop_start) if budget else None}) + "\n")

    onmt.trainer.Trainer._gradient_accumulation = timed


def _take(argv: list[str], flag: str) -> str | None:
    if flag not in argv:
        return None
    i = argv.index(flag)
    value = argv[i + 1]
    del argv[i:i + 2]
    return value


def main() -> None:
    if sys.argv[1:2] in (["-h"], ["--help"]):
        print(__doc__)
        return
    if len(sys.argv) < 2 or sys.argv[1] not in ("check", "build_vocab", "train", "translate"):
        sys.exit("usage: opennmt_runner.py check | build_vocab ARGS | train ARGS [--threads N] [--steps-file FILE] "
                 "[--budget-s S] | translate ARGS [--threads N]")
    command, argv = sys.argv[1], sys.argv[2:]
    threads, steps_file = _take(argv, "--threads"), _take(argv, "--steps-file")
    profile_from, profile_steps = _take(argv, "--profile-from"), _take(argv, "--profile-steps")
    profile_out, budget_s = _take(argv, "--profile-out"), _take(argv, "--budget-s")
    _stand_in_for_spacy()
    import torch

    if threads:
        torch.set_num_threads(int(threads))
    if command == "check":
        import onmt
        import onmt.bin.build_vocab  # noqa: F401  (imports every transform, as a run does)
        import onmt.bin.train  # noqa: F401
        print(json.dumps({"onmt": onmt.__version__, "torch": torch.__version__, "cuda": torch.version.cuda}))
        return
    if command == "build_vocab":
        from onmt.bin.build_vocab import main as entry
    elif command == "translate":
        import argparse

        # OpenNMT-py 3.5.1 stores its options as an argparse.Namespace in the checkpoint, which torch >= 2.6 no
        # longer unpickles by default (torch.load weights_only); the checkpoint is the one the train command wrote
        torch.serialization.add_safe_globals([argparse.Namespace])
        from onmt.bin.translate import main as entry
    else:
        window = None
        if profile_steps and int(profile_steps) > 0:
            if not (steps_file and profile_out):
                sys.exit("--profile-steps needs --steps-file and --profile-out")
            _mark_phases()
            window = _Window(int(profile_from or 0) + 1, int(profile_steps), profile_out)
        budget = _Budget(float(budget_s) if budget_s else None)
        _clock_training(budget)
        if steps_file:
            _clock_steps(steps_file, window, budget)
        from onmt.bin.train import main as entry
    sys.argv = [f"onmt_{command}", *argv]
    entry()


if __name__ == "__main__":
    main()
