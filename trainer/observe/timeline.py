"""Where a step's time goes, per rank: spans of every instruction, classified by how it meets other
ranks (`schedule.OPS[op].kind`), merged over all ranks.

    busy           compute instructions (kernels, the optimizer)
    waiting        receives: blocked until a peer's message is there (pipeline bubbles + transfer)
    communicating  sends, collectives (which also absorb waiting for the slowest rank), waits for
                   async collectives and pending sends
    idle           the rest of the step: between instructions and outside the program (batching,
                   the interpreter's own work)

Every step, each rank sums these (`StepRunner.kind_seconds`); every `train.log_every` steps rank 0
gathers the fractions of every rank into the metrics row (`rank{r}/busy` ...), with resident memory.
Every `train.timeline_every` steps the spans themselves are gathered and written to
RUN_DIR/timeline/: `trace.json` (Chrome / Perfetto trace events, all sampled steps, one row per
rank) and `step_XXXXXXXX.png` (a Gantt chart of that step).
"""
from __future__ import annotations

import json
import os
import resource

from trainer.artifacts.run_dir import TIMELINE_DIR, TIMELINE_TRACE, timeline_png
from trainer.parallel.schedule import KIND_CATEGORY, OPS

CATEGORY = KIND_CATEGORY
CATEGORIES = ("busy", "waiting", "communicating", "idle")
COLORS = {"busy": "#2b7bba", "waiting": "#e8a33d", "communicating": "#8e5fb5", "idle": "#d0d0d0"}
MAX_TRACE_STEPS = 50  # sampled steps kept in trace.json (the newest)


def category(op: str) -> str:
    return CATEGORY[OPS[op].kind]


def fractions(kind_seconds: dict, wall: float) -> dict:
    """{category: fraction of `wall`} from seconds per category of instructions; the rest is idle."""
    out = {c: kind_seconds.get(c, 0.0) / wall if wall > 0 else 0.0 for c in CATEGORIES[:3]}
    out["idle"] = max(0.0, 1.0 - sum(out.values()))
    return out


def memory_mb() -> dict:
    """Resident memory of this process now and its peak, in MB."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    try:
        with open("/proc/self/statm") as f:
            rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2 ** 20
    except OSError:
        rss = peak
    return {"rss_mb": round(rss, 1), "peak_rss_mb": round(peak, 1)}


def rank_columns(per_rank: list[dict]) -> dict:
    """Flat metrics keys for every rank's fractions and memory: rank0/busy, rank0/rss_mb, ..."""
    row = {}
    for rank, values in enumerate(per_rank):
        for k, v in values.items():
            row[f"rank{rank}/{k}"] = round(v, 4) if isinstance(v, float) else v
    return row


class TimelineWriter:
    """Rank 0: the merged trace of the sampled steps and a Gantt PNG per sampled step."""

    def __init__(self, run_dir: str):
        self.run_dir, self.dir = run_dir, os.path.join(run_dir, TIMELINE_DIR)
        self.events: list[list[dict]] = []

    def write(self, step: int, spans_by_rank: list[list[tuple]], labels: list[str]) -> str:
        """spans_by_rank[r]: (op, start_s, end_s) relative to the step's start on rank r's clock
        (ranks start the step together: each step begins after the previous one's collectives)."""
        from data_prep.dataformat import files
        from trainer.artifacts import run_files

        events = []
        for rank, spans in enumerate(spans_by_rank):
            events.append({"name": "thread_name", "ph": "M", "pid": step, "tid": rank, "args": {"name": labels[rank]}})
            for op, start, end in spans:
                events.append({"name": op, "cat": category(op), "ph": "X", "pid": step, "tid": rank,
                               "ts": round(start * 1e6, 1), "dur": round((end - start) * 1e6, 1)})
        events.append({"name": "process_name", "ph": "M", "pid": step, "args": {"name": f"step {step}"}})
        self.events = (self.events + [events])[-MAX_TRACE_STEPS:]
        run_files.make_dirs(self.run_dir, TIMELINE_DIR)
        with files.replace(os.path.join(self.dir, TIMELINE_TRACE), "the timeline trace", own=True) as f:
            f.write(json.dumps({"traceEvents": [e for step_events in self.events for e in step_events],
                                "displayTimeUnit": "ms"}))
        png = os.path.join(self.dir, timeline_png(step))
        with run_files.open_write(self.run_dir, f"{TIMELINE_DIR}/{timeline_png(step)}", binary=True) as f:
            gantt(spans_by_rank, labels, f"step {step}", f)
        return png


def gantt(spans_by_rank: list[list[tuple]], labels: list[str], title: str, path) -> None:
    """One bar row per rank, each instruction a box colored by its category; gaps are idle. `path`: a
    file name or a file opened for writing bytes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    ranks = len(spans_by_rank)
    end = max((e for spans in spans_by_rank for _, _, e in spans), default=0.0)
    fig, ax = plt.subplots(figsize=(12, 1.0 + 0.6 * ranks))
    for rank, spans in enumerate(spans_by_rank):
        ax.broken_barh([(0, end * 1e3)], (rank - 0.4, 0.8), facecolors=COLORS["idle"])
        bars = [(s * 1e3, (e - s) * 1e3) for _, s, e in spans]
        ax.broken_barh(bars, (rank - 0.4, 0.8), facecolors=[COLORS[category(op)] for op, _, _ in spans],
                       edgecolor="white", linewidth=0.3)
        for op, s, e in spans:  # name the boxes wide enough to hold a label
            if e - s > 0.06 * end:
                ax.text((s + e) / 2 * 1e3, rank, op, ha="center", va="center", fontsize=7, color="white")
    ax.set_yticks(range(ranks), labels)
    ax.invert_yaxis()
    ax.set_xlabel("ms since the start of the step")
    ax.set_title(title)
    ax.legend(handles=[Patch(color=COLORS[c], label=c) for c in CATEGORIES], loc="upper left",
              bbox_to_anchor=(1.01, 1.0), frameon=False, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110, format="png")
    plt.close(fig)
