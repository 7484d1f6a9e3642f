"""The GPU check (run it through benchmarks/gpu_check.sh, which installs carried wheels first).

    python benchmarks/gpu_check.py [--device cuda|cpu] [--out DIR] [--work DIR] [--corpus DIR]

1. placement: DeepSpeed's accelerator and its current device (where the trainer puts everything) are
   the requested device; a model step there leaves every parameter and gradient on it, with the loss
   and gradient norm of the same step on the CPU in fp32 (TF32 off; relative difference < 1e-3);
2. the device profile (benchmarks/gpu_profile.py): GEMM and LSTM TFLOP/s by precision at our shapes,
   copy rates, datasheet peaks with their source -> OUT/device_profile.json;
3. training through the real CLI (`python launch/train.py --deepspeed_config single.json`, one process,
   NCCL world of one on CUDA), bf16 and fp32, of
     enja-small: trainer/configs/enja_small.yaml (emb/hidden 256, 2+2 layers, batches of 64 pairs) on
                 small_parallel_enja with an 8k BPE vocabulary per side;
     paper-size: 4+4 LSTM layers of 1024 (emb 1024), batches of 128 pairs, a 32k vocabulary per side:
                 small_parallel_enja with one joint 32k BPE model (the corpus supports at most ~17k/21k
                 pieces per side alone), so both embeddings and the softmax have 32000 rows; its
                 sentences are short (~12 pieces), shorter than patent sentences;
   each: pairs/s, tokens/s, median step, peak memory of the process (nvidia-smi; RSS on CPU), model
   TFLOP/s and MFU against the datasheet peak of the precision (fp32 also against TF32: cuDNN runs fp32
   LSTMs on TF32 by default) and against the measured GEMM peak; a dev-BLEU decode on the device at the end;
4. resume: the first run continued by 5 steps with train.resume=auto (fused Adam state, RNG states and
   the data position restored on the device), every step logged once;
5. portability: `launch/translate.py` in a process that sees no GPU translates from that checkpoint.
Everything measured is printed as it comes and written to OUT/gpu_check.json.

`--device cpu` (or GPU_CHECK_DEVICE=cpu) runs the same steps at tiny sizes on the demo corpus, so the
script itself is tested without a GPU (tests/test_gpu_check.py).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import REPO, ds_variant, summarise  # noqa: E402
import gpu_profile  # noqa: E402

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
def prepare(work: Path, device: str, corpus: Path | None) -> dict[str, Path]:
    """Prepared DATA_DIRs by name: from small_parallel_enja on CUDA, from the demo corpus on CPU."""
    if device == "cpu":
        corpus = work / "demo_text"
        _run([sys.executable, "-m", "data_prep.demo_corpus", "--out", corpus, "--pairs", "600", "--dev", "40",
              "--test", "40", "--seed", "3"], 300)
        plans = {"tiny": ["--vocab-size", "2000"], "tiny_joint": ["--vocab-size", "4000", "--joint-vocab"]}
    else:
        plans = {"enja8k": ["--vocab-size", "8000", "--model-type", "bpe"],
                 "enja32k_joint": ["--vocab-size", "32000", "--model-type", "bpe", "--joint-vocab"]}
    out = {}
    for name, extra in plans.items():
        data = work / name
        if not (data / "manifest.json").exists():
            args = ["--format", "moses", "--out", data, *extra]
            for split in ("train", "dev", "test"):
                args += [f"--{split}-src", corpus / f"{split}.en", f"--{split}-tgt", corpus / f"{split}.ja"]
            t = time.time()
            _run([sys.executable, "-m", "data_prep.prepare", *args], 600)
            log(f"prepared {name} in {time.time() - t:.1f}s")
        out[name] = data
    return out


def _run(cmd, timeout: int) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(c) for c in cmd], cwd=REPO, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        sys.exit(f"gpu_check: failed ({proc.returncode}): {' '.join(map(str, cmd))}\n{proc.stderr[-3000:]}")
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
    from trainer.model import build_model

    # the trainer places everything on DeepSpeed's accelerator's current device
    accel, dev = get_accelerator().device_name(), torch.device(get_accelerator().current_device_name())
    result = {"deepspeed_accelerator": accel, "trainer_device": str(dev)}
    if dev.type != device_name:
        raise SystemExit(f"gpu_check: placement: asked for {device_name}, but DeepSpeed's accelerator is {accel!r} "
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
            raise SystemExit(f"gpu_check: placement: parameters or gradients not on {where}: {off[:5]}")
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
              steps: int, dev_sentences: int, wandb: bool, resume: bool = False) -> dict:
    """One run of the training CLI (with `resume`: continue the run of that name to `steps`)."""
    ds = ds_variant(work, "single", name, train_micro_batch_size_per_gpu=micro, bf16={"enabled": precision == "bf16"})
    run_dir = work / "runs" / name
    if not resume:
        shutil.rmtree(run_dir, ignore_errors=True)
    cmd = [sys.executable, "launch/train.py", "--deepspeed_config", str(ds), "--config", ENJA_YAML,
           f"data.dir={data}", f"run.dir={run_dir}", f"train.max_steps={steps}", f"train.eval_every={steps}",
           "train.log_every=1", f"decode.dev_max_sentences={dev_sentences}", "logging.progress=false",
           f"logging.wandb_mode={'offline' if wandb else 'disabled'}",
           *[f"model.{k}={v}" for k, v in overrides.items()], *(["train.threads=1"] if device == "cpu" else []),
           *(["train.resume=auto"] if resume else [])]
    env = dict(os.environ, PYTHONUNBUFFERED="1", **({} if wandb else {"WANDB_MODE": "disabled"}))
    log(f"{name}: {' '.join(cmd[1:])}")
    start = time.time()
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    watch = MemoryWatch(proc.pid, device)
    try:
        out, _ = proc.communicate(timeout=420)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    peak = watch.stop()
    (work / f"{name}{'_resume' if resume else ''}.log").write_text(out)
    result = {"name": name, "exit": proc.returncode, "wall_s": round(time.time() - start, 1), "peak_memory_mib": peak}
    if proc.returncode != 0:
        log(f"{name}: FAILED (exit {proc.returncode}); the end of its output:\n{out[-4000:]}")
        return {**result, "error": out[-4000:]}
    if device == "cuda" and "Setting accelerator to CPU" in out:
        result["error"] = "DeepSpeed fell back to its CPU accelerator"
    if device == "cuda" and not watch.seen_on_gpu:
        result["note"] = "nvidia-smi listed no per-process memory; peak is the whole GPU's use"
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    result.update(summarise(run_dir, warmup=min(3, steps - 2)))
    result.pop("timing", None)
    result.update(first_loss=rows[0]["loss"], dev_bleu=rows[-1].get("dev_bleu"),
                  finite=all(r["loss"] is not None and math.isfinite(r["loss"]) for r in rows))
    if wandb:
        result["wandb_offline_run"] = any((run_dir / "wandb").glob("offline-run-*"))
    if resume:
        result.update(resumed="resume: from" in out, logged_steps=[r["step"] for r in rows])
    return result


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


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=("cuda", "cpu"), default=os.environ.get("GPU_CHECK_DEVICE", "cuda"))
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/gpu_check")))
    p.add_argument("--work", type=Path, default=Path("/tmp/gpu_check_work"))
    p.add_argument("--corpus", type=Path, default=None, help="raw small_parallel_enja (default: .gpudata/ or ../shared/data/)")
    p.add_argument("--steps", type=int, default=None)
    args = p.parse_args()
    sizes = SIZES[args.device]
    steps = args.steps or sizes["steps"]
    args.out.mkdir(parents=True, exist_ok=True)
    args.work.mkdir(parents=True, exist_ok=True)
    started = time.time()
    corpus = args.corpus
    if args.device == "cuda" and corpus is None:
        corpus = next((c for c in (REPO / ".gpudata" / "small_parallel_enja",
                                   REPO.parent / "shared" / "data" / "small_parallel_enja") if (c / "train.en").exists()), None)
        if corpus is None:
            sys.exit("gpu_check: small_parallel_enja not found in .gpudata/ or ../shared/data/ "
                     "(bash benchmarks/gpu_wheels.sh copies it into .gpudata/)")
    import torch

    if args.device == "cpu":
        torch.set_num_threads(1)  # as the training runs below (train.threads=1)
    report = {"device_requested": args.device, "torch": torch.__version__, "steps": steps}
    datas = prepare(args.work, args.device, corpus)
    shapes = {name: data_shape(path) for name, path in datas.items()}
    report["data"] = {name: {"dir": str(datas[name]), **s} for name, s in shapes.items()}
    log(f"data: {json.dumps(report['data'])}")
    overrides0, _, data0 = sizes["models"]["enja-small"]
    report["placement"] = placement(args.device, datas[data0], {**_yaml_model(), **overrides0})

    dev = torch.device("cuda:0" if args.device == "cuda" else "cpu")
    measured = gpu_profile.measure(dev, sizes, sizes["reps"])
    profile = gpu_profile.profile(dev, measured)
    profile["measured_by"] = f"python benchmarks/gpu_check.py --device {args.device}"
    (args.out / "device_profile.json").write_text(json.dumps(profile, indent=1))
    log(f"profile written: {args.out / 'device_profile.json'} (datasheet: "
        f"{profile['datasheet']['name'] if profile['datasheet'] else 'none'})")
    report["profile"] = profile

    try:
        import wandb  # noqa: F401
        wandb_ok = True
    except Exception as e:  # noqa: BLE001 - any import failure means: log without wandb
        wandb_ok = False
        log(f"wandb is not importable ({type(e).__name__}: {e}); runs log with logging.wandb_mode=disabled")
    runs = []
    for model_name, (overrides, micro, data_name) in sizes["models"].items():
        model = {**_yaml_model(), **overrides}
        for precision in ("bf16", "fp32"):
            name = f"{model_name}_{precision}"
            r = train_run(args.work, args.device, name, precision, overrides, micro, datas[data_name], steps,
                          sizes["dev_sentences"], wandb=wandb_ok and name == "enja-small_bf16")
            r.update(model=model_name, precision=precision, micro_batch=micro, data=data_name)
            if "pairs_per_s" in r:
                add_mfu(r, model, shapes[data_name], precision, profile)
            log(f"{name}: {json.dumps(r)}")
            runs.append(r)
    report["runs"] = runs
    first = runs[0]
    if "pairs_per_s" in first:  # continue the first run by 5 steps: the resume path on this device
        overrides, micro, data_name = sizes["models"][first["model"]]
        again = train_run(args.work, args.device, first["name"], first["precision"], overrides, micro,
                          datas[data_name], steps + 5, sizes["dev_sentences"], wandb=False, resume=True)
        again["ok"] = again.get("resumed", False) and again.get("logged_steps") == list(range(1, steps + 6))
        report["resume"] = {k: again.get(k) for k in ("exit", "ok", "resumed", "logged_steps", "error")}
        log(f"resume to step {steps + 5}: {json.dumps(report['resume'])}")
        report["portability"] = portability(args.work / "runs" / first["name"], datas[data_name])
    for model_name in sizes["models"]:
        pair = {r["precision"]: r for r in runs if r["model"] == model_name and "first_loss" in r}
        if len(pair) == 2:  # same seed, same first batch: bf16 and fp32 start from the same loss
            report.setdefault("bf16_vs_fp32_first_loss_rel_diff", {})[model_name] = (
                abs(pair["bf16"]["first_loss"] - pair["fp32"]["first_loss"]) / pair["fp32"]["first_loss"])
    report["wall_s"] = round(time.time() - started, 1)
    (args.out / "gpu_check.json").write_text(json.dumps(report, indent=1))
    print_table(report)
    failed = [r["name"] for r in runs if "error" in r or not r.get("finite", False)]
    failed += [check for check in ("placement", "resume", "portability") if not report.get(check, {}).get("ok")]
    if failed:
        log(f"FAILED: {', '.join(failed)}")
        return 1
    log(f"all checks passed in {report['wall_s']}s; {args.out}/gpu_check.json, {args.out}/device_profile.json")
    return 0


def _yaml_model() -> dict:
    from omegaconf import OmegaConf

    from trainer.config import ModelConfig

    return {**ModelConfig().__dict__, **OmegaConf.to_container(OmegaConf.load(REPO / ENJA_YAML))["model"]}


def print_table(report: dict) -> None:
    p = report["placement"]
    print(f"\nplacement: {p['trainer_device']} (DeepSpeed accelerator {p['deepspeed_accelerator']}); loss vs CPU fp32 "
          f"rel diff {p['loss_rel_diff']:.2e}, grad norm {p['grad_norm_rel_diff']:.2e}")
    print("| run | pairs/s | tokens/s | median step ms | peak MiB | model TFLOP/s | MFU (datasheet) | MFU (GEMM peak) "
          "| first loss | dev BLEU |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in report["runs"]:
        if "pairs_per_s" not in r:
            print(f"| {r['name']} | FAILED (exit {r['exit']}) |")
            continue
        mfu = r.get("mfu_datasheet")
        mfu = "n/a" if mfu is None else f"{100 * mfu:.2f}%" + (
            f" (TF32 {100 * r['mfu_datasheet_tf32']:.2f}%)" if "mfu_datasheet_tf32" in r else "")
        print(f"| {r['name']} | {r['pairs_per_s']:.0f} | {r['tokens_per_s']:.0f} | {r['step_ms_median']:.1f} | "
              f"{r['peak_memory_mib']:.0f} | {r['model_tflops']:.4g} | {mfu} | {100 * r['mfu_measured_gemm_peak']:.2f}% | "
              f"{r['first_loss']:.4f} | {r['dev_bleu']:.2f} |")
    for precision, c in report["profile"]["compute"].items():
        print(f"{precision}: GEMM TFLOP/s " + ", ".join(f"{g['m']}x{g['n']}x{g['k']}={g['tflops']}" for g in c["gemm"])
              + "; LSTM fwd+bwd TFLOP/s " + ", ".join(f"b{x['batch']}t{x['time']}h{x['hidden']}={x['tflops']}"
                                                     for x in c["lstm"]))
    print(f"memory/links: {report['profile']['memory']} {json.dumps(report['profile']['links'])}")


if __name__ == "__main__":
    sys.exit(main())
