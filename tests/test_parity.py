"""The parallel step equals the single-process step: real multi-process gloo jobs through the CLI.

Every layout trains the same two optimizer steps on the same batches (dropout 0, same seed) with
plain SGD at lr 1 (so a parameter's change IS its clipped gradient: Adam's first step would hide
gradient errors), gradient clipping active, 2 accumulation micro-batches per step, uneven head
shards, padding, several pipeline units and time chunks. Compared with `single`: the loss of both
steps, and every parameter after the updates (the checkpoints are keyed by global layer, so any
layout's files line up with single's).
"""
from __future__ import annotations

import json
import sys

import pytest
import torch

from tests.conftest import REPO, deepspeed_cmd, read_metrics, run_cli

TOL = 2e-6  # fp32; the observed differences are ~1e-8 (summation order)


def _ds_config(path, micro: int, layout: dict, bf16: bool = False) -> str:
    base = json.loads((REPO / "ds_configs" / "single.json").read_text())
    base.update(train_micro_batch_size_per_gpu=micro, gradient_accumulation_steps=2,
                gradient_clipping=0.05, parallel_layout=layout, bf16={"enabled": bf16})
    base["optimizer"] = {"type": "SGD", "params": {"lr": 1.0}}
    base.pop("scheduler")
    path.write_text(json.dumps(base))
    return str(path)


def _train(tmp_path, data, name: str, ranks: int, micro: int, layout: dict, bf16: bool = False):
    cfg = _ds_config(tmp_path / f"{name}.json", micro, layout, bf16)
    run_dir = tmp_path / name
    args = ["launch/train.py", "--deepspeed_config", cfg, f"data.dir={data}", f"run.dir={run_dir}",
            "model.layers=4", "model.bidirectional_bottom=false", "model.emb_dim=16", "model.hidden=16",
            "model.dropout=0", "train.max_steps=2",  # (unidirectional: time chunks cut every layer along time)
            "train.eval_every=2", "train.log_every=1", "train.seed=7", "data.min_batch_sentences=8",
            "decode.dev_max_sentences=8", "logging.wandb_mode=disabled", "logging.progress=false"]
    cmd = [sys.executable, *args] if ranks == 1 else deepspeed_cmd(ranks, *args)
    run_cli(cmd, timeout=240)
    metrics = read_metrics(run_dir)
    ckpt = run_dir / "checkpoints" / "step_00000002"
    weights = {p.name: {k: v.float() for k, v in torch.load(p, weights_only=True).items()}
               for p in sorted(ckpt.glob("*-model_states.pt"))}
    return metrics, weights


def _compare(ref, got, label, tol=TOL):
    (ref_m, ref_w), (got_m, got_w) = ref, got
    assert [m["step"] for m in got_m] == [1, 2]
    for r, g in zip(ref_m, got_m):
        assert g["loss"] == pytest.approx(r["loss"], rel=tol, abs=tol), f"{label}: loss at step {r['step']}"
        assert r["grad_norm"] > 0.05, "clipping must be active for this test to mean something"
        assert g["grad_norm"] == pytest.approx(r["grad_norm"], rel=max(tol, 1e-5)), f"{label}: global grad norm"
    assert sorted(got_w) == sorted(ref_w)
    worst = 0.0
    for name, sd in ref_w.items():
        for key, tensor in sd.items():
            worst = max(worst, (got_w[name][key] - tensor).abs().max().item())
    print(f"{label}: max |param - single| = {worst:.3g}, loss diffs {[abs(g['loss'] - r['loss']) for r, g in zip(ref_m, got_m)]}")
    assert worst < tol, f"{label}: max parameter difference {worst:.3g}"


@pytest.fixture(scope="module")
def reference13(tiny_data, tmp_path_factory):
    return _train(tmp_path_factory.mktemp("ref13"), tiny_data, "single", 1, 13, {"mode": "single"})


@pytest.fixture(scope="module")
def reference14(tiny_data, tmp_path_factory):
    return _train(tmp_path_factory.mktemp("ref14"), tiny_data, "single", 1, 14, {"mode": "single"})


@pytest.mark.parametrize("name,ranks,layout", [
    ("hybrid_2", 2, {"mode": "hybrid", "num_pp": 2, "num_dp": 1, "micro_batches": 3, "time_chunks": 1}),
    ("hybrid_4", 4, {"mode": "hybrid", "num_pp": 4, "num_dp": 1, "micro_batches": 2, "time_chunks": 2}),
    ("pipeline_2", 2, {"mode": "pipeline", "num_pp": 2, "num_dp": 1, "micro_batches": 2, "time_chunks": 3}),
])
@pytest.mark.slow
def test_pipelined_modes_match_single(tiny_data, tmp_path, reference13, name, ranks, layout):
    _compare(reference13, _train(tmp_path, tiny_data, name, ranks, 13, layout), name)


@pytest.mark.parametrize("name,ranks,layout", [
    ("data_2", 2, {"mode": "data", "num_pp": 1, "num_dp": 2}),
    ("grid_2x2", 4, {"mode": "hybrid", "num_pp": 2, "num_dp": 2, "micro_batches": 2, "time_chunks": 2}),
])
@pytest.mark.slow
def test_replicated_modes_match_single(tiny_data, tmp_path, reference14, name, ranks, layout):
    _compare(reference14, _train(tmp_path, tiny_data, name, ranks, 7, layout), name)


@pytest.mark.slow
def test_bf16_hybrid_matches_bf16_single(tiny_data, tmp_path):
    """bf16 (DeepSpeed's bf16 optimizer wrapper, fp32 master weights): the hybrid step still equals
    the single step, to bf16 resolution (the reductions run in a different order)."""
    layout = {"mode": "hybrid", "num_pp": 2, "num_dp": 1, "micro_batches": 3, "time_chunks": 2}
    ref = _train(tmp_path, tiny_data, "single_bf16", 1, 13, {"mode": "single"}, bf16=True)
    _compare(ref, _train(tmp_path, tiny_data, "hybrid_bf16", 2, 13, layout, bf16=True), "hybrid_2 bf16", tol=2e-2)
