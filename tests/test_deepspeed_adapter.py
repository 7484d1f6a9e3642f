"""One test per DeepSpeed touch point (trainer/parallel/deepspeed_adapter.py): a DeepSpeed upgrade
that moves one of them fails here by name. The touch points run on a real 2x2 grid (and a bf16
hybrid_2) of the in-process harness."""
from __future__ import annotations

import json

import pytest

from tests.conftest import REPO
from tests.parallel_jobs import adapter_touch_points

MODEL = ["model.layers=2", "model.emb_dim=16", "model.hidden=16", "model.dropout=0", "data.min_batch_sentences=8"]


def _ds(layout: dict, bf16: bool, fp16: bool = False) -> dict:
    ds = json.loads((REPO / "ds_configs" / "single.json").read_text())
    ds.update(train_micro_batch_size_per_gpu=8, parallel_layout=layout, bf16={"enabled": bf16},
              fp16={"enabled": fp16})
    ds["scheduler"]["params"]["total_num_steps"] = 100
    return ds


@pytest.fixture(scope="module")
def grid(workers, tiny_data, tmp_path_factory):
    layout = {"mode": "hybrid", "num_pp": 2, "num_dp": 2, "micro_batches": 2}
    return workers.run(4, adapter_touch_points, [f"data.dir={tiny_data}", *MODEL], _ds(layout, False),
                       str(tmp_path_factory.mktemp("grid")))


@pytest.fixture(scope="module")
def bf16_hybrid(workers, tiny_data, tmp_path_factory):
    layout = {"mode": "hybrid", "num_pp": 2, "num_dp": 1}
    return workers.run(2, adapter_touch_points, [f"data.dir={tiny_data}", *MODEL], _ds(layout, True),
                       str(tmp_path_factory.mktemp("bf16")))


@pytest.fixture(scope="module")
def fp16_hybrid(workers, tiny_data, tmp_path_factory):
    layout = {"mode": "hybrid", "num_pp": 2, "num_dp": 1}
    return workers.run(2, adapter_touch_points, [f"data.dir={tiny_data}", *MODEL], _ds(layout, False, fp16=True),
                       str(tmp_path_factory.mktemp("fp16")))


def test_version_is_checked(monkeypatch):
    import deepspeed

    from trainer.parallel import deepspeed_adapter as dsa

    assert dsa.check_version().startswith(dsa.WRITTEN_FOR + ".")
    monkeypatch.setattr(deepspeed, "__version__", "0.99.1")
    with pytest.raises(dsa.DeepSpeedVersionError, match="0.99.1.*written for 0.19"):
        dsa.check_version()


def test_the_shm_op_is_neither_built_nor_loaded(grid):
    """DeepSpeed's CPU comm op (a g++ build on first use, a lock in a cache shared by every environment,
    66 MB of /dev/shm per rank) is not needed for training: init_comm keeps DeepSpeed from loading it."""
    assert all(r["shm_op"] == "None" for r in grid), [r["shm_op"] for r in grid]
    assert all(r["shm_left"] == [] for r in grid)


def test_grid_groups_are_the_layouts(grid):
    for r in grid:
        assert r["grid_members"] == {"pipe": r["layout_members"]["pipe"], "data": r["layout_members"]["data"]}
        # rank = stage * num_dp + replica; each group's handle reduces over exactly its members
        assert r["rank"] == r["stage"] * 2 + r["replica"]
        assert r["sum_over_pipe"] == sum(m + 1 for m in r["layout_members"]["pipe"])
        assert r["sum_over_data"] == sum(m + 1 for m in r["layout_members"]["data"])
        assert r["sum_over_world"] == 1 + 2 + 3 + 4


def test_stages_hold_their_slice(grid):
    for r in grid:
        assert r["stage_id"] == r["stage"]
        if r["stage"] == 0:  # type:EncoderDecoderLayer partitioning: embeddings go with the first pair
            assert (r["local_start"], r["local_layers"]) == (0, ["Embeddings", "EncoderDecoderLayer"])
        else:
            assert (r["local_start"], r["local_layers"]) == (2, ["EncoderDecoderLayer"])


def test_engine_uses_the_grid_and_leaves_reductions_to_the_schedule(grid):
    for r in grid:
        assert r["mpu_is_grid"] and r["backward_allreduce"] is False


def test_recorded_grad_norm_is_global(grid):
    norms = {round(r["grad_norm"], 6) for r in grid}
    assert len(norms) == 1 and next(iter(norms)) > 0  # every rank reports the same global norm
    # the first step of a linear warm-up from warmup_min_lr=0 runs at lr 0 (DeepSpeed counts from 0)
    assert all(r["skipped_after_good_step"] == 0 and r["lr"] == 0.0 for r in grid)


def test_counters_round_trip(grid):
    for r in grid:
        assert r["counters"]["global_steps"] == 41 and set(r["counters"]) == {"global_steps", "global_samples",
                                                                              "skipped_steps"}
        assert r["micro_steps"] == 41 * r["accumulation_steps"]


def test_fp32_optimizer_state_is_keyed_by_the_parameters(grid):
    for r in grid:
        assert r["masters"] == 0 and r["masters_fp32_match"] is None  # fp32: the parameters are the masters
        assert r["state_keyed_by_master"] and r["state_keys"] == ["exp_avg", "exp_avg_sq"]
        assert r["scheduler_state"]


def test_bf16_masters_are_fp32_copies(bf16_hybrid):
    for r in bf16_hybrid:
        assert r["bf16"] and r["masters"] == r["owned"] > 0 and r["masters_fp32_match"]
        assert r["state_keyed_by_master"] and r["state_keys"] == ["exp_avg", "exp_avg_sq"]
        assert isinstance(r["scaler"], dict)


def test_fp16_runs_on_the_cpu_accelerator_with_fp32_masters_and_a_dynamic_loss_scale(fp16_hybrid):
    """DeepSpeed's CPU accelerator says no to fp16 on a CPU without oneDNN fp16 kernels; the adapter's answer is
    yes (torch computes it): FP16_UnfusedOptimizer's masters and its loss scale (2^16 to start) are what we use."""
    for r in fp16_hybrid:
        assert r["fp16"] and not r["bf16"] and r["masters"] == r["owned"] > 0 and r["masters_fp32_match"]
        assert r["loss_scale"] == 2.0 ** 16 and r["scaler"]["cur_scale"] == 2.0 ** 16 and r["grad_norm"] > 0
        assert r["state_keyed_by_master"] and r["state_keys"] == ["exp_avg", "exp_avg_sq"]


def test_flat_partitioned_optimizers_are_refused(grid):
    assert all(r["hp_mapping_refused"] for r in grid)


def test_fp32_step_with_a_non_finite_gradient_is_skipped(grid):
    for r in grid:
        assert not r["nan_norm_finite"] and r["nan_step_skipped"] and r["nan_params_unchanged"]


@pytest.mark.parametrize("precision", ["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("clip", [1.0, 1e-3])  # clipping inactive and active
def test_lean_step_equals_deepspeeds_step(workers, tiny_data, tmp_path, clip, precision):
    """The adapter's one-sync step (the norm on the device, read once) against DeepSpeed's own step on
    the same gradients: the same norm and the same weights and Adam state after it, to the float32
    summation order of the norm (fp16: gradients carrying the loss scale, which both steps divide out)."""
    from tests.parallel_jobs import lean_step_matches_deepspeed

    layout = {"mode": "hybrid", "num_pp": 2, "num_dp": 1}
    bf16 = precision != "fp32"  # a mixed-precision optimizer (fp32 masters)
    ds = dict(_ds(layout, precision == "bf16", precision == "fp16"), gradient_clipping=clip)
    ds.pop("scheduler")  # a warm-up from lr 0 would not move the weights at the first step
    for r in workers.run(2, lean_step_matches_deepspeed, [f"data.dir={tiny_data}", *MODEL], ds,
                         str(tmp_path / "lean")):
        assert r["moved"] > 0, "the step must change the weights for the comparison to mean something"
        if bf16:
            assert r["norm"][1] == pytest.approx(r["norm"][0], rel=1e-6), r
        assert r["max_diff"] <= 1e-6, r


@pytest.mark.parametrize("clip,precision", [(1e-3, "bf16"), (1.0, "fp32")])  # clipping active and inactive
def test_lean_zero_step_equals_deepspeeds_zero_step(workers, tiny_data, tmp_path, clip, precision):
    """ZeRO stage 1 on the 2x2 grid (trainer/parallel/deepspeed_zero.py): the adapter reads ZeRO's layout (each
    parameter's elements are held by exactly one replica's partition; the gradient hooks are gone), and its one-sync
    step equals DeepSpeedZeroOptimizer.step on the same gradients: the same norm, master partitions, weights and
    Adam state, to the float32 summation order of the norm."""
    from tests.parallel_jobs import lean_zero_step_matches_deepspeed

    layout = {"mode": "hybrid", "num_pp": 2, "num_dp": 2, "micro_batches": 2}
    ds = dict(_ds(layout, precision == "bf16"), gradient_clipping=clip, zero_optimization={"stage": 1})
    ds.pop("scheduler")  # a warm-up from lr 0 would not move the weights at the first step
    out = workers.run(4, lean_zero_step_matches_deepspeed, [f"data.dir={tiny_data}", *MODEL], ds, str(tmp_path / "z"))
    for stage in (0, 1):  # ranks stage * 2 + replica
        replicas = [out[stage * 2 + r]["layout"] for r in (0, 1)]
        assert all(r["hooks"] == 0 for r in replicas) and replicas[0]["masters"] == replicas[1]["masters"]
        numel = replicas[0]["numel"]
        held = {n: sum(r["held"].get(n, 0) for r in replicas) for n in numel}
        assert held == numel and all(r["held"] for r in replicas), (held, numel)  # each element once; both hold some
    for r in out:
        assert r["moved"] > 0, "the step must change the weights for the comparison to mean something"
        assert r["norm"][1] == pytest.approx(r["norm"][0], rel=1e-6), r["norm"]
        assert r["max_diff"] <= 1e-6, r["max_diff"]


def test_the_keys_deepspeed_reads_are_recorded_from_its_own_reader():
    """unread_keys runs DeepSpeedConfig's reader on the JSON: what it looks up is what it reads. The few keys read
    elsewhere (READ_ELSEWHERE) must still be read where the adapter says, and the recorder must see every way the
    reader looks (get, [], `in`, `in .keys()`, iteration)."""
    import inspect

    import deepspeed
    from deepspeed.runtime.config import DeepSpeedConfig

    from trainer.parallel import deepspeed_adapter as dsa

    elsewhere = inspect.getsource(deepspeed.initialize) + inspect.getsource(DeepSpeedConfig)
    for key in dsa.READ_ELSEWHERE:
        assert f'"{key}"' in elsewhere or f"'{key}'" in elsewhere or key.upper() in elsewhere, key
    ds = json.loads((REPO / "ds_configs" / "single.json").read_text())
    ds.pop("parallel_layout")
    assert dsa.unread_keys(ds) == []
    assert [u.key for u in dsa.unread_keys({**ds, "gradient_clipping_": 1.0})] == ["gradient_clipping_"]
    log: dict = {}
    section = dsa._Reading({"a": {"b": 1}, "c": 2, "d": 3, "e": 4}, (), log)
    section.get("a")["b"], "c" in section.keys(), section["d"]
    assert log[()] == {"a", "c", "d"} and log[("a",)] == {"b"}
    list(section)
    assert log[()] == {"a", "c", "d", "e"}  # iterated: read whole


_NO_DYNAMO = """
import json, sys
import torch
from trainer.model.meta import shapes_only
from trainer.model.seq2seq import build_model
from trainer.config import load_config
from trainer.parallel import deepspeed_adapter as dsa

STOCK = {name: getattr(torch.optim, name).step for name in ("Adam", "AdamW")}  # torch's own, kept before the change


def three_steps(name, step=None):
    p = torch.nn.Parameter(torch.tensor([1.0, -1.0, 0.5]))
    opt = getattr(torch.optim, name)([p], lr=0.1)
    for k in range(3):
        p.grad = torch.tensor([1.0, -2.0, 3.0]) * (k + 1)
        opt.step() if step is None else step(opt)
        opt.zero_grad()
    opt.load_state_dict(opt.state_dict())
    return p.tolist()


dsa.optimizers_without_dynamo()
out = {name: three_steps(name) for name in STOCK}
with shapes_only():
    model = build_model(load_config(None, ["model.hidden=16", "model.emb_dim=8"]).model, 40, 50)
out["meta"] = all(t.is_meta for t in model.parameters())
out["dynamo"] = "torch._dynamo" in sys.modules
out["stock"] = {name: three_steps(name, step) for name, step in STOCK.items()}  # imports torch._dynamo
print(json.dumps(out))
"""


def test_an_optimizer_and_a_shapes_only_model_leave_torch_dynamo_unimported():
    """torch.optim's wrappers and the meta kernel of `normal_` import torch._dynamo (1.1 s of a training process's
    start) for torch.compile, which never traces them here: `optimizers_without_dynamo` and `shapes_only` go
    around them, with the arithmetic of torch's own step."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", _NO_DYNAMO], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["dynamo"] is False and out["meta"] is True
    for name in ("Adam", "AdamW"):
        assert out[name] == out["stock"][name] and out[name] != [1.0, -1.0, 0.5], name  # equal, and moved


_MUON = """
import json, sys
import torch
from deepspeed.runtime.zero import utils
from trainer.parallel import deepspeed_adapter as dsa

utils.dist.get_rank = lambda: 1  # (the check logs on rank 0 only; no process group here)
dsa.optimizers_without_dynamo()  # (as initialize does: torch.optim's own wrappers import it too)
adam = torch.optim.Adam([torch.nn.Parameter(torch.zeros(2))])
with dsa._muon_left_out({"optimizer": {"type": "Adam"}, "zero_optimization": {"stage": 1}}):
    supported = utils.is_zero_supported_optimizer(adam)
out = {"supported": supported, "dynamo": "torch._dynamo" in sys.modules, "mark_left": dsa.MUON_MODULE in sys.modules}
with dsa._muon_left_out({"optimizer": {"type": "Muon"}}):  # asked for: imported as DeepSpeed would
    from deepspeed.runtime.zero.muon.muon_optimizer import MuonWithAuxAdam  # noqa: F401
out["muon_after"] = "torch._dynamo" in sys.modules
print(json.dumps(out))
"""


def test_zeros_support_check_leaves_deepspeeds_muon_and_torch_dynamo_unimported_unless_muon_is_asked_for():
    """ZeRO's `is_zero_supported_optimizer` imported DeepSpeed's Muon module, which compiles its kernels at import
    (torch._dynamo, 1.1 s of every ZeRO run's start); while DeepSpeed builds another optimizer it is left out."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", _MUON], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out == {"supported": True, "dynamo": False, "mark_left": False, "muon_after": True}
