"""How the LSTM stack's calls cost on the device, at the patent run's shapes: the layers one call each (their weights
copied at every call, or each layer's in a cuDNN buffer of its own), the stack as one multi-layer call (copied, or
flattened as one buffer: trainer.model.lstm_stack), and torch's own nn.LSTM(num_layers=L). For each: forward +
backward ms per iteration on the device (CUDA events), the host's ms to queue it, kernels per iteration (profiler),
and whether cuDNN warned that the weights are "not part of single contiguous chunk" (a copy at every call).

    python -m benchmarks.gpu.gpu_lstm_calls [--batch 128] [--time 47] [--hidden 1024] [--layers 4] [--reps 20]
"""
from __future__ import annotations

import argparse
import json
import time
import warnings


def variants(hidden: int, layers: int, dtype):
    import torch
    from torch import nn

    from trainer.model.lstm_stack import LSTMStack, flatten_for_cudnn

    def fresh():
        torch.manual_seed(0)
        return [nn.LSTM(hidden, hidden, batch_first=True).to("cuda", dtype) for _ in range(layers)]

    def by_layer(lstms):
        def run(x):
            for lstm in lstms:
                x, _ = lstm(x)
            return x
        return run

    copied, flat = fresh(), fresh()
    for lstm in flat:
        flatten_for_cudnn([lstm])
    stack_copied, stack_flat = fresh(), fresh()
    flatten_for_cudnn(stack_flat)
    native = nn.LSTM(hidden, hidden, layers, batch_first=True).to("cuda", dtype)
    return {"layers, copied": by_layer(copied), "layers, flat each": by_layer(flat),
            "stack, copied": lambda x: LSTMStack(stack_copied)(x, None)[0],
            "stack, one flat buffer": lambda x: LSTMStack(stack_flat)(x, None)[0],
            "nn.LSTM(num_layers)": lambda x: native(x)[0]}


def measure(fn, x, reps: int) -> dict:
    import torch
    from torch.profiler import ProfilerActivity, profile

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            fn(x).float().sum().backward()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    host = time.perf_counter()
    start.record()
    for _ in range(reps):
        fn(x).float().sum().backward()
    end.record()
    host_ms = (time.perf_counter() - host) * 1000 / reps
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn(x).float().sum().backward()
        torch.cuda.synchronize()
    kernels = sum(1 for e in prof.profiler.kineto_results.events() if e.device_type().name == "CUDA")
    return {"ms": round(start.elapsed_time(end) / reps, 3), "host_ms": round(host_ms, 3), "kernels": kernels,
            "copies_weights": any("contiguous chunk" in str(w.message) for w in caught)}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--time", type=int, default=47)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--reps", type=int, default=20)
    args = p.parse_args(argv)
    import torch  # after the arguments: --help imports nothing heavy

    out = {}
    for name, dtype in (("bf16", torch.bfloat16), ("fp32", torch.float32)):
        torch.backends.cudnn.allow_tf32 = False
        x = torch.randn(args.batch, args.time, args.hidden, device="cuda", dtype=dtype, requires_grad=True)
        for variant, fn in variants(args.hidden, args.layers, dtype).items():
            out[f"{name} {variant}"] = r = measure(fn, x, args.reps)
            print(f"{name} {variant}: {json.dumps(r)}", flush=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
