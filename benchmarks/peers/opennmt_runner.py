"""Runs OpenNMT-py's own entry points inside the peer's virtual environment (started by opennmt_peer.py).

    VENV/bin/python benchmarks/peers/opennmt_runner.py check
    VENV/bin/python benchmarks/peers/opennmt_runner.py build_vocab -config CONFIG ...
    VENV/bin/python benchmarks/peers/opennmt_runner.py train -config CONFIG ... --threads N --steps-file FILE

Imports nothing from this repository: it runs under the venv's interpreter, next to OpenNMT-py 3.5.1.
Two things it adds around `onmt.bin.train.main`, both outside the training arithmetic:

* torch's thread count (OpenNMT-py has no option for it on CPU);
* a clock around `Trainer._gradient_accumulation` (forward, loss, backward and the optimizer step of one
  training step: what our trainer's `step_time_s` covers), one JSON line per step to FILE, so both
  trainers are timed over the same part of a step. Each line also has the wall time since the end of the
  previous step, which adds OpenNMT-py's batch preparation and reporting.

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


def _clock_steps(path: str) -> None:
    import onmt.trainer

    inner = onmt.trainer.Trainer._gradient_accumulation
    out = open(path, "w", buffering=1)
    last_end = [None]

    def timed(self, true_batches, normalization, total_stats, report_stats):
        src_before, tgt_before = total_stats.n_src_words, total_stats.n_words
        start = time.perf_counter()
        inner(self, true_batches, normalization, total_stats, report_stats)
        end = time.perf_counter()
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
        if steps_file:
            _clock_steps(steps_file)
        from onmt.bin.train import main as entry
    sys.argv = [f"onmt_{command}", *argv]
    entry()


if __name__ == "__main__":
    main()
