"""The GPU check (run it through benchmarks/gpu/gpu_check.sh, which installs carried wheels first): one
prepared script for the one short try a lent GPU gives. It cannot waste that try: every stage has a
timeout (training runs `--run-timeout-s`, 90 s), the whole check a deadline (`--deadline-s`, 480 s: later
stages are skipped, and say so), OUT/gpu_check.json is rewritten after every stage, and the runs' logs,
metrics, timing and profile files (no checkpoints) are packed into OUT/runs.tar.gz after every run. Data is
prepared before the device (`--prepare-only`, run by benchmarks/gpu/gpu_wheels.sh into .gpudata/): nothing on
the device needs MeCab; without it, dev BLEU is scored with sacreBLEU's `char` tokenizer (recorded).

    python -m benchmarks.gpu.gpu_check [--device cuda|cpu] [--out DIR] [--work DIR] [--data-root DIR]
    python -m benchmarks.gpu.gpu_check --prepare-only --work .gpudata      # here, before the device

Stages, in order:
0. environment: versions, the GPU, whether MeCab imports;
1. placement: DeepSpeed's accelerator and its current device (where the trainer puts everything) are
   the requested device; a model step there leaves every parameter and gradient on it, with the loss
   and gradient norm of the same step on the CPU in fp32 (TF32 off; relative difference < 1e-3);
2. the device profile (benchmarks/gpu/gpu_profile.py): GEMM and LSTM TFLOP/s by precision at our shapes,
   copy rates, datasheet peaks with their source -> OUT/device_profile.json;
3. training through the real CLI (`python launch/train.py`, one process, NCCL world of one on CUDA):
     enja-small: trainer/configs/enja_small.yaml (emb/hidden 256, 2+2 layers, batches of 64 pairs) on
                 small_parallel_enja with an 8k BPE vocabulary per side, bf16 and fp32; the bf16 run
                 profiles 3 steps (torch.profiler with CUDA kernels: a trace, and the device syncs per
                 step by place from torch's sync debug mode);
     paper-size: 4+4 LSTM layers of 1024 (emb 1024), batches of 128 pairs, a 32k vocabulary per side:
                 small_parallel_enja with one joint 32k BPE model, bf16 and fp32;
     units:      enja-small bf16 as a world-of-one `hybrid` layout with 2 pipeline units and 2 time
                 chunks: the chunked, packed and head-piece paths of the interpreter on the device;
   each: pairs/s, tokens/s, median step, peak memory of the process (nvidia-smi; RSS on CPU), model
   TFLOP/s and MFU against the datasheet peak of the precision (fp32 also against TF32: cuDNN runs fp32
   LSTMs on TF32 by default) and against the measured GEMM peak; a dev-BLEU decode on the device at the end;
4. resume: the first run continued by 5 steps with train.resume=auto (fused Adam state, RNG states and
   the data position restored on the device), every step logged once;
5. portability: `launch/translate.py` in a process that sees no GPU translates from that checkpoint;
6. compiled head: enja-small bf16 with train.compile_head=true (if the deadline leaves time).

`--device cpu` (or GPU_CHECK_DEVICE=cpu) runs the same stages at tiny sizes on the demo corpus, so the
script itself is tested without a GPU (tests/test_gpu_check.py, also with MeCab not importable and with a
run killed by its timeout).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from benchmarks.common import REPO, ds_variant, summarise
from benchmarks.gpu import gpu_profile

ENJA_YAML = "trainer/configs/enja_small.yaml"
# per device: model overrides, micro-batch, steps, shapes of the profile, dev sentences decoded at the end
SIZES = {
    "cuda": {
        "models": {"enja-small": ({}, 64, "enja8k"),
                   "paper-size": ({"emb_dim": 1024, "hidden": 1024, "layers": 4}, 128, "enja32k_joint")},
        "steps": 60, "dev_sentences": 64, "reps": 20, "copy_mib": 1024,
        "gemm": [(2048, 4096, 1024), (128, 4096, 1024), (2048, 32000, 1024), (8192, 8192, 8192)],
        "lstm": [(64, 16, 256, 256), (128, 16, 1024, 1024), (128, 32, 1024, 1024), (128, 64, 1024, 1024)],
    },
    "cpu": {
        "models": {"enja-small": ({"emb_dim": 16, "hidden": 16}, 8, "tiny"),
                   "paper-size": ({"emb_dim": 32, "hidden": 32, "layers": 4}, 16, "tiny_joint")},
        "steps": 5, "dev_sentences": 4, "reps": 3, "copy_mib": 16,
        "gemm": [(128, 512, 128), (16, 512, 128), (128, 1000, 128), (256, 256, 256)],
        "lstm": [(8, 8, 16, 16), (16, 8, 32, 32)],
    },
}


def log(msg: str) -> None:
    print(f"gpu_check: {msg}", flush=True)


# ---- data ----
def mecab_importable() -> bool:
    try:
        import MeCab  # noqa: F401
        import ipadic  # noqa: F401
    except Exception:  # noqa: BLE001 - any failure means: not usable here
        return False
    return True


def prepare(work: Path, device: str, corpus: Path | None, data_root: Path | None = None,
            timeout: int = 600) -> dict[str, Path]:
    """Prepared DATA_DIRs by name: from small_parallel_enja on CUDA, from the demo corpus on CPU. A DATA_DIR
    already prepared under `data_root` (.gpudata/, made before the device) is used as it is; one prepared
    here uses MeCab only where it imports (--pretokenize auto, else none)."""
    if device == "cpu":
        plans = {"tiny": ["--vocab-size", "2000"], "tiny_joint": ["--vocab-size", "4000", "--joint-vocab"]}
    else:
        plans = {"enja8k": ["--vocab-size", "8000", "--model-type", "bpe"],
                 "enja32k_joint": ["--vocab-size", "32000", "--model-type", "bpe", "--joint-vocab"]}
    out = {}
    for name, extra in plans.items():
        ready = [d / name for d in (data_root, work) if d is not None and (d / name / "manifest.json").exists()]
        if ready:
            out[name] = ready[0]
            continue
        if device == "cpu":
            corpus = work / "demo_text"
            if not (corpus / "train.en").exists():
                _run([sys.executable, "-m", "data_prep.demo_corpus", "--out", corpus, "--pairs", "600", "--dev", "40",
                      "--test", "40", "--seed", "3"], 300)
        if corpus is None:
            raise RuntimeError(f"{name}: not prepared in {data_root} and no raw corpus (--corpus)")
        data = work / name
        args = ["--format", "moses", "--out", data, *extra,
                "--pretokenize", "auto" if mecab_importable() else "none"]
        for split in ("train", "dev", "test"):
            args += [f"--{split}-src", corpus / f"{split}.en", f"--{split}-tgt", corpus / f"{split}.ja"]
        t = time.time()
        _run([sys.executable, "-m", "data_prep.prepare", *args], timeout)
        log(f"prepared {name} in {time.time() - t:.1f}s")
        out[name] = data
    return out


def _run(cmd, timeout: int) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(c) for c in cmd], cwd=REPO, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"failed ({proc.returncode}): {' '.join(map(str, cmd))}\n{proc.stderr[-3000:]}")
    return proc


def data_shape(data: Path) -> dict:
    """Mean real tokens per pair (with EOS, as the trainer counts them) and vocabulary sizes."""
    from trainer.data import ParallelData, read_manifest

    train = ParallelData(str(data), "train")
    vocab = read_manifest(str(data))["vocab"]
    return {"pairs": len(train), "src_len": float(train.src_len.mean()) + 1, "tgt_len": float(train.tgt_len.mean()) + 1,
            "src_vocab": vocab["src_size"], "tgt_vocab": vocab["tgt_size"]}


# ---- 1. placement ----
def placement(device_name: str, data: Path, model_overrides: dict) -> dict:
    import torch
    from deepspeed.accelerator import get_accelerator

    from trainer.config import ModelConfig
    from trainer.data import ParallelData
    from trainer.model.seq2seq import build_model

    # the trainer places everything on DeepSpeed's accelerator's current device
    accel, dev = get_accelerator().device_name(), torch.device(get_accelerator().current_device_name())
    result = {"deepspeed_accelerator": accel, "trainer_device": str(dev)}
    if dev.type != device_name:
        raise RuntimeError(f"placement: asked for {device_name}, but DeepSpeed's accelerator is {accel!r} "
                         f"and the trainer would run on {dev} (is CUDA visible? torch {torch.__version__}, "
                         f"cuda available: {torch.cuda.is_available()})")
    gpu_profile._tf32(dev, False)  # compare true fp32 with the CPU (cuDNN allows TF32 by default)
    cfg = ModelConfig(**{**model_overrides, "dropout": 0.0})
    shape = data_shape(data)
    batch = ParallelData(str(data), "train").batch(range(32))
    tokens = batch.tgt_tokens
    losses, norms = {}, {}
    for where in ("cpu", dev):
        model = build_model(cfg, shape["src_vocab"], shape["tgt_vocab"], seed=3).to(where)
        b = batch.to(where)
        loss = model(b.src, b.src_lengths, b.tgt_in, b.tgt_out)[0] / tokens
        loss.backward()
        off = [n for n, p in model.named_parameters() if p.device.type != torch.device(where).type
               or p.grad is None or p.grad.device.type != torch.device(where).type]
        if off:
            raise RuntimeError(f"placement: parameters or gradients not on {where}: {off[:5]}")
        losses[str(where)] = loss.item()
        norms[str(where)] = math.sqrt(sum(float(p.grad.double().pow(2).sum()) for p in model.parameters()))
    ref, got = losses["cpu"], losses[str(dev)]
    result.update(loss_cpu=ref, loss_device=got, loss_rel_diff=abs(got - ref) / abs(ref),
                  grad_norm_cpu=norms["cpu"], grad_norm_device=norms[str(dev)],
                  grad_norm_rel_diff=abs(norms[str(dev)] - norms["cpu"]) / norms["cpu"])
    result["ok"] = result["loss_rel_diff"] < 1e-3 and result["grad_norm_rel_diff"] < 1e-3
    log(f"placement: {json.dumps(result)}")
    return result


# ---- 3. training through the CLI ----
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
        apps = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True).stdout
        for line in apps.splitlines():
            pid, _, mib = line.partition(",")
            if pid.strip() == str(self.pid):
                self.seen_on_gpu = True
                return float(mib)
        total = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                               capture_output=True, text=True).stdout.split()
        return float(total[0]) if total else 0.0

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.peak_mib = max(self.peak_mib, self._sample())
            self._stop.wait(0.5)

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return self.peak_mib


def train_run(work: Path, device: str, name: str, precision: str, overrides: dict, micro: int, data: Path,
              steps: int, dev_sentences: int, wandb: bool, resume: bool = False, timeout: int = 90,
              layout: dict | None = None, extra: tuple = ()) -> dict:
    """One run of the training CLI (with `resume`: continue the run of that name to `steps`), killed after
    `timeout` seconds; its output goes to WORK/NAME.log as it comes."""
    changes = {"layout": layout} if layout else {}
    ds = ds_variant(work, "single", name, train_micro_batch_size_per_gpu=micro, bf16={"enabled": precision == "bf16"},
                    **changes)
    run_dir = work / "runs" / name
    if not resume:
        shutil.rmtree(run_dir, ignore_errors=True)
    cmd = [sys.executable, "launch/train.py", "--deepspeed_config", str(ds), "--config", ENJA_YAML,
           f"data.dir={data}", f"run.dir={run_dir}", f"train.max_steps={steps}", f"train.eval_every={steps}",
           "train.log_every=1", f"decode.dev_max_sentences={dev_sentences}", "logging.progress=false",
           f"logging.wandb_mode={'offline' if wandb else 'disabled'}",
           *[f"model.{k}={v}" for k, v in overrides.items()], *(["train.threads=1"] if device == "cpu" else []),
           *([] if mecab_importable() else ["decode.bleu_tokenize=char"]),
           *(["train.resume=auto"] if resume else []), *extra]
    env = dict(os.environ, PYTHONUNBUFFERED="1", **({} if wandb else {"WANDB_MODE": "disabled"}))
    log(f"{name}: {' '.join(cmd[1:])}")
    start = time.time()
    log_path = work / f"{name}{'_resume' if resume else ''}.log"
    with open(log_path, "w") as sink:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=sink, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
        watch = MemoryWatch(proc.pid, device)
        try:
            proc.wait(timeout=timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            timed_out = True
        peak = watch.stop()
    out = log_path.read_text(errors="replace")
    result = {"name": name, "exit": proc.returncode, "wall_s": round(time.time() - start, 1), "peak_memory_mib": peak}
    if timed_out:
        log(f"{name}: KILLED after its {timeout}s timeout; the end of its output:\n{out[-3000:]}")
        return {**result, "error": f"timeout after {timeout}s", "timeout": True}
    if proc.returncode != 0:
        log(f"{name}: FAILED (exit {proc.returncode}); the end of its output:\n{out[-4000:]}")
        return {**result, "error": out[-4000:]}
    if device == "cuda" and "Setting accelerator to CPU" in out:
        result["error"] = "DeepSpeed fell back to its CPU accelerator"
    if device == "cuda" and not watch.seen_on_gpu:
        result["note"] = "nvidia-smi listed no per-process memory; peak is the whole GPU's use"
    result.update(run_results(run_dir, steps, out, wandb, resume))
    return result


def run_results(run_dir: Path, steps: int, out: str, wandb: bool, resume: bool) -> dict:
    """What a finished run measured: speed, first loss, dev BLEU, the profile window, wandb, the resume."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    result = summarise(run_dir, warmup=min(3, steps - 2))
    result.pop("timing", None)
    result.update(first_loss=rows[0]["loss"], dev_bleu=rows[-1].get("dev_bleu"),
                  finite=all(r["loss"] is not None and math.isfinite(r["loss"]) for r in rows))
    for prof in sorted((run_dir / "profile").glob("rank*.json")):
        p = json.loads(prof.read_text())
        result["profile"] = {k: p[k] for k in ("steps", "wall_ms_per_step", "self_cpu_ms_per_step",
                                               "device_syncs_per_step", "device_sync_sites") if k in p}
    if wandb:
        result["wandb_offline_run"] = any((run_dir / "wandb").glob("offline-run-*"))
    if resume:
        result.update(resumed="resume: from" in out, logged_steps=[r["step"] for r in rows])
    return result


RUN_FILES = ("metrics.jsonl", "config.yaml", "ds_config.json", "timing", "profile", "timeline")


def pack_runs(work: Path, out: Path) -> None:
    """OUT/runs.tar.gz: every run's logs, metrics, timing and profile files, no checkpoints (rewritten
    after every run, so a check killed later still brings back what ran)."""
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


def portability(run_dir: Path, data: Path) -> dict:
    """A checkpoint written on the device translates in a CPU process (launch/translate.py)."""
    src = data / "dev.src.txt"
    lines = src.read_text(encoding="utf-8").splitlines()[:16]
    (run_dir.parent / "portability.src").write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = run_dir.parent / "portability.hyp"
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run([sys.executable, "launch/translate.py", "--run", str(run_dir), "--checkpoint", "last",
                           "--input", str(run_dir.parent / "portability.src"), "--output", str(out), "--beam", "2"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    hyps = out.read_text(encoding="utf-8").splitlines() if out.exists() else []
    result = {"exit": proc.returncode, "lines_in": len(lines), "lines_out": len(hyps),
              "ok": proc.returncode == 0 and len(hyps) == len(lines)}
    if proc.returncode != 0:
        result["error"] = proc.stderr[-2000:]
    log(f"portability (translate on CPU from the device's checkpoint): {json.dumps(result)}")
    return result


def add_mfu(result: dict, model: dict, shape: dict, precision: str, profile: dict) -> None:
    flops = gpu_profile.train_flops_per_pair(model, shape["tgt_vocab"], shape["src_len"], shape["tgt_len"])
    achieved = result["pairs_per_s"] * flops / 1e12
    result.update(model_tflop_per_pair=flops / 1e12, model_tflops=round(achieved, 4))
    sheet = profile["datasheet"]
    if sheet:
        result["mfu_datasheet"] = round(achieved / sheet["peak_tflops"][precision], 5)
        if precision == "fp32":
            result["mfu_datasheet_tf32"] = round(achieved / sheet["peak_tflops"]["tf32"], 5)
    gemm_peak = max(g["tflops"] for g in profile["compute"][precision]["gemm"])
    result["mfu_measured_gemm_peak"] = round(achieved / gemm_peak, 5)


STAGES = ("environment", "data", "placement", "profile", "runs", "resume", "portability", "compile")


class Check:
    """The report and the clock: every stage runs under a timeout and the overall deadline, and the
    report (OUT/gpu_check.json) is rewritten after each, so whatever kills the check later, what ran
    is there."""

    def __init__(self, out: Path, deadline_s: float, report: dict):
        self.out, self.deadline, self.report = out, time.time() + deadline_s, report
        self.report["stages"] = {}
        self.save()

    def left(self) -> float:
        return self.deadline - time.time()

    def save(self) -> None:
        self.report["elapsed_s"] = round(time.time() - self.started, 1) if hasattr(self, "started") else 0.0
        tmp = self.out / "gpu_check.json.tmp"
        tmp.write_text(json.dumps(self.report, indent=1, default=str))
        os.replace(tmp, self.out / "gpu_check.json")

    def stage(self, name: str, fn, timeout: float, need: float = 0.0):
        """fn() under min(timeout, the time left); its result, or None when it failed, timed out or was
        skipped for the deadline (each recorded in report["stages"])."""
        left = self.left()
        if left < max(need, 1.0):
            self.report["stages"][name] = {"status": "skipped", "why": f"deadline: {left:.0f}s left, needs {need:.0f}s"}
            log(f"{name}: skipped ({left:.0f}s left before the deadline)")
            self.save()
            return None
        limit = max(1, int(min(timeout, left)))
        start = time.time()
        previous = signal.signal(signal.SIGALRM, _alarm)
        signal.alarm(limit)
        try:
            result, status = fn(), "ok"
        except StageTimeout:
            result, status = None, "timeout"
            log(f"{name}: stopped after its {limit}s limit")
        except Exception as e:  # noqa: BLE001 - a failed stage is recorded and the check goes on
            result, status = None, "failed"
            self.report["stages"][name] = {"error": f"{type(e).__name__}: {str(e)[-2000:]}"}
            log(f"{name}: FAILED: {type(e).__name__}: {str(e)[-2000:]}")
        finally:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, previous)
        self.report["stages"][name] = {**self.report["stages"].get(name, {}), "status": status,
                                       "seconds": round(time.time() - start, 1)}
        self.save()
        return result


class StageTimeout(Exception):
    pass


def _alarm(signum, frame):
    raise StageTimeout()


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=("cuda", "cpu"), default=os.environ.get("GPU_CHECK_DEVICE", "cuda"))
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/gpu_check")))
    p.add_argument("--work", type=Path, default=Path("/tmp/gpu_check_work"))
    p.add_argument("--corpus", type=Path, default=None, help="raw small_parallel_enja (default: .gpudata/ or ../shared/data/)")
    p.add_argument("--data-root", type=Path, default=None, help="prepared DATA_DIRs (default: .gpudata/ on cuda)")
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--deadline-s", type=float, default=None, help="the whole check (default 480 on cuda, 900 on cpu)")
    p.add_argument("--run-timeout-s", type=int, default=None, help="each training run (default 90 on cuda, 240 on cpu)")
    p.add_argument("--stages", default=None, help=f"comma-separated, of {','.join(STAGES)} (default: all; compile "
                                                 f"on cuda only)")
    p.add_argument("--runs", default="", help="comma-separated run names to do (default: all)")
    p.add_argument("--prepare-only", action="store_true", help="prepare the DATA_DIRs into --work and stop")
    args = p.parse_args(argv)
    default = [s for s in STAGES if s != "compile" or args.device == "cuda"]
    args.stages = set(args.stages.split(",")) if args.stages else set(default)
    if args.stages - set(STAGES):
        p.error(f"--stages: unknown {sorted(args.stages - set(STAGES))} (of {', '.join(STAGES)})")
    if args.device == "cuda" and args.corpus is None:
        args.corpus = next((c for c in (REPO / ".gpudata" / "small_parallel_enja",
                                        REPO.parent / "shared" / "data" / "small_parallel_enja")
                            if (c / "train.en").exists()), None)
    args.data_root = args.data_root or (REPO / ".gpudata" if args.device == "cuda" else None)
    args.run_timeout_s = args.run_timeout_s or (90 if args.device == "cuda" else 240)
    args.deadline_s = args.deadline_s or (480 if args.device == "cuda" else 900)
    return args


def main() -> int:
    args = parse_args()
    if args.prepare_only:
        args.work.mkdir(parents=True, exist_ok=True)
        for name, path in prepare(args.work, args.device, args.corpus, timeout=1800).items():
            log(f"prepared {name}: {path}")
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    args.work.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGTERM, lambda *_: (log("SIGTERM: stopping; the report holds what ran"), sys.exit(3)))
    return GpuCheck(args).run()


class GpuCheck:
    """The stages in order (module docstring), each through `Check.stage`."""

    def __init__(self, args: argparse.Namespace):
        import torch

        if args.device == "cpu":
            torch.set_num_threads(1)  # as the training runs below (train.threads=1)
        self.args, self.sizes = args, SIZES[args.device]
        self.steps = args.steps or self.sizes["steps"]
        self.check = Check(args.out, args.deadline_s, {"device_requested": args.device, "torch": torch.__version__,
                                                       "steps": self.steps})
        self.check.started = time.time()
        self.report = self.check.report
        self.datas, self.shapes, self.profile = {}, {}, None

    def run(self) -> int:
        args, check, report = self.args, self.check, self.report
        if "environment" in args.stages:
            report["environment"] = check.stage("environment", lambda: environment(args.device), 60)
        if not self.data():
            log("no data: nothing more can run")
            return 1
        if "placement" in args.stages:
            overrides, _, data = self.sizes["models"]["enja-small"]
            report["placement"] = check.stage("placement", lambda: placement(args.device, self.datas[data],
                                                                             {**_yaml_model(), **overrides}), 120)
        if "profile" in args.stages:
            self.profile = report["profile"] = check.stage("profile", lambda: device_profile(
                args.device, self.sizes, args.out), 120)
        report["runs"] = []
        for spec in run_specs(self.sizes, self.steps):
            if "runs" in args.stages and (not args.runs or spec["name"] in args.runs.split(",")):
                self.train(spec)
        self.after_runs()
        return self.finish()

    def data(self) -> bool:
        args = self.args
        self.datas = self.check.stage("data", lambda: prepare(args.work, args.device, args.corpus, args.data_root),
                                      900) if "data" in args.stages else None
        if not self.datas:
            return False
        self.shapes = {name: data_shape(path) for name, path in self.datas.items()}
        self.report["data"] = {name: {"dir": str(self.datas[name]), **s} for name, s in self.shapes.items()}
        self.check.save()
        log(f"data: {json.dumps(self.report['data'])}")
        return True

    def _train(self, name: str, model: str, precision: str, steps: int, timeout: int, **kw) -> dict:
        overrides, micro, data = self.sizes["models"][model]
        return train_run(self.args.work, self.args.device, name, precision, overrides, micro, self.datas[data], steps,
                         self.sizes["dev_sentences"], timeout=timeout, **kw)

    def train(self, spec: dict) -> dict:
        """One training run of `run_specs`, as a stage; its files packed into OUT/runs.tar.gz."""
        model, precision, timeout = spec["model"], spec["precision"], self.args.run_timeout_s
        stage = f"run {spec['name']}"
        r = self.check.stage(stage, lambda: self._train(
            spec["name"], model, precision, self.steps, timeout, wandb=spec["wandb"] and wandb_importable(),
            layout=spec.get("layout"), extra=spec.get("extra", ())), timeout + 30, need=min(timeout, 30)) or {
            "name": spec["name"], "error": self.report["stages"][stage].get("why", "no result")}
        overrides, micro, data = self.sizes["models"][model]
        r.update(model=model, precision=precision, micro_batch=micro, data=data)
        if "pairs_per_s" in r and self.profile:
            add_mfu(r, {**_yaml_model(), **overrides}, self.shapes[data], precision, self.profile)
        log(f"{spec['name']}: {json.dumps(r)}")
        self.report["runs"].append(r)
        self.check.save()
        pack_runs(self.args.work, self.args.out)
        return r

    def after_runs(self) -> None:
        """resume and portability (from the first run), the compiled head."""
        args, check, report, steps = self.args, self.check, self.report, self.steps
        first = report["runs"][0] if report["runs"] else {}
        if "pairs_per_s" in first and "resume" in args.stages:
            def resume():
                again = self._train(first["name"], first["model"], first["precision"], steps + 5, args.run_timeout_s,
                                    wandb=False, resume=True)
                again["ok"] = again.get("resumed", False) and again.get("logged_steps") == list(range(1, steps + 6))
                return {k: again.get(k) for k in ("exit", "ok", "resumed", "logged_steps", "error")}

            report["resume"] = check.stage("resume", resume, args.run_timeout_s + 30, need=30)
            log(f"resume to step {steps + 5}: {json.dumps(report['resume'])}")
            pack_runs(args.work, args.out)
        if "pairs_per_s" in first and "portability" in args.stages:
            report["portability"] = check.stage("portability", lambda: portability(
                args.work / "runs" / first["name"], self.datas[first["data"]]), 120, need=20)
        if "compile" in args.stages:
            report["compiled_head"] = check.stage("compile", lambda: self._train(
                "enja-small_bf16_compiled", "enja-small", "bf16", steps, args.run_timeout_s * 2, wandb=False,
                extra=("train.compile_head=true",)), args.run_timeout_s * 2 + 30, need=60)
            pack_runs(args.work, args.out)

    def finish(self) -> int:
        report, runs = self.report, self.report["runs"]
        for model_name in self.sizes["models"]:
            pair = {r["precision"]: r for r in runs if r.get("model") == model_name and "first_loss" in r
                    and not r["name"].endswith("_units")}
            if len(pair) == 2:  # same seed, same first batch: bf16 and fp32 start from the same loss
                report.setdefault("bf16_vs_fp32_first_loss_rel_diff", {})[model_name] = (
                    abs(pair["bf16"]["first_loss"] - pair["fp32"]["first_loss"]) / pair["fp32"]["first_loss"])
        report["wall_s"] = round(time.time() - self.check.started, 1)
        self.check.save()
        print_table(report)
        failed = [r["name"] for r in runs if "error" in r or not r.get("finite", False)]
        failed += [name for name, st in report["stages"].items() if st["status"] != "ok"]
        failed += [c for c in ("placement", "resume", "portability")
                   if c in self.args.stages and not (report.get(c) or {}).get("ok")]
        if failed:
            log(f"FAILED: {', '.join(dict.fromkeys(failed))}")
            return 1
        out = self.args.out
        log(f"all checks passed in {report['wall_s']}s; {out}/gpu_check.json, {out}/device_profile.json, "
            f"{out}/runs.tar.gz")
        return 0


def run_specs(sizes: dict, steps: int) -> list[dict]:
    """The training runs, in order: both models in both precisions, the first one profiled (3 steps, CUDA
    kernels and device syncs), then the world-of-one units-and-chunks layout."""
    specs = []
    for model_name in sizes["models"]:
        for precision in ("bf16", "fp32"):
            spec = {"name": f"{model_name}_{precision}", "model": model_name, "precision": precision,
                    "wandb": not specs}
            if not specs:
                spec["extra"] = (f"train.profile_from={max(1, steps - 4)}", "train.profile_steps=3")
            specs.append(spec)
    specs.append({"name": "enja-small_bf16_units", "model": "enja-small", "precision": "bf16", "wandb": False,
                  "layout": {"mode": "hybrid", "num_pp": 1, "num_dp": 1, "micro_batches": 2, "time_chunks": 2}})
    return specs


def environment(device: str) -> dict:
    import torch

    env = {"python": sys.version.split()[0], "torch": torch.__version__, "cuda": torch.version.cuda,
           "cuda_available": torch.cuda.is_available(), "mecab": mecab_importable(),
           "bleu_tokenize": None if mecab_importable() else "char (MeCab not importable)"}
    if device == "cuda" and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        env.update(gpu=props.name, gpu_memory_gib=round(props.total_memory / 2 ** 30, 1),
                   sm_count=props.multi_processor_count)
    try:
        import deepspeed

        env["deepspeed"] = deepspeed.__version__
    except Exception as e:  # noqa: BLE001
        env["deepspeed"] = f"not importable: {e}"
    log(f"environment: {json.dumps(env)}")
    return env


def device_profile(device: str, sizes: dict, out: Path) -> dict:
    import torch

    dev = torch.device("cuda:0" if device == "cuda" else "cpu")
    profile = gpu_profile.profile(dev, gpu_profile.measure(dev, sizes, sizes["reps"]))
    profile["measured_by"] = f"python -m benchmarks.gpu.gpu_check --device {device}"
    (out / "device_profile.json").write_text(json.dumps(profile, indent=1))
    log(f"profile written: {out / 'device_profile.json'} (datasheet: "
        f"{profile['datasheet']['name'] if profile['datasheet'] else 'none'})")
    return profile


def wandb_importable() -> bool:
    try:
        import wandb  # noqa: F401
    except Exception as e:  # noqa: BLE001 - any import failure means: log without wandb
        log(f"wandb is not importable ({type(e).__name__}: {e}); runs log with logging.wandb_mode=disabled")
        return False
    return True


def _yaml_model() -> dict:
    from omegaconf import OmegaConf

    from trainer.config import ModelConfig

    return {**ModelConfig().__dict__, **OmegaConf.to_container(OmegaConf.load(REPO / ENJA_YAML))["model"]}


def print_table(report: dict) -> None:
    """What the check measured, as far as it got."""
    for name, st in report["stages"].items():
        print(f"stage {name}: {st['status']}" + (f" ({st['seconds']}s)" if "seconds" in st else f" ({st.get('why')})"))
    p = report.get("placement")
    if p:
        print(f"\nplacement: {p['trainer_device']} (DeepSpeed accelerator {p['deepspeed_accelerator']}); loss vs CPU "
              f"fp32 rel diff {p['loss_rel_diff']:.2e}, grad norm {p['grad_norm_rel_diff']:.2e}")
    print("| run | pairs/s | tokens/s | median step ms | peak MiB | model TFLOP/s | MFU (datasheet) | MFU (GEMM peak) "
          "| first loss | dev BLEU | device syncs/step |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in report["runs"] + ([report["compiled_head"]] if report.get("compiled_head") else []):
        if "pairs_per_s" not in r:
            print(f"| {r['name']} | FAILED ({str(r.get('error', ''))[:60]!r}) |")
            continue
        mfu = r.get("mfu_datasheet")
        mfu = "n/a" if mfu is None else f"{100 * mfu:.2f}%" + (
            f" (TF32 {100 * r['mfu_datasheet_tf32']:.2f}%)" if "mfu_datasheet_tf32" in r else "")
        gemm = f"{100 * r['mfu_measured_gemm_peak']:.2f}%" if "mfu_measured_gemm_peak" in r else "n/a"
        syncs = (r.get("profile") or {}).get("device_syncs_per_step", "")
        print(f"| {r['name']} | {r['pairs_per_s']:.0f} | {r['tokens_per_s']:.0f} | {r['step_ms_median']:.1f} | "
              f"{r['peak_memory_mib']:.0f} | {r.get('model_tflops', float('nan')):.4g} | {mfu} | {gemm} | "
              f"{r['first_loss']:.4f} | {r['dev_bleu']} | {syncs} |")
    profile = report.get("profile")
    if profile:
        for precision, c in profile["compute"].items():
            print(f"{precision}: GEMM TFLOP/s " + ", ".join(f"{g['m']}x{g['n']}x{g['k']}={g['tflops']}"
                                                          for g in c["gemm"])
                  + "; LSTM fwd+bwd TFLOP/s " + ", ".join(f"b{x['batch']}t{x['time']}h{x['hidden']}={x['tflops']}"
                                                         for x in c["lstm"]))
        print(f"memory/links: {profile['memory']} {json.dumps(profile['links'])}")


if __name__ == "__main__":
    sys.exit(main())
