"""The per-rank module and the interpreter that runs the schedule on a DeepSpeed engine.

Each rank holds a `RankModule`: its slice of the pair layers (a deepspeed.pipe PipelineModule built
from LayerSpecs, partitioned by the layout, each layer seeded by its global index) plus, where the
layout puts one, a replica of the attention-softmax head. DeepSpeed (a plain DeepSpeedEngine with
the layout's PipelineParallelGrid as mpu) owns the optimizer, LR schedule, clipping, precision and
the replica all-reduce; `StepRunner` executes `trainer.schedule` instruction lists on it.

Reductions: each head replica sums token cross-entropies of its shard and divides by the token count
of the whole accumulation window (all replicas, all micro-batches), times num_dp because DeepSpeed's
data-parallel all-reduce averages over replicas. So every gradient is d(global summed CE / global
tokens).

The head's weights are owned by the last stage: only there are they DeepSpeed parameters (in the
optimizer, in the gradient norm). In hybrid mode the other stages hold replicas outside the
optimizer: their gradients are summed into the owner over the pipe group before DeepSpeed's replica
all-reduce, and the owner broadcasts the updated weights after the step. The same traffic as an
all-reduce, one optimizer update instead of num_pp, and DeepSpeed's norm counts every weight once in
fp32, bf16 and fp16 alike (its bf16/fp16 norm ignores `ds_pipe_replicated` tags on gradients).
"""
from __future__ import annotations

import time

import torch
import torch.nn as nn
import torch.nn.functional as F

from trainer.comm import StageComm, broadcast, reduce_sum
from trainer.data import Batch
from trainer.distributed import CommError, is_comm_failure
from trainer.layout import LayoutError, ParallelLayout, split_even
from trainer.model import HEAD_SEED_OFFSET, Embeddings, EncoderDecoderLayer, build_head, layer_builders
from trainer.schedule import Instr, build_schedule


class RankModule(nn.Module):
    """This rank's layers (`stages`, a PipelineModule) and its head (or None). `owns_head`: the head's
    weights here are the trained ones (last stage); elsewhere the head is a replica."""

    def __init__(self, stages: nn.Module, head: nn.Module | None, owns_head: bool):
        super().__init__()
        self.stages = stages
        self.head = head
        self.owns_head = owns_head

    def optimizer_parameters(self) -> list[nn.Parameter]:
        """What DeepSpeed's optimizer updates: everything but a head replica."""
        if self.owns_head or self.head is None:
            return list(self.parameters())
        replica = {id(p) for p in self.head.parameters()}
        return [p for p in self.parameters() if id(p) not in replica]

    @property
    def first_layer(self) -> int:
        return self.stages._local_start

    @property
    def layers(self) -> list[nn.Module]:
        return list(self.stages.forward_funcs)


def build_rank_module(model_cfg, spec, src_vocab: int, tgt_vocab: int, seed: int, topology) -> RankModule:
    from deepspeed.pipe import LayerSpec, PipelineModule

    specs = [LayerSpec(cls, **kwargs) for cls, kwargs in layer_builders(model_cfg, src_vocab, tgt_vocab)]
    method = spec.partition_method
    try:
        stages = PipelineModule(layers=specs, topology=topology, partition_method=method,
                                seed_layers=True, seed_fn=_seed_layer, base_seed=seed)
    except (NotImplementedError, ValueError, IndexError) as e:
        raise LayoutError(f"parallel_layout.partition_method={method!r}: {e}") from None
    stages.checkpoint_parallel_write_pipeline = False
    parts = stages.parts
    for s in range(spec.num_pp):
        kinds = [specs[i].typename for i in range(parts[s], parts[s + 1])]
        if EncoderDecoderLayer not in kinds:
            raise LayoutError(f"parallel_layout.partition_method={method!r} gives stage {s} no encoder/decoder "
                              f"pair layer (layers {parts[s]}..{parts[s + 1] - 1}); use "
                              f"'type:EncoderDecoderLayer'")
    stage = stages.stage_id
    head = None
    if spec.head_parallel or stage == spec.num_pp - 1:
        torch.manual_seed(seed + HEAD_SEED_OFFSET)
        head = build_head(model_cfg, tgt_vocab)
        if model_cfg.tie_embeddings:
            head.proj.weight = stages.forward_funcs[0].tgt.weight
    owns_head = stage == spec.num_pp - 1
    if spec.num_pp > 1:
        # The global gradient norm sums over the pipeline's stages; DeepSpeed's fp32 clip_grad_norm_
        # counts a parameter on stage 0 only unless it is tagged `model_parallel`. Stage layers and
        # the owned head are distinct per stage; head replicas have no gradient at the step.
        for p in stages.parameters():
            p.model_parallel = True
        if owns_head:
            for p in head.parameters():
                p.model_parallel = True
    return RankModule(stages, head, owns_head)


def _seed_layer(seed) -> None:
    """Layer k is built after manual_seed(seed + k) in every layout (partitioners hand numpy ints)."""
    torch.manual_seed(int(seed))


class _Record:
    """Autograd bookkeeping of one (kind, unit, chunk) on this rank."""

    __slots__ = ("x_in", "x_out", "state_in", "state_out")

    def __init__(self, x_in, x_out, state_in, state_out):
        self.x_in, self.x_out, self.state_in, self.state_out = x_in, x_out, state_in, state_out


def _leaf(t: torch.Tensor) -> torch.Tensor:
    return t.detach().requires_grad_(True)


class StepRunner:
    """Executes one micro-step's instruction list on this rank."""

    def __init__(self, layout: ParallelLayout, engine, module: RankModule, device, hidden: int):
        self.layout, self.engine, self.module, self.device, self.hidden = layout, engine, module, device, hidden
        self.dtype = next(module.parameters()).dtype
        self.comm = StageComm(layout.stage_ranks, device, self.dtype)
        layers = module.layers
        self.embeddings = layers[0] if isinstance(layers[0], Embeddings) else None
        self.pairs = [m for m in layers if isinstance(m, EncoderDecoderLayer)]
        spec = layout.spec
        self.programs = {b: build_schedule(layout.stage, spec.num_pp, spec.micro_batches, spec.time_chunks,
                                           spec.head_parallel, boundary=b) for b in (True, False)}
        self.eval_program = [i for i in self.programs[False] if i.op in _EVAL_OPS]
        self.op_seconds: dict[str, float] = {}  # wall time per instruction type (receives include waiting)
        self.pending_head_grads = self.pending_head_weights = None  # async head collectives in flight
        self.poison = False  # set by the trainer to inject a non-finite loss (tests of the skip logic)

    # ---- the interpreter ----
    def run(self, batch: Batch, *, window_tokens: int = 0, boundary: bool = True, train: bool = True) -> dict:
        """One micro-step on the global micro-batch `batch` (identical on every rank).

        Returns {'loss_sum', 'nll_sum'} summed over every rank (the whole global micro-batch).
        """
        self._setup(batch, window_tokens, train)
        program = self.programs[boundary] if train else self.eval_program
        clock, times = time.perf_counter, self.op_seconds if train else {}
        with torch.set_grad_enabled(train):
            for ins in program:
                start = clock()
                try:
                    _DISPATCH[ins.op](self, ins)
                except RuntimeError as e:
                    raise self._comm_error(ins, e) if is_comm_failure(e) else e
                times[ins.op] = times.get(ins.op, 0.0) + clock() - start
        start = clock()
        try:
            self.comm.flush()
        except RuntimeError as e:
            raise self._comm_error(Instr("flush_sends"), e) if is_comm_failure(e) else e
        times["flush_sends"] = times.get("flush_sends", 0.0) + clock() - start
        out = {"loss_sum": float(self.metrics[0]), "nll_sum": float(self.metrics[1])}
        self.records = self.tops = None
        return out

    def _comm_error(self, ins: Instr, err: RuntimeError) -> CommError:
        """Name the instruction and, for point-to-point ones, the peer's global rank."""
        layout = self.layout
        peer = f" with rank {layout.stage_ranks[ins.peer]} (stage {ins.peer})" if ins.peer >= 0 else ""
        return CommError(f"rank {layout.rank} (stage {layout.stage}, replica {layout.replica}): {ins.op}{peer} "
                         f"failed: {str(err).splitlines()[0][:300]}")

    def _setup(self, batch: Batch, window_tokens: int, train: bool) -> None:
        spec = self.layout.spec
        start, stop = self.layout.replica_rows(batch.size)
        self.replica = batch.rows(start, stop).to(self.device)
        self.units = [self.replica.rows(a, b) for a, b in split_even(self.replica.size, spec.micro_batches)]
        self.unit_rows = split_even(self.replica.size, spec.micro_batches)
        self.chunks = {
            "enc": [split_even(u.src.shape[1], spec.time_chunks) for u in self.units],
            "dec": [split_even(u.tgt_in.shape[1], spec.time_chunks) for u in self.units],
        }
        # num_dp: DeepSpeed averages over replicas; we want the sum over the global window
        self.loss_scale = spec.num_dp / window_tokens if window_tokens else 0.0
        self.records: dict[tuple, _Record] = {}
        self.tops: dict[tuple, torch.Tensor] = {}
        self.pending_recv: dict[tuple, torch.Tensor] = {}
        self.top_grads = None
        self.metrics = torch.zeros(2, dtype=torch.float64)
        self.train = train

    def _width(self, kind: str, unit: int, chunk: int) -> int:
        a, b = self.chunks[kind][unit][chunk]
        return b - a

    def _act_shape(self, kind: str, unit: int, chunk: int):
        return (self.units[unit].size, self._width(kind, unit, chunk), self.hidden)

    # forward
    def _recv_forward(self, ins: Instr) -> None:
        shape = self._act_shape(ins.kind, ins.unit, ins.chunk)
        self.pending_recv[(ins.kind, ins.unit, ins.chunk)] = self.comm.recv_forward(shape, ins.peer)

    def _forward(self, ins: Instr) -> None:
        kind, u, c = ins.kind, ins.unit, ins.chunk
        unit = self.units[u]
        a, b = self.chunks[kind][u][c]
        if self.embeddings is not None:
            x_in = None
            x = (self.embeddings.embed_src(unit.src[:, a:b]) if kind == "enc"
                 else self.embeddings.embed_tgt(unit.tgt_in[:, a:b]))
        else:
            x_in = self.pending_recv.pop((kind, u, c))
            x = x_in = _leaf(x_in) if self.train else x_in
        state_in = self._state_in(kind, u, c)
        state_out = []
        if kind == "enc":
            lengths = (unit.src_lengths - a).clamp(0, b - a)
            for pair, st in zip(self.pairs, state_in):
                x, st = pair.encode(x, lengths, st)
                state_out.append(pair.decoder_init(st) if c == len(self.chunks["enc"][u]) - 1 else st)
        else:
            for pair, st in zip(self.pairs, state_in):
                x, st = pair.decode(x, st)
                state_out.append(st)
        self.records[(kind, u, c)] = _Record(x_in, x, state_in, state_out)

    def _state_in(self, kind: str, u: int, c: int) -> list:
        """Each local layer's incoming LSTM state: carried from the previous time chunk of the same
        unit, or (decoder chunk 0) the encoder's final state. Detached leaves, so each chunk's
        backward is separate and hands the state gradient on explicitly."""
        if kind == "enc" and c == 0:
            return [None] * len(self.pairs)
        prev = self.records[("enc", u, len(self.chunks["enc"][u]) - 1) if c == 0 else (kind, u, c - 1)]
        if not self.train:
            return list(prev.state_out)
        return [tuple(_leaf(t) for t in st) if st is not None else None for st in prev.state_out]

    def _send_forward(self, ins: Instr) -> None:
        self.comm.send_forward(self.records[(ins.kind, ins.unit, ins.chunk)].x_out, ins.peer)

    # the head phase
    def _top(self, kind: str) -> torch.Tensor:
        """The replica's top encoder (kind 'enc') or decoder outputs, (rows, len, hidden), detached."""
        rep = self.replica
        width = rep.src.shape[1] if kind == "enc" else rep.tgt_in.shape[1]
        parts = []
        for u, unit in enumerate(self.units):
            t = torch.cat([self.records[(kind, u, c)].x_out.detach() for c in range(len(self.chunks[kind][u]))], 1)
            parts.append(F.pad(t, (0, 0, 0, width - t.shape[1])))
        return torch.cat(parts, 0)

    def _shard(self, stage: int) -> tuple[Batch, int, int]:
        a, b = self.layout.head_shards(self.replica.size)[stage]
        return self.replica.rows(a, b), a, b

    def _scatter_shard(self, ins: Instr) -> None:
        if "enc" not in self.tops:
            self.tops = {"enc": self._top("enc"), "dec": self._top("dec")}
        shard, a, b = self._shard(ins.peer)
        self.comm.scatter_shard(self.tops["enc"][a:b, :shard.src.shape[1]],
                                self.tops["dec"][a:b, :shard.tgt_in.shape[1]], ins.peer)

    def _recv_shard(self, ins: Instr) -> None:
        shard, _, _ = self._shard(self.layout.stage)
        enc, dec = self.comm.recv_shard((shard.size, shard.src.shape[1], self.hidden),
                                        (shard.size, shard.tgt_in.shape[1], self.hidden), ins.peer)
        self.tops = {"shard": (enc, dec)}

    def _head(self, ins: Instr) -> None:
        shard, a, b = self._shard(self.layout.stage)
        if "shard" in self.tops:
            enc, dec = self.tops["shard"]
        else:
            if "enc" not in self.tops:
                self.tops = {"enc": self._top("enc"), "dec": self._top("dec")}
            enc = self.tops["enc"][a:b, :shard.src.shape[1]]
            dec = self.tops["dec"][a:b, :shard.tgt_in.shape[1]]
        if self.train:
            enc, dec = _leaf(enc), _leaf(dec)
        self.sync_head()
        loss_sum, nll_sum = self.module.head(enc, shard.src_mask, dec, shard.tgt_out)
        if self.poison and self.train:  # fault injection (trainer.faults): a non-finite loss
            loss_sum = loss_sum * float("nan")
        self.metrics += torch.tensor([loss_sum.item(), nll_sum.item()], dtype=torch.float64)
        if not self.train:
            return
        self.engine.backward(loss_sum * self.loss_scale, scale_wrt_gas=False)
        self.shard_grads = (enc.grad, dec.grad)
        if self.layout.is_last:
            rep = self.replica
            self.top_grads = {
                "enc": torch.zeros(rep.size, rep.src.shape[1], self.hidden, device=self.device, dtype=self.dtype),
                "dec": torch.zeros(rep.size, rep.tgt_in.shape[1], self.hidden, device=self.device, dtype=self.dtype),
            }
            self._place_grads(self.layout.stage, *self.shard_grads)

    def _place_grads(self, stage: int, enc_grad, dec_grad) -> None:
        _, a, b = self._shard(stage)
        self.top_grads["enc"][a:b, :enc_grad.shape[1]] += enc_grad
        self.top_grads["dec"][a:b, :dec_grad.shape[1]] += dec_grad

    def _send_shard_grad(self, ins: Instr) -> None:
        self.comm.send_shard_grad(*self.shard_grads, ins.peer)

    def _gather_grad(self, ins: Instr) -> None:
        stage = ins.peer
        shard, _, _ = self._shard(stage)
        enc, dec = self.comm.gather_grad((shard.size, shard.src.shape[1], self.hidden),
                                         (shard.size, shard.tgt_in.shape[1], self.hidden), ins.peer)
        self._place_grads(stage, enc, dec)

    # backward
    def _recv_backward(self, ins: Instr) -> None:
        shape = self._act_shape(ins.kind, ins.unit, ins.chunk)
        self.pending_recv[("grad", ins.kind, ins.unit, ins.chunk)] = self.comm.recv_backward(shape, ins.peer)

    def _out_grad(self, kind: str, u: int, c: int) -> torch.Tensor:
        if not self.layout.is_last:
            return self.pending_recv.pop(("grad", kind, u, c))
        a, b = self.unit_rows[u]
        ca, cb = self.chunks[kind][u][c]
        return self.top_grads[kind][a:b, ca:cb]

    def _backward(self, ins: Instr) -> None:
        kind, u, c = ins.kind, ins.unit, ins.chunk
        rec = self.records[(kind, u, c)]
        outs, grads = [rec.x_out], [self._out_grad(kind, u, c)]
        nxt = self._next_state_leaves(kind, u, c)
        for st_out, st_leaf in zip(rec.state_out, nxt):
            if st_leaf is None:
                continue
            for t, leaf in zip(st_out, st_leaf):
                if leaf.grad is not None:
                    outs.append(t)
                    grads.append(leaf.grad)
        surrogate = sum((t * g).sum() for t, g in zip(outs, grads))
        self.engine.backward(surrogate, scale_wrt_gas=False)
        rec.x_out = None

    def _next_state_leaves(self, kind: str, u: int, c: int) -> list:
        """The leaves that consumed this chunk's outgoing states (whose .grad we hand back)."""
        last_enc = len(self.chunks["enc"][u]) - 1
        if kind == "enc":
            nxt = ("dec", u, 0) if c == last_enc else ("enc", u, c + 1)
        else:
            nxt = ("dec", u, c + 1) if c + 1 < len(self.chunks["dec"][u]) else None
        if nxt is None:
            return [None] * len(self.pairs)
        return self.records[nxt].state_in

    def _send_backward(self, ins: Instr) -> None:
        rec = self.records[(ins.kind, ins.unit, ins.chunk)]
        self.comm.send_backward(rec.x_in.grad, ins.peer)

    # collectives and the step
    def _reduce_metrics(self, ins: Instr) -> None:
        import torch.distributed as dist

        dist.all_reduce(self.metrics, op=dist.ReduceOp.SUM)

    def _reduce_grads(self, ins: Instr) -> None:
        if self.layout.num_dp > 1:
            self.engine.allreduce_gradients()

    def _reduce_head_grads(self, ins: Instr) -> None:
        """Start summing every replica's (final) head gradients into the owner (last stage); it runs
        while the LSTM stages do their backward."""
        params = list(self.module.head.parameters())
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        grads = [p.grad for p in params]
        self.pending_head_grads = reduce_sum(grads, dst=self.layout.stage_ranks[-1], group=self.layout.head_group)

    def _wait_head_grads(self, ins: Instr) -> None:
        self.pending_head_grads.wait()
        self.pending_head_grads = None
        if not self.module.owns_head:  # a replica's gradient now lives in the owner
            for p in self.module.head.parameters():
                p.grad = None

    def _broadcast_head(self, ins: Instr) -> None:
        """Start sending the owner's updated head weights to every replica; it runs while the next
        micro-step's LSTM forward does, and completes before the next head phase (`sync_head`)."""
        self.pending_head_weights = broadcast([p.data for p in self.module.head.parameters()],
                                              src=self.layout.stage_ranks[-1], group=self.layout.head_group)

    def sync_head(self) -> None:
        """Finish an in-flight head-weight broadcast (before the head runs, and at the end)."""
        if self.pending_head_weights is not None:
            self.pending_head_weights.wait()
            self.pending_head_weights = None

    def _optimizer_step(self, ins: Instr) -> None:
        self.engine.step()


_EVAL_OPS = {"recv_forward", "forward", "send_forward", "scatter_shard", "recv_shard", "head", "reduce_metrics"}
_DISPATCH = {
    "recv_forward": StepRunner._recv_forward,
    "forward": StepRunner._forward,
    "send_forward": StepRunner._send_forward,
    "scatter_shard": StepRunner._scatter_shard,
    "recv_shard": StepRunner._recv_shard,
    "head": StepRunner._head,
    "gather_grad": StepRunner._gather_grad,
    "send_shard_grad": StepRunner._send_shard_grad,
    "recv_backward": StepRunner._recv_backward,
    "backward": StepRunner._backward,
    "send_backward": StepRunner._send_backward,
    "reduce_metrics": StepRunner._reduce_metrics,
    "reduce_grads": StepRunner._reduce_grads,
    "reduce_head_grads": StepRunner._reduce_head_grads,
    "wait_head_grads": StepRunner._wait_head_grads,
    "broadcast_head": StepRunner._broadcast_head,
    "optimizer_step": StepRunner._optimizer_step,
}
