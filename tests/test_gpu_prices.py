"""The GPU's prices from what a GPU check measured (benchmarks/planner/gpu_prices.py, trainer/planner/roofline.py)
and validate-gpu's reading of a check's directory (benchmarks/planner/gpu_check_runs.py)."""
from __future__ import annotations

import json

import pytest

from tests.conftest import REPO

V2 = REPO / "benchmarks" / "results" / "gpu" / "2026-12-04-v2"


def _device(profile: dict, precision="bf16", math=None, **prices):
    from trainer.planner.roofline import RooflineDevice

    profile = json.loads(json.dumps(profile))
    for key, value in prices.items():
        profile["roofline"][key] = {"value": value, "source": "test"}
    profile["_path"] = "test.json"
    return RooflineDevice(profile, precision, "nvlink", None, math)


def test_an_lstm_call_costs_the_host_a_fixed_part_and_each_time_step_and_stacks_pay_it_once():
    from trainer.planner.profile import load, resolve

    host = dict(lstm_call_us=400.0, lstm_call_bwd_us=800.0, lstm_step_us=17.0, lstm_step_bwd_us=20.0,
                lstm_stack_step_ratio=1.25, lstm_stack_step_bwd_ratio=2.0, lstm_step_device_us=1.0)
    dev = _device(load(resolve("h200")), **host)
    layer = dev.lstm_fused("fwd", 1024, 1024, 128, 40)
    assert layer == pytest.approx((400 + 40 * 17) * 1e-6)  # host-paced: the device's 40 steps are shorter
    assert dev.lstm_fused("bwd", 1024, 1024, 128, 40) == pytest.approx((800 + 40 * 20) * 1e-6)
    stack = dev.lstm_fused("fwd", 1024, 1024, 128, 40, above=3)  # one call over 4 layers
    assert stack == pytest.approx((400 + 40 * 17 * 4 * 1.25) * 1e-6)
    assert dev.lstm_fused("bwd", 1024, 1024, 128, 40, above=3) == pytest.approx((800 + 40 * 20 * 4 * 2.0) * 1e-6)
    assert dev.lstm_packed("fwd", 1024, 1024, [128, 100, 0, 0]) == pytest.approx((400 + 2 * 17) * 1e-6)
    # where the device is slower than the host (a slow recurrent step), the device's time
    slow = _device(load(resolve("h200")), **{**host, "lstm_step_device_us": 100.0})
    assert slow.lstm_fused("fwd", 1024, 1024, 128, 40) == pytest.approx(40 * 100e-6, rel=0.1)


def test_matrix_rates_follow_the_measured_rows_and_tf32_runs_where_it_was_set():
    from trainer.planner.gpu_profile import gemm_rates
    from trainer.planner.profile import load, resolve

    compute = {"fp32": {"gemm": [{"m": 128, "n": 4096, "k": 1024, "ms": 0.05, "tflops": 21.0},
                                 {"m": 2048, "n": 4096, "k": 1024, "ms": 0.37, "tflops": 46.0}]},
               "bf16": {"gemm": [{"m": 128, "n": 4096, "k": 1024, "ms": 0.03, "tflops": 33.0},
                                 {"m": 2048, "n": 4096, "k": 1024, "ms": 0.05, "tflops": 349.0}]}}
    rates = gemm_rates(compute, launch_us=10.0)
    assert rates["fp32"]["value"] == [[128, 21.0], [2048, 46.0]]
    assert rates["bf16"]["value"] == [[2048, 349.0]]  # 30 us < 4 launches: the host set that time, not the device
    shipped = load(resolve("h200"))
    fp32, tf32 = _device(shipped, "fp32"), _device(shipped, "fp32", "tf32")
    assert fp32.gemm_rate(128) < fp32.gemm_rate(2048) <= fp32.gemm_rate(8192)
    assert tf32.gemm_rate(4096) > 4 * fp32.gemm_rate(4096)
    legacy = _device(shipped, "fp32", "cudnn_tf32")  # torch's defaults: cuDNN in TF32, matmuls in fp32
    assert legacy.lstm_rate(4096) == tf32.lstm_rate(4096) and legacy.gemm_rate(4096) == fp32.gemm_rate(4096)


def test_the_shipped_gpu_profile_is_the_second_checks_machine():
    from benchmarks.planner.gpu_prices import host_factor, machine_profile
    from trainer.planner.profile import load, resolve

    shipped = load(resolve("h200"))
    assert shipped["calibration"]["runs"] and shipped["roofline"]["lstm_step_us"]["value"] == json.loads(
        (V2 / "gpu_check.json").read_text())["latency"]["lstm_step_us"]
    same = machine_profile(shipped, V2)
    assert host_factor(same, shipped) == 1.0
    assert {k: v["value"] for k, v in same["roofline"].items() if isinstance(v, dict) and "value" in v} == \
           {k: v["value"] for k, v in shipped["roofline"].items() if isinstance(v, dict) and "value" in v}
    first = REPO.parent / "shared" / "gpu" / "2026-12-04"
    if (first / "gpu_check.json").exists():  # the first check's machine: its own latency stage sets its host
        other = machine_profile(shipped, first)
        lat = json.loads((first / "gpu_check.json").read_text())["latency"]
        factor = (lat["lstm_step_us"] + lat["lstm_step_bwd_us"]) / (
            shipped["roofline"]["lstm_step_us"]["value"] + shipped["roofline"]["lstm_step_bwd_us"]["value"])
        assert other["roofline"]["lstm_call_us"]["value"] == pytest.approx(
            shipped["roofline"]["lstm_call_us"]["value"] * factor, rel=1e-3)


def test_a_checks_runs_are_read_with_the_steps_it_measured(tmp_path):
    from benchmarks.gpu.gpu_runs import untimed_rates
    from benchmarks.planner.gpu_check_runs import current_config, read_check, steady_steps

    runs = read_check(V2, tmp_path)
    report = json.loads((V2 / "gpu_check.json").read_text())
    measured = {r["name"]: r for r in report["runs"] if r.get("step_ms_mean")}
    own = [r for r in runs if not r.machine]
    assert {r.name for r in own} == set(measured) and {r.machine for r in runs} == {"", "second machine"}
    for run in own:
        assert run.measured_ms == measured[run.name]["step_ms_mean"] and len(run.steps) == measured[run.name]["untimed_steps"]
        rows = [json.loads(line) for line in (run.run_dir / "metrics.jsonl").read_text().splitlines()]
        warmup = min(run.steps) - 1  # 50, or the scan's 30
        assert len(steady_steps(rows, warmup)) == untimed_rates(rows, warmup)["untimed_steps"] == len(run.steps)
        assert not {r["step"] for r in rows} & set(run.steps)  # logged (timed) steps left out
    patent = next(r for r in own if r.name == "patent_bf16")
    cfg = current_config(patent.run_dir, tmp_path, tmp_path / "patent.yaml")  # length_multiple 0 was 8 on a GPU
    assert cfg.data.length_multiple == 8 and cfg.train.stack_layers == "on" and str(cfg.data.dir) == str(tmp_path)
    assert not patent.legacy_tf32


@pytest.mark.skipif(not (REPO / ".gpudata" / "enja32k_joint" / "manifest.json").exists(),
                    reason="the GPU check's prepared data (.gpudata: gpu_check --prepare-only)")
def test_validate_gpu_predicts_every_run_of_the_check(tmp_path, capsys):
    from benchmarks.planner.gpu_validation import validate_gpu

    rows = validate_gpu(V2, REPO / ".gpudata", tmp_path, "h200")
    out = capsys.readouterr().out
    assert len(rows) == 14 and "worst last" in out
    table = out[out.index("worst last"):]
    best, worst = min(rows, key=lambda r: abs(r["error"])), max(rows, key=lambda r: abs(r["error"]))
    assert table.index(f"| {best['run']} |") < table.index(f"| {worst['run']} |")
    own = [r for r in rows if not r["second_machine"]]
    assert sum(abs(r["error"]) <= 0.10 for r in own) >= 10  # docs/BENCHMARKS.md names the others' causes


def test_validate_gpu_records_each_run_and_the_page_shows_them_worst_last(tmp_path):
    """Issue 40: validate-gpu's table belongs in docs/BENCHMARKS.md; `--record` makes a record of each run (the GPU
    that measured it, the check and its date), and the planner section renders them, the runs off by more than 10%
    marked."""
    from benchmarks import results
    from benchmarks.planner.gpu_validation import validation_records
    from benchmarks.results.page import planner

    rows = [{"run": run, "math": "bf16", "precision": "bf16", "pairs": 128, "steps": 144, "measured_ms": measured,
             "predicted_ms": predicted,
             "error": predicted / measured - 1, "role": "validates", "second_machine": second}
            for run, measured, predicted, second in (("patent_bf16_b256", 59.5, 35.6, True),
                                                     ("enja-small_bf16", 17.1, 17.0, False))]
    recs = validation_records(V2, rows, "h200")
    for rec in recs:
        results.check(rec)
    assert [r["machine"] for r in recs] == ["NVIDIA H200 (second machine)", "NVIDIA H200"]
    assert recs[0]["settings"]["check"] == "2026-12-04-v2" and recs[0]["settings"]["measured_on"] == "2026-12-04"
    text = "\n".join(planner(recs)[0])
    good, bad = text.index("| enja-small_bf16 |"), text.index("| patent_bf16_b256 |")
    assert good < bad and "| -0.6% |" in text and "| -40.2% ** |" in text
    assert "| a second machine, whose host no latency stage measured: priced with the check's machine's host |" in text
    results.write(recs, tmp_path)
    assert len((tmp_path / "planner.jsonl").read_text().splitlines()) == 2


def test_validate_gpu_names_why_a_run_is_off():
    """Each run off by more than 10% gets one line: a second machine's unmeasured host; else the part of the step
    farthest from its price, an instruction or the host time between the timed instructions; and a precision priced
    as another."""
    from benchmarks.planner.gpu_validation import miss_cause

    row = {"second_machine": False, "math": "fp32", "precision": "fp32", "measured_ms": 18.9,
           "timed_ops_ms": {"forward": 4.1, "backward": 6.0, "head": 4.7, "optimizer_step": 1.3},
           "predicted_ops_ms": {"forward": 4.0, "backward": 5.4, "head": 6.0, "optimizer_step": 1.2}}
    assert miss_cause(row) == "the host time between the timed instructions, 2.8 ms of the step, unpriced"
    fp16 = {**row, "math": "bf16", "precision": "fp16", "measured_ms": 18.6,
            "timed_ops_ms": {**row["timed_ops_ms"], "optimizer_step": 3.4}}
    assert miss_cause(fp16) == "optimizer_step: timed 3.4 ms, priced 1.2 (fp16 priced as bf16)"
    assert miss_cause({**row, "math": "cudnn_tf32"}).endswith("unpriced")  # fp32 that ran cuDNN in TF32: the same
