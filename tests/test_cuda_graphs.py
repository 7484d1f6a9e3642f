"""train.cuda_graphs: the step with the decoder stack and the head replayed from graphs equals the eager step (loss,
grad norm and every parameter after SGD at lr 1, i.e. every gradient) in one process and in a 2-rank hybrid with
several pipeline units and time chunks in flight; the cache's keys, slots, cap, recapture and auto's proof. All on
the CPU stand-in backend (trainer.model.graphs.RecordingBackend: everything but the kernels' replay); the tests
of real CUDA graphs are skipped without CUDA, and none has run on a GPU yet."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.conftest import REPO, launch_main
from tests.parallel_jobs import graphed_steps, train_steps
from tests.test_parallel_parity import MODEL, _ds
from trainer.model.dropout import DropoutKeys, GivenMasks, KeyedDropout
from trainer.model.graphs import GraphCache, RecordingBackend

TOL = 2e-6
HYBRID = {"mode": "hybrid", "num_pp": 2, "num_dp": 1, "micro_batches": 3, "time_chunks": 2}


def _job(workers, tiny_data, tmp_path, name, world, layout, graphs, dropout=0.2, bf16=False, **kw):
    overrides = [f"data.dir={tiny_data}", *MODEL, f"model.dropout={dropout}"]
    ds = _ds(13, layout, bf16=bf16)
    if graphs:
        out = workers.run(world, graphed_steps, overrides, ds, str(tmp_path / name), 2, kw.get("prove", False),
                          kw.get("skew", 0.0))
    else:
        out = workers.run(world, train_steps, overrides, ds, str(tmp_path / name), 2)
    params = {}
    for rank_out in out:
        params.update(rank_out["params"])
    return out, params


def _same_step(ref, got, label, tol=TOL):
    (ref_out, ref_p), (got_out, got_p) = ref, got
    for r, g in zip(ref_out[0]["rows"], got_out[0]["rows"]):
        assert g["loss"] == pytest.approx(r["loss"], rel=tol, abs=tol), f"{label}: loss at step {r['step']}"
        assert g["grad_norm"] == pytest.approx(r["grad_norm"], rel=max(tol, 1e-5)), f"{label}: grad norm"
    assert sorted(got_p) == sorted(ref_p)
    worst = max(float(np.abs(got_p[k] - v).max()) for k, v in ref_p.items())
    assert worst < tol, f"{label}: max parameter difference {worst:.3g}"


@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16"])
def test_the_replayed_step_equals_the_eager_step_in_one_process(workers, tiny_data, tmp_path, bf16):
    eager = _job(workers, tiny_data, tmp_path, "eager", 1, {"mode": "single"}, False, bf16=bf16)
    replayed = _job(workers, tiny_data, tmp_path, "graphs", 1, {"mode": "single"}, True, bf16=bf16)
    _same_step(eager, replayed, f"single, dropout 0.2, {'bf16' if bf16 else 'fp32'}")  # the same operations: equal
    stats = replayed[0][0]["stats"]
    assert stats["captured"] >= 2 and stats["replays"] >= 4 and stats["eager"] == 0  # decoder and head, 2 steps


def test_the_replayed_step_equals_the_eager_step_in_a_2_rank_hybrid(workers, tiny_data, tmp_path):
    """Three pipeline units and two time chunks: several decoder calls of one shape in flight at once."""
    eager = _job(workers, tiny_data, tmp_path, "eager", 2, HYBRID, False)
    replayed = _job(workers, tiny_data, tmp_path, "graphs", 2, HYBRID, True)
    _same_step(eager, replayed, "hybrid_2, dropout 0.2")
    assert all(r["stats"]["replays"] > 0 for r in replayed[0])
    assert max(r["stats"]["captured"] for r in replayed[0]) > 2  # more than one slot for a shape in flight
    columns = replayed[0][0]["columns"]  # a logged row's: the sum over the ranks, and each rank's
    assert columns["cuda_graphs"] == sum(r["stats"]["held"] for r in replayed[0]) and columns["cuda_graphs_mib"] == 0
    assert columns["rank1/cuda_graphs"] == replayed[0][1]["stats"]["held"] > 0
    end = replayed[0][0]["end_lines"]  # rank 0 logs every rank's line
    assert [line.split(":")[0] for line in end] == ["rank 0", "rank 1"] and all("replays" in line for line in end)
    assert replayed[0][1]["end_lines"] == []


def test_auto_proves_each_shape_and_falls_back_for_good_on_a_mismatch(workers, tiny_data, tmp_path):
    eager = _job(workers, tiny_data, tmp_path, "eager", 1, {"mode": "single"}, False)
    proved = _job(workers, tiny_data, tmp_path, "proved", 1, {"mode": "single"}, True, prove=True)
    _same_step(eager, proved, "auto")
    assert proved[0][0]["stats"]["proved"] >= 2 and proved[0][0]["stats"]["fallbacks"] == 0
    skewed = _job(workers, tiny_data, tmp_path, "skewed", 1, {"mode": "single"}, True, prove=True, skew=0.5)
    _same_step(eager, skewed, "auto after its fallback")  # the mismatching call itself ran eagerly
    out = skewed[0][0]
    assert out["stats"]["fallbacks"] == 1 and out["stats"]["eager"] > 0 and out["stats"]["replays"] == 0
    assert out["stats"]["held"] == 0  # the failed proof's graphs let go
    assert len(out["lines"]) == 1 and "eager from now on" in out["lines"][0]


# ---- the cache, without a model ----
def _linear_call(cache, lin, x, mask):
    def fn(x, mask):
        y = lin(x) * mask
        return y, y.detach().sum()
    return cache.call("lin", fn, (x, mask), (True, False), list(lin.parameters()))


def _eager_grads(lin, x, mask, g):
    x = x.detach().requires_grad_(True)
    lin.zero_grad()
    y = lin(x) * mask
    (y * g).sum().backward()
    return y.detach(), x.grad, lin.weight.grad.clone(), lin.bias.grad.clone()


def test_a_shape_is_captured_once_and_replayed_and_a_new_shape_is_captured_again():
    torch.manual_seed(0)
    lin, cache = torch.nn.Linear(4, 3), GraphCache(RecordingBackend())
    for rows in (2, 2, 2, 5, 5):
        x, mask = torch.randn(rows, 4, requires_grad=True), torch.rand(rows, 3)
        g = torch.randn(rows, 3)
        ref = _eager_grads(lin, x, mask, g)
        lin.zero_grad()
        y, total = _linear_call(cache, lin, x, mask)
        (y * g).sum().backward()
        for got, want in zip((y, x.grad, lin.weight.grad, lin.bias.grad), ref):
            torch.testing.assert_close(got, want)
        assert float(total) == pytest.approx(float(ref[0].sum()), rel=1e-6)
    assert (cache.stats.captured, cache.stats.replays) == (2, 5)


def test_two_calls_in_flight_take_two_slots_and_neither_overwrites_the_other():
    """Two micro-batches of one shape forwarded before either's backward (a pipeline's units)."""
    torch.manual_seed(1)
    lin, cache = torch.nn.Linear(4, 3), GraphCache(RecordingBackend())
    xs = [torch.randn(2, 4, requires_grad=True) for _ in range(2)]
    mask, gs = torch.ones(2, 3), [torch.randn(2, 3) for _ in range(2)]
    refs = [_eager_grads(lin, x, mask, g) for x, g in zip(xs, gs)]
    lin.zero_grad()
    outs = [_linear_call(cache, lin, x, mask)[0] for x in xs]
    for y, ref in zip(outs, refs):
        torch.testing.assert_close(y.detach(), ref[0])  # the first output still holds the first call's values
    for y, g in reversed(list(zip(outs, gs))):
        (y * g).sum().backward()
    for x, ref in zip(xs, refs):
        torch.testing.assert_close(x.grad, ref[1])
    torch.testing.assert_close(lin.weight.grad, refs[0][2] + refs[1][2])
    assert cache.stats.captured == 2
    cache.end_step()
    _linear_call(cache, lin, xs[0], mask)  # a free slot again: no new capture
    assert cache.stats.captured == 2


def test_beyond_the_cap_new_shapes_run_eagerly_said_once():
    lin, said = torch.nn.Linear(4, 3), []
    cache = GraphCache(RecordingBackend(), cap=2, say=said.append)
    for rows in (1, 2, 3, 4):
        x, mask = torch.randn(rows, 4, requires_grad=True), torch.ones(rows, 3)
        y, _ = _linear_call(cache, lin, x, mask)
        y.sum().backward()
        torch.testing.assert_close(y.detach(), lin(x).detach())
    assert cache.stats.captured == 2 and cache.stats.eager == 2 and len(said) == 1 and "cap" in said[0]


def test_a_parameter_on_new_storage_is_recaptured():
    torch.manual_seed(2)
    lin, cache = torch.nn.Linear(4, 3), GraphCache(RecordingBackend())
    x, mask = torch.randn(2, 4, requires_grad=True), torch.ones(2, 3)
    _linear_call(cache, lin, x, mask)[0].sum().backward()
    lin.weight.data = lin.weight.data.clone() * 2  # what a loaded checkpoint or a reshard does
    y, _ = _linear_call(cache, lin, x, mask)
    torch.testing.assert_close(y.detach(), lin(x).detach())
    assert cache.stats.recaptures == 1 and cache.stats.captured == 2 and cache.stats.held == 1


def test_given_masks_are_the_masks_keyed_dropout_draws():
    keys = DropoutKeys((1, 2, 0), 6, {"src": 5, "tgt": 7})
    drop = KeyedDropout(0.3, site=9, side="tgt").train()
    x = torch.randn(3, 4, 8)
    at = keys.at(2, 3)
    given = GivenMasks(GivenMasks.draw(at, [drop], 3, 4, 8, x.dtype))
    torch.testing.assert_close(drop(x, given), drop(x, at))
    with pytest.raises(ValueError, match="site 9"):
        given.mask(9, "tgt", 0.3, 3, 5, 8, x.dtype)


def test_without_a_cache_the_runner_adds_no_columns():
    from types import SimpleNamespace

    from trainer.parallel.interpreter import StepRunner

    assert StepRunner.graph_counts(SimpleNamespace(graphs=None)) == {}  # train.cuda_graphs=off changes nothing
    cache = GraphCache(RecordingBackend())
    assert StepRunner.graph_counts(SimpleNamespace(graphs=cache)) == {"cuda_graphs": 0, "cuda_graphs_mib": 0.0}


# ---- the key ----
def test_the_key_is_checked_and_on_is_refused_without_cuda(capsys):
    from trainer.config import ConfigError, load_config
    from trainer.training import tuning

    with pytest.raises(ConfigError, match="train.cuda_graphs"):
        load_config(None, ["train.cuda_graphs=maybe"])
    assert load_config(None, []).train.cuda_graphs == "off"
    with pytest.raises(tuning.GraphsRefused, match="needs CUDA"):
        tuning.check_cuda_graphs("on", "cpu")
    tuning.check_cuda_graphs("auto", "cpu")
    assert tuning.graph_cache("auto", torch.device("cpu"), 0) is None  # auto without CUDA: the eager step
    assert tuning.graph_cache("off", torch.device("cuda"), 0) is None
    code, out, err = launch_main("train", ["--deepspeed_config", REPO / "ds_configs" / "single.json", "--dry-run",
                                           "train.cuda_graphs=on"], capsys)
    if torch.cuda.is_available():
        assert code == 0
    else:
        assert code != 0 and "train.cuda_graphs=on needs CUDA" in err and len(err.strip().splitlines()) == 1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need CUDA")
def test_real_cuda_graphs_replay_the_eager_call():
    from trainer.model.graphs import CudaBackend

    torch.manual_seed(3)
    lin = torch.nn.Linear(4, 3).cuda()
    cache = GraphCache(CudaBackend(), prove=True)
    for _ in range(3):
        x, mask = torch.randn(2, 4, device="cuda", requires_grad=True), torch.rand(2, 3, device="cuda")
        g = torch.randn(2, 3, device="cuda")
        ref = _eager_grads(lin, x, mask, g)
        lin.zero_grad()
        y, _ = _linear_call(cache, lin, x, mask)
        (y * g).sum().backward()
        for got, want in zip((y, x.grad, lin.weight.grad), ref):
            torch.testing.assert_close(got.detach(), want)
    assert cache.stats.fallbacks == 0 and cache.stats.replays == 3 and cache.stats.held_bytes > 0
