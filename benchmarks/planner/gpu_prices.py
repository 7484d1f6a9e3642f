"""A GPU's planner profile from what one GPU check measured (`python -m benchmarks.planner gpu-prices --from DIR
--out FILE`; trainer/planner/profiles/h200.json is its output for benchmarks/results/gpu/2026-12-04-v2).

Where each price comes from (each number's `source` in the profile says it again):
    device rates       DIR/device_profile.json: the matrix rate by rows per precision, memory bandwidth
                       (trainer.planner.gpu_profile.roofline)
    lstm_step_us,      DIR/gpu_check.json's latency stage: host time per forward / backward time step of one cuDNN
    lstm_step_bwd_us,  layer (bf16, batch 128, hidden 1024, the slope between 33 and 66 steps); a tiny op's host
    op_overhead_us,    time; one device sync
    sync_us
    lstm_stack_step_ratio   DIR/lstm_calls.log (python -m benchmarks.gpu.gpu_lstm_calls): kernels a 4-layer cuDNN
                       call launches against four layer calls at the same shape (1,234 against 1,022); kernel counts
                       do not depend on the host
    lstm_call_us, lstm_call_bwd_us, lstm_stack_step_bwd_ratio, host_op_us, optimizer_host_us
                       fitted (non-negative least squares) to the timed instructions (timing/rank0.json: forward,
                       backward, head, optimizer_step ms per step) of the CALIBRATION runs, each predicted on the
                       batches of the very steps those files timed, with the device left out (these runs are paced by
                       the host)
    lstm_step_device_us  the least device time of a recurrent step, such that the profiled patent step's predicted
                       device time equals what the profiler measured busy (DIR/gpu_check.json profiled_patent)

Only the CALIBRATION runs' timing files and the profiled run set prices; every other run of the directory, and every
run of any other check, is validation (python -m benchmarks.planner validate-gpu). A check on another machine is
priced by `machine_profile`: its own device profile and latency stage, the fitted host prices scaled by its measured
host time per forward + backward LSTM step against the calibration machine's (a slower host is slower at everything it
launches).
"""
from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np

from trainer.artifacts import run_dir as run_dir_names

from benchmarks.planner.gpu_check_runs import CheckRun, at_steps, read_check, run_workload

CALIBRATION = ("patent_bf16", "patent_bf16_layers", "enja-small_fp32", "paper-size_bf16")
FITTED = ("lstm_call_us", "lstm_call_bwd_us", "lstm_stack_step_bwd_ratio", "host_op_us", "optimizer_host_us",
          "optimizer_tensor_us")
HOST = ("host_op_us", "lstm_call_us", "lstm_call_bwd_us", "lstm_step_us", "lstm_step_bwd_us", "optimizer_host_us",
        "optimizer_tensor_us", "instruction_us", "backward_call_us", "sync_us")
TIMED = ("forward", "backward", "head", "optimizer_step")
LATENCY = {"op_overhead_us": "host time of a tiny eager op", "sync_us": "one device sync beyond its launch",
           "lstm_step_us": "host time per forward time step of one cuDNN LSTM layer",
           "lstm_step_bwd_us": "host time per backward time step of one cuDNN LSTM layer"}
HUGE = 1e9  # a rate that makes the device's time vanish (host-only predictions)


def num(value, source: str) -> dict:
    return {"value": value, "source": source}


def base_profile(check_dir: Path) -> dict:
    """The check's device profile with the planner's roofline section and its latency stage's prices."""
    from trainer.planner.profile import planner_profile

    device = json.loads((check_dir / "device_profile.json").read_text())
    profile = planner_profile(device)
    report = json.loads((check_dir / "gpu_check.json").read_text())
    lat = report.get("latency")
    if not lat:
        raise ValueError(f"{check_dir}/gpu_check.json: no latency stage: its host prices cannot be measured")
    where = f"{check_dir.name}/gpu_check.json latency stage"
    for key, what in LATENCY.items():
        if lat.get(key) is not None:
            profile["roofline"][key] = num(lat[key], f"measured: {what} ({where}; bf16, batch {lat['batch']}, hidden "
                                                     f"{lat['hidden']}, time steps {lat['time_steps']})")
    ratio = stack_ratio(check_dir / "lstm_calls.log")
    if ratio:
        profile["roofline"]["lstm_stack_step_ratio"] = num(round(ratio, 4), "measured: kernels of one 4-layer cuDNN "
                                                           f"call over four layer calls ({check_dir.name}/lstm_calls.log)")
    profile["_path"] = str(check_dir / "device_profile.json")
    return profile


def stack_ratio(log: Path) -> float | None:
    """Kernels of the bf16 stack in one flat buffer over the layers' (flat each), from gpu_lstm_calls' last line."""
    if not log.exists():
        return None
    calls = json.loads(log.read_text().strip().splitlines()[-1])
    return calls["bf16 stack, one flat buffer"]["kernels"] / calls["bf16 layers, flat each"]["kernels"]


def host_only(profile: dict, prices: dict) -> dict:
    """The profile with its device infinitely fast and the given host prices (us): host-paced predictions."""
    out = copy.deepcopy(profile)
    roof = out["roofline"]
    roof["gemm_rates"] = {p: num([[1, HUGE]], "fit") for p in ("bf16", "fp32", "tf32")}
    roof["memory_tb_s"] = num(HUGE, "fit")
    roof["lstm_step_device_us"] = num(0.0, "fit")
    for key, value in prices.items():
        roof[key] = num(value, "fit")
    return out


def timed_steps(run: CheckRun) -> list[int]:
    """The steps timing/rank0.json timed: the logged ones after the first."""
    rows = [json.loads(line) for line in (run.run_dir / run_dir_names.METRICS).read_text().splitlines()]
    logged = sorted({r["step"] for r in rows if "wall_s" in r})
    return [s for s in logged[1:] if s <= run.steps[-1] + 1]


def predicted_ops(profile: dict, wl, spec) -> dict:
    """ms per step of each instruction type on rank 0."""
    from trainer.planner import plan
    from trainer.planner.candidates import Candidate

    pred = plan.predict(Candidate(spec, 1, 0), wl, profile)
    return {op: 1000 * s for op, s in pred.op_seconds[0].items()}


def fit_host(profile: dict, cases: list) -> dict:
    """The FITTED host prices (us) from `cases` [(workload of the timed steps, layout, {op: timed ms})]."""
    from trainer.planner.fit import nnls

    zero = {k: 0.0 for k in FITTED}
    rows, target = [], []
    for wl, spec, timed in cases:
        base = predicted_ops(host_only(profile, zero), wl, spec)
        unit = {k: predicted_ops(host_only(profile, {**zero, k: 1.0}), wl, spec) for k in FITTED}
        # a timed optimizer step waits for its own Adam on the device (the instruction's closing sync): not host time
        adam = predicted_ops(device_only(profile), wl, spec).get("optimizer_step", 0.0)
        for op in TIMED:
            if op in timed:
                rows.append([unit[k].get(op, 0.0) - base.get(op, 0.0) for k in FITTED])
                target.append(timed[op] - base.get(op, 0.0) - (adam if op == "optimizer_step" else 0.0))
    x = nnls(np.array(rows), np.array(target))
    return {k: round(float(v), 4) for k, v in zip(FITTED, x)}


def device_only(profile: dict) -> dict:
    """The profile with every host price 0: the device's own time."""
    out = copy.deepcopy(profile)
    for key in HOST:
        out["roofline"][key] = num(0.0, "fit")
    return out


def fit_device_floor(profile: dict, wl, spec, busy_ms: float) -> float:
    """lstm_step_device_us such that the predicted device time of `wl`'s steps is `busy_ms` (bisection)."""
    host_free = device_only(profile)
    lo, hi = 0.0, 200.0
    for _ in range(30):
        mid = (lo + hi) / 2
        host_free["roofline"]["lstm_step_device_us"] = num(mid, "fit")
        if sum(predicted_ops(host_free, wl, spec).values()) < busy_ms:
            lo = mid
        else:
            hi = mid
    return round((lo + hi) / 2, 3)


def calibrated_profile(check_dir: Path, gpudata: Path, work: Path, calibration=CALIBRATION) -> tuple[dict, dict]:
    """(the planner profile priced from `check_dir`, what the fit found: prices, residuals by run)."""
    profile = base_profile(check_dir)
    runs = {r.name: r for r in read_check(check_dir, work) if not r.machine}
    missing = [name for name in calibration if name not in runs or not runs[name].timing]
    if missing:
        raise ValueError(f"{check_dir}: no timed run {', '.join(missing)} to calibrate with")
    cases = []
    for name in calibration:
        run = runs[name]
        wl, spec = run_workload(run, gpudata, work)
        cases.append((at_steps(wl, timed_steps(run)), spec, {op: 1000 * s for op, s in run.timing.items()}))
    prices = fit_host(profile, cases)
    names = ", ".join(calibration)
    for key, value in prices.items():
        profile["roofline"][key] = num(value, f"measured: fitted to the timed instructions of {names} "
                                              f"({check_dir.name}/runs.tar.gz timing/rank0.json), host-paced")
    profiled = _profiled(check_dir, runs, gpudata, work)
    if profiled:
        wl, spec, busy, steps = profiled
        floor = fit_device_floor(profile, wl, spec, busy)
        profile["roofline"]["lstm_step_device_us"] = num(floor, f"measured: the profiled patent step's device busy "
                                                                f"{busy:.2f} ms (steps {steps}; {check_dir.name}/"
                                                                f"gpu_check.json profiled_patent), predicted")
    residuals = {name: {op: (round(predicted_ops(profile, wl, spec).get(op, 0.0), 2), round(timed.get(op, 0.0), 2))
                        for op in TIMED} for name, (wl, spec, timed) in zip(calibration, cases)}
    profile.pop("_path", None)
    profile["calibration"] = {"check": check_dir.name, "runs": list(calibration),
                              "profiled": profiled[3] if profiled else None}
    profile["measured_by"] = (f"python -m benchmarks.planner gpu-prices --from {check_dir.name}: the device profile, "
                              f"the latency stage, lstm_calls.log and the timed instructions of {names}")
    return profile, {"prices": prices, "calibration": residuals}


def _profiled(check_dir: Path, runs: dict, gpudata: Path, work: Path):
    """(workload of the profiled steps, layout, device busy ms per step, steps) of the check's profiled patent run."""
    report = json.loads((check_dir / "gpu_check.json").read_text())
    prof = (report.get("profiled_patent") or {}).get("profile")
    base = runs.get("patent_bf16")
    if not prof or base is None:
        return None
    first, last = prof["steps"]
    wl, spec = run_workload(base, gpudata, work)  # the same config, data and batches as the profiled run
    return at_steps(wl, list(range(first, last + 1))), spec, prof["device_busy_ms_per_step"], prof["steps"]


def machine_profile(calibrated: dict, check_dir: Path) -> dict:
    """Another machine's profile: its own device rates and latency stage; the fitted host prices scaled by its host
    time per LSTM step over the calibration machine's."""
    own = base_profile(check_dir)
    factor = host_factor(own, calibrated)
    keys = [*FITTED, "lstm_step_device_us", "instruction_us", "backward_call_us"]
    if "lstm_stack_step_ratio" not in own["roofline"]:  # kernel counts: the calibration machine's lstm_calls.log
        keys.append("lstm_stack_step_ratio")
    for key in keys:
        node = calibrated["roofline"].get(key)
        if node is None:
            continue
        if key.endswith("_us") and key != "lstm_step_device_us":
            own["roofline"][key] = num(round(node["value"] * factor, 4),
                                       f"{node['source']}; x {factor:.3f} for this machine's host (its LSTM host time "
                                       f"per forward + backward step over the calibration machine's)")
        else:
            own["roofline"][key] = node
    own["calibration"] = calibrated.get("calibration")
    return own


def host_factor(own: dict, calibrated: dict) -> float:
    """How much slower this machine's host is than the calibration machine's: the latency stages' host time per
    forward + backward LSTM time step (both slopes measured; one alone moves with the noise of one timing)."""
    step = lambda p: p["roofline"]["lstm_step_us"]["value"] + p["roofline"]["lstm_step_bwd_us"]["value"]  # noqa: E731
    return step(own) / step(calibrated)
