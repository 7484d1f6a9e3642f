"""parallel_layout {"mode": "auto"}: refused in one line where it cannot be planned, chosen by the planner (and
cached) where it can, and a launched 2-rank run that logs its choice and trains with it."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, deepspeed_cmd, read_metrics, run_cli
from tests.planner_profiles import measured_profile, write

TINY = ["model.emb_dim=16", "model.hidden=16", "model.layers=2", "model.dropout=0.1", "data.min_batch_sentences=8",
        "model.bidirectional_bottom=false", "model.attention=general"]


def _profile(tmp_path, tiny_data):
    from trainer.data import read_manifest

    vocab = read_manifest(str(tiny_data))["vocab"]
    model = {"emb_dim": 16, "hidden": 16, "layers": 2, "attention": "general", "src_vocab": vocab["src_size"],
             "tgt_vocab": vocab["tgt_size"]}
    # the head dear, the LSTMs cheap: splitting the head over the ranks (hybrid) pays
    return write(tmp_path / "cpu.json", measured_profile(model, head_token=0.05, p2p_latency=0.01))


def _auto_json(tmp_path, **section) -> str:
    ds = json.loads((REPO / "ds_configs" / "single.json").read_text())
    ds["parallel_layout"] = {"mode": "auto", **section}
    ds["scheduler"]["params"].update(warmup_num_steps=2)
    path = tmp_path / "auto.json"
    path.write_text(json.dumps(ds))
    return str(path)


def test_auto_that_cannot_be_planned_is_refused_in_one_line(tiny_data, tmp_path, monkeypatch):
    from trainer.config import load_config
    from trainer.parallel.layout import LayoutError
    from trainer.training.build import plan

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # no calibrated CPU profile there
    cfg = load_config(None, [*TINY, f"data.dir={tiny_data}"])
    with pytest.raises(LayoutError, match=r"^parallel_layout\.mode=auto: no planner profile for this CPU \(.*"
                                          r"cpu_profile\.json does not exist\): measure one with python launch/plan\.py "
                                          r"--calibrate"):
        plan(cfg, _auto_json(tmp_path), world=2)
    with pytest.raises(LayoutError, match=r"parallel_layout\.profile='nowhere\.json': no such file"):
        plan(cfg, _auto_json(tmp_path, profile="nowhere.json"), world=2)
    with pytest.raises(LayoutError, match=r"parallel_layout\.num_pp: not a key of mode=auto"):
        plan(cfg, _auto_json(tmp_path, num_pp=2), world=2)
    for bad in (-0.1, 0.6, "0.1", True):
        with pytest.raises(LayoutError, match=r"^parallel_layout\.margin=.*: must be a number in 0 \.\. 0\.5"):
            plan(cfg, _auto_json(tmp_path, margin=bad), world=2)
    unprepared = load_config(None, [*TINY, f"data.dir={tmp_path / 'raw'}"])
    with pytest.raises(FileNotFoundError, match=r"data\.dir=.*raw: not prepared \(no manifest\.json\)"):
        plan(unprepared, _auto_json(tmp_path, profile=str(_profile(tmp_path, tiny_data))), world=2)
    # through the CLI: exit 2, one line on stderr, before any process talks
    proc = run_cli([sys.executable, "launch/train.py", "--deepspeed_config", _auto_json(tmp_path), *TINY,
                    f"data.dir={tiny_data}", f"run.dir={tmp_path / 'run'}"], check=False, timeout=120,
                   env_extra={"XDG_CACHE_HOME": str(tmp_path / "cache")})
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0, proc.stderr
    assert proc.stderr.startswith("error: parallel_layout.mode=auto: no planner profile for this CPU")
    assert not (tmp_path / "run").exists()


def test_auto_takes_the_planners_fastest_layout_of_the_ranks_launched_and_caches_it(tiny_data, tmp_path, monkeypatch):
    from trainer.config import load_config
    from trainer.parallel.deepspeed_json import load_ds_config
    from trainer.parallel.layout import LayoutSpec
    from trainer.planner import plan as planner
    from trainer.planner.profile import load
    from trainer.training import auto_layout
    from trainer.training.build import plan

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    cfg = load_config(None, [*TINY, f"data.dir={tiny_data}"])
    profile = _profile(tmp_path, tiny_data)
    path = _auto_json(tmp_path, profile=str(profile), steps=2)
    ds, request = plan(cfg, path, world=2)
    assert isinstance(request, auto_layout.AutoRequest) and request.world == 2 and request.device == "cpu"
    spec, choice = auto_layout.choose(cfg, ds, request)
    # the planner's own ranking of 2-rank layouts, at the JSON's micro-batch as one process's
    base = {**load_ds_config(path, None), "parallel_layout": {"mode": "single"}}
    ranked, _, _ = planner.rank_layouts(planner.workload(cfg, base, 2), load(str(profile)), 2, screen_steps=2)
    fits = [p for p in ranked if p.candidate.ranks == 2]
    best, why = auto_layout.pick(fits, auto_layout.DEFAULT_MARGIN)
    assert spec == best.candidate.spec and spec.world_size == 2
    assert (f"parallel_layout auto: {why}" in choice.lines) == bool(why)
    assert choice.lines[-1] == f"parallel_layout auto: chose {best.candidate.label()}: {json.dumps(choice.layout)}"
    assert "ranked in" in choice.lines[0] and choice.lines[1].startswith(f"  1. {best.candidate.label()}: predicted ")
    run_ds = auto_layout.apply(ds, choice)  # one replica's share of the global micro-batch
    assert run_ds["train_micro_batch_size_per_gpu"] * spec.num_dp == ds["train_micro_batch_size_per_gpu"]
    assert LayoutSpec.from_ds_config(run_ds, 2) == spec
    again, cached = auto_layout.choose(cfg, ds, request)
    assert again == spec and "from the cache" in cached.lines[0] and cached.lines[1:] == choice.lines[1:]
    other = auto_layout.AutoRequest(request.profile, 3, 2, "cpu")  # another number of steps: ranked again
    assert "ranked in" in auto_layout.choose(cfg, ds, other)[1].lines[0]


def test_a_dry_run_with_bf16_auto_ranks_the_layouts_in_the_precision_a_run_would_train_in(tiny_data, tmp_path,
                                                                                          monkeypatch, capsys):
    """`--dry-run` of a 2-rank auto layout with bf16.enabled "auto" on a CPU where bf16 is the slower: the precision
    line first, then the planner's ranking of fp32 steps (its cache key says fp32)."""
    from tests.conftest import launch_main
    from trainer.training import tuning

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("WORLD_SIZE", "2")
    ratio = {"now": 40.0}
    monkeypatch.setattr(tuning, "bf16_over_fp32", lambda width: (ratio["now"], "set by the test"))
    path = Path(_auto_json(tmp_path, profile=str(_profile(tmp_path, tiny_data)), steps=2))
    path.write_text(json.dumps({**json.loads(path.read_text()), "bf16": {"enabled": "auto"}}))

    def dry_run() -> list[str]:
        code, out, err = launch_main("train", ["--deepspeed_config", path, "--dry-run", *TINY,
                                               f"data.dir={tiny_data}"], capsys)
        assert code == 0, err
        return out.splitlines()

    lines = dry_run()
    assert lines[0] == ("precision: bf16.enabled=auto -> fp32: a bf16 GEMM at width 16 takes 40.00x fp32's time on "
                        "this CPU (set by the test)") and "ranked in" in lines[1]
    ratio["now"] = 0.5  # bf16 the faster: ranked again, in bf16 (the cached fp32 ranking is not its answer)
    lines = dry_run()
    assert "-> bf16" in lines[0] and "ranked in" in lines[1]
    ratio["now"] = 40.0
    assert "from the cache" in dry_run()[1]


def test_auto_does_not_order_layouts_closer_than_the_planners_error():
    from trainer.parallel.layout import LayoutSpec
    from trainer.planner.candidates import Candidate
    from trainer.planner.plan import Prediction
    from trainer.training.auto_layout import handoffs, pick

    def pred(ms, mode="hybrid", pp=2, dp=1, units=2, chunks=1, shares=None, screened=False):
        spec = LayoutSpec(mode, pp, dp, micro_batches=units, time_chunks=chunks, head_shares=shares)
        return Prediction(Candidate(spec, pp * dp, 1), ms / 1000, 1.0, screened_only=screened)

    hybrid = pred(125.4, shares=(10, 6))
    data = pred(127.8, "data", 1, 2, 1)
    assert handoffs(hybrid.candidate.spec) == 4 and handoffs(data.candidate.spec) == 1
    chosen, why = pick([hybrid, data], 0.10)  # 1.9% apart: closer than the planner's error
    assert chosen is data and why.startswith("data 2 is predicted 1.9% slower than hybrid 2 u2 c1 shares 10:6, within "
                                             "the planner's error (margin 0.1): taken for its 1 pipeline hand-off(s) "
                                             "per step against 4, even head shares")
    assert pick([hybrid, data], 0.0) == (hybrid, "")  # margin 0: the fastest prediction
    assert pick([pred(100.0), pred(125.0, "data", 1, 2, 1)], 0.10)[0].candidate.spec.mode == "hybrid"  # 25% apart
    even = pred(104.0)  # same hand-offs, even shares: preferred to uneven ones within the margin
    assert pick([hybrid := pred(100.0, shares=(10, 6)), even], 0.10)[0] is even
    assert pick([hybrid, pred(101.0, "data", 1, 2, 1, screened=True)], 0.10)[0] is hybrid  # screened rows: not taken
    fewer = pred(103.0, chunks=1, units=1)
    assert pick([pred(100.0, units=2, chunks=2), fewer], 0.05)[0] is fewer


@pytest.mark.slow
def test_launched_two_ranks_with_auto_log_their_choice_and_train(tiny_data, tmp_path):
    run_dir = tmp_path / "run"
    path = _auto_json(tmp_path, profile=str(_profile(tmp_path, tiny_data)), steps=2)
    train = run_cli(deepspeed_cmd(2, "launch/train.py", "--deepspeed_config", path, *TINY, f"data.dir={tiny_data}",
                                  f"run.dir={run_dir}", "train.max_steps=8", "train.eval_every=8", "train.log_every=2",
                                  "decode.dev_max_sentences=8", "logging.progress=false"),
                    timeout=400, env_extra={"XDG_CACHE_HOME": str(tmp_path / "cache")})
    chose = [line for line in train.stdout.splitlines() if "parallel_layout auto: chose " in line]
    assert len(chose) == 1, train.stdout[-3000:]  # said once, by rank 0
    layout = json.loads(chose[0].split(": ", 2)[2])
    assert "  1. " in train.stdout and "layouts of 2 rank(s) on cpu" in train.stdout
    written = json.loads((run_dir / "ds_config.json").read_text())  # the run's own JSON: the chosen layout
    assert written["parallel_layout"] == layout and layout["num_pp"] * layout["num_dp"] == 2
    rows = read_metrics(run_dir)
    assert rows[-1]["step"] == 8 and all(r["loss"] == r["loss"] for r in rows)
    trained = [r for r in rows if "grad_norm" in r]  # it learned, not only ran: every logged step moved the weights
    assert trained and all(0 < r["grad_norm"] < float("inf") for r in trained), trained
    assert f"layout: mode={layout['mode']} num_pp={layout['num_pp']} num_dp={layout['num_dp']}" in train.stdout


def test_auto_check_measures_the_choice_against_the_fastest_shipped_layout():
    from benchmarks.planner.auto_check import GOAL, compare

    rounds = {"auto": [10.0, 11.0, 30.0], "data_2": [12.0, 12.5, 12.0], "hybrid_2": [10.5, 10.4, 10.6]}
    hybrid = '{"mode": "hybrid", "num_pp": 2, "num_dp": 1, "time_chunks": 2}'
    got = compare(rounds, hybrid)  # each run's median round: a slow round is noise
    assert got["best"] == "hybrid_2" and got["auto_ms"] == 11.0 and got["best_ms"] == 10.5
    assert got["slower_by"] == pytest.approx(11.0 / 10.5 - 1) and got["within_goal"] == (11.0 / 10.5 - 1 <= GOAL)
    assert not compare({"auto": [12.0], "hybrid_2": [10.0]}, hybrid)["within_goal"]  # 20% slower: not within 5%
    # a choice that is a shipped layout (as the trainer reads it) is named: its gap to that layout is the machine's
    assert got["same_as"] == [] and compare({"auto": [12.0], "data_2": [10.0]}, json.dumps(
        {"mode": "data", "num_pp": 1, "num_dp": 2, "micro_batches": 1, "time_chunks": 1}))["same_as"] == ["data_2"]
