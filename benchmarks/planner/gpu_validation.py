"""`python -m benchmarks.planner validate-gpu --from DIR`: the planner's prediction of every training run of a GPU
check's output directory against its measured steady-state ms per step, worst last.

Each run is predicted as it ran: its config, DeepSpeed JSON and batches (benchmarks.planner.gpu_check_runs, the
batches checked against its metrics' token counts), the steady-state steps only (the warm-up left out, as the check
measured it), with a planner profile for the machine the check ran on: `--profile` (default the shipped h200, priced
from benchmarks/results/gpu/2026-12-04-v2 by `gpu-prices`) moved onto DIR's own device profile and latency stage
(benchmarks.planner.gpu_prices.machine_profile: for the calibration check itself this changes nothing). A run whose
timing files set prices is marked `calibrates`; every other row is a validation. Runs of a second machine in DIR
(scan_gpu_check.json) are priced with DIR's machine, whose host they do not share: their rows say so.
"""
from __future__ import annotations

import json
from pathlib import Path

from benchmarks import results as records
from benchmarks.planner.gpu_check_runs import at_steps, read_check, run_workload


def validate_gpu(check_dir: Path, gpudata: Path, work: Path, profile_name: str, record: bool = False) -> list[dict]:
    from benchmarks.planner.gpu_prices import host_factor, machine_profile, predicted_ops
    from trainer.planner import plan
    from trainer.planner.candidates import Candidate
    from trainer.planner.profile import load, resolve

    shipped = load(resolve(profile_name))
    profile = machine_profile(shipped, check_dir)
    profile["_path"] = f"{Path(shipped['_path']).name} on {check_dir.name}"
    calibrating = set((shipped.get("calibration") or {}).get("runs", [])) if _same_check(shipped, check_dir) else set()
    print(f"prices: {profile['_path']}; host x {host_factor(profile, shipped):.3f} against the calibration machine "
          f"(its latency stage); every predicted figure is a prediction", flush=True)
    rows = []
    for run in read_check(check_dir, work / check_dir.name):
        wl, spec = run_workload(run, gpudata, work)
        pred = plan.predict(Candidate(spec, 1, 0), at_steps(wl, run.steps), profile)
        ms = 1000 * pred.step_s
        role = "calibrates" if run.name in calibrating and not run.machine else "validates"
        rows.append({"run": run.label, "math": wl.math, "precision": run.precision, "pairs": wl.global_batch,
                     "steps": len(run.steps),
                     "measured_ms": run.measured_ms, "predicted_ms": ms, "error": ms / run.measured_ms - 1,
                     "role": role, "second_machine": bool(run.machine),
                     "predicted_ops_ms": predicted_ops(profile, at_steps(wl, run.steps), spec),
                     "timed_ops_ms": {op: 1000 * s for op, s in run.timing.items()}})
        print(f"{run.label:36s} measured {run.measured_ms:6.1f} ms  predicted {ms:6.1f} ms  "
              f"{100 * rows[-1]['error']:+6.1f}%  ({role})", flush=True)
    report(check_dir, rows)
    (work / f"validate_gpu_{check_dir.name}.json").write_text(json.dumps(rows, indent=1))
    if record:
        records.write(validation_records(check_dir, rows, profile_name))
        print("docs/BENCHMARKS.md shows them once rendered: python -m benchmarks.results render")
    return rows


def validation_records(check_dir: Path, rows: list[dict], profile_name: str) -> list[dict]:
    """Each run's prediction as a record of the machine that measured it (the check's device; a second machine's
    runs under that name with "(second machine)"), predicted now at this checkout's commit (the record's date and
    commit); the check and the date it measured on in its settings."""
    device = json.loads((check_dir / "device_profile.json").read_text())
    name, measured_on = device["device"]["name"], (device.get("measured_on") or {}).get("date", "not recorded")
    command = records.command("benchmarks.planner")
    return [records.record("planner", "gpu validation", command=command,
                           machine_name=name + (" (second machine)" if r["second_machine"] else ""),
                           settings={"check": check_dir.name, "measured_on": measured_on, "run": r["run"],
                                     "math": r["math"], "pairs": r["pairs"], "steady_steps": r["steps"],
                                     "role": r["role"], "profile": profile_name},
                           figures={"measured_step_ms": r["measured_ms"], "predicted_step_ms": r["predicted_ms"]},
                           ratios={"error": r["error"]},
                           note=miss_cause(r) if abs(r["error"]) > 0.10 else None) for r in rows]


def miss_cause(r: dict) -> str:
    """One line naming why a run is off: a second machine's host, which no latency stage measured; else the part of
    the step whose timed ms per step is farthest from its price: an instruction type, or the host time between the
    timed instructions (the steady step less their sum), which nothing prices; with a precision the planner prices
    as another said."""
    if r["second_machine"]:
        return "a second machine, whose host no latency stage measured: priced with the check's machine's host"
    timed, priced = r["timed_ops_ms"], r["predicted_ops_ms"]
    gaps = [(timed.get(op, 0) - priced.get(op, 0), op) for op in set(timed) | set(priced)]
    gaps.append((max(0.0, r["measured_ms"] - sum(timed.values())), "between the timed instructions"))
    gap, op = max(gaps, key=lambda g: abs(g[0]))
    said = (f"the host time between the timed instructions, {gap:.1f} ms of the step, unpriced" if op.startswith("between")
            else f"{op}: timed {timed.get(op, 0):.1f} ms, priced {priced.get(op, 0):.1f}")
    other = r.get("precision") not in (None, r["math"]) and not (r["math"] == "cudnn_tf32" and r["precision"] == "fp32")
    return said + (f" ({r['precision']} priced as {r['math']})" if other else "")


def _same_check(profile: dict, check_dir: Path) -> bool:
    return (profile.get("calibration") or {}).get("check") == check_dir.name


def report(check_dir: Path, rows: list[dict]) -> None:
    rows = sorted(rows, key=lambda r: abs(r["error"]))
    print(f"\n{check_dir.name}: predicted against measured steady-state ms per step, worst last")
    print("| run | math | pairs | steady steps | measured ms/step | predicted ms/step | error | role |")
    print("|---|---|---:|---:|---:|---:|---:|---|")
    for r in rows:
        flag = " **" if abs(r["error"]) > 0.10 else ""
        role = r["role"] + ("; host not measured there" if r["second_machine"] else "")
        print(f"| {r['run']} | {r['math']} | {r['pairs']} | {r['steps']} | {r['measured_ms']:.1f} | "
              f"{r['predicted_ms']:.1f} | {100 * r['error']:+.1f}%{flag} | {role} |")
    within = sum(abs(r["error"]) <= 0.10 for r in rows)
    print(f"\n{within} of {len(rows)} runs within 10%")
    off = [r for r in rows if abs(r["error"]) > 0.10]
    if off:
        print("runs off by more than 10%, and why (instructions timed on the logged steps, each synchronised; "
              "predicted for the steady state):")
        for r in off:
            print(f"  {r['run']}: {miss_cause(r)}")
        print("the same runs by instruction, timed / predicted ms per step:")
        for r in off:
            ops = sorted(set(r["timed_ops_ms"]) | set(r["predicted_ops_ms"]))
            print(f"  {r['run']}: " + ", ".join(f"{op} {r['timed_ops_ms'].get(op, 0):.1f}/{r['predicted_ops_ms'].get(op, 0):.1f}"
                                                for op in ops if max(r["timed_ops_ms"].get(op, 0),
                                                                     r["predicted_ops_ms"].get(op, 0)) > 0.05))
