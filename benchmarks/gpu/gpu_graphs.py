"""Would CUDA graphs take the host off the LSTM's step? The experiment the next GPU check runs first (its `graphs`
stage; cuda only).

At patent length the bf16 step is paced by the host launching cuDNN's per-time-step kernels (about 1,000 per
forward and backward of 4 layers at 47 steps, ~16 us each; the device 39% busy: docs/gpu.md). A CUDA graph
replays a captured call's kernels with one launch. Packed sequences (the encoder) change their batch sizes every
batch, so only a call over a fixed padded shape can be replayed: the decoder's, which runs over the whole padded
target (trainer.model.seq2seq: teacher forcing, no packing). This times, at the patent run's shapes, the decoder
stack's forward and backward (a layer at a time, as train.stack_layers=auto runs bf16) eagerly and as graphs made
by torch.cuda.make_graphed_callables (one per shape, warm-up included), and compares their outputs and every
gradient.

    python -m benchmarks.gpu.gpu_graphs [--batch 128] [--time 48] [--hidden 1024] [--layers 4] [--reps 20]

Prints one JSON object: per precision, eager and graphed ms per iteration on the device (CUDA events) and the host's
ms to queue it, the capture's seconds, and the largest relative difference of the outputs and gradients.
"""
from __future__ import annotations

import argparse
import json
import time


def decoder_stack(hidden: int, layers: int, dtype):
    """The decoders of `layers` pair layers, a layer at a time, as one module (what a stage runs for `dec`)."""
    import torch
    from torch import nn

    class Decoders(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.lstms = nn.ModuleList(nn.LSTM(hidden, hidden, batch_first=True) for _ in range(layers))

        def forward(self, y, h0, c0):
            hs, cs = [], []
            for k, lstm in enumerate(self.lstms):
                y, (h, c) = lstm(y, (h0[k:k + 1], c0[k:k + 1]))
                hs.append(h)
                cs.append(c)
            return y, torch.cat(hs), torch.cat(cs)

    module = Decoders().to("cuda", dtype)
    for lstm in module.lstms:
        lstm.flatten_parameters()
    return module


def _inputs(batch: int, time_steps: int, hidden: int, layers: int, dtype, seed: int):
    import torch

    g = torch.Generator(device="cuda").manual_seed(seed)
    make = lambda *shape: torch.randn(*shape, device="cuda", dtype=dtype, generator=g).requires_grad_()  # noqa: E731
    return make(batch, time_steps, hidden), make(layers, batch, hidden), make(layers, batch, hidden)


def _run(fn, args):
    import torch

    out = fn(*args)
    weights = torch.linspace(0.5, 1.5, out[0].numel(), device="cuda", dtype=out[0].dtype).view_as(out[0])
    (out[0] * weights).float().sum().add(out[1].float().sum()).backward()
    return out


def _timed(fn, args, reps: int) -> tuple[float, float]:
    import torch

    for _ in range(3):
        _run(fn, args)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    host = time.perf_counter()
    start.record()
    for _ in range(reps):
        _run(fn, args)
    end.record()
    host_ms = (time.perf_counter() - host) * 1000 / reps
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps, host_ms


def compare(batch: int, time_steps: int, hidden: int, layers: int, dtype, reps: int) -> dict:
    import torch

    eager = decoder_stack(hidden, layers, dtype)
    graphed_module = decoder_stack(hidden, layers, dtype)  # the same weights (seeded), captured
    sample = _inputs(batch, time_steps, hidden, layers, dtype, seed=1)
    start = time.perf_counter()
    graphed = torch.cuda.make_graphed_callables(graphed_module, sample, pool=torch.cuda.graph_pool_handle())
    capture_s = time.perf_counter() - start
    args = _inputs(batch, time_steps, hidden, layers, dtype, seed=2)
    results = []
    for module in (eager, graphed):
        module.zero_grad()
        leaves = [a.detach().clone().requires_grad_() for a in args]
        out = _run(module, leaves)
        results.append([t.detach().float() for t in out] + [a.grad.float() for a in leaves]
                       + [p.grad.float() for p in (eager if module is eager else graphed_module).parameters()])
    diff = max(float((b - a).abs().max() / a.abs().max().clamp_min(1e-12)) for a, b in zip(*results))
    eager_ms, eager_host = _timed(eager, args, reps)
    graph_ms, graph_host = _timed(graphed, args, reps)
    return {"eager_ms": round(eager_ms, 3), "eager_host_ms": round(eager_host, 3), "graphed_ms": round(graph_ms, 3),
            "graphed_host_ms": round(graph_host, 3), "capture_s": round(capture_s, 2), "max_rel_diff": diff,
            "speedup": round(eager_ms / graph_ms, 3)}


def run(batch: int = 128, time_steps: int = 48, hidden: int = 1024, layers: int = 4, reps: int = 20) -> dict:
    import torch

    torch.backends.cudnn.allow_tf32 = False
    out = {"shape": {"batch": batch, "time": time_steps, "hidden": hidden, "layers": layers}}
    for name, dtype in (("bf16", torch.bfloat16), ("fp32", torch.float32)):
        try:
            out[name] = compare(batch, time_steps, hidden, layers, dtype, reps)
        except Exception as e:  # noqa: BLE001 - a capture cuDNN refuses is the answer, recorded
            out[name] = {"error": f"{type(e).__name__}: {str(e)[:500]}"}
        print(f"graphs {name}: {json.dumps(out[name])}", flush=True)
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--time", type=int, default=48)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--reps", type=int, default=20)
    args = p.parse_args(argv)
    print(json.dumps(run(args.batch, args.time, args.hidden, args.layers, args.reps)))


if __name__ == "__main__":
    main()
