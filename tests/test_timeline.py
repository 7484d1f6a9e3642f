"""The timeline and the step profiler: every instruction of every rank as a span, merged into one Chrome
trace, a Gantt PNG, and per-rank busy / waiting / communicating / idle fractions with memory in the metrics."""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import torch

from tests.conftest import REPO
from tests.parallel_jobs import timeline_job
from trainer.observe.profiling import StepProfiler
from trainer.observe.timeline import CATEGORIES, fractions, gantt


def test_fractions_add_up_and_idle_is_the_rest():
    f = fractions({"busy": 0.5, "waiting": 0.2, "communicating": 0.1}, wall=1.0)
    assert f == pytest.approx({"busy": 0.5, "waiting": 0.2, "communicating": 0.1, "idle": 0.2})
    assert fractions({}, wall=0.0)["idle"] == 1.0


def test_gantt_draws_a_png(tmp_path):
    gantt([[("forward", 0.0, 0.01), ("recv_forward", 0.01, 0.02)], [("head", 0.0, 0.02)]], ["r0", "r1"], "t",
          str(tmp_path / "g.png"))
    assert (tmp_path / "g.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_hybrid_timeline_has_every_instruction_of_every_rank(workers, tiny_data, tmp_path):
    ds = json.loads((REPO / "ds_configs" / "hybrid_2.json").read_text())
    ds.update(train_micro_batch_size_per_gpu=16)
    ds["parallel_layout"].update(micro_batches=2)
    out = workers.run(2, timeline_job, [f"data.dir={tiny_data}", "model.emb_dim=16", "model.hidden=16",
                                        "data.min_batch_sentences=8"], ds, str(tmp_path / "tl"), 5)
    run = Path(out[0]["run_dir"])
    trace = json.loads((run / "timeline" / "trace.json").read_text())["traceEvents"]
    spans = [e for e in trace if e["ph"] == "X"]
    for rank in (0, 1):
        for step in (1, 2):
            ops = Counter(e["name"] for e in spans if e["tid"] == rank and e["pid"] == step)
            assert ops == Counter(out[rank]["program"]), f"rank {rank} step {step}: spans != its program"
    assert {e["cat"] for e in spans} <= set(CATEGORIES) and {"busy", "waiting"} <= {e["cat"] for e in spans}
    assert all(e["dur"] >= 0 for e in spans)
    assert (run / "timeline" / "step_00000001.png").exists() and (run / "timeline" / "step_00000002.png").exists()
    stats = out[0]["stats"]
    assert out[1]["stats"] == stats  # gathered: every rank has every rank's numbers
    for rank in (0, 1):
        assert sum(stats[f"rank{rank}/{c}"] for c in CATEGORIES) == pytest.approx(1.0, abs=2e-4)
        assert stats[f"rank{rank}/busy"] > 0.05 and stats[f"rank{rank}/peak_rss_mb"] > 50
    assert stats["rank0/waiting"] + stats["rank1/waiting"] > 0  # a 2-stage pipeline always waits somewhere
    for rank in (0, 1):  # steps 4-5 (after the warm-up): seconds per instruction, CPU ms per thread
        timing = json.loads((run / "timing" / f"rank{rank}.json").read_text())
        assert timing["steps"] == 2 and set(timing["seconds_per_step"]) == set(out[rank]["program"])
        assert timing["cpu_ms_per_step"]["main"] > 0 and timing["wall_ms_per_step"] > 0


def test_step_profiler_writes_the_window_per_operator(tmp_path):
    prof = StepProfiler(str(tmp_path), rank=3, start=1, steps=2)  # steps 2 and 3
    a = torch.randn(64, 64)
    for step in range(1, 5):
        prof.before(step)
        for _ in range(step):  # step k runs k matmuls
            a = torch.tanh(a @ a)
        written = prof.after(step)
        assert (written is not None) == (step == 3)
    out = json.loads((tmp_path / "profile" / "rank3.json").read_text())
    assert out["steps"] == [2, 3] and out["rank"] == 3
    assert out["ops"]["aten::mm"]["calls"] == pytest.approx(2.5)  # (2 + 3) matmuls over 2 steps
    assert out["ops"]["aten::mm"]["self_ms"] > 0 and out["self_cpu_ms_per_step"] >= out["ops"]["aten::mm"]["self_ms"]
    assert out["wall_ms_per_step"] > 0 and out["minor_faults_per_step"] >= 0
    assert "aten::mm" in (tmp_path / "profile" / "rank3.txt").read_text()


def test_step_profiler_writes_a_window_the_run_ends_inside(tmp_path):
    prof = StepProfiler(str(tmp_path), rank=0, start=1, steps=10)  # steps 2-11 of a 3-step run
    for step in range(1, 4):
        prof.before(step)
        torch.randn(32, 32) @ torch.randn(32, 32)
        assert prof.after(step) is None
    assert prof.after(3, end=True) is not None
    out = json.loads((tmp_path / "profile" / "rank0.json").read_text())
    assert out["steps"] == [2, 3] and out["ops"]["aten::mm"]["calls"] == pytest.approx(1.0)


def test_profile_steps_off_writes_nothing(tmp_path):
    prof = StepProfiler(str(tmp_path), rank=0, start=0, steps=0)
    for step in range(1, 3):
        prof.before(step)
        assert prof.after(step) is None
    assert not (tmp_path / "profile").exists()
