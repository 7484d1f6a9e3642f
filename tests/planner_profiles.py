"""Synthetic device profiles for the planner's tests: the format of trainer/planner/profile.py with
simple, known numbers (milliseconds), so that predictions can be checked by hand."""
from __future__ import annotations

import json


def lines(points, f):
    return [[*p, f(*p)] for p in points]


def measured_profile(model: dict, *, lstm_call=0.1, lstm_step=0.01, lstm_row=0.001, head_token=0.01, head_fixed=0.1,
                     optimizer_param=1e-5, p2p_latency=0.05, p2p_byte=1e-6, contention=None,
                     instruction_ms=0.0, threads=(1, 2), bf16_sum_byte=None) -> dict:
    """A calibrated-machine profile for `model` (emb_dim, hidden, layers, attention, src_vocab,
    tgt_vocab): LSTM ms = lstm_call + steps * (lstm_step + lstm_row * rows) (packed: 1.5x per step), head ms
    = head_fixed + head_token * tokens, optimizer ms = 0.5 + optimizer_param * params; 2 threads run
    everything twice as fast. bf16_sum_byte: the all-reduce of bf16 tensors its own ms per byte (none: no line,
    a profile from before it)."""
    emb, hidden = model["emb_dim"], model["hidden"]
    dims = sorted({(emb, hidden), (hidden, hidden)})
    rows_steps = [(r, s) for r in (1, 4, 16, 64) for s in (2, 8, 32)]

    def table(speed: float) -> dict:
        def lstm(extra):
            return lines(rows_steps, lambda r, s: (lstm_call + s * extra * (lstm_step + lstm_row * r)) / speed)
        return {
            "lstm": {f"{i}x{h}": {"fused_fwd": lstm(1.0), "fused_bwd": lstm(2.0), "packed_fwd": lstm(1.5),
                                  "packed_bwd": lstm(3.0)} for i, h in dims},
            "embedding": {k: lines([(64,), (1024,)], lambda t: (0.01 + 1e-4 * t) / speed)
                          for k in ("src_fwd", "src_bwd", "tgt_fwd", "tgt_bwd")},
            "mask": lines([(1000,), (100000,)], lambda n: (0.01 + 1e-6 * n) / speed),
            "copy": lines([(1000,), (1000000,)], lambda b: 1e-7 * b / speed),
            "head": lines([(r, s, t, r * t) for r in (2, 8, 32) for s, t in ((5, 6), (20, 25))],
                          lambda r, s, t, n: (head_fixed + head_token * n) / speed),
            "optimizer": lines([(1000, 4), (100000, 10), (1000000, 20)], lambda p, n: (0.5 + optimizer_param * p) / speed),
            "overhead": {"instruction_ms": {op: instruction_ms for op in ("forward", "backward", "head", "reduce_metrics")},
                         "micro_step_ms": 0.0, "backward_ms": 0.0},
        }

    gloo = {"p2p": [[b, p2p_latency + p2p_byte * b, 0.0] for b in (1000, 1000000)],
            **{name: [[b, p2p_latency + p2p_byte * b] for b in (1000, 1000000)]
               for name in ("all_reduce", "reduce", "broadcast")}}
    if bf16_sum_byte is not None:
        gloo["all_reduce_bf16"] = [[b, p2p_latency + bf16_sum_byte * b] for b in (1000, 1000000)]
    return {"device": {"name": "synthetic", "type": "cpu", "cores": 2}, "datasheet": None,
            "layers": {"model": model, **{p: {str(t): table(float(t)) for t in threads} for p in ("bf16", "fp32")}},
            "contention": {p: contention or {} for p in ("bf16", "fp32")},
            "transfers": {"gloo": gloo}}


def write(path, profile: dict):
    path.write_text(json.dumps(profile))
    return path
