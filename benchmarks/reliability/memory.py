"""Resident memory per rank over a long training run, with the memory fix and without it, side by side.

    python -m benchmarks.reliability.memory [--work /tmp/hybrid-nmt-bench] [--minutes 30] [--layouts single hybrid_2]
        [--variants fix=. before=c395322] [--interval 5]

For each layout (single: 1 process; hybrid_2: 2 ranks through the deepspeed launcher), every variant
trains enja-small in bf16 (ds_configs/LAYOUT.json, 1 thread per rank) for --minutes of training time
(`train.max_time_min`). All runs go AT ONCE, so they share whatever load the machine has: step times of
the variants of a layout are comparable with each other, not with another run's (on 2 cores, the 6
processes of the default share them 3 to a core). A variant is LABEL=REF[,K=V...]:
REF `.` is this checkout, any other REF a commit extracted with `git archive` into WORK/src/REF (the
default `before`, c395322, is main just before the fix); K=V are environment settings for that variant
only (e.g. `fix-glibc=.,HYBRID_NMT_ALLOCATOR=glibc`). Allocator and oneDNN settings inherited from the
caller's environment are removed first, so each variant runs with its own defaults.

Every --interval seconds a sampler reads the resident set size (psutil) of every rank process of every
run. Written to WORK: memory.json (samples, step times), memory.png (RSS per rank over time, a panel per
layout); printed: a Markdown table with RSS per rank at 1/4, 1/2 and 9/10 of the run, the growth from
1/2 to 9/10, peak RSS (metrics.jsonl's peak_rss_mb), median step time and steps done.
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import psutil

from benchmarks.common import REPO, ds_variant, metrics, prepare_enja, train_command

RANKS = {"single": 1, "hybrid_2": 2}
FOREIGN_ENV = ("LD_PRELOAD", "ONEDNN_PRIMITIVE_CACHE_CAPACITY", "DNNL_PRIMITIVE_CACHE_CAPACITY",
               "HYBRID_NMT_ALLOCATOR", "MIMALLOC_", "MALLOC_", "JE_MALLOC_CONF", "MALLOC_CONF")
DEFAULT_VARIANTS = ("fix=.", "before=c395322")


def parse_variant(text: str) -> tuple[str, str, dict]:
    label, _, rest = text.partition("=")
    ref, *settings = rest.split(",")
    if not label or not ref or any("=" not in s for s in settings):
        sys.exit(f"--variants {text!r}: expected LABEL=REF[,KEY=VALUE...]")
    return label, ref, dict(s.split("=", 1) for s in settings)


def checkout(work: Path, ref: str) -> Path:
    """REPO for `.`, else the files of commit `ref` in WORK/src/REF (git archive: the repo is not touched)."""
    if ref == ".":
        return REPO
    dest = work / "src" / re.sub(r"[^A-Za-z0-9._-]", "_", ref)
    if not (dest / "launch" / "train.py").exists():
        dest.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "-C", str(REPO), "archive", ref], capture_output=True, check=False)
        if archive.returncode != 0:
            sys.exit(f"--variants: git archive {ref}: {archive.stderr.decode().strip()}")
        subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
    return dest


def allocator_of(proc: psutil.Process) -> str:
    """The malloc a process runs with: the preloaded library's name, or glibc."""
    try:
        with open(f"/proc/{proc.pid}/maps") as f:
            maps = f.read()
    except OSError:
        return "?"
    found = re.findall(r"lib(mimalloc|jemalloc|tcmalloc\w*)\.so", maps)
    return found[0] if found else "glibc"


def clean_env(env: dict) -> dict:
    return {k: v for k, v in env.items() if not k.startswith(FOREIGN_ENV)}


def rank_processes(proc: psutil.Process) -> dict[int, psutil.Process]:
    """{rank: process} of a run: the launched process itself for one rank, else the launcher's children
    that carry --local_rank=N."""
    found = {}
    try:
        family = [proc, *proc.children(recursive=True)]
    except psutil.NoSuchProcess:
        return found
    for p in family:
        try:
            cmd = p.cmdline()
        except psutil.Error:
            continue
        ranks = [int(a.split("=", 1)[1]) for a in cmd if a.startswith("--local_rank=")]
        if ranks:
            found[ranks[0]] = p
        elif p is proc and "deepspeed.launcher.runner" not in cmd:
            found[0] = p
    return found


def run_all(work: Path, layouts: list, variants: list, minutes: float, interval: float, data: Path) -> dict:
    """Every (layout, variant) at once; returns {layout: {label: {"samples": [[t_s, rank, rss_mb]], ...}}}."""
    runs = {}
    for layout in layouts:
        for label, ref, settings in variants:
            name = f"memory_{layout}_{label}"
            cfg = ds_variant(work, layout, name, bf16={"enabled": True})
            cmd, env, run_dir = train_command(work, name, cfg, RANKS[layout], 1, 10 ** 7, data,
                                              extra=(f"train.max_time_min={minutes}",))
            log = open(work / f"{name}.log", "w")
            popen = subprocess.Popen(cmd, cwd=checkout(work, ref), env=dict(clean_env(env), **settings), stdout=log,
                                     stderr=subprocess.STDOUT)
            runs[layout, label] = {"popen": popen, "proc": psutil.Process(popen.pid), "run_dir": run_dir, "log": log,
                                   "samples": [], "ref": ref, "settings": settings, "allocator": {}}
    start = time.monotonic()
    while any(r["popen"].poll() is None for r in runs.values()):
        now = time.monotonic() - start
        for r in runs.values():
            for rank, p in rank_processes(r["proc"]).items():
                try:
                    r["samples"].append([round(now, 1), rank, round(p.memory_info().rss / 2 ** 20, 1)])
                except psutil.Error:
                    continue
                if rank not in r["allocator"] and time.time() - p.create_time() > 60:  # long after its exec
                    r["allocator"][rank] = allocator_of(p)
        time.sleep(interval)
    out = {}
    for (layout, label), r in runs.items():
        r["log"].close()
        if r["popen"].returncode != 0:
            tail = (work / f"memory_{layout}_{label}.log").read_text()[-3000:]
            sys.exit(f"{layout} {label} failed ({r['popen'].returncode}):\n{tail}")
        out.setdefault(layout, {})[label] = {"ref": r["ref"], "settings": r["settings"], "samples": r["samples"],
                                             "allocator": r["allocator"], **step_summary(r["run_dir"], RANKS[layout])}
    return out


def step_summary(run_dir: Path, ranks: int, warmup: int = 3) -> dict:
    rows = metrics(run_dir)
    timed = [r["step_time_s"] for r in rows if r["step"] > warmup and "step_time_s" in r]
    peaks = {k: max(r.get(f"rank{k}/peak_rss_mb", 0.0) for r in rows) for k in range(ranks)}
    return {"steps": rows[-1]["step"], "step_ms_median": 1000 * statistics.median(timed),
            "final_loss": rows[-1]["loss"], "peak_rss_mb": peaks}


def rss_at(samples: list, rank: int, t: float) -> float:
    """The last RSS sample of `rank` at or before t seconds."""
    before = [s[2] for s in samples if s[1] == rank and s[0] <= t]
    return before[-1] if before else float("nan")


def table(results: dict) -> str:
    """RSS per rank at 1/4, 1/2 and 9/10 of each run's sampled time (the end holds the last validation and
    save), the growth from 1/2 to 9/10, peak RSS, median step time, steps."""
    lines = ["| layout | variant | rank | malloc | RSS at 1/4 (MB) | at 1/2 | at 9/10 | growth 1/2 to 9/10 | peak (MB) "
             "| median step (ms) | steps |", "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for layout, variants in results.items():
        for label, v in variants.items():
            end = max(s[0] for s in v["samples"])
            for rank in sorted({s[1] for s in v["samples"]}):
                quarter, half, late = (rss_at(v["samples"], rank, end * f) for f in (0.25, 0.5, 0.9))
                lines.append(f"| {layout} | {label} | {rank} | {v['allocator'].get(rank, '?')} | {quarter:.0f} | "
                             f"{half:.0f} | {late:.0f} | "
                             f"{late - half:+.0f} | {v['peak_rss_mb'][rank]:.0f} | {v['step_ms_median']:.0f} | "
                             f"{v['steps']} |")
    return "\n".join(lines)


def plot(results: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(6.5 * len(results), 4.2), squeeze=False, sharey=True)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, (layout, variants) in zip(axes[0], results.items()):
        for i, (label, v) in enumerate(variants.items()):
            for rank in sorted({s[1] for s in v["samples"]}):
                pts = [(s[0] / 60, s[2] / 1024) for s in v["samples"] if s[1] == rank]
                ax.plot(*zip(*pts), color=colors[i % len(colors)], linestyle=("-", "--", ":", "-.")[rank % 4],
                        label=f"{label} rank {rank} ({v['step_ms_median']:.0f} ms/step)")
        ax.set_title(f"{layout}, bf16, enja-small")
        ax.set_xlabel("minutes")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="upper left")
    axes[0][0].set_ylabel("resident memory per rank (GB)")
    axes[0][0].set_ylim(bottom=0)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", type=Path, default=Path("/tmp/hybrid-nmt-bench"))
    p.add_argument("--minutes", type=float, default=30.0, help="training time of every run")
    p.add_argument("--layouts", nargs="+", default=list(RANKS), choices=list(RANKS))
    p.add_argument("--variants", nargs="+", default=list(DEFAULT_VARIANTS), help="LABEL=REF[,KEY=VALUE...]")
    p.add_argument("--interval", type=float, default=5.0, help="seconds between RSS samples")
    args = p.parse_args()
    variants = [parse_variant(v) for v in args.variants]
    args.work.mkdir(parents=True, exist_ok=True)
    data = prepare_enja(args.work)
    results = run_all(args.work, args.layouts, variants, args.minutes, args.interval, data)
    (args.work / "memory.json").write_text(json.dumps(results, indent=1))
    plot(results, args.work / "memory.png")
    print(table(results))
    print(f"\n{args.work / 'memory.png'}, {args.work / 'memory.json'}")


if __name__ == "__main__":
    main()
