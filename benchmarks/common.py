"""Shared by the benchmarks: prepare the enja-small data, run the real training CLI, read its numbers."""
from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ENJA = REPO.parent / "shared" / "data" / "small_parallel_enja"


def prepare_enja(work: Path) -> Path:
    """small_parallel_enja -> DATA_DIR with an 8k BPE SentencePiece vocabulary per side (a unigram
    model of this corpus tops out at ~3.5k pieces), once per work directory."""
    data = work / "enja_small"
    if (data / "manifest.json").exists():
        return data
    if not ENJA.exists():
        sys.exit(f"{ENJA}: not found (the shared data folder beside the checkout)")
    args = ["--format", "moses", "--out", data, "--vocab-size", "8000", "--model-type", "bpe"]
    for split in ("train", "dev", "test"):
        args += [f"--{split}-src", ENJA / f"{split}.en", f"--{split}-tgt", ENJA / f"{split}.ja"]
    subprocess.run([sys.executable, "-m", "data_prep.prepare", *map(str, args)], cwd=REPO, check=True)
    return data


def ds_variant(work: Path, base: str, name: str, **changes) -> Path:
    """A copy of ds_configs/BASE.json with top-level keys and `parallel_layout` keys changed."""
    cfg = json.loads((REPO / "ds_configs" / f"{base}.json").read_text())
    layout = changes.pop("layout", {})
    cfg.update(changes)
    cfg["parallel_layout"] = {**cfg["parallel_layout"], **layout}
    path = work / f"{name}.json"
    path.write_text(json.dumps(cfg, indent=1))
    return path


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def train_command(work: Path, name: str, ds_config: Path, ranks: int, threads: int, steps: int, data: Path,
                  config: str = "trainer/configs/enja_small.yaml", extra: tuple = ()) -> tuple[list, dict, Path]:
    """The command (run from the checkout's root), environment and run directory of a training run
    of launch/train.py (through the deepspeed launcher when ranks > 1); an old run directory is removed."""
    run_dir = work / "runs" / name
    args = ["launch/train.py", "--deepspeed_config", str(ds_config), "--config", config, f"data.dir={data}",
            f"run.dir={run_dir}", f"train.max_steps={steps}", f"train.eval_every={10 * steps}",
            "train.log_every=1", f"train.threads={threads}", "decode.dev_max_sentences=32",
            "logging.wandb_mode=disabled", "logging.progress=false", *extra]
    cmd = ([sys.executable, *args] if ranks == 1 else
           [sys.executable, "-m", "deepspeed.launcher.runner", "--num_gpus", str(ranks),
            "--master_port", str(_port()), *args])
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


def summarise(run_dir: Path, warmup: int = 3) -> dict:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    timed = [r for r in rows if r["step"] > warmup]
    seconds = sum(r["step_time_s"] for r in timed)
    tokens = sum(r["tokens_per_s"] * r["step_time_s"] for r in timed)
    pairs = sum(r["sentences_per_s"] * r["step_time_s"] for r in timed)
    timing = {}
    for path in sorted((run_dir / "timing").glob("rank*.json")):
        t = json.loads(path.read_text())
        timing[t["rank"]] = t["seconds_per_step"]
    return {"steps": len(timed), "step_ms_median": 1000 * statistics.median(r["step_time_s"] for r in timed),
            "step_ms_mean": 1000 * seconds / len(timed), "pairs_per_s": pairs / seconds,
            "tokens_per_s": tokens / seconds, "final_loss": rows[-1]["loss"], "timing": timing}


COMPUTE = ("forward", "backward", "head", "optimizer_step")
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
    return out
