"""The parallel step equals the single-process step, in seconds: every layout as a real gloo job of the
in-process harness (tests/harness.py), built by the same code as launch/train.py; and once through the real
CLI and the deepspeed launcher, comparing the checkpoint files.

SGD at lr 1, so a parameter's change IS its clipped gradient; clipping active; 2 accumulation micro-batches
per step; uneven head shards, padding, several pipeline units and time chunks; dropout 0. Compared with
`single`: the loss and the global gradient norm of both steps, and every parameter after the updates.
Then the shipped optimizer (Adam, warm-up, clipping) over several steps: the modes agree step by step.
The model has residual layers (model.residual, as the quickstart's), so every layout runs the adds across its
stage boundaries and time chunks; one test runs the plain model (no residual) in the pipelined layouts.
"""
from __future__ import annotations

import json
import math
import sys

import numpy as np
import pytest

from tests.conftest import REPO, deepspeed_cmd, read_metrics, run_cli
from tests.parallel_jobs import auto_precision, early_reduce_points, train_steps

TOL = 2e-6
# general attention (the score's W_a, a parameter of the head summed over its shards), stated here: the harness's
# defaults are the demo's (trainer/configs/demo.yaml), whose attention is another
PLAIN_MODEL = ["model.layers=4", "model.emb_dim=16", "model.hidden=16", "model.dropout=0", "train.seed=7",
               "data.min_batch_sentences=8", "model.attention=general", "model.residual=false"]
MODEL = [*PLAIN_MODEL[:-1], "model.residual=true"]


def _ds(micro: int, layout: dict, bf16: bool = False, fp16: bool = False, gas: int = 2) -> dict:
    ds = json.loads((REPO / "ds_configs" / "single.json").read_text())
    ds.update(train_micro_batch_size_per_gpu=micro, gradient_accumulation_steps=gas, gradient_clipping=0.05,
              parallel_layout=layout, bf16={"enabled": bf16}, fp16={"enabled": fp16})
    ds["optimizer"] = {"type": "SGD", "params": {"lr": 1.0}}
    ds.pop("scheduler")
    return ds


def _run(workers, tiny_data, tmp_path, name, world, micro, layout, bf16=False, dropout=0.0, extra=(), fp16=False,
         gas=2, model=MODEL):
    out = workers.run(world, train_steps, [f"data.dir={tiny_data}", *model, f"model.dropout={dropout}", *extra],
                      _ds(micro, layout, bf16, fp16, gas), str(tmp_path / name), 2)
    params = {}
    for rank_out in out:
        params.update(rank_out["params"])
    return out[0]["rows"], params


def _compare(ref, got, label, tol=TOL):
    (ref_rows, ref_p), (got_rows, got_p) = ref, got
    assert [r["step"] for r in got_rows] == [1, 2]
    for r, g in zip(ref_rows, got_rows):
        assert g["loss"] == pytest.approx(r["loss"], rel=tol, abs=tol), f"{label}: loss at step {r['step']}"
        assert r["grad_norm"] > 0.05, "clipping must be active for this test to mean something"
        assert g["grad_norm"] == pytest.approx(r["grad_norm"], rel=max(tol, 1e-5)), f"{label}: global grad norm"
    assert sorted(got_p) == sorted(ref_p), f"{label}: parameter names differ"
    worst = max(float(np.abs(got_p[k] - v).max()) for k, v in ref_p.items())
    print(f"{label}: max |param - single| = {worst:.3g}")
    assert worst < tol, f"{label}: max parameter difference {worst:.3g}"


@pytest.fixture(scope="module")
def single13(workers, tiny_data, tmp_path_factory):
    return _run(workers, tiny_data, tmp_path_factory.mktemp("s13"), "single", 1, 13, {"mode": "single"})


@pytest.fixture(scope="module")
def single14(workers, tiny_data, tmp_path_factory):
    return _run(workers, tiny_data, tmp_path_factory.mktemp("s14"), "single", 1, 14, {"mode": "single"})


@pytest.mark.parametrize("name,world,layout", [
    ("hybrid_2", 2, {"mode": "hybrid", "num_pp": 2, "num_dp": 1, "micro_batches": 3, "time_chunks": 1}),
    ("hybrid_2_chunks", 2, {"mode": "hybrid", "num_pp": 2, "num_dp": 1, "micro_batches": 1, "time_chunks": 3}),
    ("hybrid_2_shares", 2, {"mode": "hybrid", "num_pp": 2, "num_dp": 1, "micro_batches": 2, "head_shares": [3, 1]}),
    ("hybrid_2_per_unit", 2, {"mode": "hybrid", "num_pp": 2, "num_dp": 1, "micro_batches": 3, "time_chunks": 2,
                              "head_schedule": "per_unit"}),
    ("hybrid_3_per_unit", 3, {"mode": "hybrid", "num_pp": 3, "num_dp": 1, "micro_batches": 4,
                              "head_schedule": "per_unit"}),
    ("hybrid_3", 3, {"mode": "hybrid", "num_pp": 3, "num_dp": 1, "micro_batches": 2, "time_chunks": 1}),
    ("hybrid_4", 4, {"mode": "hybrid", "num_pp": 4, "num_dp": 1, "micro_batches": 2, "time_chunks": 2}),
    ("pipeline_2", 2, {"mode": "pipeline", "num_pp": 2, "num_dp": 1, "micro_batches": 2, "time_chunks": 3}),
    # the head cut along time: each stage runs every row at its block of decoder time chunks
    ("hybrid_2_time", 2, {"mode": "hybrid", "num_pp": 2, "num_dp": 1, "time_chunks": 3, "head_split": "time"}),
    ("hybrid_3_time_shares", 3, {"mode": "hybrid", "num_pp": 3, "num_dp": 1, "time_chunks": 5, "head_split": "time",
                                 "head_shares": [2, 2, 1]}),
    # the head projection's weight gradient where each rank would wait
    ("hybrid_2_head_deferred", 2, {"mode": "hybrid", "num_pp": 2, "num_dp": 1, "micro_batches": 3,
                                   "defer_head_weight_grads": True}),
    ("hybrid_3_time_head_deferred", 3, {"mode": "hybrid", "num_pp": 3, "num_dp": 1, "time_chunks": 4,
                                        "head_split": "time", "defer_head_weight_grads": True}),
    ("pipeline_2_head_deferred", 2, {"mode": "pipeline", "num_pp": 2, "num_dp": 1, "micro_batches": 2,
                                     "defer_head_weight_grads": True}),
])
def test_pipelined_layouts_match_single(workers, tiny_data, tmp_path, single13, name, world, layout):
    _compare(single13, _run(workers, tiny_data, tmp_path, name, world, 13, layout), name)


def test_the_plain_model_without_residual_layers_matches_single(workers, tiny_data, tmp_path, single13):
    """model.residual=false (the default): the pipelined layouts, units and time chunks, still single's step; and
    the residual model is another model (its step differs from the plain one's by far more than the tolerance)."""
    ref = _run(workers, tiny_data, tmp_path, "single_plain", 1, 13, {"mode": "single"}, model=PLAIN_MODEL)
    moved = max(float(np.abs(single13[1][k] - v).max()) for k, v in ref[1].items())
    assert moved > 10 * TOL, f"model.residual must change the step far more than the tolerance ({moved:.3g})"
    for name in ("hybrid_2", "pipeline_2", "hybrid_4"):
        world, micro, layout = LAYOUTS[name]
        _compare(ref, _run(workers, tiny_data, tmp_path, f"{name}_plain", world, micro, layout,
                                model=PLAIN_MODEL),
                 f"{name} plain")


@pytest.mark.parametrize("name,world,layout", [
    ("data_2", 2, {"mode": "data", "num_pp": 1, "num_dp": 2}),
    ("grid_2x2", 4, {"mode": "hybrid", "num_pp": 2, "num_dp": 2, "micro_batches": 2, "time_chunks": 2}),
    ("grid_2x2_head_deferred", 4, {"mode": "hybrid", "num_pp": 2, "num_dp": 2, "micro_batches": 2,
                                   "defer_head_weight_grads": True}),
])
def test_replicated_layouts_match_single(workers, tiny_data, tmp_path, single14, name, world, layout):
    _compare(single14, _run(workers, tiny_data, tmp_path, name, world, 7, layout), name)


def test_bf16_hybrid_matches_bf16_single(workers, tiny_data, tmp_path):
    layout = {"mode": "hybrid", "num_pp": 2, "num_dp": 1, "micro_batches": 3, "time_chunks": 2}
    ref = _run(workers, tiny_data, tmp_path, "single_bf16", 1, 13, {"mode": "single"}, bf16=True)
    _compare(ref, _run(workers, tiny_data, tmp_path, "hybrid_bf16", 2, 13, layout, bf16=True), "hybrid_2 bf16",
             tol=2e-2)


FP16_LAYOUTS = ("hybrid_2", "hybrid_4", "pipeline_2", "data_2", "grid_2x2")


def test_data_parallel_sums_start_during_the_backward_and_the_step_still_equals_singles(workers, tiny_data, tmp_path,
                                                                                      single14):
    """data_2 starts summing the head's gradients after the window's last head and each LSTM direction's after
    its last backward (trainer.parallel.interpreter: early reduce points), so that reduce_grads only drains the
    rest; the step still equals single's. parallel_layout.overlap_grad_sums=false starts none early, and neither
    do sums through shared memory (the default on a CPU: done when started, trainer.parallel.shm_sum), whose step
    equals single's too. The early points are those of gloo's sums (shared_memory_sums=false)."""
    layout = {"mode": "data", "num_pp": 1, "num_dp": 2, "shared_memory_sums": False}
    out = workers.run(2, early_reduce_points, [f"data.dir={tiny_data}", *MODEL], _ds(7, layout),
                      str(tmp_path / "early"), 2)
    points = [o["points"] for o in out]
    assert points[0] == points[1]
    assert [(op, kind) for op, kind, _ in points[0]] == [("head", ""), ("backward", "dec"), ("backward", "enc")]
    assert [n for _, _, n in points[0][1:]] == [16, 16]  # 4 layers x (w_ih, w_hh, b_ih, b_hh)
    _compare(single14, (out[0]["rows"], {k: v for o in out for k, v in o["params"].items()}), "data_2 early sums")
    late = workers.run(2, early_reduce_points, [f"data.dir={tiny_data}", *MODEL],
                       _ds(7, {**layout, "overlap_grad_sums": False}), str(tmp_path / "late"), 0)
    assert [o["points"] for o in late] == [[], []]
    shm = workers.run(2, early_reduce_points, [f"data.dir={tiny_data}", *MODEL],
                      _ds(7, {**layout, "shared_memory_sums": True}), str(tmp_path / "shm"), 2)
    assert [o["points"] for o in shm] == [[], []]
    _compare(single14, (shm[0]["rows"], {k: v for o in shm for k, v in o["params"].items()}), "data_2 shared memory")


def test_a_tied_projection_is_summed_after_the_lookups_backward(workers, tiny_data, tmp_path):
    """model.tie_embeddings: the head's projection is the target table, which the embedding's backward writes
    after the head's: its sum waits for reduce_grads, and data_2's step still equals single's (gloo's sums, which
    start early; shared_memory_sums=false)."""
    tied = [f"data.dir={tiny_data}", *MODEL, "model.tie_embeddings=true"]
    layout = {"mode": "data", "num_pp": 1, "num_dp": 2, "shared_memory_sums": False}
    ref = _run(workers, tiny_data, tmp_path, "single_tied", 1, 14, {"mode": "single"}, extra=("model.tie_embeddings=true",))
    out = workers.run(2, early_reduce_points, tied, _ds(7, layout), str(tmp_path / "early_tied"), 2)
    untied = workers.run(2, early_reduce_points, [f"data.dir={tiny_data}", *MODEL], _ds(7, layout),
                         str(tmp_path / "early_untied"), 0)
    assert out[0]["points"][0][:2] == ("head", "") and out[0]["points"][0][2] == untied[0]["points"][0][2] - 1
    _compare(ref, (out[0]["rows"], {k: v for o in out for k, v in o["params"].items()}), "data_2 tied early sums")


@pytest.fixture(scope="module")
def single14_fp16(workers, tiny_data, tmp_path_factory):
    return _run(workers, tiny_data, tmp_path_factory.mktemp("s14fp16"), "single", 1, 14, {"mode": "single"},
                fp16=True)


@pytest.mark.parametrize("name", FP16_LAYOUTS)
def test_fp16_every_layout_matches_fp16_single(workers, tiny_data, tmp_path, single14_fp16, name):
    """fp16 with DeepSpeed's dynamic loss scaling (2^16 to start): the scaled loss's gradients, handed on between
    stages and summed over replicas, then unscaled at the step, give single's fp16 step in every layout, to about
    an fp16 rounding of a weight (the weights are fp16 copies of fp32 masters)."""
    world, _, layout = LAYOUTS[name]
    _compare(single14_fp16, _run(workers, tiny_data, tmp_path, name, world, 14 // layout.get("num_dp", 1), layout,
                                 fp16=True), f"{name} fp16", tol=1e-3)


@pytest.mark.parametrize("name", ["single", "hybrid_2"])
def test_fp16_overflow_skips_the_step_holds_the_lr_and_halves_the_scale(workers, tiny_data, tmp_path, name):
    """A loss scale of 2^24 overflows fp16 gradients: as DeepSpeed's fp16 optimizer does, the step is skipped (the
    weights stay, the LR schedule does not advance) and the scale halves, until a step fits; then it trains."""
    from tests.parallel_jobs import overflow_steps

    world, _, layout = ({"single": (1, 14, {"mode": "single"})} | LAYOUTS)[name]
    ds = _ds(14, layout, fp16=True)
    ds["fp16"]["initial_scale_power"] = 24
    ds["scheduler"] = {"type": "WarmupLR", "params": {"warmup_min_lr": 0.1, "warmup_max_lr": 1.0,
                                                      "warmup_num_steps": 10, "warmup_type": "linear"}}
    out = workers.run(world, overflow_steps, [f"data.dir={tiny_data}", *MODEL, "model.dropout=0"], ds,
                      str(tmp_path / name), 6)
    steps = out[0]["steps"]
    print(name, [(s["skipped"], s["lr"], s["scale"]) for s in steps])
    assert steps[0]["skipped"] and not steps[-1]["skipped"], steps  # it overflowed, then it fit
    lr = 0.1  # WarmupLR from warmup_min_lr
    for s in steps:
        before, after = s["scale"]
        if s["skipped"]:
            assert not s["moved"] and s["lr"] == lr and after == before / 2, s
        else:
            assert s["moved"] and s["lr"] >= lr and after == before, s
        lr = s["lr"]
    assert lr > 0.1, steps  # the schedule advanced with the steps that were applied
    assert steps[-1]["skipped_steps"] == sum(s["skipped"] for s in steps)
    agreed = [[(s["skipped"], s["lr"], s["scale"]) for s in o["steps"]] for o in out]
    assert all(a == agreed[0] for a in agreed), agreed  # every rank skips the same steps


@pytest.fixture(scope="module")
def single14_gas3(workers, tiny_data, tmp_path_factory):
    return _run(workers, tiny_data, tmp_path_factory.mktemp("s14gas3"), "single", 1, 14, {"mode": "single"}, gas=3)


@pytest.mark.parametrize("name", ["data_2", "grid_2x2", "hybrid_4", "pipeline_2", "hybrid_2_per_unit"])
def test_three_accumulation_steps_match_single(workers, tiny_data, tmp_path, single14_gas3, name):
    """gradient_accumulation_steps=3 (every other test here takes 2): two micro-batches between boundaries, whose
    gradients accumulate before the replicas' sum, the head's reduction and the step; single's step in every
    kind of layout."""
    world, _, layout = LAYOUTS[name]
    got = _run(workers, tiny_data, tmp_path, name, world, 14 // layout.get("num_dp", 1), layout, gas=3)
    _compare(single14_gas3, got, f"{name} gas=3")


def test_bidirectional_bottom_layer_in_the_quickstart_layout_matches_single(workers, tiny_data, tmp_path):
    """The quickstart's model (a bidirectional bottom encoder layer, residual layers above it, concat attention,
    dropout) in its layout (hybrid_2, one pipeline unit) and in a pipelined one (3 units), against single."""
    quick = [*PLAIN_MODEL[:-2], "model.attention=concat", "model.residual=true", "model.bidirectional_bottom=true"]
    ref = _run(workers, tiny_data, tmp_path, "single_bi", 1, 13, {"mode": "single"}, dropout=0.3, model=quick)
    for units in (1, 3):
        layout = {"mode": "hybrid", "num_pp": 2, "num_dp": 1, "micro_batches": units, "time_chunks": 1}
        _compare(ref, _run(workers, tiny_data, tmp_path, f"hybrid_bi_{units}", 2, 13, layout, dropout=0.3,
                           model=quick), f"hybrid_2 bidirectional, {units} units")


LAYOUTS = {
    "hybrid_2": (2, 13, {"mode": "hybrid", "num_pp": 2, "num_dp": 1, "micro_batches": 3, "time_chunks": 2}),
    "hybrid_4": (4, 13, {"mode": "hybrid", "num_pp": 4, "num_dp": 1, "micro_batches": 2, "time_chunks": 2}),
    "pipeline_2": (2, 13, {"mode": "pipeline", "num_pp": 2, "num_dp": 1, "micro_batches": 2, "time_chunks": 3}),
    "data_2": (2, 7, {"mode": "data", "num_pp": 1, "num_dp": 2}),
    "grid_2x2": (4, 7, {"mode": "hybrid", "num_pp": 2, "num_dp": 2, "micro_batches": 2, "time_chunks": 2}),
    "hybrid_2_per_unit": (2, 14, {"mode": "hybrid", "num_pp": 2, "num_dp": 1, "micro_batches": 2,
                                  "head_schedule": "per_unit"}),
    "grid_2x2_time": (4, 7, {"mode": "hybrid", "num_pp": 2, "num_dp": 2, "time_chunks": 3, "head_split": "time"}),
}


@pytest.fixture(scope="module")
def single_dropout(workers, tiny_data, tmp_path_factory):
    return _run(workers, tiny_data, tmp_path_factory.mktemp("sd"), "single", 1, 14, {"mode": "single"}, dropout=0.3)


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_dropout_masks_are_the_same_in_every_layout(workers, tiny_data, tmp_path, single14, single_dropout, name):
    """Dropout 0.3 on (embeddings, every LSTM layer, the attentional layer): each layout draws the masks
    keyed by (seed, step, micro-batch, site, row, position), so its step still equals single's."""
    world, micro, layout = LAYOUTS[name]
    micro = 14 // (layout.get("num_dp", 1))  # the same 14-sentence global micro-batches as the reference
    moved = max(float(np.abs(single_dropout[1][k] - v).max()) for k, v in single14[1].items())
    assert moved > 10 * TOL, f"dropout must change the step far more than the tolerance ({moved:.3g})"
    _compare(single_dropout, _run(workers, tiny_data, tmp_path, name, world, micro, layout, dropout=0.3),
             f"{name} dropout 0.3")


def test_stepwise_lstm_kernel_is_the_same_model_in_every_layout(workers, tiny_data, tmp_path, single13):
    """model.lstm_kernel=stepwise (trainer/model/lstm.py): single with it equals single with torch's LSTM,
    and the time-chunked and pipelined layouts with it equal single with it, also with the weight
    gradients deferred to after each rank's last backward (with replicas: before their all-reduce)."""
    step = ("model.lstm_kernel=stepwise",)
    ref = _run(workers, tiny_data, tmp_path, "single_step", 1, 13, {"mode": "single"}, extra=step)
    _compare(single13, ref, "single stepwise vs fused", tol=1e-5)
    for name, world, layout in (
            ("hybrid_2", 2, {"mode": "hybrid", "num_pp": 2, "num_dp": 1, "micro_batches": 2, "time_chunks": 3}),
            ("hybrid_2_deferred", 2, {"mode": "hybrid", "num_pp": 2, "num_dp": 1, "micro_batches": 2,
                                      "time_chunks": 3, "defer_weight_grads": True}),
            ("pipeline_2", 2, {"mode": "pipeline", "num_pp": 2, "num_dp": 1, "micro_batches": 3, "time_chunks": 2})):
        _compare(ref, _run(workers, tiny_data, tmp_path, f"{name}_step", world, 13, layout, extra=step),
                 f"{name} stepwise")
    ref14 = _run(workers, tiny_data, tmp_path, "single_step14", 1, 14, {"mode": "single"}, extra=step)
    grid = {"mode": "hybrid", "num_pp": 2, "num_dp": 2, "micro_batches": 1, "time_chunks": 2, "defer_weight_grads": True}
    _compare(ref14, _run(workers, tiny_data, tmp_path, "grid_2x2_deferred", 4, 7, grid, extra=step),
             "grid_2x2_deferred stepwise")


@pytest.mark.parametrize("kernel,split", [("fused", "sentences"), ("stepwise", "sentences"), ("stepwise", "time")])
def test_more_time_chunks_than_steps_match_single(workers, tiny_data, tmp_path, single13, kernel, split):
    """Empty time chunks (a batch narrower than time_chunks) pass the state on, with either LSTM kernel;
    with the head cut along time the last stage's block is empty, and its head runs on no token."""
    layout = {"mode": "hybrid", "num_pp": 2, "num_dp": 1, "micro_batches": 1, "time_chunks": 48, "head_split": split}
    got = _run(workers, tiny_data, tmp_path, f"hybrid_48_{kernel}_{split}", 2, 13, layout,
               extra=(f"model.lstm_kernel={kernel}",))
    _compare(single13, got, f"hybrid_2, 48 time chunks, {kernel}, head split by {split}", tol=1e-5)


def test_the_shipped_modes_agree_with_single_step_by_step_over_adam_steps(workers, tiny_data, tmp_path):
    """ds_configs/{single,data_2,pipeline_2,hybrid_2}.json as shipped (Adam, warm-up then decay, clipping 1.0;
    their layouts) in fp32 with dropout 0, the same global micro-batches: over 8 optimizer steps every mode's
    loss stays within summation-order tolerance of single's at every step (docs/BENCHMARKS.md 3)."""
    steps, losses = 8, {}
    for name in ("single", "data_2", "pipeline_2", "hybrid_2"):
        ds = json.loads((REPO / "ds_configs" / f"{name}.json").read_text())
        layout = ds["parallel_layout"]
        ds.update(train_micro_batch_size_per_gpu=14 // layout["num_dp"], bf16={"enabled": False})
        ds["scheduler"]["params"].update(warmup_num_steps=3)  # its length: train.max_steps
        overrides = [f"data.dir={tiny_data}", *MODEL, f"train.max_steps={steps}"]
        out = workers.run(layout["num_pp"] * layout["num_dp"], train_steps, overrides, ds, str(tmp_path / name), steps)
        losses[name] = [r["loss"] for r in out[0]["rows"]]
    # Adam moves the model: the loss falls by far more than the tolerance over the steps
    assert len(losses["single"]) == steps and losses["single"][-1] < losses["single"][0] - 100 * 1e-5, losses["single"]
    for name in ("data_2", "pipeline_2", "hybrid_2"):
        worst = max(abs(a - b) for a, b in zip(losses[name], losses["single"], strict=True))
        print(f"{name}: max |loss - single| over {steps} Adam steps = {worst:.3g}")
        assert worst < 1e-5, f"{name}: {losses[name]} vs single {losses['single']}"


def _cli_run(tmp_path, tiny_data, name, ranks, micro, layout):
    """A run of launch/train.py (through the deepspeed launcher when ranks > 1): its metrics rows and the
    parameters of its step-2 checkpoint files as '<file>:<key>' -> float32 array."""
    import torch

    ds = tmp_path / f"{name}.json"
    ds.write_text(json.dumps(_ds(micro, layout)))
    run_dir = tmp_path / name
    args = ["launch/train.py", "--deepspeed_config", ds, f"data.dir={tiny_data}", f"run.dir={run_dir}", *MODEL,
            "model.bidirectional_bottom=false", "train.max_steps=2", "train.eval_every=2", "train.log_every=1",
            "decode.dev_max_sentences=8", "logging.wandb_mode=disabled", "logging.progress=false"]
    run_cli([sys.executable, *args] if ranks == 1 else deepspeed_cmd(ranks, *args), timeout=240)
    files = sorted((run_dir / "checkpoints" / "step_00000002").glob("*-model_states.pt"))
    return read_metrics(run_dir), {f"{f.name}:{k}": v.float().numpy() for f in files
                                   for k, v in torch.load(f, weights_only=True).items()}


@pytest.mark.slow
def test_a_cli_run_saves_the_same_checkpoint_files_as_single(tiny_data, tmp_path):
    """Through the real CLI and launcher (what the harness stands in for): the 2x2 grid (2 stages x 2
    replicas, 2 units, 2 time chunks) logs single's losses and gradient norms in metrics.jsonl, and its
    step-2 checkpoint is single's files, keyed by global layer, with the same parameters."""
    ref = _cli_run(tmp_path, tiny_data, "single", 1, 14, {"mode": "single"})
    grid = {"mode": "hybrid", "num_pp": 2, "num_dp": 2, "micro_batches": 2, "time_chunks": 2}
    _compare(ref, _cli_run(tmp_path, tiny_data, "grid_2x2", 4, 7, grid), "grid_2x2 through the CLI")


def test_bf16_auto_trains_every_rank_in_rank_0s_choice(workers, tiny_data, tmp_path):
    """bf16.enabled "auto" in a 2-rank hybrid whose ranks measure opposite answers (rank 0 bf16 the faster, rank 1
    the slower): both train in rank 0's choice, and the run says which and why; then the other way round."""
    layout = {"mode": "hybrid", "num_pp": 2, "num_dp": 1, "micro_batches": 2, "time_chunks": 1}
    ds = {**_ds(8, layout), "bf16": {"enabled": "auto"}}
    for ratios, precision in (([0.5, 40.0], "bf16"), ([40.0, 0.5], "fp32")):
        out = workers.run(2, auto_precision, [f"data.dir={tiny_data}", *MODEL], ds, str(tmp_path / precision), ratios)
        assert [r["precision"] for r in out] == [precision, precision]
        assert out[0]["lines"] == [f"precision: bf16.enabled=auto -> {precision}: a bf16 GEMM at width 16 takes "
                                   f"{ratios[0]:.2f}x fp32's time on this CPU (set by the test)"]
        assert all(math.isfinite(r["rows"][0]["loss"]) for r in out)
        assert 0 < out[0]["rows"][0]["grad_norm"] < math.inf  # it trained: a gradient, not only a loss
