"""The training runs of a GPU check's output directory, as the planner needs them: each run's config, DeepSpeed JSON,
data and the steps its steady-state time was measured over, read from DIR/gpu_check.json and DIR/runs.tar.gz
(and, where the directory holds them, a second machine's DIR/scan_gpu_check.json and DIR/scan_runs.tar.gz).

A run's measured ms per step is the check's own steady-state figure (untimed_rates of benchmarks/gpu/gpu_runs.py: the
steps after the warm-up that no metrics row timed); `steady_steps` names those steps, so that the planner predicts
the same batches. The data are the check's: small_parallel_enja prepared as the check prepares it (`--gpudata`,
where `python -m benchmarks.gpu.gpu_check --prepare-only --work .gpudata` put it) and the patent-length data
derived from it (every sentence's pieces repeated 4 times: benchmarks.gpu.gpu_patent.stretch_data_dir); each is
checked against the pairs and mean lengths the check recorded, and the batches against the tokens its metrics
counted.

Configs written by older trainers are read as those trainers ran them: no data.length_multiple (no padding) or
0 (8 on an accelerator), train.stack_layers true/false (on/off) or absent (by layer), train.tf32 absent (cuDNN's
LSTMs in TF32, matmuls in fp32: torch's defaults, which that trainer left alone).
"""
from __future__ import annotations

import json
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from data_prep.dataformat import MANIFEST
from trainer.artifacts import run_dir as run_dir_names

CHECKS = (("gpu_check.json", "runs.tar.gz", ""), ("scan_gpu_check.json", "scan_runs.tar.gz", "second machine"))
PATENT_REPEAT = 4


@dataclass
class CheckRun:
    check: str  # the check file it came from
    machine: str  # "" for the check's own machine; "second machine" for a scan run elsewhere
    name: str
    run_dir: Path
    measured_ms: float
    steps: list  # the steady-state step numbers (1-based) the measurement covers
    precision: str  # bf16 | fp16 | fp32 | tf32: what the check calls it
    legacy_tf32: bool  # a trainer that left torch's TF32 defaults alone (cuDNN in TF32, matmuls not)
    latency: dict | None  # the check's latency stage on that machine (None: not measured there)
    timing: dict = field(default_factory=dict)  # timing/rank0.json's seconds per step by instruction (timed steps)
    data: dict = field(default_factory=dict)  # what the check recorded of its data sets (pairs, mean lengths)

    @property
    def label(self) -> str:
        return f"{self.name} ({self.machine})" if self.machine else self.name


def read_check(check_dir: Path, work: Path) -> list[CheckRun]:
    """Every training run of the check's directory with a steady-state measurement and its files."""
    out = []
    latency = None
    for report_name, tar_name, machine in CHECKS:
        report_path, tar_path = check_dir / report_name, check_dir / tar_name
        if not report_path.exists():
            if not machine:
                raise FileNotFoundError(f"{report_path}: no such file (a GPU check's output directory has gpu_check.json)")
            continue
        if not tar_path.exists():
            raise FileNotFoundError(f"{tar_path}: no such file (the runs' files, beside {report_name})")
        report = json.loads(report_path.read_text())
        where = work / (tar_name.replace(".tar.gz", ""))
        if not where.exists():
            with tarfile.open(tar_path) as tar:
                tar.extractall(where, filter="data")
        own = report.get("latency")
        if not machine:
            latency = own
        warmup = report.get("warmup", report.get("log_every"))
        for run in report.get("runs", []):
            run_dir = where / "runs" / run["name"]
            if not run.get("step_ms_mean") or not (run_dir / run_dir_names.CONFIG).exists():
                continue
            rows = [json.loads(line) for line in (run_dir / run_dir_names.METRICS).read_text().splitlines()]
            steps = next((s for w in [warmup] + [r["step"] for r in rows]  # the scan's runs warm up for fewer steps
                          if len(s := steady_steps(rows, w)) == run.get("untimed_steps")), None)
            if steps is None:
                raise ValueError(f"{run_dir}: no warm-up gives the {run.get('untimed_steps')} steady steps of {report_name}")
            timing = run_dir / run_dir_names.TIMING_DIR / run_dir_names.rank_file(0)
            out.append(CheckRun(report_name, machine, run["name"], run_dir, run["step_ms_mean"], steps,
                                run.get("precision", "?"), "tf32" not in _config(run_dir).get("train", {}),
                                own if own else (None if machine else latency),
                                json.loads(timing.read_text())["seconds_per_step"] if timing.exists() else {},
                                report.get("data") or {}))
    return out


def steady_steps(rows: list[dict], warmup: int) -> list[int]:
    """The steps untimed_rates (benchmarks/gpu/gpu_runs.py) measures: those between two logged rows, the first at
    step `warmup` or later and no validation, the wall clock running forward."""
    rows = [r for r in rows if "wall_s" in r]
    steps = []
    for a, b in zip(rows, rows[1:]):
        if a["step"] < warmup or b["step"] - a["step"] < 2 or "dev_loss" in a or b["wall_s"] <= a["wall_s"]:
            continue
        steps += list(range(a["step"] + 1, b["step"]))
    return steps


def _config(run_dir: Path) -> dict:
    return yaml.safe_load((run_dir / run_dir_names.CONFIG).read_text())


def current_config(run_dir: Path, data_dir: Path, out: Path):
    """The run's config.yaml as today's trainer reads it (module docstring), data.dir moved to `data_dir`."""
    from trainer.config import load_config

    cfg = _config(run_dir)
    data, train = cfg["data"], cfg["train"]
    multiple = data.get("length_multiple", 1)
    data["length_multiple"] = 8 if multiple == 0 else multiple
    stack = train.get("stack_layers", False)
    train["stack_layers"] = {True: "on", False: "off"}.get(stack, stack)
    data["dir"] = str(data_dir)
    out.write_text(yaml.safe_dump(cfg))
    return load_config(str(out))


def data_dir_for(run: CheckRun, gpudata: Path, work: Path) -> Path:
    """Where the run's data are here: the check's prepared small_parallel_enja (`gpudata`), or the patent-length
    data derived from it in `work`; checked against what the check recorded of them."""
    from benchmarks.gpu.gpu_patent import stretch_data_dir

    name = Path(_config(run.run_dir)["data"]["dir"]).name
    if name.startswith("patent_x"):
        local = stretch_data_dir(gpudata / "enja32k_joint", work / name, int(name.removeprefix("patent_x")))
        key = "patent"
    else:
        local, key = gpudata / name, name
    if not (local / MANIFEST).exists():
        raise FileNotFoundError(f"{local}: not prepared; the check's data: python -m benchmarks.gpu.gpu_check "
                                f"--prepare-only --work {gpudata} --corpus ../shared/data/small_parallel_enja")
    recorded = run.data.get(key)
    if recorded:
        split = json.loads((local / MANIFEST).read_text())["splits"]["train"]
        pairs = split["pairs_kept"]
        src_len = split["tokens"]["src"] / pairs + 1
        if pairs != recorded["pairs"] or abs(src_len - recorded["src_len"]) > 1e-6 * recorded["src_len"] + 1e-9:
            raise ValueError(f"{local}: {pairs} pairs, mean source length {src_len:.4f} here; the check's {key} had "
                             f"{recorded['pairs']} and {recorded['src_len']:.4f}: not the same data")
    return local


def run_workload(run: CheckRun, gpudata: Path, work: Path):
    """(the planner's Workload of every step of the run up to its last measured or logged one, its layout): the
    run's own config, DeepSpeed JSON and data, the batches as the trainer cut them, checked against the tokens
    its metrics counted."""
    from trainer.parallel.deepspeed_json import load_ds_config
    from trainer.parallel.layout import LayoutSpec
    from trainer.planner import plan

    cfg = current_config(run.run_dir, data_dir_for(run, gpudata, work), work / f"{run.run_dir.parent.parent.name}_{run.name}.yaml")
    ds_path = run.run_dir / run_dir_names.DS_CONFIG
    total = (json.loads(ds_path.read_text()).get("scheduler") or {}).get("params", {}).get("total_num_steps")
    ds = load_ds_config(str(ds_path), total)
    rows = [json.loads(line) for line in (run.run_dir / run_dir_names.METRICS).read_text().splitlines()]
    last = max(max(run.steps), max(r["step"] for r in rows))
    wl = plan.workload(cfg, ds, steps=last)
    if run.legacy_tf32 and wl.precision == "fp32":
        wl.math = "cudnn_tf32"
    seen, before = {}, 0
    for r in rows:  # a resumed process (the check's resume stage) counts again from its start: not checked
        if r.get("tokens_seen", 0) < before:
            break
        seen[r["step"]] = before = r.get("tokens_seen", before)
    counted = 0
    for step in range(1, last + 1):
        counted += wl.tokens(wl.windows[step - 1])
        if step in seen and seen[step] != counted:
            raise ValueError(f"{run.run_dir}: {counted} tokens by step {step} in the batches here, {seen[step]} in its "
                             f"metrics: not the batches it trained on")
    return wl, LayoutSpec.from_ds_config(ds, 1)


def at_steps(wl, steps: list):
    """The workload of the given steps (1-based) only."""
    import copy

    out = copy.copy(wl)
    out.windows = [wl.windows[s - 1] for s in steps]
    return out
