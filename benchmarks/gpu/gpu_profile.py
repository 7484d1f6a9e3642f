"""Measuring a device for its profile: GEMM and LSTM rates at the shapes of our models, copy rates, the
host's time per launched op (`measure`), the device's description (`describe`), and the model FLOP count
that MFU is taken against. The profile's format (and the planner's "roofline" section) is the planner's:
trainer/planner/profile.py. The GPU check (python -m benchmarks.gpu.gpu_check) writes device_profile.json
with `profile`; this script turns one into a planner profile:

    python -m benchmarks.gpu.gpu_profile --planner-profile OUT.json [--from device_profile.json]
    python -m benchmarks.gpu.gpu_profile --planner-profile OUT.json --device-name "NVIDIA H200"

from the measured numbers where the file has them and datasheet figures or stated estimates elsewhere
(trainer/planner/profiles/h200.json was written so, from the datasheet and this workplace's measurements).
torch is imported where a measurement needs it, so that writing a planner profile needs none.
"""
from __future__ import annotations

import statistics
import time


# ---- the model's FLOPs (matrix products only; what MFU counts): the trainer's own count ----
def train_flops_per_pair(model: dict, tgt_vocab: int, src_len: float, tgt_len: float) -> float:
    """Forward + backward FLOPs of a mean sentence pair (trainer/model/flops.py: tied embeddings, the
    bidirectional bottom layer and the attention kind counted as the trainer counts them)."""
    from trainer.config import ModelConfig
    from trainer.model.flops import forward_flops

    cfg = ModelConfig(**{k: v for k, v in model.items() if k in ModelConfig.__dataclass_fields__})
    return 3 * forward_flops(cfg, tgt_vocab, src_len, tgt_len, src_len * tgt_len)


# ---- timing ----
def _timer(device):
    import torch

    if device.type == "cuda":
        def run(fn, reps: int) -> float:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            times = []
            for _ in range(reps):
                start.record()
                fn()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end))
            return statistics.median(times)
    else:
        def run(fn, reps: int) -> float:
            times = []
            for _ in range(reps):
                t = time.perf_counter()
                fn()
                times.append(1000 * (time.perf_counter() - t))
            return statistics.median(times)
    return run


def _sig(value: float) -> float:
    """Four significant digits (tiny CPU rates must not round to 0)."""
    return float(f"{value:.4g}")


def _dtype(precision: str):
    import torch

    return torch.bfloat16 if precision == "bf16" else torch.float32


def _tf32(device, on: bool) -> None:
    if device.type == "cuda":
        import torch

        torch.backends.cuda.matmul.allow_tf32 = on
        torch.backends.cudnn.allow_tf32 = on


def gemm(device, precision: str, shapes: list[tuple[int, int, int]], reps: int) -> list[dict]:
    """C (m, n) = A (m, k) @ B (k, n) on random data, median of `reps` after 3 warm-ups."""
    import torch

    timer, out = _timer(device), []
    _tf32(device, precision == "tf32")
    for m, n, k in shapes:
        a = torch.randn(m, k, device=device, dtype=_dtype(precision))
        b = torch.randn(k, n, device=device, dtype=_dtype(precision))
        for _ in range(3):
            a @ b
        ms = timer(lambda: a @ b, reps)
        out.append({"m": m, "n": n, "k": k, "ms": _sig(ms), "tflops": _sig(2 * m * n * k / ms / 1e9)})
    _tf32(device, False)
    return out


def lstm(device, precision: str, shapes: list[tuple[int, int, int, int]], reps: int) -> list[dict]:
    """One nn.LSTM layer (batch-first), forward + backward to inputs and weights, on random data."""
    import torch

    timer, out = _timer(device), []
    _tf32(device, precision == "tf32")
    for batch, steps, inp, hidden in shapes:
        layer = torch.nn.LSTM(inp, hidden, batch_first=True).to(device=device, dtype=_dtype(precision))
        x = torch.randn(batch, steps, inp, device=device, dtype=_dtype(precision), requires_grad=True)

        def step():
            y, _ = layer(x)
            y.sum().backward()

        for _ in range(2):
            step()
        ms = timer(step, reps)
        flops = 3 * 2 * 4 * hidden * (inp + hidden) * batch * steps
        out.append({"batch": batch, "time": steps, "input": inp, "hidden": hidden, "ms_fwd_bwd": _sig(ms),
                    "tflops": _sig(flops / ms / 1e9)})
    _tf32(device, False)
    return out


def copy_rates(device, mib: int, reps: int) -> dict:
    """Device-to-device copy (bytes read + written) and, on CUDA, pinned host<->device copies."""
    import torch

    timer = _timer(device)
    n = mib * 2 ** 20 // 4
    src = torch.randn(n, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    ms = timer(lambda: dst.copy_(src), reps)
    out = {"copy_tb_s": _sig(2 * src.numel() * 4 / ms / 1e9)}
    if device.type == "cuda":
        host = torch.empty(n, dtype=torch.float32, pin_memory=True)
        ms_h2d = timer(lambda: src.copy_(host, non_blocking=True), reps)
        ms_d2h = timer(lambda: host.copy_(src, non_blocking=True), reps)
        out.update(host_to_device_gb_s=_sig(n * 4 / ms_h2d / 1e6), device_to_host_gb_s=_sig(n * 4 / ms_d2h / 1e6))
    return out


def op_overhead(device, reps: int = 200) -> float:
    """Host microseconds per tiny eager op (an add of 8 numbers), the device synchronised at the end."""
    import torch

    x = torch.zeros(8, device=device)
    for _ in range(20):
        x.add_(1)
    if device.type == "cuda":
        torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(reps):
        x.add_(1)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return _sig(1e6 * (time.perf_counter() - t) / reps)


def measure(device, sizes: dict, reps: int) -> dict:
    """Every measured number of the profile; `sizes` holds the GEMM and LSTM shapes and copy size."""
    precisions = ("bf16", "fp32", "tf32") if device.type == "cuda" else ("bf16", "fp32")
    compute = {}
    for precision in precisions:
        compute[precision] = {"gemm": gemm(device, precision, sizes["gemm"], reps),
                              "lstm": lstm(device, precision, sizes["lstm"], reps)}
        print(f"profile: {precision}: GEMM TFLOP/s {[g['tflops'] for g in compute[precision]['gemm']]}, "
              f"LSTM fwd+bwd TFLOP/s {[x['tflops'] for x in compute[precision]['lstm']]}", flush=True)
    rates = copy_rates(device, sizes["copy_mib"], reps)
    print(f"profile: transfers {rates}", flush=True)
    overhead = op_overhead(device)
    print(f"profile: {overhead} us per tiny eager op", flush=True)
    return {"compute": compute, "rates": rates, "op_overhead_us": overhead}


def describe(device) -> dict:
    """The profile's "device" section of a torch.device."""
    import torch

    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        return {"name": p.name, "type": "cuda", "capability": f"{p.major}.{p.minor}",
                "memory_gib": round(p.total_memory / 2 ** 30, 1), "multiprocessors": p.multi_processor_count,
                "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
                "nccl": ".".join(map(str, torch.cuda.nccl.version())) if hasattr(torch.cuda, "nccl") else None}
    import platform

    return {"name": platform.processor() or platform.machine(), "type": "cpu", "threads": torch.get_num_threads()}


def profile(device, measured: dict) -> dict:
    """The device profile (trainer/planner/profile.py's format) of what `measure` measured on `device`."""
    from trainer.planner.profile import device_profile

    return device_profile(describe(device), measured)


def main() -> None:
    import argparse
    import json
    import os

    p = argparse.ArgumentParser(prog="python -m benchmarks.gpu.gpu_profile", description=(
        "Write a planner profile (with a roofline section) from a device profile, or from the datasheet alone."))
    p.add_argument("--planner-profile", required=True, help="the file to write")
    p.add_argument("--from", dest="source", default=None,
                   help="a device_profile.json from benchmarks/gpu/gpu_check.sh")
    p.add_argument("--device-name", default="NVIDIA H200", help="without --from: the datasheet entry to use")
    args = p.parse_args()
    from trainer.planner.profile import ProfileError, datasheet_profile, planner_profile

    if args.source:
        with open(args.source, encoding="utf-8") as f:
            base = json.load(f)
    else:
        try:
            base = datasheet_profile(args.device_name)
        except ProfileError as e:
            raise SystemExit(str(e)) from None
    if os.path.exists(args.planner_profile):
        raise SystemExit(f"--planner-profile {args.planner_profile}: exists; choose another path")
    out = planner_profile(base)
    with open(args.planner_profile, "x", encoding="utf-8") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print(f"wrote {args.planner_profile}")


if __name__ == "__main__":
    main()
