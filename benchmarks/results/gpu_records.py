"""The GPU check's records: what `bash benchmarks/gpu/gpu_check.sh` left in its $OUT (gpu_check.json, runs.tar.gz)
as records of the gpu question, one per training run, anchor program, latency and profile measurement.

The check runs on a lent device whose checkout does not come back; its files do. So the records are made here,
from those files: `python -m benchmarks.results gpu OUT_DIR --command "bash benchmarks/gpu/gpu_check.sh" --commit C`
appends them to benchmarks/results/gpu.jsonl (the date is the check's own start, from its log).
"""
from __future__ import annotations

import json
import re
import tarfile
from pathlib import Path

from benchmarks.results import record as new_record
from trainer.artifacts.run_dir import CONFIG

LAYOUTS = {"units": "hybrid, a world of one: 2 pipeline units x 2 time chunks"}
RUN_TABLE = "runs"


def run_configs(archive: Path) -> dict[str, str]:
    """run name -> its config.yaml text, from the check's runs.tar.gz (empty when the archive is missing)."""
    if not archive.exists():
        return {}
    configs = {}
    with tarfile.open(archive) as tar:
        for member in tar.getmembers():
            parts = Path(member.name).parts
            if len(parts) == 3 and parts[0] == "runs" and parts[2] == CONFIG and member.isfile():
                configs[parts[1]] = tar.extractfile(member).read().decode("utf-8")
    return configs


def _config_value(config: str, name: str) -> str | None:
    m = re.search(rf"^\s*{name}: (\S+)", config, re.M)
    return m.group(1) if m else None


def run_settings(run: dict, config: str) -> dict:
    """What a run held fixed, from its entry in gpu_check.json and its resolved config."""
    precision = run.get("precision")
    if precision == "fp32" and config and _config_value(config, "tf32") is None:
        precision = "fp32 (cuDNN's TF32 on, unsaid)"  # before train.tf32: torch leaves cuDNN's TF32 on
    variant = []
    if config:
        stacked = _config_value(config, "stack_layers") in ("true", "on") and _config_value(config, "dropout") == "0.0"
        variant.append("stacked layers" if stacked else "a call per layer")  # dropout between layers: never stacked
        if _config_value(config, "length_multiple") == "1":
            variant.append("widths unpadded")
    if run["name"].endswith("_compiled"):
        variant.append("compiled head")
    layout = next((v for k, v in LAYOUTS.items() if run["name"].endswith(f"_{k}")), "single")
    return {"run": run["name"], "model": run.get("model"), "precision": precision, "layout": layout,
            "variant": ", ".join(variant) or None, "pairs_per_step": run.get("micro_batch"),
            "steps_counted": run.get("untimed_steps")}


def run_figures(run: dict) -> tuple[dict, dict]:
    """(figures, ratios) of a training run: its unlogged (untimed) steps' rates, host CPU, memory, MFU."""
    cpu = run.get("cpu_ms_per_step") or {}
    host = sum(v for k, v in cpu.items() if k == "main" or k.startswith("pt_autograd")) if cpu else None
    figures = {"pairs_per_s": run.get("pairs_per_s"), "tokens_per_s": run.get("tokens_per_s"),
               "step_ms": run.get("step_ms_mean"), "timed_step_ms_median": run.get("timed_step_ms_median"),
               "host_cpu_ms_per_step": host, "peak_memory_mib": run.get("peak_memory_mib"),
               "model_tflops": run.get("model_tflops"), "dev_bleu": run.get("dev_bleu")}
    ratios = {"mfu_datasheet": run.get("mfu_datasheet"), "mfu_measured_gemm_peak": run.get("mfu_measured_gemm_peak")}
    if run.get("mfu_precision"):
        ratios["mfu_of_precision"] = run["mfu_precision"]
    return ({k: v for k, v in figures.items() if v is not None}, {k: v for k, v in ratios.items() if v is not None})


def anchor_record(anchor: dict, **meta) -> dict | None:
    if "tokens_per_s" not in anchor:
        return None  # an anchor the deadline cut
    settings = {"run": anchor["name"], "system": "the minimal PyTorch program (benchmarks/gpu/gpu_anchor.py)",
                "model": "patent" if "patent" in anchor["name"] else anchor.get("model"),
                "precision": anchor["precision"], "layout": "single", "pairs_per_step": anchor["batch"],
                "steps_counted": anchor["steps"] - anchor["warmup"]}
    figures = {"pairs_per_s": anchor["pairs_per_s"], "tokens_per_s": anchor["tokens_per_s"],
               "step_ms": anchor["step_ms_mean"], "peak_memory_mib": anchor.get("peak_memory_mib")}
    return new_record("gpu", RUN_TABLE, settings=settings, figures=figures, **meta)


def records(out_dir: Path, *, command: str, machine_name: str | None = None, note: str | None = None,
            prefix: str = "") -> list[dict]:
    """The records of one GPU check's $OUT: PREFIXgpu_check.json and PREFIXruns.tar.gz (a second call of the check
    into the same folder, e.g. `scan_`). They carry this checkout's commit and today's date: the caller sets the
    check's own on the result (`stamp`)."""
    report = json.loads((out_dir / f"{prefix}gpu_check.json").read_text())
    machine_name = machine_name or report.get("environment", {}).get("gpu")
    meta = dict(command=command, machine_name=machine_name, note=note)
    configs = run_configs(out_dir / f"{prefix}runs.tar.gz")
    out = []
    for run in report.get("runs", []):
        if "pairs_per_s" not in run:
            continue  # a run the deadline cut, or a failure: its error is in gpu_check.json
        figures, ratios = run_figures(run)
        settings = {k: v for k, v in run_settings(run, configs.get(run["name"], "")).items() if v is not None}
        out.append(new_record("gpu", RUN_TABLE, settings=settings, figures=figures, ratios=ratios, **meta))
    out += [r for r in (anchor_record(a, **meta) for a in report.get("anchors", [])) if r]
    out += measurement_records(report, meta)
    return out


def measurement_records(report: dict, meta: dict) -> list[dict]:
    """The latencies, the device profile's peaks and the profiled steps of a check, one record each."""
    out = []
    if report.get("latency"):
        lat = report["latency"]
        out.append(new_record("gpu", "latency", settings={"lstm": f"bf16, batch {lat['batch']}, hidden {lat['hidden']}"},
                              figures={k: lat[k] for k in ("op_overhead_us", "sync_us", "lstm_step_us",
                                                           "lstm_step_bwd_us")}, **meta))
    profile = report.get("profile") or {}
    if profile.get("compute"):
        peak = {p: max(g["tflops"] for g in c["gemm"]) for p, c in profile["compute"].items()}
        out.append(new_record("gpu", "device profile", settings={"what": "matmul at the model's shapes and 8192^3"},
                              figures={**{f"{p}_matmul_tflops": v for p, v in peak.items()},
                                       "copy_tb_s": profile.get("memory", {}).get("copy_tb_s"),
                                       "host_to_device_gb_s": profile.get("links", {}).get("host_to_device_gb_s")},
                              **meta))
    for key in ("profiled_patent", "profiled"):
        prof = (report.get(key) or {}).get("profile")
        if prof:
            figures = {k: prof.get(k) for k in ("wall_ms_per_step", "self_cpu_ms_per_step", "device_syncs_per_step",
                                                "device_busy_ms_per_step", "kernels_per_step")}
            ratios = {"device_busy_fraction": prof["device_busy_fraction"]} if "device_busy_fraction" in prof else {}
            out.append(new_record("gpu", "profiled step", settings={
                "run": report[key]["name"], "model": report[key].get("model"), "precision": report[key].get("precision"),
                "steps": f"{prof['steps'][0]}-{prof['steps'][1]}"},
                figures={k: v for k, v in figures.items() if v is not None}, ratios=ratios, **meta))
    return out
