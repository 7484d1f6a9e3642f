"""Bad configs and layouts fail before any compute, naming the key; batching is deterministic."""
from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from tests.conftest import REPO, launch_main, run_cli
from trainer.config import ConfigError, load_config
from trainer.data import make_batches
from trainer.parallel.layout import LayoutError, LayoutSpec


def test_unknown_key_and_wrong_type_name_the_key():
    with pytest.raises(ConfigError, match="^command-line override: bad config key .model.hiden."):
        load_config(None, ["model.hiden=3"])
    with pytest.raises(ConfigError, match="train.max_steps"):
        load_config(None, ["train.max_steps=lots"])
    with pytest.raises(ConfigError, match="model.attention"):
        load_config(None, ["model.attention=bahdanau"])
    with pytest.raises(ConfigError, match="model.dropout"):
        load_config(None, ["model.dropout=1.5"])


def test_config_is_frozen():
    cfg = load_config(None, ["train.max_steps=7"])
    assert cfg.train.max_steps == 7
    with pytest.raises(Exception):
        cfg.train.max_steps = 8


def _spec(world, **layout):
    return LayoutSpec.from_ds_config({"parallel_layout": layout}, world)


def test_layout_errors_name_the_key():
    with pytest.raises(LayoutError, match="world size 3"):
        _spec(3, mode="hybrid", num_pp=2, num_dp=1)
    with pytest.raises(LayoutError, match="parallel_layout.mode='tensor'"):
        _spec(2, mode="tensor")
    with pytest.raises(LayoutError, match="parallel_layout.micro_batche"):
        _spec(2, mode="hybrid", micro_batche=2)
    cfg = load_config(None, ["model.layers=2"])
    with pytest.raises(LayoutError, match="num_pp=4.*model.layers=2"):
        _spec(4, mode="hybrid", num_pp=4).check_model(cfg.model, 8, 64)
    bi = load_config(None, ["model.bidirectional_bottom=true"])
    with pytest.raises(LayoutError, match="time_chunks"):
        _spec(2, mode="hybrid", time_chunks=2).check_model(bi.model, 8, 64)
    _spec(2, mode="hybrid", time_chunks=1).check_model(bi.model, 8, 64)  # units of sentences carry it
    with pytest.raises(LayoutError, match="data.min_batch_sentences"):
        _spec(2, mode="hybrid", micro_batches=16).check_model(cfg.model, 8, 64)
    with pytest.raises(LayoutError, match="train_micro_batch_size_per_gpu"):
        _spec(2, mode="data").check_model(cfg.model, 8, 3)
    with pytest.raises(LayoutError, match="head_shares"):
        _spec(2, mode="hybrid", head_shares=[1])
    with pytest.raises(LayoutError, match="head_shares"):
        _spec(2, mode="hybrid", head_shares=[1, 0])
    assert _spec(2, mode="hybrid", head_shares=[5, 4]).head_shares == (5, 4)
    with pytest.raises(LayoutError, match="defer_weight_grads=.yes.: must be true or false"):
        _spec(2, mode="hybrid", defer_weight_grads="yes")
    with pytest.raises(LayoutError, match="defer_weight_grads=true: .*model.lstm_kernel=stepwise"):
        _spec(2, mode="hybrid", defer_weight_grads=True).check_model(cfg.model, 8, 64)  # fused: nothing to defer
    with pytest.raises(LayoutError, match="head_split='rows'|head_split=.rows.: one of sentences, time"):
        _spec(2, mode="hybrid", head_split="rows")
    for bad in ({"time_chunks": 1}, {"time_chunks": 4, "micro_batches": 2},
                {"time_chunks": 4, "micro_batches": 2, "head_schedule": "per_unit"}):
        with pytest.raises(LayoutError, match="head_split=time .*micro_batches=1 and time_chunks >= num_pp=2"):
            _spec(2, mode="hybrid", head_split="time", **bad)
    assert _spec(2, mode="hybrid", head_split="time", time_chunks=2).head_split == "time"
    stepwise = load_config(None, ["model.layers=2", "model.lstm_kernel=stepwise", "model.bidirectional_bottom=false"])
    _spec(2, mode="hybrid", time_chunks=4, defer_weight_grads=True).check_model(stepwise.model, 8, 64)
    with pytest.raises(LayoutError, match="defer_head_weight_grads=1: must be true or false"):
        _spec(2, mode="hybrid", defer_head_weight_grads=1)
    with pytest.raises(LayoutError, match="defer_head_weight_grads=true fills .* needs num_pp >= 2 .now 1."):
        _spec(2, mode="data", defer_head_weight_grads=True)
    with pytest.raises(LayoutError, match="defer_head_weight_grads=true: not with head_schedule=per_unit"):
        _spec(2, mode="hybrid", micro_batches=2, head_schedule="per_unit", defer_head_weight_grads=True)
    assert _spec(2, mode="pipeline", defer_head_weight_grads=True).defer_head_weight_grads
    tied = load_config(None, ["model.tie_embeddings=true"])
    with pytest.raises(LayoutError, match="tie_embeddings"):
        _spec(2, mode="hybrid").check_model(tied.model, 8, 64)


def test_modes_resolve_degrees():
    assert (_spec(4, mode="data").num_pp, _spec(4, mode="data").num_dp) == (1, 4)
    h = _spec(8, mode="hybrid", num_pp=2, num_dp=4)
    assert (h.num_pp, h.num_dp, h.head_parallel, h.min_rows) == (2, 4, True, 8)
    assert not _spec(2, mode="pipeline").head_parallel


def test_shipped_ds_configs_are_valid():
    expect = {"single": 1, "data_2": 2, "pipeline_2": 2, "hybrid_2": 2, "hybrid_2_wide": 2, "hybrid_4": 4,
              "grid_2x4": 8}
    for name, world in expect.items():
        ds = json.loads((REPO / "ds_configs" / f"{name}.json").read_text())
        spec = LayoutSpec.from_ds_config(ds, world)
        assert spec.world_size == world
        # the global micro-batch is the same in every shipped layout, so runs are comparable
        assert ds["train_micro_batch_size_per_gpu"] * spec.num_dp == 64


def test_the_wide_config_trains_its_layout():
    """enja_wide.yaml with hybrid_2_wide.json: a unidirectional model (time chunks allowed), the auto kernel
    (stepwise in bf16 on a CPU), the head cut along time."""
    cfg = load_config(str(REPO / "trainer/configs/enja_wide.yaml"), [])
    ds = json.loads((REPO / "ds_configs" / "hybrid_2_wide.json").read_text())
    spec = LayoutSpec.from_ds_config(ds, 2)
    assert spec.time_chunks == 4 and spec.head_split == "time"
    assert cfg.model.lstm_kernel == "auto" and cfg.model.hidden == 1024
    spec.check_model(cfg.model, cfg.data.min_batch_sentences, ds["train_micro_batch_size_per_gpu"])


def test_cli_rejects_a_layout_before_training(tmp_path):
    proc = run_cli([sys.executable, "launch/train.py", "--deepspeed_config", "ds_configs/hybrid_2.json",
                    f"run.dir={tmp_path / 'r'}", "logging.wandb_mode=disabled"], check=False, timeout=120)
    assert proc.returncode == 2
    assert "num_pp x num_dp = 1 x 2" not in proc.stderr and "world size 1" in proc.stderr
    assert "Traceback" not in proc.stderr
    proc = run_cli([sys.executable, "launch/train.py", "--deepspeed_config", "ds_configs/single.json",
                    "model.nope=1"], check=False, timeout=120)
    assert proc.returncode == 2 and "model.nope" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "r").exists()


def test_batches_deterministic_capped_and_complete():
    rng = np.random.default_rng(0)
    src, tgt = rng.integers(1, 40, 1000), rng.integers(1, 50, 1000)
    kw = dict(max_sentences=32, max_tokens=900, seed=3, epoch=1, bucket_batches=4, min_batch=8)
    a, left_a = make_batches(src, tgt, **kw)
    b, left_b = make_batches(src, tgt, **kw)
    assert [x.tolist() for x in a] == [x.tolist() for x in b] and left_a == left_b
    c, _ = make_batches(src, tgt, **{**kw, "epoch": 2})
    assert [x.tolist() for x in a] != [x.tolist() for x in c]
    seen = np.concatenate(a)
    assert len(seen) == len(set(seen.tolist())) and len(seen) + left_a == 1000
    for batch in a:
        assert 8 <= len(batch) <= 32
        assert len(batch) * (src[batch].max() + 1 + tgt[batch].max() + 1) <= 900 or len(batch) == 8


def test_dry_run_prints_each_ranks_instruction_list(capsys):
    code, stdout, _ = launch_main("train", ["--deepspeed_config", REPO / "ds_configs" / "grid_2x4.json", "--dry-run"],
                                  capsys)
    assert code == 0 and "num_pp=2 num_dp=4" in stdout
    for rank in range(8):
        assert f"rank {rank} (" in stdout
    assert stdout.count("broadcast_head") == 8 and stdout.count("scatter_shard") == 4


def test_weighted_head_shards_cover_the_rows():
    from trainer.parallel.layout import ParallelLayout, split_weighted

    assert split_weighted(64, [5, 4]) == [(0, 36), (36, 64)]
    assert split_weighted(13, [1, 1]) == [(0, 7), (7, 13)]  # as split_even
    assert split_weighted(3, [100, 1, 1]) == [(0, 1), (1, 2), (2, 3)]  # no empty shard
    layout = ParallelLayout(_spec(2, mode="hybrid", head_shares=[3, 1]), rank=1)
    assert layout.head_shards(8) == [(0, 6), (6, 8)]
    spec = _spec(2, mode="hybrid", head_shares=[3, 1])
    assert LayoutSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec
