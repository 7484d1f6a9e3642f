"""Runs OpenNMT-py's own entry points inside the peer's virtual environment (started by opennmt_peer.py).

    VENV/bin/python benchmarks/peers/opennmt_runner.py check
    VENV/bin/python benchmarks/peers/opennmt_runner.py build_vocab -config CONFIG ...
    VENV/bin/python benchmarks/peers/opennmt_runner.py train -config CONFIG ... --threads N --steps-file FILE
                                                        [--profile-from S --profile-steps N --profile-out FILE]

Imports nothing from this repository: it runs under the venv's interpreter, next to OpenNMT-py 3.5.1.
Two things it adds around `onmt.bin.train.main`, both outside the training arithmetic:

* torch's thread count (OpenNMT-py has no option for it on CPU);
* a clock around `Trainer._gradient_accumulation` (forward, loss, backward and the optimizer step of one
  training step: what our trainer's `step_time_s` covers), one JSON line per step to FILE, so both
  trainers are timed over the same part of a step. Each line also has the wall time since the end of the
  previous step, which adds OpenNMT-py's batch preparation and reporting.

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


def _clock_steps(path: str, window: _Window | None) -> None:
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
                              "step_time_s": end - start, "wall_s": wall}) + "\n")

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
    if len(sys.argv) < 2 or sys.argv[1] not in ("check", "build_vocab", "train"):
        sys.exit("usage: opennmt_runner.py check | build_vocab ARGS | train ARGS [--threads N] [--steps-file FILE]")
    command, argv = sys.argv[1], sys.argv[2:]
    threads, steps_file = _take(argv, "--threads"), _take(argv, "--steps-file")
    profile_from, profile_steps = _take(argv, "--profile-from"), _take(argv, "--profile-steps")
    profile_out = _take(argv, "--profile-out")
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
    else:
        window = None
        if profile_steps and int(profile_steps) > 0:
            if not (steps_file and profile_out):
                sys.exit("--profile-steps needs --steps-file and --profile-out")
            _mark_phases()
            window = _Window(int(profile_from or 0) + 1, int(profile_steps), profile_out)
        if steps_file:
            _clock_steps(steps_file, window)
        from onmt.bin.train import main as entry
    sys.argv = [f"onmt_{command}", *argv]
    entry()


if __name__ == "__main__":
    main()
