"""A device profile a planner can read: datasheet peaks (with their source) and measured compute and
transfer rates at the shapes of our models, plus the model FLOP count that MFU is taken against.

Profile file (JSON), written by benchmarks/gpu_check.py:
    device        {"name", "type": "cuda"|"cpu", "capability", "memory_gib", "multiprocessors", "threads"}
    datasheet     {"name", "source", "peak_tflops": {"bf16", "tf32", "fp32"}, "memory_tb_s",
                   "links_gb_s": {"nvlink", "pcie"}} (dense rates, no sparsity), or null (no entry)
    compute       {precision: {"gemm": [{"m", "n", "k", "ms", "tflops"}], "lstm": [{"batch", "time",
                   "input", "hidden", "ms_fwd_bwd", "tflops"}]}} for bf16, fp32 (TF32 off) and, on
                   CUDA, tf32; the largest GEMM is the achievable matrix peak
    memory        {"copy_tb_s": device-to-device copy, bytes read + written}
    links         {"host_to_device_gb_s", "device_to_host_gb_s" (pinned), "nvlink_gb_s", "pcie_gb_s",
                   "allreduce": null + why (one GPU: no peer to measure against), "sources"}
    host          {"op_overhead_us"}: host time per tiny eager op (dispatch + launch), what small
                   kernels cost when the host, not the GPU, sets the pace
    sources       what each number is: "measured: <how>" or "datasheet: <document>"

The planner (launch/plan.py) reads such a file once it has a "roofline" section:
`python benchmarks/gpu_profile.py --planner-profile OUT.json [--from device_profile.json]` adds one,
from the measured numbers where the file has them and datasheet figures or stated estimates elsewhere
(benchmarks/profiles/h200.json was written so, from the datasheet and this workplace's measurements). The
roofline section's format, the datasheets and the estimates live with the planner that reads them:
trainer/planner/gpu_profile.py.
"""
from __future__ import annotations

import statistics
import time

import torch

from trainer.planner.gpu_profile import DATASHEETS, datasheet, roofline

# ---- the model's FLOPs (matrix products only; what MFU counts): the trainer's own count ----
def train_flops_per_pair(model: dict, tgt_vocab: int, src_len: float, tgt_len: float) -> float:
    """Forward + backward FLOPs of a mean sentence pair (trainer/model/flops.py: tied embeddings, the
    bidirectional bottom layer and the attention kind counted as the trainer counts them)."""
    from trainer.config import ModelConfig
    from trainer.model.flops import forward_flops

    cfg = ModelConfig(**{k: v for k, v in model.items() if k in ModelConfig.__dataclass_fields__})
    return 3 * forward_flops(cfg, tgt_vocab, src_len, tgt_len, src_len * tgt_len)


# ---- timing ----
def _timer(device: torch.device):
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
    return torch.bfloat16 if precision == "bf16" else torch.float32


def _tf32(device: torch.device, on: bool) -> None:
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = on
        torch.backends.cudnn.allow_tf32 = on


def gemm(device, precision: str, shapes: list[tuple[int, int, int]], reps: int) -> list[dict]:
    """C (m, n) = A (m, k) @ B (k, n) on random data, median of `reps` after 3 warm-ups."""
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


def measure(device: torch.device, sizes: dict, reps: int) -> dict:
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


def describe(device: torch.device) -> dict:
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        return {"name": p.name, "type": "cuda", "capability": f"{p.major}.{p.minor}",
                "memory_gib": round(p.total_memory / 2 ** 30, 1), "multiprocessors": p.multi_processor_count,
                "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
                "nccl": ".".join(map(str, torch.cuda.nccl.version())) if hasattr(torch.cuda, "nccl") else None}
    import platform

    return {"name": platform.processor() or platform.machine(), "type": "cpu", "threads": torch.get_num_threads()}


def profile(device: torch.device, measured: dict) -> dict:
    """The planner's file: measured numbers next to the datasheet's, each with its source."""
    info = describe(device)
    sheet = datasheet(info["name"]) if device.type == "cuda" else None
    rates = measured["rates"]
    links = {"host_to_device_gb_s": rates.get("host_to_device_gb_s"),
             "device_to_host_gb_s": rates.get("device_to_host_gb_s"),
             "nvlink_gb_s": sheet["links_gb_s"]["nvlink"] if sheet else None,
             "pcie_gb_s": sheet["links_gb_s"]["pcie"] if sheet else None,
             "allreduce": None,
             "allreduce_note": "not measured: one device, no peer (NCCL all-reduce needs a second GPU)"}
    sources = {
        "compute": "measured: torch matmul / nn.LSTM forward+backward on random data, median of repeats after "
                   "warm-up (CUDA events on GPU, perf_counter on CPU); tf32 = fp32 tensors with TF32 allowed",
        "memory.copy_tb_s": "measured: device-to-device copy, bytes read + written",
        "links.host_to_device_gb_s": "measured: pinned host memory copy" if device.type == "cuda" else None,
        "links.nvlink_gb_s": f"datasheet: {sheet['source']}" if sheet else None,
        "links.pcie_gb_s": f"datasheet: {sheet['source']}" if sheet else None,
        "datasheet": sheet["source"] if sheet else "no datasheet entry for this device",
    }
    if "op_overhead_us" in measured:
        sources["host.op_overhead_us"] = "measured: host time of 200 eager adds of 8 numbers, synchronised at the end"
    return {"device": info, "datasheet": sheet, "compute": measured["compute"],
            "memory": {"copy_tb_s": rates["copy_tb_s"]}, "links": links,
            "host": {"op_overhead_us": measured.get("op_overhead_us")}, "sources": sources}


def main() -> None:
    import argparse
    import json
    import os

    p = argparse.ArgumentParser(description="Write a planner profile (with a roofline section) from a device "
                                            "profile, or from the datasheet alone.")
    p.add_argument("--planner-profile", required=True, help="the file to write")
    p.add_argument("--from", dest="source", default=None, help="a device_profile.json from benchmarks/gpu_check.sh")
    p.add_argument("--device-name", default="NVIDIA H200", help="without --from: the datasheet entry to use")
    args = p.parse_args()
    if args.source:
        with open(args.source, encoding="utf-8") as f:
            base = json.load(f)
    else:
        sheet = datasheet(args.device_name)
        if sheet is None:
            raise SystemExit(f"--device-name {args.device_name!r}: no datasheet entry ({', '.join(DATASHEETS)})")
        base = {"device": {"name": args.device_name, "type": "cuda"}, "datasheet": sheet,
                "sources": {"datasheet": sheet["source"]}}
    if os.path.exists(args.planner_profile):
        raise SystemExit(f"--planner-profile {args.planner_profile}: exists; choose another path")
    base["roofline"] = roofline(base)
    base["measured_by"] = base.get("measured_by") or "datasheet + this workplace's measurements + stated estimates"
    with open(args.planner_profile, "x", encoding="utf-8") as f:
        json.dump(base, f, indent=1)
        f.write("\n")
    print(f"wrote {args.planner_profile}")


if __name__ == "__main__":
    main()
