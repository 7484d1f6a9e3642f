"""A GPU priced from its rates (the profile's "roofline" section) when no calibrated layer table exists:
every kernel takes max(FLOPs / matrix rate, bytes / memory bandwidth), and a piece of work takes the
longer of its kernels' GPU time and the host's time to launch them (eager PyTorch launches
asynchronously, so whichever is slower sets the pace). The LSTM recurrence runs step after step, each
step at least `lstm_step_us` (cuDNN's per-step kernels). Dropout masks are drawn on the device
(trainer/model/dropout.py: a generator keyed like the host one; a few elementwise passes per site). The
optimizer step reads the gradient norm back once (the step's one device sync, tests/test_device_syncs.py),
and the head's loss runs in chunks of LOSS_CHUNK_ROWS["accelerator"] rows.

Section format, every number {"value": x, "source": "datasheet: ... | measured: ... | estimate: ..."}:
    gemm_tflops {bf16, fp32}   matrix rate reached by large products (fp32: cuBLAS without TF32)
    lstm_gemm_tflops {...}     the same for cuDNN's LSTM (fp32 LSTMs run on TF32 by default); optional
    memory_tb_s                device memory bandwidth (bytes read + written)
    op_overhead_us             host time per eager aten op (dispatch + launch)
    lstm_step_us               least time of one LSTM time step (forward; backward twice)
    instruction_us             the interpreter's own work per instruction; backward_call_us DeepSpeed's
    sync_us                    one device sync: the host waits for the queue, then a small device-to-host copy
    host_collective_us         a small gloo all-reduce between the ranks' host processes (the loss sums)
    links {NAME: {gb_s (one direction), latency_us, efficiency}}   NCCL over NVLink, PCIe, ...
Host-side op counts per call are counted, not guessed: each component is run once on the CPU at tiny
sizes under a dispatch counter (`op_counts`).
"""
from __future__ import annotations

import math
from functools import lru_cache

import torch

from trainer.model.seq2seq import LOSS_CHUNK_ROWS
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
def op_counts(attention: str) -> dict:
    """aten ops per call of each component at tiny sizes on the CPU (sizes do not change the count,
    except the head's per-chunk loop): what the host launches on a GPU."""
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
    head = AttentionSoftmaxHead(hidden=4, tgt_vocab=10, attention=attention, dropout=0.0, label_smoothing=0.1)
    head.loss_projection = "whole"  # what an accelerator runs (trainer.training.tuning.loss_projection)

    def head_call(tokens: int) -> int:
        enc, dec = torch.randn(1, 3, 4, requires_grad=True), torch.randn(1, tokens, 4, requires_grad=True)
        tgt = torch.randint(4, 10, (1, tokens))
        mask = torch.ones(1, 3, dtype=torch.bool)
        return _count(lambda: head(enc, mask, dec, tgt)[0].backward())

    one, three = head_call(COUNT_CHUNK), head_call(3 * COUNT_CHUNK)
    out["head_per_chunk"] = max(0, (three - one) // 2)
    out["head_fixed"] = one - out["head_per_chunk"]
    return out


class RooflineDevice:
    """A GPU of a profile's roofline section, at one precision, linked to its peers by `link`."""

    kind = "roofline"

    def __init__(self, profile: dict, precision: str, link: str, dims=None):
        self.profile, self.precision = profile, precision
        r = ("roofline",)
        self.peak = _value(profile, *r, "gemm_tflops", precision) * 1e12
        self.lstm_peak = (_value(profile, *r, "lstm_gemm_tflops", precision) * 1e12
                          if precision in profile["roofline"].get("lstm_gemm_tflops", {}) else self.peak)
        self.bw = _value(profile, *r, "memory_tb_s") * 1e12
        self.op = _value(profile, *r, "op_overhead_us") * 1e-6
        self.step = _value(profile, *r, "lstm_step_us") * 1e-6
        self.per_instruction = _value(profile, *r, "instruction_us") * 1e-6
        self.backward_call = _value(profile, *r, "backward_call_us") * 1e-6
        self.micro_step = self.per_instruction
        self.sync = _value(profile, *r, "sync_us") * 1e-6
        self.host_collective = _value(profile, *r, "host_collective_us") * 1e-6
        links = _get(profile, *r, "links")
        if link not in links:
            raise ProfileError(f"{profile['_path']}: roofline.links.{link}: no such link (has: {', '.join(sorted(links))})")
        self.link_name = link
        self.link_bw = _value(profile, *r, "links", link, "gb_s") * 1e9 * _value(profile, *r, "links", link, "efficiency")
        self.link_latency = _value(profile, *r, "links", link, "latency_us") * 1e-6
        self.bytes = 2 if precision == "bf16" else 4
        self.ops = op_counts(dims.attention if dims is not None else "general")
        self.hidden = dims.hidden if dims is not None else 0
        self.out_dim = dims.out_dim if dims is not None else 0
        self.vocab = dims.tgt_vocab if dims is not None else 0
        self.src_vocab = dims.src_vocab if dims is not None else 0
        self.emb = dims.emb if dims is not None else 0
        self._memo: dict = {}  # (counts, in_dim, hidden, backward) -> seconds of an LSTM call

    def instruction(self, op: str) -> float:
        return self.per_instruction

    # ---- kernels ----
    def gemm(self, m: float, n: float, k: float, peak: float | None = None) -> float:
        if m <= 0 or n <= 0 or k <= 0:
            return 0.0
        return max(2.0 * m * n * k / (peak or self.peak), (m * k + k * n + m * n) * self.bytes / self.bw)

    def _paced(self, gpu: float, ops: float) -> float:
        return max(gpu, ops * self.op)

    def _steps(self, counts, in_dim: int, hidden: int, backward: bool) -> float:
        """Recurrent steps with `counts` active rows each (+ the input projection over all of them)."""
        tokens = sum(counts)
        g4 = 4 * hidden
        peak = self.lstm_peak
        each = {n: max(self.step, self.gemm(n, g4, hidden, peak) + 10 * n * g4 * self.bytes / self.bw)
                for n in set(counts) if n}  # a step's price depends on its rows alone: once per distinct count
        gpu = sum([each[n] for n in counts if n]) * (2 if backward else 1)
        if backward:  # gradients of the input and of both weight matrices, one product each at the end
            gpu += self.gemm(tokens, in_dim, g4, peak) + self.gemm(g4, in_dim + hidden, tokens, peak)
        else:
            gpu += self.gemm(tokens, g4, in_dim, peak)
        return self._paced(gpu, self.ops["lstm_bwd" if backward else "lstm_fwd"])

    # ---- the interface costs.py prices with (seconds) ----
    def lstm_fused(self, direction: str, in_dim: int, hidden: int, rows: int, steps: int) -> float:
        return self._memo_steps((rows,) * steps, in_dim, hidden, direction == "bwd") if rows and steps else 0.0

    def lstm_packed(self, direction: str, in_dim: int, hidden: int, counts) -> float:
        return self._memo_steps(tuple(counts), in_dim, hidden, direction == "bwd") if any(counts) else 0.0

    def _memo_steps(self, counts: tuple, in_dim: int, hidden: int, backward: bool) -> float:
        """_steps, once per shape: the candidates of a ranking share this device and mostly the same chunks."""
        key = (counts, in_dim, hidden, backward)
        if key not in self._memo:
            self._memo[key] = self._steps(list(counts), in_dim, hidden, backward)
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
        """The adapter's lean_step: bf16 gradient copies to fp32 (one op per tensor), the norm, fused Adam on
        the fp32 masters and the copy back (foreach ops: a few launches in all), about 40 bytes per
        parameter; and the step's one device sync, the norm's read (the host waits for the queue)."""
        return self._paced(40 * params / self.bw, 16 + (tensors if self.precision == "bf16" else 0)) + self.sync

    def slowdown(self, component: str) -> float:
        return 1.0  # each rank has a GPU of its own

    # ---- between GPUs ----
    def p2p(self, nbytes: int) -> tuple[float, float]:
        return self.op, self.link_latency + nbytes / self.link_bw

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
