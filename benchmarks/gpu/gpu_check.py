"""The GPU check, second version (run it through benchmarks/gpu/gpu_check.sh, which installs carried wheels
first): one prepared script for the one short try a lent GPU gives. It cannot waste that try: every stage has a
timeout (training runs `--run-timeout-s`, 90 s), the whole check a deadline (`--deadline-s`, 510 s on cuda: later
stages are skipped, and say so), OUT/gpu_check.json is rewritten after every stage, and the runs' logs, metrics,
timing and profile files (no checkpoints) are packed into OUT/runs.tar.gz after every run and whenever the check
ends (a training child is killed with its whole process group first). Data is prepared before the device
(`--prepare-only`, run by benchmarks/gpu/gpu_wheels.sh into .gpudata/): nothing on the device needs MeCab;
without it, dev BLEU is scored with sacreBLEU's `char` tokenizer (recorded).

    python3 -m benchmarks.gpu.gpu_check [--device cuda|cpu] [--out DIR] [--work DIR] [--data-root DIR]
    python3 -m benchmarks.gpu.gpu_check --prepare-only --work .gpudata      # here, before the device

Every training run is timed in the steady state: its throughput comes from the steps after `warmup` (50 of 200
on cuda) that no metrics row timed (gpu_runs.untimed_rates), at least 100 of them; and every run passes the gates
(gpu_gates.training_gates): each logged grad norm finite and non-zero, and the loss falling over the run (the
first check passed a compiled head that trained nothing, because it only asked for a finite loss).

Stages, in order (the most wanted first: a deadline cuts the end):
 1. environment: versions, the GPU, whether MeCab imports;
 2. data: the prepared DATA_DIRs, and the patent-length one derived from the 32k one (gpu_patent.py);
 3. placement: the trainer computes on the requested device; a model step there against the CPU (fp32, TF32 off);
 4. profile: GEMM and LSTM TFLOP/s by precision at our shapes, copy rates, datasheet peaks -> device_profile.json;
 5. latency: the planner's latencies at patent length -> OUT/planner_profile.json (gpu_patent.py);
 6. graphs_stack (cuda only): the decoder stack's forward and backward at the patent run's shapes, eager against
    replayed as CUDA graphs (gpu_graphs.py: would graphs take the host off the LSTM's step?);
 7. runs, through the real CLI (`python launch/train.py`, one process): the paper-size model (4+4 LSTM layers of
    1024, 32k joint BPE) at patent length (sentences 4x as long, no dropout) in bf16 at 128 pairs (the goal: 2x the
    first check's 373,080 tokens/s), the same with each side's LSTM layers as one call (train.stack_layers=on: the
    stack's A/B), in fp32 with TF32 off, in TF32 (train.tf32=true) and in fp16 (DeepSpeed's loss scaling). Each:
    pairs/s, tokens/s, steady ms per step, the host threads' CPU ms per step, peak memory, model TFLOP/s and MFU
    against the peak of the precision its matrix work ran in (gpu_report.py), the gates;
 8. anchor: the minimal PyTorch program for the same model (gpu_anchor.py: nn.LSTM per side, autocast bf16, fused
    Adam) on the same data and batches, after our run of that data, batch and precision (patent at 128 pairs, the
    scan's largest batch, enja-small);
 8b. graphs: the patent bf16 run with train.cuda_graphs on against off (the same seed and batches; on the CPU
    rehearsal `auto`, which is eager there: only the plumbing is rehearsed), its gate (gpu_gates.graphs_gate: every
    logged loss and grad norm within bf16's tolerance, graphs captured) and both runs' steady ms per step;
 9. profiled: patent bf16 profiled in the steady state (steps 121-123: the device busy fraction, the union of
    its kernels over the wall), a run of its own (and, late, enja-small bf16 early, as the first check did);
10. shared_gpu: a 2-rank hybrid (2 stages, 2 units, 2 time chunks) with both ranks on the one GPU (gloo,
    tensors through host memory: NCCL refuses two ranks on one device) against one process, fp32, every step's
    loss and grad norm: the multi-rank CUDA path once;
11. compile: the head's loss compiled against eager on the device, same batches (gpu_gates.compiled_eager_pair;
    train.compile_head stays refused on CUDA until this passes there);
12. scan: the patent bf16 run at 512 and 1024 pairs (150 steps, 30 of warm-up; 256 was measured on 2026-12-04);
13. short: enja-small and paper-size at the short lengths in bf16 (after the first, `resume`: 5 more steps with
    train.resume=auto, and `portability`: translate on the CPU from its checkpoint), patent bf16 with its widths
    padded to multiples of 8 (data.length_multiple=8: the shape buckets' A/B), enja-small as a world-of-one hybrid
    of 2 units and 2 time chunks, the fp32 twins;
14. wandb: a short enja-small run logging to wandb offline, the last run and alone;
15. planner (host CPU only, so last): launch/plan.py's ranking for 2, 4 and 8 GPUs at patent length from the
    shipped estimates and from planner_profile.json, beside the patent run's measured step.
The summary ends with the goals of the device-paced step (gpu_report.goals): met, not met, or not measured.

`--device cpu` (or GPU_CHECK_DEVICE=cpu) runs the same stages at tiny sizes on the demo corpus (compile and
graphs_stack on cuda only; graphs with train.cuda_graphs=auto, which is eager on a CPU), so the script itself is tested without a GPU (tests/test_gpu_check.py, also with MeCab not importable, with
a run killed by its timeout, and in the device's Python with the carried wheels: gpu_rehearsal.sh).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.common import REPO
from benchmarks.gpu import gpu_graphs, gpu_patent
from benchmarks.gpu import gpu_profile
from benchmarks.gpu.gpu_gates import compiled_eager_pair, graphs_gate, training_gates
from benchmarks.gpu.gpu_report import add_mfu, goals, print_table
from benchmarks.gpu.gpu_runs import log, mecab_importable, pack_runs, portability, run_group, train_run
from data_prep.dataformat import MANIFEST
from trainer.artifacts.run_dir import METRICS

ENJA_YAML = "trainer/configs/enja_small.yaml"
PAPER = {"emb_dim": 1024, "hidden": 1024, "layers": 4}
# per device: model overrides, micro-batch, data; steps and rows (steady state: the unlogged steps after `warmup`);
# the patent run's batch scan; shapes of the profile; the patent length
SIZES = {
    "cuda": {
        "models": {"enja-small": ({}, 64, "enja8k"),
                   "paper-size": (PAPER, 128, "enja32k_joint"),
                   "patent": ({**PAPER, "dropout": 0.0}, 128, "patent")},
        "steps": 200, "log_every": 25, "warmup": 50, "gate_min_steps": 100,
        "scan": [512, 1024], "scan_steps": 150, "scan_log_every": 30, "scan_warmup": 30,
        "anchor_steps": 200, "anchor_warmup": 50,
        "profile_from": 5, "patent_profile_from": 120, "dev_sentences": 16, "reps": 20,
        "copy_mib": 1024, "patent_repeat": 4, "planner_overrides": [], "planner_steps": 2, "planner_timeout": 150,
        "compile": {"hidden": 256, "vocab": 8000},
        "graphs": {"steps": 160, "log_every": 10, "warmup": 40, "setting": "on"},  # 108 steady steps each
        "gemm": [(2048, 4096, 1024), (128, 4096, 1024), (2048, 32000, 1024), (8192, 8192, 8192)],
        "lstm": [(64, 16, 256, 256), (128, 16, 1024, 1024), (128, 32, 1024, 1024), (128, 64, 1024, 1024)],
    },
    "cpu": {
        "models": {"enja-small": ({"emb_dim": 16, "hidden": 16}, 8, "tiny"),
                   "paper-size": ({"emb_dim": 32, "hidden": 32, "layers": 4}, 16, "tiny_joint"),
                   "patent": ({"emb_dim": 32, "hidden": 32, "layers": 4, "dropout": 0.0}, 16, "patent")},
        "steps": 6, "log_every": 2, "warmup": 2, "gate_min_steps": 100,
        "scan": [24], "scan_steps": 6, "scan_log_every": 2, "scan_warmup": 2,
        "anchor_steps": 6, "anchor_warmup": 2,
        "profile_from": 1, "patent_profile_from": 3, "dev_sentences": 4, "reps": 3,
        "copy_mib": 16, "patent_repeat": 2, "planner_steps": 1, "planner_timeout": 400,
        "planner_overrides": ["model.emb_dim=32", "model.hidden=32", "data.min_batch_sentences=8"],
        "compile": {"hidden": 16, "vocab": 100},
        "graphs": {"steps": 6, "log_every": 2, "warmup": 2, "setting": "auto"},  # auto: eager on a CPU (on is refused)
        "gemm": [(128, 512, 128), (16, 512, 128), (128, 1000, 128), (256, 256, 256)],
        "lstm": [(8, 8, 16, 16), (16, 8, 32, 32)],
    },
}
STAGES = ("environment", "data", "placement", "profile", "latency", "graphs_stack", "runs", "anchor", "graphs", "profiled",
          "shared_gpu", "compile", "scan", "short", "resume", "portability", "wandb", "planner")
SHARED_STEPS = 8  # the 2-rank hybrid on one GPU and its single-process twin, every step logged
SHARED_TOLERANCE = 1e-3  # relative, of each step's loss and grad norm (fp32, TF32 off; cuDNN's own order)


# ---- data ----
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
        ready = [d / name for d in (data_root, work) if d is not None and (d / name / MANIFEST).exists()]
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


def _sigterm(signum, frame):
    log("SIGTERM: stopping (the running training is killed, its files packed); the report holds what ran")
    sys.exit(3)  # SystemExit unwinds through every `finally`: the child's process group, pack_runs, the report


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=("cuda", "cpu"), default=os.environ.get("GPU_CHECK_DEVICE", "cuda"))
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/gpu_check")))
    p.add_argument("--work", type=Path, default=Path("/tmp/gpu_check_work"))
    p.add_argument("--corpus", type=Path, default=None, help="raw small_parallel_enja (default: .gpudata/ or ../shared/data/)")
    p.add_argument("--data-root", type=Path, default=None, help="prepared DATA_DIRs (default: .gpudata/ on cuda)")
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--deadline-s", type=float, default=None, help="the whole check (default 510 s on cuda, 1200 on cpu)")
    p.add_argument("--run-timeout-s", type=int, default=None, help="each training run (default 90 on cuda, 240 on cpu)")
    p.add_argument("--stages", default=None, help=f"comma-separated, of {','.join(STAGES)} (default: all; compile "
                                                 f"and graphs_stack on cuda only)")
    p.add_argument("--runs", default="", help="comma-separated names of the `runs` stage to do (default: all)")
    p.add_argument("--prepare-only", action="store_true", help="prepare the DATA_DIRs into --work and stop")
    args = p.parse_args(argv)
    default = [s for s in STAGES if s not in ("compile", "graphs_stack") or args.device == "cuda"]
    args.stages = set(args.stages.split(",")) if args.stages else set(default)
    if args.stages - set(STAGES):
        p.error(f"--stages: unknown {sorted(args.stages - set(STAGES))} (of {', '.join(STAGES)})")
    if args.device == "cuda" and args.corpus is None:
        args.corpus = next((c for c in (REPO / ".gpudata" / "small_parallel_enja",
                                        REPO.parent / "shared" / "data" / "small_parallel_enja")
                            if (c / "train.en").exists()), None)
    args.data_root = args.data_root or (REPO / ".gpudata" if args.device == "cuda" else None)
    args.run_timeout_s = args.run_timeout_s or (90 if args.device == "cuda" else 240)
    args.deadline_s = args.deadline_s or (510 if args.device == "cuda" else 1200)
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
    signal.signal(signal.SIGTERM, _sigterm)
    check = GpuCheck(args)
    try:
        return check.run()
    finally:  # however it ends (SIGTERM, a bug): what ran comes back
        check.check.save()
        if (args.work / "runs").exists():
            pack_runs(args.work, args.out)


def run_plan(sizes: dict) -> dict[str, list[dict]]:
    """The training runs by stage, each stage's in the order they run; the stages run in STAGES' order, the most
    wanted first (a deadline cuts the end).
    runs: the patent-length paper-size model in bf16 (the goal), the same with the LSTM stack as one call per side
        (train.stack_layers=on: the stack's A/B), in fp32 (TF32 off), TF32 and fp16 (loss scaling); the
        enja-small and paper-size bf16 runs (resume and portability continue the first of them), their fp32
        twins, enja-small as a world-of-one hybrid of 2 units and 2 time chunks, and patent bf16 with its widths
        padded to multiples of 8 (data.length_multiple=8: the shape buckets' A/B);
    scan: the patent bf16 run at larger batches;
    profiled: steady-state patent bf16 and early enja-small bf16 (a run each, profiled, not timed)."""
    def spec(model, precision, name=None, **kw):
        return {"name": name or f"{model}_{precision}", "model": model, "precision": precision, **kw}

    runs = [spec("patent", "bf16"), spec("patent", "bf16", "patent_bf16_stacked", extra=("train.stack_layers=on",)),
            spec("patent", "fp32"), spec("patent", "tf32"), spec("patent", "fp16")]
    short = [spec("enja-small", "bf16"), spec("paper-size", "bf16"),
             spec("patent", "bf16", "patent_bf16_padded", extra=("data.length_multiple=8",)),
             spec("enja-small", "bf16", "enja-small_bf16_units",
                  layout={"mode": "hybrid", "num_pp": 1, "num_dp": 1, "micro_batches": 2, "time_chunks": 2}),
             spec("enja-small", "fp32"), spec("paper-size", "fp32")]
    scan = [spec("patent", "bf16", f"patent_bf16_b{b}", micro=b, steps=sizes["scan_steps"],
                 log_every=sizes["scan_log_every"], warmup=sizes["scan_warmup"]) for b in sizes["scan"]]
    start = sizes["patent_profile_from"]
    profiled = [spec("patent", "bf16", "patent_bf16_profiled", steps=start + 4, log_every=start + 4,
                     extra=(f"train.profile_from={start}", "train.profile_steps=3"), report="profiled_patent"),
                spec("enja-small", "bf16", "enja-small_bf16_profiled", steps=sizes["profile_from"] + 4,
                     extra=(f"train.profile_from={sizes['profile_from']}", "train.profile_steps=3"), report="profiled")]
    anchors = [{"name": f"anchor_{model}_b{batch}", "model": model, "batch": batch, "ours": ours}
               for model, batch, ours in (("patent", sizes["models"]["patent"][1], "patent_bf16"),
                                          ("patent", sizes["scan"][-1], f"patent_bf16_b{sizes['scan'][-1]}"),
                                          ("enja-small", sizes["models"]["enja-small"][1], "enja-small_bf16"))]
    shared = [spec("enja-small", "fp32", f"enja-small_fp32_{name}", steps=SHARED_STEPS, log_every=1, warmup=1,
                   layout=layout) for name, layout in (("single", None), ("hybrid2_shared", {
                       "mode": "hybrid", "num_pp": 2, "num_dp": 1, "micro_batches": 2, "time_chunks": 2}))]
    g = sizes["graphs"]
    graphs = [spec("patent", "bf16", f"patent_bf16_graphs_{setting}", steps=g["steps"], log_every=g["log_every"],
                   warmup=g["warmup"], extra=(f"train.cuda_graphs={setting}",)) for setting in ("off", g["setting"])]
    return {"runs": runs, "short": short, "scan": scan, "profiled": profiled, "anchor": anchors, "shared_gpu": shared,
            "graphs": graphs}


class GpuCheck:
    """The stages in order (module docstring), each through `Check.stage`."""

    def __init__(self, args: argparse.Namespace):
        import torch

        if args.device == "cpu":
            torch.set_num_threads(1)  # as the training runs below (train.threads=1)
        self.args, self.sizes = args, SIZES[args.device]
        self.steps = args.steps or self.sizes["steps"]
        self.check = Check(args.out, args.deadline_s, {"device_requested": args.device, "torch": torch.__version__,
                                                       "steps": self.steps, "log_every": self.sizes["log_every"],
                                                       "warmup": self.sizes["warmup"]})
        self.check.started = time.time()
        self.report = self.check.report
        self.report["runs"], self.report["anchors"] = [], []
        self.plan = run_plan(self.sizes)
        self.datas, self.shapes, self.profile, self.latency = {}, {}, None, None

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
        if "latency" in args.stages and self.profile:
            self.latency = report["latency"] = check.stage("latency", self.latencies, 90, need=10)
        if "graphs_stack" in args.stages:  # cuda only: the decoder stack's calls replayed as CUDA graphs
            report["graphs_stack"] = check.stage("graphs_stack", lambda: gpu_graphs.run(
                self.sizes["models"]["patent"][1], 48, PAPER["hidden"], PAPER["layers"]), 120, need=30)
        self.stages_in_order()
        if "planner" in args.stages and self.latency:  # CPU work only: last, and can be done here from OUT
            report["planner"] = check.stage("planner", self.planner, self.sizes["planner_timeout"], need=60)
        return self.finish()

    def stages_in_order(self) -> None:
        args, report, plan = self.args, self.report, self.plan
        self.train_runs("runs")
        if "graphs" in args.stages:
            report["graphs"] = self.graphs_pair()
        if "profiled" in args.stages:
            report[plan["profiled"][0]["report"]] = self.train(plan["profiled"][0], stage=plan["profiled"][0]["name"])
        if "shared_gpu" in args.stages:
            report["shared_gpu"] = self.shared_gpu()
        if "compile" in args.stages:
            report["compile_gate"] = self.check.stage("compile", self.compile_gate, 240, need=60)
        if "scan" in args.stages:
            for spec in plan["scan"]:
                report["runs"].append(self.train(spec))
            if "anchor" in args.stages:
                self.anchor(plan["anchor"][1])
        self.train_runs("short")
        if "profiled" in args.stages:
            for spec in plan["profiled"][1:]:
                report[spec["report"]] = self.train(spec, stage=spec["name"])
        self.wandb_run()

    def train_runs(self, stage: str) -> None:
        """The runs of `stage` (runs: at patent length; short: the short-sentence runs) that --runs selects; each
        first run of a data set is followed by its anchor, the first enja-small run by resume and portability."""
        args, report = self.args, self.report
        if stage not in args.stages:
            return
        for spec in self.plan[stage]:
            if args.runs and spec["name"] not in args.runs.split(","):
                continue
            report["runs"].append(self.train(spec))
            anchor = next((a for a in self.plan["anchor"] if a["ours"] == spec["name"]), None)
            if anchor is not None and anchor is not self.plan["anchor"][1] and "anchor" in args.stages:
                self.anchor(anchor)
            if spec["name"] == "enja-small_bf16":
                self.after_first_run(report["runs"][-1])

    def data(self) -> bool:
        args, sizes = self.args, self.sizes

        def prepared() -> dict:
            datas = prepare(args.work, args.device, args.corpus, args.data_root)
            joint = datas["enja32k_joint" if args.device == "cuda" else "tiny_joint"]
            datas["patent"] = gpu_patent.stretch_data_dir(joint, args.work / f"patent_x{sizes['patent_repeat']}",
                                                          sizes["patent_repeat"])
            return datas

        self.datas = self.check.stage("data", prepared, 900) if "data" in args.stages else None
        if not self.datas:
            return False
        self.shapes = {name: data_shape(path) for name, path in self.datas.items()}
        self.report["data"] = {name: {"dir": str(self.datas[name]), **s} for name, s in self.shapes.items()}
        self.check.save()
        log(f"data: {json.dumps(self.report['data'])}")
        return True

    def latencies(self) -> dict:
        """The planner's latencies at patent length, into OUT/planner_profile.json (gpu_patent.py)."""
        import torch

        overrides, micro, _ = self.sizes["models"]["patent"]
        hidden = overrides.get("hidden") or _yaml_model()["hidden"]
        dev = torch.device("cuda:0" if self.args.device == "cuda" else "cpu")
        lat = gpu_patent.latencies(dev, hidden, micro, self.shapes["patent"]["src_len"], self.sizes["reps"])
        gpu_patent.planner_profile(self.profile, lat, self.args.out / "planner_profile.json")
        return lat

    def _train(self, spec: dict, steps: int, timeout: int, **kw) -> dict:
        overrides, micro, data = self.sizes["models"][spec["model"]]
        precision, extra = spec["precision"], tuple(spec.get("extra", ()))
        if precision == "tf32":  # fp32 with TF32 on (train.tf32)
            precision, extra = "fp32", ("train.tf32=true", *extra)
        return train_run(self.args.work, self.args.device, spec["name"], precision, overrides,
                         spec.get("micro", micro), self.datas[data], steps, self.sizes["dev_sentences"],
                         timeout=timeout, layout=spec.get("layout"), extra=extra,
                         **{"log_every": spec.get("log_every", self.sizes["log_every"]),
                            "warmup": spec.get("warmup", self.sizes["warmup"]), **kw})

    def train(self, spec: dict, stage: str | None = None, wandb: bool = False) -> dict:
        """One training run as a stage (its name, `run NAME` by default), its files packed into
        OUT/runs.tar.gz however it ends; the gates applied to its metrics; the report rewritten."""
        model, precision, steps = spec["model"], spec["precision"], spec.get("steps", self.steps)
        stage, timeout = stage or f"run {spec['name']}", spec.get("timeout", self.args.run_timeout_s)
        try:
            r = self.check.stage(stage, lambda: self._train(spec, steps, timeout, wandb=wandb), timeout + 30,
                                 need=min(timeout, 30)) or {
                "name": spec["name"], "error": self.report["stages"][stage].get("why", "no result")}
        finally:
            pack_runs(self.args.work, self.args.out)
        overrides, micro, data = self.sizes["models"][model]
        r.update(model=model, precision=precision, micro_batch=spec.get("micro", micro), data=data)
        if "rows" in r:  # every logged grad norm finite and non-zero; the loss falling (judged on long runs)
            r["gates"] = training_gates(r.pop("rows"))
            r["gates"]["loss_judged"] = steps >= self.sizes["gate_min_steps"]
            r["gates"]["ok"] = r["gates"]["grad_norm_ok"] and (r["gates"]["loss_falls"] or not r["gates"]["loss_judged"])
        if "pairs_per_s" in r and self.profile:
            add_mfu(r, {**_yaml_model(), **overrides}, self.shapes[data], precision, self.profile)
        log(f"{spec['name']}: {json.dumps(r)}")
        self.check.save()
        return r

    def anchor(self, spec: dict) -> None:
        """The minimal PyTorch program (gpu_anchor.py) on the same data and batch, in a process of its own, beside
        our run of that data, batch and precision."""
        overrides, _, data = self.sizes["models"][spec["model"]]
        model = {**_yaml_model(), **overrides}
        out = self.args.work / f"{spec['name']}.json"
        cmd = [sys.executable, "-m", "benchmarks.gpu.gpu_anchor", "--data", self.datas[data], "--batch", spec["batch"],
               "--steps", self.sizes["anchor_steps"], "--warmup", self.sizes["anchor_warmup"], "--emb",
               model["emb_dim"], "--hidden", model["hidden"], "--layers", model["layers"], "--device",
               "cuda" if self.args.device == "cuda" else "cpu", "--out", out,
               *(["--threads", 1] if self.args.device == "cpu" else [])]  # as the runs (train.threads=1)

        def one() -> dict:
            code, timed_out, watch = run_group(cmd, self.args.work / f"{spec['name']}.log", self.args.run_timeout_s,
                                               self.args.device, dict(os.environ, PYTHONUNBUFFERED="1"))
            if code != 0 or timed_out:
                text = (self.args.work / f"{spec['name']}.log").read_text(errors="replace")[-2000:]
                return {"error": f"timeout after {self.args.run_timeout_s}s" if timed_out else text}
            return {**json.loads(out.read_text()), "peak_memory_mib_smi": watch.peak_mib}

        a = {"name": spec["name"], **(self.check.stage(spec["name"], one, self.args.run_timeout_s + 30, need=20)
                                      or {"error": "no result"})}
        ours = next((r for r in self.report["runs"] if r["name"] == spec["ours"]), {})
        a["ours"], a["ours_tokens_per_s"] = spec["ours"], ours.get("tokens_per_s")
        self.report["anchors"].append(a)
        log(f"{spec['name']}: {json.dumps(a)}")
        pack_runs(self.args.work, self.args.out)
        self.check.save()

    def shared_gpu(self) -> dict:
        """The multi-rank CUDA path once on one GPU: a 2-rank hybrid (2 stages, 2 units, 2 time chunks) with both
        ranks on the same device (gloo, tensors through host memory: NCCL refuses two ranks on one device) against
        one process on the same config, step by step: the losses and gradient norms (fp32, TF32 off)."""
        runs = [self.train(spec) for spec in self.plan["shared_gpu"]]
        single, hybrid = runs
        by_run = []
        for r in runs:
            path = self.args.work / "runs" / r["name"] / METRICS
            rows = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
            by_run.append({row["step"]: row for row in rows})
        steps = sorted(set(by_run[0]) & set(by_run[1]))
        diff = {k: max((abs(by_run[1][s][k] - by_run[0][s][k]) / max(abs(by_run[0][s][k]), 1e-12) for s in steps
                        if by_run[0][s].get(k) is not None and by_run[1][s].get(k) is not None), default=None)
                for k in ("loss", "grad_norm")}
        ok = ("error" not in single and "error" not in hybrid and len(steps) >= SHARED_STEPS
              and all(v is not None and v <= SHARED_TOLERANCE for v in diff.values()))
        out = {"steps": steps, "max_rel_diff": diff, "tolerance": SHARED_TOLERANCE, "ok": ok,
               "device": hybrid.get("device"), "errors": [r.get("error") for r in runs if "error" in r]}
        log(f"2 ranks on one GPU against one process: {json.dumps(out)}")
        return out

    def graphs_pair(self) -> dict:
        """The patent bf16 run with train.cuda_graphs off and on (auto on a CPU), the same seed and batches: every
        logged loss and grad norm compared (gpu_gates.graphs_gate), and both runs' steady ms per step."""
        runs = [self.train(spec) for spec in self.plan["graphs"]]
        rows = []
        for r in runs:
            path = self.args.work / "runs" / r["name"] / METRICS
            rows.append([json.loads(line) for line in path.read_text().splitlines()] if path.exists() else [])
        gate = graphs_gate(*rows, "bf16", need_graphs=self.args.device == "cuda")
        gate.update({f"step_ms_{name}": r.get("step_ms_mean") for name, r in zip(("off", "on"), runs)},
                    setting=self.sizes["graphs"]["setting"], errors=[r["error"] for r in runs if "error" in r])
        if gate["errors"]:
            gate["ok"] = False
        off, on = gate["step_ms_off"], gate["step_ms_on"]
        gate["speedup"] = round(off / on, 3) if off and on else None
        log(f"cuda_graphs on against off: {json.dumps(gate)}")
        return gate

    def compile_gate(self) -> dict:
        """The head's loss compiled and eager on the device, on the same batches (gpu_gates.compiled_eager_pair)."""
        dev = "cuda" if self.args.device == "cuda" else "cpu"
        gate = compiled_eager_pair(dev, "bf16", **self.sizes["compile"])
        log(f"compile gate: {json.dumps(gate)}")
        return gate

    def after_first_run(self, first: dict) -> None:
        """resume and portability (from the first enja-small run)."""
        args, check, report, steps = self.args, self.check, self.report, self.steps
        if "pairs_per_s" in first and "resume" in args.stages:
            report["resume"] = check.stage("resume", lambda: self.resume(first), args.run_timeout_s + 30, need=30)
            log(f"resume to step {steps + 5}: {json.dumps(report['resume'])}")
            pack_runs(args.work, args.out)
        if "pairs_per_s" in first and "portability" in args.stages:
            report["portability"] = check.stage("portability", lambda: portability(
                args.work / "runs" / first["name"], self.datas[first["data"]]), 150, need=20)

    def resume(self, first: dict) -> dict:
        """The first run continued by 5 steps, each logged: the rows are the first run's and those 5, once each."""
        before = [json.loads(line)["step"] for line in
                  (self.args.work / "runs" / first["name"] / METRICS).read_text().splitlines()]
        spec = {"name": first["name"], "model": first["model"], "precision": first["precision"]}
        again = self._train(spec, self.steps + 5, self.args.run_timeout_s, wandb=False, resume=True, log_every=1)
        expected = before + list(range(self.steps + 1, self.steps + 6))
        again.update(expected_steps=expected, ok=again.get("resumed", False) and again.get("logged_steps") == expected)
        return {k: again.get(k) for k in ("exit", "ok", "resumed", "logged_steps", "expected_steps", "error")}

    def planner(self) -> dict:
        _, micro, _ = self.sizes["models"]["patent"]
        profiles = {"estimates": gpu_patent.ESTIMATES_PROFILE, "measured": self.args.out / "planner_profile.json"}
        out = {"data": str(self.datas["patent"]), "profiles": {k: str(v) for k, v in profiles.items()}}
        out["predictions"] = gpu_patent.predictions(self.datas["patent"], self.sizes["planner_overrides"], micro,
                                                    profiles, self.args.work, steps=self.sizes["planner_steps"])
        return out

    def wandb_run(self) -> None:
        """A short run logging to wandb offline, the last run and alone (its failure costs nothing else)."""
        if "wandb" not in self.args.stages:
            return
        spec = {"name": "enja-small_bf16_wandb", "model": "enja-small", "precision": "bf16", "steps": 4}
        if wandb_importable():
            self.report["wandb"] = self.train(spec, "wandb", wandb=True)
            self.report["wandb"]["ok"] = "error" not in self.report["wandb"] and self.report["wandb"].get(
                "wandb_offline_run")
        else:
            self.report["wandb"] = {"name": spec["name"], "ok": False, "error": "wandb is not importable"}

    def failures(self) -> list[str]:
        report, runs = self.report, self.report["runs"]
        failed = [r["name"] for r in runs if "error" in r or not r.get("finite", False)
                  or not (r.get("gates") or {}).get("ok", False)]
        failed += [name for name, st in report["stages"].items() if st["status"] != "ok"]
        failed += [c for c in ("placement", "resume", "portability", "wandb")
                   if c in self.args.stages and not (report.get(c) or {}).get("ok")]
        failed += [c for c in ("profiled", "profiled_patent") if "error" in (report.get(c) or {})]
        failed += [a["name"] for a in report["anchors"] if "error" in a]
        if "shared_gpu" in self.args.stages and not (report.get("shared_gpu") or {}).get("ok"):
            failed.append("shared_gpu (2 ranks on one GPU against one process)")
        if "graphs" in self.args.stages and not (report.get("graphs") or {}).get("ok"):
            failed.append("graphs (train.cuda_graphs on against off)")
        if "compile" in self.args.stages and not (report.get("compile_gate") or {}).get("ok"):
            failed.append("compile gate (the compiled head stays refused on CUDA)")
        return failed

    def finish(self) -> int:
        report, runs = self.report, self.report["runs"]
        for model_name in self.sizes["models"]:
            pair = {r["precision"]: r for r in runs if r.get("model") == model_name and "first_loss" in r
                    and r["name"] == f"{model_name}_{r['precision']}"}
            if "bf16" in pair and "fp32" in pair:  # same seed, same first batch: bf16 and fp32 start from the same loss
                report.setdefault("bf16_vs_fp32_first_loss_rel_diff", {})[model_name] = (
                    abs(pair["bf16"]["first_loss"] - pair["fp32"]["first_loss"]) / pair["fp32"]["first_loss"])
        report["goals"] = goals(report)
        report["wall_s"] = round(time.time() - self.check.started, 1)
        self.check.save()
        print_table(report)
        failed = self.failures()
        if failed:
            log(f"FAILED: {', '.join(dict.fromkeys(failed))}")
            return 1
        out = self.args.out
        log(f"all checks passed in {report['wall_s']}s; {out}/gpu_check.json, {out}/device_profile.json, "
            f"{out}/planner_profile.json, {out}/runs.tar.gz")
        return 0


def environment(device: str) -> dict:
    import torch

    env = {"python": sys.version.split()[0], "torch": torch.__version__, "cuda": torch.version.cuda,
           "cuda_available": torch.cuda.is_available(), "mecab": mecab_importable(),
           "bleu_tokenize": None if mecab_importable() else "char (MeCab not importable)"}
    if device == "cuda" and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        env.update(gpu=props.name, gpu_memory_gib=round(props.total_memory / 2 ** 30, 1),
                   sm_count=props.multi_processor_count)
    for name in ("deepspeed", "typing_extensions", "pydantic", "omegaconf", "sentencepiece", "wandb"):
        try:
            from importlib.metadata import version

            env[name] = version(name.replace("_", "-"))
        except Exception as e:  # noqa: BLE001
            env[name] = f"not installed: {e}"
    log(f"environment: {json.dumps(env)}")
    return env


def device_profile(device: str, sizes: dict, out: Path) -> dict:
    import torch

    dev = torch.device("cuda:0" if device == "cuda" else "cpu")
    profile = gpu_profile.profile(dev, gpu_profile.measure(dev, sizes, sizes["reps"]))
    profile["measured_by"] = f"python3 -m benchmarks.gpu.gpu_check --device {device}"
    (out / "device_profile.json").write_text(json.dumps(profile, indent=1))
    log(f"profile written: {out / 'device_profile.json'} (datasheet: "
        f"{profile['datasheet']['name'] if profile['datasheet'] else 'none'})")
    return profile


def wandb_importable() -> bool:
    try:
        import wandb  # noqa: F401
    except Exception as e:  # noqa: BLE001 - any import failure means: no wandb run
        log(f"wandb is not importable ({type(e).__name__}: {e}); no wandb run")
        return False
    return True


def _yaml_model() -> dict:
    from omegaconf import OmegaConf

    from trainer.config import ModelConfig

    return {**ModelConfig().__dict__, **OmegaConf.to_container(OmegaConf.load(REPO / ENJA_YAML))["model"]}


if __name__ == "__main__":
    sys.exit(main())
