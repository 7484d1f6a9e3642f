"""What a DeepSpeed user types (issue 31, part B): each key works in the layouts where it makes sense (the parity,
resume and sync tests say so: tests/test_parallel_parity.py, tests/test_zero.py, tests/test_device_syncs.py) or is
refused before anything is built, in one line that names the key and says what to use instead."""
from __future__ import annotations

import json

import pytest

from tests.conftest import REPO
from trainer.config import load_config
from trainer.ds_config import DSConfigError
from trainer.parallel.deepspeed_json import load_ds_config


def _ds(tmp_path, change=None, base="hybrid_2", name="ds.json") -> str:
    ds = json.loads((REPO / "ds_configs" / f"{base}.json").read_text())
    if change:
        change(ds)
    path = tmp_path / name
    path.write_text(json.dumps(ds))
    return str(path)


def _one_line(err) -> str:
    text = str(err.value)
    assert "\n" not in text and "Traceback" not in text, text
    return text


# ---- fp16 -----------------------------------------------------------------------------------------------------

def _fp16(**keys):
    return lambda d: (d.__setitem__("bf16", {"enabled": False}), d.__setitem__("fp16", {"enabled": True, **keys}))


def test_fp16_with_dynamic_loss_scaling_is_accepted(tmp_path):
    ds = load_ds_config(_ds(tmp_path, _fp16(loss_scale=0, initial_scale_power=12, loss_scale_window=500,
                                            hysteresis=2, min_loss_scale=1)), 100)
    assert ds["fp16"]["enabled"] and not ds["bf16"]["enabled"]


@pytest.mark.parametrize("change,expected", [
    (lambda d: (d.__setitem__("bf16", {"enabled": True}), d.__setitem__("fp16", {"enabled": True})),
     r"fp16.enabled and bf16.enabled are both true: choose one"),
    (lambda d: d.__setitem__("fp16", {"enabled": True}), r"fp16.enabled and bf16.enabled are both set: choose one"),
    (_fp16(loss_scale=-1), r"fp16.loss_scale=-1: must be a finite number >= 0 \(0: dynamic loss scaling\)"),
    (_fp16(initial_scale_power=99), r"fp16.initial_scale_power=99: must be an integer in 0..64"),
    (_fp16(loss_scale_window=0), r"fp16.loss_scale_window=0: must be an integer >= 1"),
    (_fp16(auto_cast=True), r"fp16.auto_cast=true: .* drop auto_cast"),
])
def test_a_bad_fp16_section_names_the_key(tmp_path, change, expected):
    with pytest.raises(DSConfigError, match=expected) as err:
        load_ds_config(_ds(tmp_path, change), 100)
    _one_line(err)


def test_the_planner_prices_fp16_as_bf16(tiny_data, tmp_path):
    from trainer.planner.plan import workload

    cfg = load_config(None, [f"data.dir={tiny_data}", "model.layers=2"])
    ds = load_ds_config(_ds(tmp_path, _fp16()), 100)
    assert workload(cfg, ds, steps=1).precision == "bf16"


# ---- gradient_accumulation_steps and train_batch_size -----------------------------------------------------------

@pytest.mark.parametrize("base,world,micro,gas,num_dp", [("single", 1, 64, 4, 1), ("data_2", 2, 32, 3, 2),
                                                          ("hybrid_2", 2, 64, 2, 1), ("grid_2x4", 8, 16, 2, 4)])
def test_train_batch_size_is_micro_times_accumulation_times_replicas(tmp_path, base, world, micro, gas, num_dp):
    """Stated as DeepSpeed derives it, train_batch_size is accepted (and the window holds gas micro-batches);
    any other number is refused in one line naming the three numbers and their product."""
    from trainer.training.build import plan

    cfg = load_config(None, ["model.layers=4"])
    batch = micro * gas * num_dp

    def stated(n):
        return lambda d: d.update(gradient_accumulation_steps=gas, train_batch_size=n)

    ds, spec = plan(cfg, _ds(tmp_path, stated(batch), base=base), world=world)
    assert (ds["train_batch_size"], spec.num_dp, ds["gradient_accumulation_steps"]) == (batch, num_dp, gas)
    with pytest.raises(DSConfigError, match=rf"train_batch_size={batch + num_dp} != train_micro_batch_size_per_gpu="
                                            rf"{micro} x gradient_accumulation_steps={gas} x replicas "
                                            rf"\(parallel_layout.num_dp\)={num_dp} = {batch}: drop train_batch_size "
                                            rf"\(it is derived\) or make it {batch}") as err:
        plan(cfg, _ds(tmp_path, stated(batch + num_dp), base=base, name="bad.json"), world=world)
    _one_line(err)


# ---- the planner reads a JSON with these keys -------------------------------------------------------------------

def test_the_planner_plans_with_fp16_zero_and_accumulation_and_writes_them_back(tiny_data, tmp_path, capsys):
    """The planner prices layouts, not ZeRO: a JSON with fp16, ZeRO-1, 2 accumulation steps and a consistent
    train_batch_size plans (priced as bf16), and the written winner keeps fp16, ZeRO and the accumulation; its
    train_batch_size, which the winner's num_dp changes, is dropped."""
    from tests.test_planner import _tiny_cfg, _tiny_profile
    from trainer.planner.cli import main

    def keys(d):
        _fp16()(d)
        d.update(zero_optimization={"stage": 1}, gradient_accumulation_steps=2, train_micro_batch_size_per_gpu=16,
                 train_batch_size=32)
        d["parallel_layout"] = {"mode": "single", "num_pp": 1, "num_dp": 1}

    out = tmp_path / "best.json"
    main(["--devices", "2", "--profile", str(_tiny_profile(tmp_path, tiny_data)), "--steps", "1",
          "--deepspeed_config", _ds(tmp_path, keys), "--write-config", str(out), *_tiny_cfg(tiny_data)])
    assert "hybrid" in capsys.readouterr().out
    written = load_ds_config(str(out), 100)
    assert written["fp16"]["enabled"] and written["zero_optimization"] == {"stage": 1}
    assert written["gradient_accumulation_steps"] == 2 and "train_batch_size" not in written


def test_zero_over_one_replica_is_named_at_the_start():
    from types import SimpleNamespace

    from trainer.parallel.layout import LayoutSpec
    from trainer.training.build import zero_notes

    def engine(stage, precision):
        return SimpleNamespace(zero_stage=stage, precision=precision)

    one, two = LayoutSpec("hybrid", 2, 1), LayoutSpec("data", 1, 2)
    assert zero_notes(engine(1, "fp32"), one) == [
        "zero_optimization.stage=1 with one replica (parallel_layout.num_dp=1) shards nothing; in fp32 it adds an fp32 "
        "master copy (1.5x the optimizer memory): drop it, or use replicas"]
    assert zero_notes(engine(1, "bf16"), one)[0].endswith("shards nothing: drop it, or use replicas")
    assert zero_notes(engine(1, "fp32"), two) == [] and zero_notes(engine(0, "fp32"), one) == []


# ---- keys DeepSpeed does not read (issue 42, item 7) -------------------------------------------------------------

def _set(key, value):
    return lambda d: d.__setitem__(key, value)


@pytest.mark.parametrize("change,expected", [
    (_set("gradient_clіpping", 1.0),  # a Cyrillic і: DeepSpeed ignored it and trained without clipping
     r"gradient_clіpping: not a key DeepSpeed reads there \(did you mean gradient_clipping\? it holds 'і' U\+0456 "
     r"CYRILLIC SMALL LETTER BYELORUSSIAN-UKRAINIAN I\); refused"),
    (_set("_comment", "mine"), r"_comment: not a key DeepSpeed reads there; refused"),
    (_set("checkpoint", {"tag_validaton": "Ignore"}), r"checkpoint.tag_validaton: .* \(did you mean tag_validation\?\)"),
    (lambda d: d["optimizer"].__setitem__("parms", {}), r"optimizer.parms: not a key DeepSpeed reads there"),
    (lambda d: d["optimizer"]["params"].__setitem__("weight_dеcay", 0.1),  # a TypeError once the model was built
     r"optimizer.params.weight_dеcay: .* \(did you mean weight_decay\? it holds 'е' U\+0435"),
    (lambda d: d["scheduler"]["params"].__setitem__("warmup_num_stepz", 3),
     r"scheduler.params.warmup_num_stepz: .* \(did you mean warmup_num_steps\?\)"),
    (_set("zero_optimization", {"stagе": 0}),  # DeepSpeed's own model refused it, in 4 lines, after the build
     r"zero_optimization.stagе: DeepSpeed refuses it: not a key of this section \(it holds 'е' U\+0435"),
    (_set("zero_optimization", {"stage": 0, "reduce_bucket_size": "big"}),
     r"zero_optimization.reduce_bucket_size: DeepSpeed refuses it: Input should be a valid integer"),
    (_set("wandb", {"enabled": False, "projekt": "x"}), r"wandb.projekt: DeepSpeed refuses it: not a key"),
    (_set("amp", {"enabled": True}), r"amp: DeepSpeed refuses it: NVIDIA Apex AMP integration has been removed"),
])
def test_a_key_deepspeed_does_not_read_is_refused_in_one_line_naming_it(tmp_path, change, expected):
    path = _ds(tmp_path, change)
    with pytest.raises(DSConfigError, match=expected) as err:
        load_ds_config(path, 100)
    assert _one_line(err).startswith(f"{path}: ")


@pytest.mark.parametrize("change", [
    None, _set("zero_optimization", {"stage": 1, "reduce_bucket_size": 500000000}),
    _set("tensorboard", {"enabled": False, "output_path": "tb"}), _set("wandb", {"enabled": False, "project": "p"}),
    _set("flops_profiler", {"enabled": False, "profile_step": 1}),
    lambda d: d.update(bf16={"enabled": True}, data_types={"grad_accum_dtype": "bf16"}),
    _set("optimizer", {"type": "SGD", "params": {"lr": 0.1, "momentum": 0.9, "nesterov": True}}),
    _set("scheduler", {"type": "StepLR", "params": {"step_size": 3, "gamma": 0.5}}),
    _set("activation_checkpointing", {"partition_activations": False}), _set("vocabulary_size", 32000),
])
def test_every_key_deepspeed_reads_is_accepted(tmp_path, change):
    load_ds_config(_ds(tmp_path, change, base="single"), 100)


def test_every_shipped_deepspeed_json_holds_only_keys_deepspeed_reads():
    for path in sorted((REPO / "ds_configs").glob("*.json")):
        load_ds_config(str(path), 100)


def test_a_json_without_a_scheduler_or_its_type_is_read_without_one():
    """No `scheduler` (a constant learning rate), or one without a type: nothing is built from its params, so they
    name no constructor (a TypeError in every parity job before the fix)."""
    from trainer.parallel.deepspeed_adapter import constructor_arguments

    assert constructor_arguments("scheduler", {}) is None
    assert constructor_arguments("scheduler", {"scheduler": {"params": {"warmup_num_steps": 3}}}) is None
    assert constructor_arguments("optimizer", {"optimizer": None}) is None
