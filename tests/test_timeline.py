"""The timeline: every instruction of every rank as a span, merged into one Chrome trace, a Gantt PNG,
and per-rank busy / waiting / communicating / idle fractions with memory in the metrics."""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.parallel_jobs import timeline_job
from trainer.timeline import CATEGORIES, fractions, gantt


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
                                        "data.min_batch_sentences=8"], ds, str(tmp_path / "tl"), 2)
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
