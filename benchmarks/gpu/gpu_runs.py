"""The GPU check's training runs (benchmarks/gpu/gpu_check.py): one run of the real training CLI in a process
group of its own, which nothing leaves behind (a timeout, the stage's alarm, SIGTERM to the check: the
group is killed in a `finally`), its peak memory, what its metrics say, and the files brought back.

Throughput comes from the steps no metrics row logged: on a GPU a logged step times every instruction,
which synchronises the device at each one (train.step_timing=auto), so its own step_time_s is slow by
design. Every row carries running totals (wall_s, sentences_seen, tokens_seen: trainer/observe/run_totals.py);
`untimed_rates` takes the steps between two rows from them. The runs that measure speed are neither
profiled nor logged to wandb (each of those has a run of its own).
"""
from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from benchmarks.common import REPO, ds_variant, free_port, own_process_group, summarise
from trainer.artifacts.run_dir import CONFIG, DS_CONFIG, METRICS, PROFILE_DIR, TIMELINE_DIR, TIMING_DIR, WANDB_DIR

NVIDIA_SMI_TIMEOUT_S = 10
RUN_FILES = (METRICS, CONFIG, DS_CONFIG, TIMING_DIR, PROFILE_DIR, TIMELINE_DIR)  # what runs.tar.gz keeps of a run


def log(msg: str) -> None:
    print(f"gpu_check: {msg}", flush=True)


def mecab_importable() -> bool:
    try:
        import MeCab  # noqa: F401
        import ipadic  # noqa: F401
    except Exception:  # noqa: BLE001 - any failure means: not usable here
        return False
    return True


# ---- peak memory ----
def nvidia_smi(*query: str) -> str:
    """nvidia-smi's CSV answer ('' when it fails or hangs: it is given NVIDIA_SMI_TIMEOUT_S)."""
    try:
        return subprocess.run(["nvidia-smi", *query, "--format=csv,noheader,nounits"], capture_output=True,
                              text=True, timeout=NVIDIA_SMI_TIMEOUT_S).stdout
    except (subprocess.TimeoutExpired, OSError):
        return ""


class MemoryWatch:
    """Peak memory of a process while it runs: its GPU memory per nvidia-smi (or, when per-process
    numbers are not shown, the whole GPU's use), its resident set size on CPU."""

    def __init__(self, pid: int, device: str):
        self.pid, self.device, self.peak_mib, self.seen_on_gpu = pid, device, 0.0, False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _sample(self) -> float:
        if self.device == "cpu":
            import psutil

            try:
                p = psutil.Process(self.pid)
                return sum(q.memory_info().rss for q in [p, *p.children(recursive=True)]) / 2 ** 20
            except psutil.Error:
                return 0.0
        for line in nvidia_smi("--query-compute-apps=pid,used_memory").splitlines():
            pid, _, mib = line.partition(",")
            if pid.strip() == str(self.pid):
                self.seen_on_gpu = True
                return float(mib)
        total = nvidia_smi("--query-gpu=memory.used").split()
        return float(total[0]) if total else 0.0

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.peak_mib = max(self.peak_mib, self._sample())
            self._stop.wait(0.5)

    def stop(self) -> float:
        self._stop.set()
        self._thread.join(timeout=NVIDIA_SMI_TIMEOUT_S + 5)  # a sample in flight ends within its timeout
        return self.peak_mib


# ---- one run ----
def kill_group(proc: subprocess.Popen) -> None:
    """The process and everything it started (its own process group), at once; then reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        log(f"pid {proc.pid}: still there 30 s after SIGKILL")


def run_group(cmd: list, log_path: Path, timeout: float, device: str, env: dict) -> tuple[int | None, bool, MemoryWatch]:
    """`cmd` in a process group of its own (`own_process_group`), its output to `log_path` as it comes: (exit
    code, timed out, its memory watch, stopped). Whatever ends the wait (its timeout, an exception such as the
    stage's alarm or the SystemExit of SIGTERM) kills the whole group first, so nothing of it stays on the device."""
    with open(log_path, "w") as sink:
        proc = subprocess.Popen([str(c) for c in cmd], cwd=REPO, env=env, stdout=sink, stderr=subprocess.STDOUT,
                                text=True, **own_process_group())
        watch = MemoryWatch(proc.pid, device)
        timed_out = False
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            if proc.poll() is None:
                kill_group(proc)
            watch.stop()
    return proc.returncode, timed_out, watch


def train_command(work: Path, device: str, name: str, precision: str, overrides: dict, micro: int, data: Path,
                  steps: int, dev_sentences: int, log_every: int, wandb: bool, resume: bool,
                  layout: dict | None, extra: tuple) -> tuple[list, Path]:
    changes = {"layout": layout} if layout else {}
    if precision == "fp16":  # DeepSpeed's dynamic loss scale (cuDNN's persistent LSTM kernel is fp16's)
        changes["fp16"] = {"enabled": True, "loss_scale": 0, "initial_scale_power": 16}
    ds = ds_variant(work, "single", name, train_micro_batch_size_per_gpu=micro, bf16={"enabled": precision == "bf16"},
                    **changes)
    run_dir = work / "runs" / name
    if not resume:
        shutil.rmtree(run_dir, ignore_errors=True)
    from trainer.config import merge_overrides  # a later key=value replaces an earlier one: one key, one value

    ranks = (layout or {}).get("num_pp", 1) * (layout or {}).get("num_dp", 1)
    launcher = ([sys.executable, "-m", "deepspeed.launcher.runner", "--num_gpus", str(ranks), "--master_port",
                 str(free_port())] if ranks > 1 else [sys.executable])  # several ranks on one GPU: they share it
    cmd = [*launcher, "launch/train.py", "--deepspeed_config", str(ds), "--config", "trainer/configs/enja_small.yaml",
           f"data.dir={data}", f"run.dir={run_dir}", f"train.max_steps={steps}", f"train.eval_every={steps}",
           f"train.log_every={log_every}", f"decode.dev_max_sentences={dev_sentences}", "logging.progress=false",
           f"logging.wandb_mode={'offline' if wandb else 'disabled'}",
           *[f"model.{k}={v}" for k, v in overrides.items()], *(["train.threads=1"] if device == "cpu" else []),
           *([] if mecab_importable() else ["decode.bleu_tokenize=char"]),
           *(["train.resume=auto"] if resume else [])]
    return merge_overrides(cmd, extra), run_dir


def train_run(work: Path, device: str, name: str, precision: str, overrides: dict, micro: int, data: Path,
              steps: int, dev_sentences: int, wandb: bool, resume: bool = False, timeout: int = 90,
              layout: dict | None = None, extra: tuple = (), log_every: int = 10, warmup: int = 10) -> dict:
    """One run of the training CLI (with `resume`: continue the run of that name to `steps`), killed after
    `timeout` seconds; its output goes to WORK/NAME.log as it comes. Rows every `log_every` steps; the
    throughput from the unlogged steps after step `warmup`."""
    cmd, run_dir = train_command(work, device, name, precision, overrides, micro, data, steps, dev_sentences,
                                 log_every, wandb, resume, layout, extra)
    env = dict(os.environ, PYTHONUNBUFFERED="1", **({} if wandb else {"WANDB_MODE": "disabled"}))
    log(f"{name}: {' '.join(map(str, cmd[1:]))}")
    start = time.time()
    log_path = work / f"{name}{'_resume' if resume else ''}.log"
    code, timed_out, watch = run_group(cmd, log_path, timeout, device, env)
    out = log_path.read_text(errors="replace")
    result = {"name": name, "exit": code, "wall_s": round(time.time() - start, 1), "peak_memory_mib": watch.peak_mib}
    if timed_out:
        log(f"{name}: KILLED after its {timeout}s timeout; the end of its output:\n{out[-3000:]}")
        return {**result, "error": f"timeout after {timeout}s", "timeout": True}
    if code != 0:
        log(f"{name}: FAILED (exit {code}); the end of its output:\n{out[-4000:]}")
        return {**result, "error": out[-4000:]}
    result["device"] = device_seen(out)
    wrong = wrong_device(out, device)
    if wrong:
        result["error"] = wrong
    if device == "cuda" and not watch.seen_on_gpu:
        result["note"] = "nvidia-smi listed no per-process memory; peak is the whole GPU's use"
    result.update(run_results(run_dir, out, wandb, resume, warmup))
    return result


# ---- what the run printed and wrote ----
_DEVICE_LINE = re.compile(r"^device: ([a-z]+)(?::\d+)?\b", re.M)


def device_seen(out: str) -> str | None:
    """The device type the trainer says it computes on (its `device: ...` line at start), or None."""
    m = _DEVICE_LINE.search(out)
    return m.group(1) if m else None


def wrong_device(out: str, requested: str) -> str | None:
    """Why the run did not compute on the requested device type (e.g. DeepSpeed fell back to its CPU
    accelerator), or None."""
    seen = device_seen(out)
    if seen is None:
        return "the trainer printed no 'device: ...' line: where it computed is unknown"
    if seen != requested:
        line = next(l for l in out.splitlines() if l.startswith("device: "))
        return f"the trainer computed on {seen}, not {requested} ({line!r})"
    return None


def untimed_rates(rows: list[dict], warmup: int) -> dict | None:
    """Pairs/s, tokens/s and mean step of the steps between two logged rows (neither timed nor
    profiled), from the rows' running totals; only windows that start at step `warmup` or later, and
    none after a validation (its row has dev_loss: the validation and checkpoint ran after its wall_s).
    None without such a window."""
    rows = [r for r in rows if "wall_s" in r]
    seconds = pairs = tokens = steps = 0
    for a, b in zip(rows, rows[1:]):
        between = b["step"] - a["step"] - 1
        if a["step"] < warmup or between < 1 or "dev_loss" in a or b["wall_s"] <= a["wall_s"]:
            continue  # (a resumed process starts its clock again)
        own_pairs = round(b["sentences_per_s"] * b["step_time_s"])
        own_tokens = round(b["tokens_per_s"] * b["step_time_s"])
        seconds += b["wall_s"] - b["step_time_s"] - a["wall_s"]
        pairs += b["sentences_seen"] - own_pairs - a["sentences_seen"]
        tokens += b["tokens_seen"] - own_tokens - a["tokens_seen"]
        steps += between
    if not steps or seconds <= 0:
        return None
    return {"untimed_steps": steps, "pairs_per_s": pairs / seconds, "tokens_per_s": tokens / seconds,
            "step_ms_mean": 1000 * seconds / steps}


def run_results(run_dir: Path, out: str, wandb: bool, resume: bool, warmup: int) -> dict:
    """What a finished run measured: speed (untimed steps; the logged steps' own, timed, for reference),
    first loss, dev BLEU, the profile window, wandb, the resume."""
    rows = [json.loads(line) for line in (run_dir / METRICS).read_text().splitlines()]
    timed = summarise(run_dir, warmup=1)
    result = {"timed_step_ms_median": timed["step_ms_median"], "timed_pairs_per_s": timed["pairs_per_s"],
              "first_loss": rows[0]["loss"], "dev_bleu": rows[-1].get("dev_bleu"),
              "finite": all(r["loss"] is not None and math.isfinite(r["loss"]) for r in rows),
              "cpu_ms_per_step": timed["cpu"].get(0, {}), "rows": rows}
    rates = untimed_rates(rows, warmup)
    if rates:
        result.update(rates)
    for prof in sorted((run_dir / PROFILE_DIR).glob("rank*.json")):
        p = json.loads(prof.read_text())
        result["profile"] = {k: p[k] for k in ("steps", "wall_ms_per_step", "self_cpu_ms_per_step",
                                               "device_syncs_per_step", "device_sync_sites", "device_busy_ms_per_step",
                                               "device_busy_fraction", "kernels_per_step") if k in p}
    if wandb:
        result["wandb_offline_run"] = any((run_dir / WANDB_DIR).glob("offline-run-*"))
    if resume:
        result.update(resumed="resume: from" in out, logged_steps=[r["step"] for r in rows])
    return result


def pack_runs(work: Path, out: Path) -> None:
    """OUT/runs.tar.gz: every run's logs, metrics, timing and profile files, no checkpoints (rewritten
    after every run and when the check ends however it ends, so what ran comes back)."""
    import tarfile

    tmp = out / "runs.tar.gz.tmp"
    with tarfile.open(tmp, "w:gz") as tar:
        for log_file in sorted(work.glob("*.log")):
            tar.add(log_file, arcname=f"logs/{log_file.name}")
        for run_dir in sorted((work / "runs").glob("*")):
            for name in RUN_FILES:
                if (run_dir / name).exists():
                    tar.add(run_dir / name, arcname=f"runs/{run_dir.name}/{name}")
    os.replace(tmp, out / "runs.tar.gz")


def portability(run_dir: Path, data: Path, timeout: int = 120) -> dict:
    """A checkpoint written on the device translates in a CPU process (launch/translate.py)."""
    src = data / "dev.src.txt"
    lines = src.read_text(encoding="utf-8").splitlines()[:16]
    (run_dir.parent / "portability.src").write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = run_dir.parent / "portability.hyp"
    cmd = [sys.executable, "launch/translate.py", "--run", run_dir, "--checkpoint", "last",
           "--input", run_dir.parent / "portability.src", "--output", out, "--beam", "2"]
    log_path = run_dir.parent.parent / "portability.log"
    code, timed_out, _ = run_group(cmd, log_path, timeout, "cpu", dict(os.environ, CUDA_VISIBLE_DEVICES=""))
    hyps = out.read_text(encoding="utf-8").splitlines() if out.exists() else []
    result = {"exit": code, "lines_in": len(lines), "lines_out": len(hyps),
              "ok": code == 0 and not timed_out and len(hyps) == len(lines)}
    if not result["ok"]:
        result["error"] = f"timeout after {timeout}s" if timed_out else log_path.read_text(errors="replace")[-2000:]
    log(f"portability (translate on CPU from the device's checkpoint): {json.dumps(result)}")
    return result
