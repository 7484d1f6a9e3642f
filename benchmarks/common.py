"""Shared by the benchmarks, once: the checkout and the shared data, this CPU's name, a free port, the
enja-small data, running the real training CLI, reading its metrics and timing, this machine's GEMM peak."""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from data_prep.dataformat import MANIFEST
from trainer.artifacts.run_dir import CONFIG, DS_CONFIG, METRICS, TIMING_DIR
from trainer.parallel.ports import free_port  # noqa: F401  (the benchmarks' MASTER_PORT, imported from here)
REPO = Path(__file__).resolve().parents[1]
ENJA = REPO.parent / "shared" / "data" / "small_parallel_enja"
VOCAB_SIZE = 8000  # per side, for enja-small and for the peers measured against it


def cpu_model() -> str:
    """The processor's name as the kernel reports it (lscpu's "Model name"), and the usable cores."""
    name = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{name} ({len(os.sched_getaffinity(0))} cores)"


def prepare_enja(work: Path, raw_ja: bool = False, model_type: str = "bpe", pretokenize: str = "none") -> Path:
    """small_parallel_enja -> DATA_DIR with an 8k BPE SentencePiece vocabulary per side (a unigram
    model of this pre-tokenized corpus tops out at ~3.9k pieces), once per work directory. `raw_ja`:
    the Japanese side with its word-separating spaces removed first (as real patent text is), in
    WORK/enja_raw_text/, prepared into WORK/enja_raw (WORK/enja_raw_unigram with a unigram model).
    `pretokenize`: prepare's --pretokenize; "none" (pieces from the text as it is: what every benchmark
    measured before the option existed) or "auto" (Japanese pieces within MeCab's words; WORK/*_words)."""
    data = work / ("enja_raw" if raw_ja else "enja_small")
    if model_type != "bpe":
        data = data.with_name(f"{data.name}_{model_type}")
    if pretokenize != "none":
        data = data.with_name(f"{data.name}_words")
    manifest = data / MANIFEST
    if manifest.exists() and json.loads(manifest.read_text()).get("vocab", {}).get("byte_fallback"):
        return data  # (a DATA_DIR from before byte fallback is prepared again)
    if not ENJA.exists():
        sys.exit(f"{ENJA}: not found (the shared data folder beside the checkout)")
    args = ["--format", "moses", "--out", data, "--vocab-size", str(VOCAB_SIZE), "--model-type", model_type,
            "--pretokenize", pretokenize]
    for split in ("train", "dev", "test"):
        args += [f"--{split}-src", ENJA / f"{split}.en", f"--{split}-tgt", raw_enja(work, split) if raw_ja else
                 ENJA / f"{split}.ja"]
    subprocess.run([sys.executable, "-m", "data_prep.prepare", *map(str, args)], cwd=REPO, check=True)
    return data


def raw_enja(work: Path, split: str) -> Path:
    """WORK/enja_raw_text/SPLIT.ja: small_parallel_enja's Japanese without the spaces between words."""
    path = work / "enja_raw_text" / f"{split}.ja"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        text = (ENJA / f"{split}.ja").read_text(encoding="utf-8")
        path.write_text("\n".join(line.replace(" ", "") for line in text.split("\n")), encoding="utf-8")
    return path


def ds_variant(work: Path, base: str, name: str, **changes) -> Path:
    """A copy of ds_configs/BASE.json with top-level keys (None: removed) and `parallel_layout` keys changed."""
    cfg = json.loads((REPO / "ds_configs" / f"{base}.json").read_text())
    layout = changes.pop("layout", {})
    cfg.update(changes)
    for key in [k for k, v in changes.items() if v is None]:  # None: drop the key (e.g. no LR scheduler)
        del cfg[key]
    cfg["parallel_layout"] = {**cfg["parallel_layout"], **layout}
    path = work / f"{name}.json"
    path.write_text(json.dumps(cfg, indent=1))
    return path


def own_process_group() -> dict:
    """Popen keywords for a child in a process group of its own (`os.killpg(child.pid, ...)` ends it and all it
    started) but in this process's session. Not `start_new_session`: where the kernel groups tasks by session for
    scheduling (autogroup, on in most distributions: /proc/sys/kernel/sched_autogroup_enabled), a new session is a
    new group that gets an equal share of a busy core, whatever its nice value; a check started at nice 19 took
    half the machine from the tests that way (docs/testing.md). Its stdin is not the terminal."""
    group = {"process_group": 0} if sys.version_info >= (3, 11) else {"preexec_fn": os.setpgrp}
    return {"stdin": subprocess.DEVNULL, **group}


def train_command(work: Path, name: str, ds_config: Path, ranks: int, threads: int, steps: int, data: Path,
                  config: str = "trainer/configs/enja_small.yaml", extra: tuple = ()) -> tuple[list, dict, Path]:
    """The command (run from the checkout's root), environment and run directory of a training run
    of launch/train.py (through the deepspeed launcher when ranks > 1); an old run directory is removed."""
    from trainer.config import merge_overrides  # a later key=value replaces an earlier one: one key, one value

    run_dir = work / "runs" / name
    args = ["launch/train.py", "--deepspeed_config", str(ds_config), "--config", config, f"data.dir={data}",
            f"run.dir={run_dir}", f"train.max_steps={steps}", f"train.eval_every={10 * steps}",
            "train.log_every=1", f"train.threads={threads}", "decode.dev_max_sentences=32",
            "logging.wandb_mode=disabled", "logging.progress=false"]
    args = merge_overrides(args, extra)
    cmd = ([sys.executable, *args] if ranks == 1 else
           [sys.executable, "-m", "deepspeed.launcher.runner", "--num_gpus", str(ranks),
            "--master_port", str(free_port()), *args])
    if run_dir.exists():
        subprocess.run(["rm", "-rf", str(run_dir)], check=True)
    return cmd, dict(os.environ, WANDB_MODE="disabled", PYTHONUNBUFFERED="1"), run_dir


def train(work: Path, name: str, ds_config: Path, ranks: int, threads: int, steps: int, data: Path,
          config: str = "trainer/configs/enja_small.yaml", extra: tuple = (), timeout: int = 3600) -> dict:
    """Run launch/train.py (through the deepspeed launcher when ranks > 1) and summarise it."""
    cmd, env, run_dir = train_command(work, name, ds_config, ranks, threads, steps, data, config, extra)
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        sys.exit(f"{name} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    return summarise(run_dir)


def start_train(work: Path, name: str, ds_config: Path, ranks: int, threads: int, steps: int, data: Path,
                config: str = "trainer/configs/enja_small.yaml", extra: tuple = ()) -> tuple[subprocess.Popen, Path]:
    """Start a training run like `train` without waiting (runs meant to share the machine); `wait_train`
    finishes it."""
    cmd, env, run = train_command(work, name, ds_config, ranks, threads, steps, data, config, extra)
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True), run


def wait_train(label: str, proc: subprocess.Popen, run_dir: Path, timeout: int = 3600,
               last_step: int | None = None) -> dict:
    """Wait for a run of `start_train` and summarise it, up to `last_step` (exits with its stderr if it failed)."""
    _, err = proc.communicate(timeout=timeout)
    if proc.returncode:
        sys.exit(f"{label} failed ({proc.returncode}):\n{err[-3000:]}")
    return summarise(run_dir, last_step=last_step)


def metrics(run_dir: Path) -> list[dict]:
    """RUN_DIR/metrics.jsonl, one dict per logged row."""
    return [json.loads(line) for line in (run_dir / METRICS).read_text().splitlines()]


def summarise(run_dir: Path, warmup: int = 3, last_step: int | None = None) -> dict:
    """Throughput over the logged steps after `warmup` (up to `last_step`), the per-rank seconds per step of
    every instruction (RUN_DIR/timing/rank*.json) and, as `cpu`, each rank's CPU ms per step by thread."""
    rows = metrics(run_dir)
    timed = [r for r in rows if r["step"] > warmup and (last_step is None or r["step"] <= last_step)]
    seconds = sum(r["step_time_s"] for r in timed)
    tokens = sum(r["tokens_per_s"] * r["step_time_s"] for r in timed)
    pairs = sum(r["sentences_per_s"] * r["step_time_s"] for r in timed)
    timing, cpu = {}, {}
    for path in sorted((run_dir / TIMING_DIR).glob("rank*.json")):
        t = json.loads(path.read_text())
        timing[t["rank"]] = t["seconds_per_step"]
        cpu[t["rank"]] = t.get("cpu_ms_per_step", {})
    return {"cpu": cpu, "steps": len(timed), "step_ms_median": 1000 * statistics.median(r["step_time_s"] for r in timed),
            "step_ms_mean": 1000 * seconds / len(timed), "pairs_per_s": pairs / seconds,
            "tokens_per_s": tokens / seconds, "final_loss": rows[-1]["loss"], "timing": timing}


def rank_skew(rows: list[dict], warmup: int = 3) -> dict | None:
    """How far apart a run's ranks are step by step (its metrics rows after `warmup`; None for one rank): the
    mean spread of the ranks' busy ms (most - least busy; for two ranks |rank 0 - rank 1|), and each rank's
    communicating + waiting ms per step beside the step's least of them (the rank that arrived last waits least:
    about what the transfers themselves take; the rest is ranks waiting for each other). A simulation of mean
    costs prices the batches' imbalance between the ranks, not this machine's step-to-step noise."""
    rows = [r for r in rows if r["step"] > warmup]
    ranks = sum(1 for k in rows[0] if k.startswith("rank") and k.endswith("/busy")) if rows else 0
    if ranks < 2:
        return None
    ms = lambda r, k, what: 1000 * r["step_time_s"] * sum(r[f"rank{k}/{w}"] for w in what)  # noqa: E731
    busy = [[ms(r, k, ("busy",)) for k in range(ranks)] for r in rows]
    comm = [[ms(r, k, ("communicating", "waiting")) for k in range(ranks)] for r in rows]
    return {"busy_diff_ms": statistics.mean(max(b) - min(b) for b in busy),
            "comm_wait_ms": [statistics.mean(c[k] for c in comm) for k in range(ranks)],
            "comm_wait_least_ms": statistics.mean(min(c) for c in comm)}


def replica_lengths(run_dir: Path, warmup: int = 3) -> dict | None:
    """What each replica of a data-parallel run (mode data) was handed, step by step: the trainer's batching and
    cutter replayed from the run's own config.yaml, ds_config.json and data (trainer.planner.plan.workload,
    trainer.parallel.cut.cut_replica). Per replica, the mean over the steps after `warmup` of its padded target
    and source positions (the longest row of its slice: the decoder's and the encoder's time steps), of its rows
    and of its real source + target tokens. With two replicas, beside each rank's busy ms (metrics.jsonl): the
    correlation of rank 1's busy ms minus rank 0's with its padded target positions minus rank 0's, and the
    least-squares ms per position (with an intercept). None for a run that is not data-parallel, or whose files
    or data are gone."""
    import numpy as np

    from trainer.config import load_config
    from trainer.parallel.layout import layout_world
    from trainer.parallel.cut import cut_replica
    from trainer.parallel.layout import LayoutSpec
    from trainer.planner.plan import workload

    if not all((run_dir / name).is_file() for name in (DS_CONFIG, CONFIG, METRICS)):
        return None
    ds = json.loads((run_dir / DS_CONFIG).read_text())
    spec = LayoutSpec.from_ds_config(ds, layout_world(ds)) if "parallel_layout" in ds else None
    if spec is None or spec.mode != "data" or spec.num_dp < 2:
        return None
    rows = [r for r in metrics(run_dir) if r["step"] > warmup and "rank0/busy" in r]
    if not rows:
        return None
    try:
        work = workload(load_config(str(run_dir / CONFIG)), ds, steps=max(r["step"] for r in rows))
    except (FileNotFoundError, ValueError):
        return None
    shapes = []  # per step and replica: target positions, source positions, rows, tokens (over its micro-batches)
    for r in rows:
        cuts = [[cut_replica(spec, b, k).replica for b in work.windows[r["step"] - 1]] for k in range(spec.num_dp)]
        shapes.append([(sum(c.tgt_in.shape[1] for c in cs), sum(c.src.shape[1] for c in cs), sum(c.size for c in cs),
                        sum(c.src_tokens + c.tgt_tokens for c in cs)) for cs in cuts])
    a = np.asarray(shapes, dtype=float)  # (steps, replicas, 4)
    out = {"tgt_positions": a[:, :, 0].mean(0).tolist(), "src_positions": a[:, :, 1].mean(0).tolist(),
           "rows": a[:, :, 2].mean(0).tolist(), "tokens": a[:, :, 3].mean(0).tolist(), "steps": len(rows)}
    if spec.num_dp == 2 and len(rows) > 2:
        busy = np.asarray([[1000 * r["step_time_s"] * r[f"rank{k}/busy"] for k in range(2)] for r in rows])
        d_busy, d_tgt = busy[:, 1] - busy[:, 0], a[:, 1, 0] - a[:, 0, 0]
        if d_tgt.std() > 0 and d_busy.std() > 0:
            slope, intercept = np.polyfit(d_tgt, d_busy, 1)
            out.update(busy_diff_mean_ms=float(d_busy.mean()), corr=float(np.corrcoef(d_tgt, d_busy)[0, 1]),
                       ms_per_position=float(slope), intercept_ms=float(intercept))
    return out


RANK_CATEGORIES = ("busy", "waiting", "communicating", "idle")


def rank_fractions(run_dir: Path, warmup: int = 3) -> dict:
    """Mean per-rank fractions of the step (busy / waiting / communicating / idle) over the logged rows
    after the warm-up, the median model GFLOP per step and the largest peak RSS of any rank."""
    rows = [r for r in metrics(run_dir) if r["step"] > warmup]
    out = {}
    for key in rows[0]:
        if key.startswith("rank") and key.split("/")[1] in RANK_CATEGORIES:
            rank, cat = key[4:].split("/")
            out.setdefault(int(rank), {})[cat] = statistics.mean(r[key] for r in rows if key in r)
    gflop = statistics.median(r["model_gflop"] for r in rows)
    return {"ranks": out, "model_gflop": gflop, "peak_rss_mb": max(v for r in rows for k, v in r.items()
                                                                  if k.endswith("/peak_rss_mb"))}


COMPUTE = ("forward", "backward", "head", "optimizer_step", "weight_grads")
P2P_WAIT = ("recv_forward", "recv_backward", "recv_shard", "gather_grad")
P2P_SEND = ("send_forward", "send_backward", "scatter_shard", "send_shard_grad", "flush_sends")
COLLECTIVE = ("reduce_metrics", "reduce_grads", "reduce_head_grads", "wait_head_grads", "broadcast_head")


def breakdown(seconds_per_step: dict) -> dict:
    """ms per step per category: compute, waiting in receives (transfer + idle bubbles), sends,
    collectives (they also absorb waiting for the slowest rank)."""
    cat = lambda names: 1000 * sum(seconds_per_step.get(n, 0.0) for n in names)  # noqa: E731
    out = {"compute": cat(COMPUTE), "recv_wait": cat(P2P_WAIT), "send": cat(P2P_SEND),
           "collectives": cat(COLLECTIVE)}
    out.update({f"{n}": 1000 * seconds_per_step.get(n, 0.0) for n in COMPUTE})
    out["backward"] += out.pop("weight_grads")  # deferred weight gradients (defer_weight_grads) are backward
    return out


def matmul_peak(work: Path) -> dict:
    """This machine's measured GEMM peak, {"fp32": {"1": flop/s, "2": ...}, "bf16": {...}, "cpu": ...}, from
    WORK/peak.json (python -m benchmarks.micro.peak); measured now when that file is missing or was measured on
    another CPU."""
    path = work / "peak.json"
    if path.exists() and _read_peak(path).get("cpu") != cpu_model():
        path.unlink()  # ours, from another machine kind
    if not path.exists():
        subprocess.run([sys.executable, "-m", "benchmarks.micro.peak", "--work", str(work)], cwd=REPO, check=True)
    return _read_peak(path)


def _read_peak(path: Path) -> dict:
    try:
        peak = json.loads(path.read_text())
        for precision in ("fp32", "bf16"):
            for threads in ("1", "2"):
                if not float(peak[precision][threads]) > 0:
                    raise ValueError(f"{precision}.{threads} = {peak[precision][threads]}")
    except (ValueError, KeyError, TypeError) as e:
        sys.exit(f"{path}: not a peak file of benchmarks/micro/peak.py ({type(e).__name__}: {e}); delete it to measure again")
    return peak
