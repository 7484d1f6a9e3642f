"""A GPU priced from its rates and host prices (the profile's "roofline" section) when no calibrated layer table
exists. Every piece of work has a host side (the Python, dispatch and launches that queue it) and a device side
(its kernels: max(FLOPs / matrix rate, bytes / memory bandwidth)); eager PyTorch launches asynchronously, so a
piece takes the longer of the two, and the pieces of an instruction follow one another. Where the host waits for
the device it does not overlap: the optimizer step reads the gradient norm back (the step's one device sync,
tests/test_device_syncs.py), so the queue drains there and DeepSpeed's step runs after it.

A cuDNN LSTM call launches kernels at every time step from the host: its host time is a fixed part per call and a
part per time step and layer (forward and backward priced apart); a stack of layers in one call
(train.stack_layers) pays the fixed part once and `lstm_stack_step_ratio` times a layer's per-step part (cuDNN's
wavefront launches more kernels per step). On the device each recurrent step takes at least
`lstm_step_device_us`, or its GEMM at the measured rate for its rows. Dropout masks are drawn on the device
(trainer/model/dropout.py); the head's loss runs in chunks of LOSS_CHUNK_ROWS["accelerator"] rows.

Section format, every number {"value": x, "source": "datasheet: ... | measured: ... | estimate: ..."}:
    gemm_tflops {bf16, fp32[, tf32]}   matrix rate reached by large products (fp32: cuBLAS without TF32)
    gemm_rates {bf16, fp32, tf32}      optional: measured [[m, tflops], ...] by the product's rows (a small
                                       product is slower); missing: gemm_tflops at any size
    lstm_gemm_tflops {...}             cuDNN's LSTM rate where no gemm_rates say it (older profiles)
    memory_tb_s                        device memory bandwidth (bytes read + written)
    op_overhead_us                     host time of one tiny eager op (dispatch + launch): posting a message
    host_op_us                         host time per aten op of the trainer outside cuDNN (head, embeddings,
                                       masks, copies): dispatch, autograd and the module's Python
    lstm_call_us, lstm_call_bwd_us     host time of one cuDNN LSTM call, forward / backward, beside its steps
    lstm_step_us, lstm_step_bwd_us     host time per time step of one layer, forward / backward
    lstm_stack_step_ratio              a stacked call's host time per layer and step over a layer call's, forward
    lstm_stack_step_bwd_ratio          ... and backward
    lstm_step_device_us                least device time of one recurrent step (a GEMM and the gate kernels)
    optimizer_host_us                  DeepSpeed's step on the host (the fused Adam, the clip, its Python);
    optimizer_tensor_us                ... and per parameter tensor in bf16 (the masters' gradients)
    instruction_us                     the interpreter's own work per instruction; backward_call_us DeepSpeed's
    sync_us                            one device sync: the host waits for the queue, then a small copy back
    host_collective_us                 a small gloo all-reduce between the ranks' host processes (the loss sums)
    links {NAME: {gb_s (one direction), latency_us, efficiency}}   NCCL over NVLink, PCIe, ...
Keys a profile lacks (one written before they existed) take the stated estimates of
trainer/planner/gpu_profile.py. Host-side op counts of the head and embeddings are counted, not guessed: each is run
once on the CPU at tiny sizes under a dispatch counter (`op_counts`).
"""
from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
import torch

from trainer.model.seq2seq import LOSS_CHUNK_ROWS
from trainer.planner.gpu_profile import ESTIMATES
from trainer.planner.profile import ProfileError, _get

COUNT_CHUNK = LOSS_CHUNK_ROWS["cpu"]  # the chunk op_counts counts the head's loss in
CHUNK = LOSS_CHUNK_ROWS["accelerator"]  # rows per chunk of the head's loss on a GPU (trainer.model.seq2seq._chunked_loss)
MASK_OPS = 4  # a device-side dropout mask: rand, compare, cast, scale


RATES = ("gemm_tflops", "lstm_gemm_tflops", "memory_tb_s", "gb_s", "efficiency")


def _value(profile: dict, *keys) -> float:
    node = _get(profile, *keys)
    value = node.get("value") if isinstance(node, dict) else node
    least = "> 0" if any(k in RATES for k in keys) else ">= 0"
    if (not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 <= value < math.inf
            or (least == "> 0" and value == 0)):
        raise ProfileError(f"{profile['_path']}: {'.'.join(keys)}: must be a finite number {least} (or {{value, source}})")
    return float(value)


class _OpCounter(torch.utils._python_dispatch.TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += 1
        return func(*args, **(kwargs or {}))


def _count(fn) -> int:
    with _OpCounter() as counter:
        fn()
    return counter.count


@lru_cache(maxsize=None)
def op_counts(attention: str, dtype: str = "fp32") -> dict:
    """aten ops per call of each component at tiny sizes on the CPU, its weights in `dtype` (sizes do not change
    the count, except the head's per-chunk loop; bf16 adds the loss's casts): what the host launches on a GPU."""
    from trainer.model.seq2seq import AttentionSoftmaxHead, Embeddings

    torch.manual_seed(0)
    lstm = torch.nn.LSTM(4, 4, batch_first=True)
    x = torch.randn(2, 3, 4, requires_grad=True)
    out = {"lstm_fwd": _count(lambda: lstm(x))}
    y, _ = lstm(x)
    out["lstm_bwd"] = _count(lambda: y.sum().backward())
    emb = Embeddings(src_vocab=10, tgt_vocab=10, emb_dim=4, dropout=0.0)
    ids = torch.tensor([[1, 2, 3]])
    out["embedding_fwd"] = _count(lambda: emb.embed_src(ids))
    e = emb.embed_src(ids)
    out["embedding_bwd"] = _count(lambda: e.sum().backward())
    kind = torch.bfloat16 if dtype == "bf16" else torch.float32
    head = AttentionSoftmaxHead(hidden=4, tgt_vocab=10, attention=attention, dropout=0.0, label_smoothing=0.1).to(kind)
    head.loss_projection = "whole"  # what an accelerator runs (trainer.training.tuning.loss_projection)

    def head_call(tokens: int) -> int:
        enc = torch.randn(1, 3, 4, dtype=kind, requires_grad=True)
        dec = torch.randn(1, tokens, 4, dtype=kind, requires_grad=True)
        tgt = torch.randint(4, 10, (1, tokens))
        mask = torch.ones(1, 3, dtype=torch.bool)
        return _count(lambda: head(enc, mask, dec, tgt)[0].backward())

    one, three = head_call(COUNT_CHUNK), head_call(3 * COUNT_CHUNK)
    out["head_per_chunk"] = max(0, (three - one) // 2)
    out["head_fixed"] = one - out["head_per_chunk"]
    return out


class RooflineDevice:
    """A GPU of a profile's roofline section, at one precision, linked to its peers by `link`. `math`: what the
    matrix work runs in where it differs from the storage precision: "tf32" (train.tf32: fp32 matmuls and cuDNN
    in TF32), "cudnn_tf32" (torch's defaults: cuDNN in TF32, matmuls in fp32); default `precision`."""

    kind = "roofline"
    masks_by_rows = False  # an accelerator draws a dropout mask for the whole micro-batch, one launch

    def __init__(self, profile: dict, precision: str, link: str, dims=None, math: str | None = None):
        self.profile, self.precision = profile, precision
        self.math = math or precision
        gemm_math = {"cudnn_tf32": "fp32"}.get(self.math, self.math)
        lstm_math = {"cudnn_tf32": "tf32"}.get(self.math, self.math)
        self.gemm_rate, self.lstm_rate = _Rates(profile, gemm_math), _Rates(profile, lstm_math, lstm=True)
        self.bw = _value(profile, "roofline", "memory_tb_s") * 1e12
        us = lambda key: _price(profile, key) * 1e-6  # noqa: E731
        self.op, self.host_op = us("op_overhead_us"), us("host_op_us")
        self.call = {"fwd": us("lstm_call_us"), "bwd": us("lstm_call_bwd_us")}
        self.step_host = {"fwd": us("lstm_step_us"), "bwd": us("lstm_step_bwd_us")}
        self.stack_ratio = {"fwd": _price(profile, "lstm_stack_step_ratio"),
                            "bwd": _price(profile, "lstm_stack_step_bwd_ratio")}
        self.step_device = us("lstm_step_device_us")
        self.optimizer_host, self.optimizer_tensor = us("optimizer_host_us"), us("optimizer_tensor_us")
        self.per_instruction = us("instruction_us")
        self.backward_call = us("backward_call_us")
        self.micro_step = self.per_instruction
        self.sync = us("sync_us")
        self.host_collective = us("host_collective_us")
        links = _get(profile, "roofline", "links")
        if link not in links:
            raise ProfileError(f"{profile['_path']}: roofline.links.{link}: no such link (has: {', '.join(sorted(links))})")
        self.link_name = link
        r = ("roofline", "links", link)
        self.link_bw = _value(profile, *r, "gb_s") * 1e9 * _value(profile, *r, "efficiency")
        self.link_latency = _value(profile, *r, "latency_us") * 1e-6
        self.bytes = 2 if precision == "bf16" else 4
        self.ops = op_counts(dims.attention if dims is not None else "general", "bf16" if precision == "bf16" else "fp32")
        self.hidden = dims.hidden if dims is not None else 0
        self.out_dim = dims.out_dim if dims is not None else 0
        self.vocab = dims.tgt_vocab if dims is not None else 0
        self.src_vocab = dims.src_vocab if dims is not None else 0
        self.emb = dims.emb if dims is not None else 0
        self._memo: dict = {}  # (counts, in_dim, hidden, backward, layers above) -> seconds of an LSTM call

    def instruction(self, op: str) -> float:
        return self.per_instruction

    # ---- kernels ----
    def gemm(self, m: float, n: float, k: float, rate=None) -> float:
        if m <= 0 or n <= 0 or k <= 0:
            return 0.0
        rate = rate or self.gemm_rate
        return max(2.0 * m * n * k / rate(m), (m * k + k * n + m * n) * self.bytes / self.bw)

    def _paced(self, gpu: float, ops: float) -> float:
        """Work of `ops` aten ops outside cuDNN: the host queues them while the device runs them."""
        return max(gpu, ops * self.host_op)

    def _steps(self, counts, in_dim: int, hidden: int, backward: bool, above: int) -> float:
        """One cuDNN call over recurrent steps with `counts` active rows each (+ the input projections over all
        of them), for a layer and `above` more stacked on it (hidden -> hidden)."""
        tokens, g4, rate = sum(counts), 4 * hidden, self.lstm_rate
        direction = "bwd" if backward else "fwd"
        layers = 1 + above
        each = {n: max(self.step_device, self.gemm(n, g4, hidden, rate) + 10 * n * g4 * self.bytes / self.bw)
                for n in set(counts) if n}  # a step's price depends on its rows alone: once per distinct count
        gpu = layers * sum(each[n] for n in counts if n)
        for i in [in_dim] + [hidden] * above:
            if backward:  # the input's gradient and both weight gradients, one product each over all steps
                gpu += self.gemm(tokens, i, g4, rate) + self.gemm(g4, i, tokens, rate) + self.gemm(g4, hidden, tokens, rate)
            else:
                gpu += self.gemm(tokens, g4, i, rate)
        steps = sum(1 for n in counts if n)
        host = self.call[direction] + steps * self.step_host[direction] * layers * (self.stack_ratio[direction] if above else 1.0)
        return max(gpu, host)

    # ---- the interface costs.py prices with (seconds) ----
    def lstm_fused(self, direction: str, in_dim: int, hidden: int, rows: int, steps: int, above: int = 0) -> float:
        return self._memo_steps((rows,) * steps, in_dim, hidden, direction == "bwd", above) if rows and steps else 0.0

    def lstm_packed(self, direction: str, in_dim: int, hidden: int, counts, above: int = 0) -> float:
        return self._memo_steps(tuple(counts), in_dim, hidden, direction == "bwd", above) if any(counts) else 0.0

    def _memo_steps(self, counts: tuple, in_dim: int, hidden: int, backward: bool, above: int) -> float:
        """_steps, once per shape: the candidates of a ranking share this device and mostly the same chunks."""
        key = (counts, in_dim, hidden, backward, above)
        if key not in self._memo:
            self._memo[key] = self._steps(list(counts), in_dim, hidden, backward, above)
        return self._memo[key]

    def embed(self, side: str, direction: str, tokens: int) -> float:
        if not tokens:
            return 0.0
        if direction == "fwd":
            return self._paced(2 * tokens * self.emb * self.bytes / self.bw, self.ops["embedding_fwd"])
        table = (self.src_vocab if side == "src" else self.vocab) * self.emb  # the dense gradient of the table
        return self._paced((3 * table + 2 * tokens * self.emb) * self.bytes / self.bw, self.ops["embedding_bwd"])

    def dropout_mask(self, elements: int) -> float:
        """Drawn on the device: random floats (4 bytes written), compared (4 read, 1 written), cast and
        scaled to the parameters' dtype (read and written twice)."""
        if not elements:
            return 0.0
        return self._paced(elements * (4 + 5 + 1 + 3 * self.bytes) / self.bw, MASK_OPS)

    def copy_bytes(self, nbytes: int) -> float:
        return self._paced(nbytes / self.bw, 1) if nbytes else 0.0

    def head_step(self, rows: int, src: int, tgt: int, tokens: int) -> float:
        if not rows:
            return 0.0
        h, d, v, positions = self.hidden, self.out_dim, self.vocab, rows * tgt
        attention = self.gemm(positions, h, h) + 2 * rows * self.gemm(tgt, src, h)
        projection = self.gemm(tokens, v, d) + self.gemm(tokens, d, v) + self.gemm(v, d + 1, tokens)
        attentional = self.gemm(tokens, d, 2 * h)
        elementwise = (6 * tokens * v * 4 + 6 * positions * src * 4) / self.bw
        gpu = 3 * (attention + attentional) + projection + elementwise
        chunks = math.ceil(tokens / CHUNK)
        return self._paced(gpu, self.ops["head_fixed"] + chunks * self.ops["head_per_chunk"])

    def optimizer(self, params: int, tensors: int) -> float:
        """The step's one device sync (the gradient norm read back: the host waits for the queue), then the
        adapter's lean_step: bf16 gradient copies to fp32 (one foreach), the clip, fused Adam on the fp32 masters
        and the copy back, about 40 bytes per parameter on the device; its host part beside that."""
        host = self.optimizer_host + (tensors * self.optimizer_tensor if self.precision == "bf16" else 0.0)
        return self.sync + max(host, 40 * params / self.bw)

    def slowdown(self, component: str) -> float:
        return 1.0  # each rank has a GPU of its own

    # ---- between GPUs ----
    def p2p(self, nbytes: int) -> tuple[float, float]:
        return self.op, self.link_latency + nbytes / self.link_bw

    def collective_cpu(self, name: str, nbytes: int, ranks: int) -> float:
        return 0.0  # NCCL's transfers run on the device, not on the caller's host core

    def collective(self, name: str, nbytes: int, ranks: int, itemsize: int = 4) -> float:
        """NCCL's ring: an all-reduce moves 2 (n - 1) / n of the bytes through each link in 2 (n - 1)
        steps; reduce and broadcast (n - 1) / n ... 1 of them, pipelined. The loss sums (16 bytes) go
        over gloo between host processes. `itemsize` changes nothing: NCCL's sums keep pace with the link."""
        if ranks <= 1:
            return 0.0
        if nbytes <= 16:
            return self.host_collective
        if name == "all_reduce":
            return 2 * (ranks - 1) * self.link_latency + 2 * (ranks - 1) / ranks * nbytes / self.link_bw
        return (ranks - 1) * self.link_latency + nbytes / self.link_bw


def _price(profile: dict, key: str) -> float:
    """A host price or floor of the roofline section; a profile written before the key existed takes its stated
    estimate (trainer.planner.gpu_profile.ESTIMATES)."""
    if key not in profile["roofline"] and key in ESTIMATES:
        return float(ESTIMATES[key][0])
    return _value(profile, "roofline", key)


class _Rates:
    """The matrix rate (FLOP/s) of a product with m rows, in one precision: the measured rates by rows
    (gemm_rates), linear in log(m) between them and flat beyond; else one rate for every size."""

    def __init__(self, profile: dict, precision: str, lstm: bool = False):
        roof = profile["roofline"]
        points = (roof.get("gemm_rates") or {}).get(precision)
        if points:
            pts = points.get("value") if isinstance(points, dict) else points
            if (not isinstance(pts, list) or not pts
                    or not all(isinstance(p, list) and len(p) == 2 and all(_positive(v) for v in p) for p in pts)):
                raise ProfileError(f"{profile['_path']}: roofline.gemm_rates.{precision}: must be a non-empty list of "
                                   f"[rows, tflops] pairs of finite numbers > 0")
            pts = sorted(pts)
            self.log_rows, self.rates = [math.log2(m) for m, _ in pts], [t * 1e12 for _, t in pts]
            return
        self.log_rows = None
        if precision in roof.get("gemm_tflops", {}):
            key = "lstm_gemm_tflops" if lstm and precision in roof.get("lstm_gemm_tflops", {}) else "gemm_tflops"
            self.flat = _value(profile, "roofline", key, precision) * 1e12
        elif precision == "tf32":  # older profiles: cuDNN's TF32 LSTM rate under lstm_gemm_tflops.fp32
            self.flat = _value(profile, "roofline", "lstm_gemm_tflops", "fp32") * 1e12
        else:
            self.flat = _value(profile, "roofline", "gemm_tflops", precision) * 1e12

    def __call__(self, m: float) -> float:
        if self.log_rows is None:
            return self.flat
        return float(np.interp(math.log2(max(m, 1.0)), self.log_rows, self.rates))


def _positive(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < math.inf
