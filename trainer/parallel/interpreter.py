"""The interpreter: runs one micro-step's instruction list (`trainer.parallel.schedule`) on this rank.

Each instruction type in `schedule.OPS` has a handler `op_<name>` here (checked at import); what
crosses ranks goes through the runtime's verbs, over the group its `Op` declares. Everything a
micro-step builds up (autograd records, received activations, the head's inputs and gradients)
lives in one `MicroStep`, made fresh for every micro-step.

Reductions: each head replica sums token cross-entropies of its shard and divides by the token count
of the whole accumulation window (all replicas, all micro-batches; times fp16's loss scale), and every reduction
over ranks sums
(the head's over the pipeline, `reduce_grads` over a stage's replicas: trainer.parallel.replica_grads). So
every gradient is d(global summed CE / global tokens).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from trainer.data import Batch
from trainer.model import graphed
from trainer.model.dropout import DropoutKeys
from trainer.model.graphs import GraphCache
from trainer.model.lstm_stack import decode_stack, encode_stack
from trainer.model.weight_grads import WeightGradQueue, deferred_weight_grads
from trainer.model.seq2seq import Embeddings, EncoderDecoderLayer
from trainer.model.tensors import to_device
from trainer.observe.op_counter import host
from trainer.parallel import deepspeed_adapter as dsa
from trainer.parallel.comm import AsyncCollective
from trainer.parallel.cut import ReplicaCut, cut_replica
from trainer.parallel.replica_grads import ReplicaGrads
from trainer.parallel.runtime import CommError, ParallelRuntime, is_comm_failure
from trainer.parallel.schedule import KIND_CATEGORY, OPS, Instr, eval_program, rank_programs


class _Record:
    """Autograd bookkeeping of one (kind, unit, chunk) on this rank."""

    __slots__ = ("x_in", "x_out", "state_in", "state_out")

    def __init__(self, x_in, x_out, state_in, state_out):
        self.x_in, self.x_out, self.state_in, self.state_out = x_in, x_out, state_in, state_out


class _Embedded:
    """First stage: a unit's embedded source or target, looked up once for all its time chunks. Each
    chunk reads a leaf slice; the slices' gradients are gathered and the embedding's backward (a dense
    vocabulary x emb gradient) runs once, after the unit's last chunk, instead of once per chunk."""

    __slots__ = ("out", "grad", "pending")

    def __init__(self, out: torch.Tensor, chunks: int):
        self.out, self.grad, self.pending = out, None, chunks

    def take(self, a: int, b: int, grad: torch.Tensor) -> bool:
        """Chunk [a, b)'s input gradient; True once every chunk's is in."""
        if self.grad is None:
            self.grad = torch.zeros_like(self.out)
        if grad is not None:  # None: an empty time chunk
            self.grad[:, a:b] = grad
        self.pending -= 1
        return self.pending == 0


def _leaf(t: torch.Tensor) -> torch.Tensor:
    return t.detach().requires_grad_(True)


class AccumulationWindow:
    """The micro-batches of one optimizer step, owned by the runner: which one is the boundary, the target tokens
    the loss is divided by, and the (loss, nll) sums so far on the device, read back with the gradient norm at the
    optimizer step (the step's one device sync). The engine is told the boundary; DeepSpeed's own counter is
    checked against it (trainer.parallel.deepspeed_adapter.Engine.step)."""

    def __init__(self, batches: list[Batch], device):
        self.batches = batches
        self.tokens = sum(b.tgt_tokens for b in batches)
        self.sums = torch.zeros(2, dtype=torch.float64, device=device)
        self.read: list | None = None  # the sums on the host, once the optimizer step read them

    def boundary(self, micro: int) -> bool:
        return micro == len(self.batches) - 1


@dataclass
class MicroStep:
    """The state of one micro-step on this rank."""

    cut: ReplicaCut  # this replica's rows of the global micro-batch, its units and time chunks (on the device)
    loss_scale: float
    window: AccumulationWindow | None  # training: the optimizer step's window; None in evaluation
    boundary: bool  # the window's last micro-step (evaluation: True)
    records: dict = field(default_factory=dict)  # (kind, unit, chunk) -> _Record
    received: dict = field(default_factory=dict)  # activations / gradients received, not yet used
    top: tuple | None = None  # last stage: the replica's top (encoder, decoder) outputs, assembled
    shards: dict = field(default_factory=dict)  # head inputs received, by unit (-1: this stage's shard)
    shard_grads: dict = field(default_factory=dict)  # gradients w.r.t. them, by unit, until sent
    top_grads: dict | None = None  # last stage: gradients w.r.t. the top outputs, from every piece
    metrics: torch.Tensor | None = None  # on the device: (loss, nll) sums of the pieces this rank ran
    reduced: torch.Tensor | None = None  # on the host: the sums over every rank, after reduce_metrics
    dropout: DropoutKeys | None = None  # the micro-batch's dropout masks; each forward gets its slice
    embedded: dict = field(default_factory=dict)  # first stage, (kind, unit) cut in chunks -> _Embedded

    @property
    def train(self) -> bool:
        return self.window is not None

    @property
    def replica(self) -> Batch:
        return self.cut.replica

    @property
    def units(self) -> list:
        return self.cut.units

    @property
    def unit_rows(self) -> list:
        return self.cut.unit_rows

    @property
    def chunks(self) -> dict:
        return self.cut.chunks


class StepRunner:
    """Executes the schedule on this rank: `step(batches)` for an optimizer step (its accumulation window), and
    `evaluate(batch)` for the forward-only evaluation program."""

    def __init__(self, runtime: ParallelRuntime, engine, module, hidden: int, graphs: GraphCache | None = None):
        self.rt, self.layout, self.engine, self.module, self.hidden = runtime, runtime.layout, engine, module, hidden
        self.graphs = graphs  # train.cuda_graphs: the decoder stack and the head replayed by shape (None: eager)
        self.device = runtime.device()
        self.dtype = next(module.parameters()).dtype
        self.comm = runtime.stage_comm(self.dtype)
        layers = module.layers
        self.embeddings = layers[0] if isinstance(layers[0], Embeddings) else None
        self.pairs = [m for m in layers if isinstance(m, EncoderDecoderLayer)]
        self.programs = rank_programs(self.layout.spec, self.layout.stage)
        self.eval_program = eval_program(self.programs[True])
        self.sync = None if self.device.type == "cpu" else dsa.accelerator().synchronize  # timed steps only
        self.op_seconds: dict[str, float] = {}  # wall time per instruction type (receives include waiting)
        self.kind_seconds: dict[str, float] = {}  # ... per timeline category (trainer.observe.timeline)
        self.spans: list | None = None  # when a list: (op, start, end) of every instruction (the timeline)
        self.span_origin = 0.0
        self.pending: dict = {}  # async op name -> its handle in flight, until the op that completes it
        self.poison = False  # set by the trainer to inject a non-finite loss (tests of the skip logic)
        self.ms: MicroStep | None = None
        # LSTM weight gradients deferred to the program's `weight_grads` (the schedule decides which stages)
        self.weight_grads = WeightGradQueue() if any(i.op == "weight_grads" for i in self.programs[True]) else None
        # ... and the head projection's, to `head_weight_grads`
        self.head_weight_grads = (WeightGradQueue() if any(i.op == "head_weight_grads" for i in self.programs[True])
                                  else None)
        # the replicas' gradient sums (reduce_grads): what this rank's optimizer updates, embeddings by touched row
        self.replica_grads = (ReplicaGrads(runtime, module.optimizer_parameters(), self._row_tables())
                              if self.layout.num_dp > 1 else None)
        # ... started early for the gradients the boundary program has finished (position -> parameters)
        # (not where the sums are done when started: shared memory, trainer.parallel.shm_sum)
        self.early_reduce = (self._early_reduce_points()
                             if self.replica_grads is not None and self.layout.spec.overlap_grad_sums
                             and runtime.sums_overlap else {})

    def _early_reduce_points(self) -> dict[int, list]:
        """Where in the boundary program a group of the replicas' dense gradients is final, so that its sum can
        start while the backward goes on (the drain of reduce_grads shrinks): each LSTM direction's weights
        after the stage's last backward of that kind (not when the schedule defers weight gradients); the head's
        after its last `head`, where the stage owns the whole head (num_pp == 1: elsewhere the pipeline's
        replicas are summed into it later) and its projection gradient is not deferred. A parameter the
        embeddings share (model.tie_embeddings) waits for reduce_grads."""
        program = self.programs[True]
        end = next((i for i, ins in enumerate(program) if ins.op == "reduce_grads"), len(program))
        last = {}
        for i, ins in enumerate(program[:end]):
            if ins.op == "backward" and self.weight_grads is None:
                last[ins.kind] = i
            elif ins.op == "head" and self.layout.num_pp == 1 and self.head_weight_grads is None:
                last["head"] = i
        groups = {"enc": [p for layer in self.module.layers for p in _params_of(layer, "encoder")],
                  "dec": [p for layer in self.module.layers for p in _params_of(layer, "decoder")],
                  "head": [] if self.module.head is None else list(self.module.head.parameters())}
        emb = self.embeddings
        tables = set() if emb is None else {id(emb.src.weight), id(emb.tgt.weight)}  # a tied one: final after
        dense = {id(p) for p in self.replica_grads.dense} - tables                    # the lookup's backward
        points = {i: [p for p in groups[what] if id(p) in dense] for what, i in last.items()}
        return {i: params for i, params in points.items() if params}

    def _row_tables(self) -> dict:
        """The embedding tables whose gradients the replicas sum by touched row (not one tied to the head's
        projection, model.tie_embeddings: its gradient is dense)."""
        if self.embeddings is None:
            return {}
        tables = {"src": self.embeddings.src.weight, "tgt": self.embeddings.tgt.weight}
        head = [] if self.module.head is None else list(self.module.head.parameters())
        return {side: t for side, t in tables.items() if not any(p is t for p in head)}

    @property
    def window_size(self) -> int:
        """Global micro-batches per optimizer step (DeepSpeed's gradient_accumulation_steps)."""
        return self.engine.accumulation_steps

    def step(self, batches: list[Batch], *, key: tuple = (), timed: bool = True) -> dict:
        """One optimizer step on its accumulation window: the global micro-batches `batches` (identical on every
        rank). `key` (seed, step) names the step for the dropout masks (with each micro-batch's index: the same
        in every layout). `timed`: measure every instruction (`op_seconds`, `kind_seconds`, `spans`); on an
        accelerator that synchronises the device at each instruction edge, so untimed steps never wait for it.

        Returns the window's {'loss_sum', 'nll_sum'} summed over every rank."""
        window = AccumulationWindow(batches, self.device)
        for micro, batch in enumerate(batches):
            if self.replica_grads is not None:
                self.replica_grads.note(batch)
            self.ms = ms = self._micro_step(batch, window, window.boundary(micro))
            ms.metrics = window.sums
            ms.dropout = DropoutKeys((*key, micro), batch.size, {"src": batch.src.shape[1],
                                                                 "tgt": batch.tgt_in.shape[1]}, self.device)
            self._run(self.programs[ms.boundary], timed)
        if self.graphs is not None:
            self.graphs.end_step()
        return self._result(ms)

    def evaluate(self, batch: Batch) -> dict:
        """The forward-only program on the global micro-batch `batch`: its {'loss_sum', 'nll_sum'} summed over
        every rank."""
        self.ms = ms = self._micro_step(batch, None, True)
        ms.metrics = torch.zeros(2, dtype=torch.float64, device=self.device)
        self._run(self.eval_program, False)
        return self._result(ms)

    def _run(self, program: list[Instr], timed: bool) -> None:
        ms = self.ms
        with torch.set_grad_enabled(ms.train):
            if ms.train and timed:
                self._run_timed(program)
            else:
                early = self.early_reduce if program is self.programs[True] else {}
                for i, ins in enumerate(program):
                    self._execute(ins)
                    if i in early:
                        self.replica_grads.start_early(early[i])

    def _result(self, ms: MicroStep) -> dict:
        """The sums the last micro-step's reduce_metrics left (on the host)."""
        self.ms = None
        loss_sum, nll_sum = ms.reduced.tolist()
        return {"loss_sum": loss_sum, "nll_sum": nll_sum}

    # ---- what the training loop asks of the interpreter ----
    @property
    def synchronises(self) -> bool:
        """Whether timing an instruction waits for the device (an accelerator) or costs nothing (a CPU)."""
        return self.sync is not None

    def inject_nan(self, on: bool) -> None:
        """Fault injection (trainer.training.faults): the next micro-steps' losses are non-finite."""
        self.poison = on

    def record_spans(self, origin: float) -> None:
        """Keep every instruction's (op, start, end) from now on, relative to `origin` (the timeline)."""
        self.spans, self.span_origin = [], origin

    def take_spans(self) -> list:
        """The spans recorded since `record_spans`; recording stops."""
        spans, self.spans = self.spans or [], None
        return spans

    def take_kind_seconds(self) -> dict:
        """Seconds per timeline category since the last call."""
        kinds, self.kind_seconds = self.kind_seconds, {}
        return kinds

    def restart_op_seconds(self) -> None:
        """Forget the per-op totals so far (the warm-up steps)."""
        self.op_seconds.clear()

    def _execute(self, ins: Instr) -> None:
        """One instruction under the rules of its op (schedule.OPS, as trainer.parallel.walk applies them): an
        asynchronous op's handle is kept until the wait that `completes` it, which finishes it first."""
        op = OPS[ins.op]
        try:
            if op.completes and op.completes in self.pending:
                self.pending.pop(op.completes).wait()
            handle = HANDLERS[ins.op](self, ins)
        except RuntimeError as e:
            raise self._comm_error(ins, e) if is_comm_failure(e) else e
        if op.asynchronous:
            self.pending[ins.op] = handle

    def _run_timed(self, program: list[Instr]) -> None:
        """The program with every instruction's wall time (per op, per timeline category, and its span
        when the timeline samples this step). On an accelerator the device is synchronised at every
        instruction edge: the host only queues kernels, and a NCCL receive does not block it, so host
        clocks alone would put device time into whichever later op waits and read waits as ~0."""
        clock, sync = time.perf_counter, self.sync
        times, kinds, spans = self.op_seconds, self.kind_seconds, self.spans
        if sync is not None:
            sync()
        early = self.early_reduce if program is self.programs[True] else {}
        for i, ins in enumerate(program):
            start = clock()
            self._execute(ins)
            if i in early:
                self.replica_grads.start_early(early[i])
            if sync is not None:
                sync()
            end = clock()
            times[ins.op] = times.get(ins.op, 0.0) + end - start
            cat = CATEGORY[ins.op]
            kinds[cat] = kinds.get(cat, 0.0) + end - start
            if spans is not None:
                spans.append((ins.op, start - self.span_origin, end - self.span_origin))

    def _comm_error(self, ins: Instr, err: RuntimeError) -> CommError:
        """Name the instruction and, for point-to-point ones, the peer's global rank."""
        layout = self.layout
        peer = f" with rank {layout.stage_ranks[ins.peer]} (stage {ins.peer})" if ins.peer >= 0 else ""
        return CommError(f"rank {layout.rank} (stage {layout.stage}, replica {layout.replica}): {ins.op}{peer} "
                         f"failed: {str(err).splitlines()[0][:300]}")

    def _micro_step(self, batch: Batch, window: AccumulationWindow | None, boundary: bool) -> MicroStep:
        spec = self.layout.spec
        cut = cut_replica(spec, batch, self.layout.replica).to(self.device)
        # the one place the loss is scaled: the replicas' gradients are summed (reduce_grads,
        # trainer.parallel.replica_grads), so the sum over the window, divided by its tokens; and fp16's dynamic
        # loss scale (1 in bf16 and fp32), which the optimizer step divides out
        loss_scale = self.engine.loss_scale / window.tokens if window is not None and window.tokens else 0.0
        return MicroStep(cut, loss_scale, window, boundary)

    def _act_shape(self, kind: str, unit: int, chunk: int):
        a, b = self.ms.chunks[kind][unit][chunk]
        return (self.ms.units[unit].size, b - a, self.hidden)

    # ---- forward ----
    def op_recv_forward(self, ins: Instr) -> None:
        shape = self._act_shape(ins.kind, ins.unit, ins.chunk)
        self.ms.received[(ins.kind, ins.unit, ins.chunk)] = self.comm.recv_forward(shape, ins.peer)

    def op_forward(self, ins: Instr) -> None:
        ms, kind, u, c = self.ms, ins.kind, ins.unit, ins.chunk
        unit = ms.units[u]
        a, b = ms.chunks[kind][u][c]
        masks = ms.dropout.at(ms.cut.row0 + ms.unit_rows[u][0], a) if ms.dropout is not None else None
        if self.embeddings is not None:
            x_in, x = self._embed(kind, u, a, b, masks)
        else:
            x_in = ms.received.pop((kind, u, c))
            x = x_in = _leaf(x_in) if ms.train else x_in
        state_in = self._state_in(kind, u, c)
        # the stage's layers in as few LSTM calls as they allow (trainer.model.lstm_stack)
        if kind == "enc":
            lengths = ms.cut.encoder_lengths(u, c)  # on the host: packing needs no device read
            x, state_out = encode_stack(self.pairs, x, lengths, state_in, masks)
            if c == len(ms.chunks["enc"][u]) - 1:
                state_out = [pair.decoder_init(st) for pair, st in zip(self.pairs, state_out)]
        else:
            replayed = self._graphed_decode(x, state_in, masks)
            x, state_out = replayed if replayed is not None else decode_stack(self.pairs, x, state_in, masks)
        ms.records[(kind, u, c)] = _Record(x_in, x, state_in, state_out)

    def _graphed_decode(self, x, state_in: list, masks):
        """The stage's decoders replayed as graphs (train.cuda_graphs), or None: eager. Not in evaluation, nor where
        the schedule defers weight gradients (their backward queues work for later)."""
        if self.graphs is None or not self.ms.train or self.weight_grads is not None:
            return None
        return graphed.decode(self.graphs, self.pairs, x, state_in, masks)

    def _embed(self, kind: str, u: int, a: int, b: int, masks):
        """(x_in, x) of a first-stage chunk: the embedding itself (x_in None) for an uncut unit or in
        evaluation, else a leaf slice of the unit's embedding, looked up at its first chunk (`masks`: the
        chunk's place in the global micro-batch, for dropout)."""
        ms, unit = self.ms, self.ms.units[u]
        ids = unit.src if kind == "enc" else unit.tgt_in
        lookup = self.embeddings.embed_src if kind == "enc" else self.embeddings.embed_tgt
        chunks = len(ms.chunks[kind][u])
        if chunks == 1 or not ms.train:
            return None, lookup(ids[:, a:b], masks)
        if a == 0:  # dropout keys: t0 is 0 here, so the whole unit's masks hold every chunk's
            ms.embedded[(kind, u)] = _Embedded(lookup(ids, masks), chunks)
        x_in = _leaf(ms.embedded[(kind, u)].out[:, a:b])
        return x_in, x_in

    def _state_in(self, kind: str, u: int, c: int) -> list:
        """Each local layer's incoming LSTM state: carried from the previous time chunk of the same
        unit, or (decoder chunk 0) the encoder's final state. Detached leaves, so each chunk's
        backward is separate and hands the state gradient on explicitly."""
        ms = self.ms
        if kind == "enc" and c == 0:
            return [None] * len(self.pairs)
        prev = ms.records[("enc", u, len(ms.chunks["enc"][u]) - 1) if c == 0 else (kind, u, c - 1)]
        if not ms.train:
            return list(prev.state_out)
        return [tuple(_leaf(t) for t in st) if st is not None else None for st in prev.state_out]

    def op_send_forward(self, ins: Instr) -> None:
        self.comm.send_forward(self.ms.records[(ins.kind, ins.unit, ins.chunk)].x_out, ins.peer)

    # ---- the head phase ----
    # A head "piece" is the rows one head call works on: a stage's shard of the whole replica
    # (after_forward: instructions without a unit) or one pipeline unit (per_unit).
    def _piece(self, ins: Instr, stage: int) -> tuple[int, int]:
        """[start, stop) rows of the replica."""
        return self.ms.cut.piece_rows(self.layout.spec, stage, ins.unit)

    def _unit_top(self, kind: str, u: int) -> torch.Tensor:
        """Unit u's top encoder (kind 'enc') or decoder outputs, (rows, len, hidden), detached."""
        ms = self.ms
        return torch.cat([ms.records[(kind, u, c)].x_out.detach() for c in range(len(ms.chunks[kind][u]))], 1)

    def _top_rows(self, ins: Instr, stage: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Last stage: the top outputs of a piece, trimmed to the piece's lengths (head_split=time: the
        whole encoder and the decoder chunks of the piece's block, which are done before the last)."""
        ms = self.ms
        if ins.unit >= 0:
            return self._unit_top("enc", ins.unit), self._unit_top("dec", ins.unit)
        cols = ms.cut.piece_cols(self.layout.spec, stage)
        if cols is not None:
            dec = [ms.records[("dec", 0, c)].x_out.detach() for c in ms.cut.piece_chunks(self.layout.spec, stage)]
            return self._unit_top("enc", 0), torch.cat(dec, 1)
        if ms.top is None:  # the whole replica, assembled once
            widths = {"enc": ms.replica.src.shape[1], "dec": ms.replica.tgt_in.shape[1]}
            tops = {kind: [self._unit_top(kind, u) for u in range(len(ms.units))] for kind in ("enc", "dec")}
            ms.top = tuple(torch.cat([F.pad(t, (0, 0, 0, widths[kind] - t.shape[1])) for t in tops[kind]], 0)
                           for kind in ("enc", "dec"))
        a, b = self._piece(ins, stage)
        rows = ms.replica.rows(a, b)
        return ms.top[0][a:b, :rows.src.shape[1]], ms.top[1][a:b, :rows.tgt_in.shape[1]]

    def _piece_shapes(self, ins: Instr, stage: int):
        rows = self.ms.cut.piece(self.layout.spec, stage, ins.unit)
        return (rows.size, rows.src.shape[1], self.hidden), (rows.size, rows.tgt_in.shape[1], self.hidden)

    def op_scatter_shard(self, ins: Instr) -> None:
        self.comm.scatter_shard(*self._top_rows(ins, ins.peer), ins.peer)

    def op_recv_shard(self, ins: Instr) -> None:
        self.ms.shards[ins.unit] = self.comm.recv_shard(*self._piece_shapes(ins, self.layout.stage), ins.peer)

    def op_head(self, ins: Instr) -> None:
        ms, stage = self.ms, self.layout.stage
        a, b = self._piece(ins, stage)
        rows = ms.cut.piece(self.layout.spec, stage, ins.unit)
        t0 = ms.cut.piece_t0(self.layout.spec, stage, ins.unit)
        masks = ms.dropout.at(ms.cut.row0 + a, t0, b - a) if ms.dropout is not None else None
        enc, dec = ms.shards.pop(ins.unit) if ins.unit in ms.shards else self._top_rows(ins, stage)
        if ms.train:
            enc, dec = _leaf(enc), _leaf(dec)
        self.sync_head()
        positions = to_device(rows.token_positions(), self.device)
        with deferred_weight_grads(self.head_weight_grads if ms.train else None):  # (None: no deferral here)
            loss_sum, nll_sum = self._head_loss(enc, rows, dec, positions, masks)
            if self.poison and ms.train:  # fault injection (trainer.training.faults): a non-finite loss
                loss_sum = loss_sum * float("nan")
            ms.metrics += torch.stack([loss_sum.detach(), nll_sum]).double()
            if not ms.train:
                return
            self.engine.backward(loss_sum * ms.loss_scale)
        if self.layout.is_last:
            self._place_grads((a, b), t0, enc.grad, dec.grad)
        else:
            ms.shard_grads[ins.unit] = (enc.grad, dec.grad)

    def _head_loss(self, enc, rows, dec, positions, masks):
        """The head's (loss_sum, nll_sum) on a piece, replayed as a graph (train.cuda_graphs) where it can be: in
        training, the projection's weight gradient not deferred."""
        head, ms = self.module.head, self.ms
        if self.graphs is not None and ms.train and self.head_weight_grads is None:
            replayed = graphed.head_loss(self.graphs, head, enc, rows.src_mask, dec, rows.tgt_out, positions, masks)
            if replayed is not None:
                return replayed
        return head(enc, rows.src_mask, dec, rows.tgt_out, positions, masks)

    def graph_counts(self) -> dict:
        """Metrics columns of train.cuda_graphs on this rank: the graphs held (slots: a forward and a backward each)
        and their memory ({} when off)."""
        if self.graphs is None:
            return {}
        st = self.graphs.stats
        return {"cuda_graphs": st.held, "cuda_graphs_mib": round(st.held_bytes / 2 ** 20, 3)}

    def _place_grads(self, rows: tuple[int, int], t0: int, enc_grad, dec_grad) -> None:
        """Last stage: gradients w.r.t. the top outputs of a piece (its rows, its target positions from
        t0), into the replica's."""
        ms = self.ms
        if ms.top_grads is None:
            rep = ms.replica
            ms.top_grads = {
                "enc": torch.zeros(rep.size, rep.src.shape[1], self.hidden, device=self.device, dtype=self.dtype),
                "dec": torch.zeros(rep.size, rep.tgt_in.shape[1], self.hidden, device=self.device, dtype=self.dtype),
            }
        a, b = rows
        ms.top_grads["enc"][a:b, :enc_grad.shape[1]] += enc_grad
        ms.top_grads["dec"][a:b, t0:t0 + dec_grad.shape[1]] += dec_grad

    def op_send_shard_grad(self, ins: Instr) -> None:
        self.comm.send_shard_grad(*self.ms.shard_grads.pop(ins.unit), ins.peer)

    def op_gather_grad(self, ins: Instr) -> None:
        enc, dec = self.comm.gather_grad(*self._piece_shapes(ins, ins.peer), ins.peer)
        self._place_grads(self._piece(ins, ins.peer), self.ms.cut.piece_t0(self.layout.spec, ins.peer, ins.unit),
                          enc, dec)

    # ---- backward ----
    def op_recv_backward(self, ins: Instr) -> None:
        shape = self._act_shape(ins.kind, ins.unit, ins.chunk)
        self.ms.received[("grad", ins.kind, ins.unit, ins.chunk)] = self.comm.recv_backward(shape, ins.peer)

    def _out_grad(self, kind: str, u: int, c: int) -> torch.Tensor:
        ms = self.ms
        if not self.layout.is_last:
            return ms.received.pop(("grad", kind, u, c))
        a, b = ms.unit_rows[u]
        ca, cb = ms.chunks[kind][u][c]
        return ms.top_grads[kind][a:b, ca:cb]

    def op_backward(self, ins: Instr) -> None:
        kind, u, c = ins.kind, ins.unit, ins.chunk
        rec = self.ms.records[(kind, u, c)]
        outs, grads = [rec.x_out], [self._out_grad(kind, u, c)]
        for st_out, st_leaf in zip(rec.state_out, self._next_state_leaves(kind, u, c)):
            if st_leaf is None:
                continue
            for t, leaf in zip(st_out, st_leaf):
                if leaf.grad is not None:
                    outs.append(t)
                    grads.append(leaf.grad)
        loss = sum((t * g).sum() for t, g in zip(outs, grads))
        if loss.requires_grad:  # not for an empty last time chunk, which nothing depends on
            with deferred_weight_grads(self.weight_grads):
                self.engine.backward(loss)
        rec.x_out = None
        emb = self.ms.embedded.get((kind, u))
        if emb is not None and emb.take(*self.ms.chunks[kind][u][c], rec.x_in.grad):
            self.engine.backward((emb.out * emb.grad).sum())
            del self.ms.embedded[(kind, u)]

    def op_weight_grads(self, ins: Instr) -> None:
        self.weight_grads.run()

    def op_head_weight_grads(self, ins: Instr) -> None:
        self.head_weight_grads.run()

    def _next_state_leaves(self, kind: str, u: int, c: int) -> list:
        """The leaves that consumed this chunk's outgoing states (whose .grad we hand back)."""
        ms = self.ms
        last_enc = len(ms.chunks["enc"][u]) - 1
        if kind == "enc":
            nxt = ("dec", u, 0) if c == last_enc else ("enc", u, c + 1)
        else:
            nxt = ("dec", u, c + 1) if c + 1 < len(ms.chunks["dec"][u]) else None
        if nxt is None:
            return [None] * len(self.pairs)
        return ms.records[nxt].state_in

    def op_send_backward(self, ins: Instr) -> None:
        x_in = self.ms.records[(ins.kind, ins.unit, ins.chunk)].x_in
        self.comm.send_backward(x_in.grad if x_in.grad is not None else torch.zeros_like(x_in), ins.peer)

    # ---- collectives, the step ----
    def op_reduce_metrics(self, ins: Instr) -> None:
        """The loss sums over every rank, on the host (a CPU collective: on CUDA, gloo beside NCCL).
        Training: the window's, already read by the optimizer step (read here only if DeepSpeed took
        none); evaluation: this micro-batch's."""
        ms = self.ms
        if ms.train:
            values = ms.window.read if ms.window.read is not None else ms.window.sums.tolist()
        else:
            values = ms.metrics.tolist()
        ms.reduced = self.rt.all_reduce(host(torch.tensor(values, dtype=torch.float64)), group=OPS[ins.op].group)

    def op_reduce_grads(self, ins: Instr) -> None:
        if self.replica_grads is not None:
            self.replica_grads.start().wait()

    def op_reduce_head_grads(self, ins: Instr) -> AsyncCollective:
        """Start summing every replica's (final) head gradients into the owner (last stage); it runs
        while the LSTM stages do their backward."""
        params = list(self.module.head.parameters())
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        return self.rt.reduce_async([p.grad for p in params], dst=self.layout.stage_ranks[ins.peer],
                                    group=OPS[ins.op].group)

    def op_wait_head_grads(self, ins: Instr) -> None:
        """(reduce_head_grads is finished by now: this op completes it.)"""
        if not self.module.owns_head:  # a replica's gradient now lives in the owner
            for p in self.module.head.parameters():
                p.grad = None

    def op_broadcast_head(self, ins: Instr) -> AsyncCollective:
        """Start sending the owner's updated head weights to every replica; it runs while the next
        micro-step's LSTM forward does, and completes before the next head phase (`sync_head`)."""
        return self.rt.broadcast_async([p.data for p in self.module.head.parameters()],
                                       src=self.layout.stage_ranks[ins.peer], group=OPS[ins.op].group)

    def sync_head(self) -> None:
        """Finish an in-flight head-weight broadcast (before the head runs, and at the end)."""
        handle = self.pending.pop("broadcast_head", None)
        if handle is not None:
            handle.wait()

    def op_optimizer_step(self, ins: Instr) -> None:
        ms = self.ms
        read = self.engine.step(boundary=ms.boundary, along=ms.window.sums if ms.boundary else None)
        if read is not None:
            ms.window.read = read

    def op_flush_sends(self, ins: Instr) -> None:
        self.comm.flush()


def _params_of(layer: nn.Module, part: str) -> list:
    """The parameters of an encoder-decoder layer's `part` ("encoder" | "decoder"); none for other layers."""
    sub = getattr(layer, part, None)
    return list(sub.parameters()) if isinstance(sub, nn.Module) else []


HANDLERS = {name: getattr(StepRunner, f"op_{name}", None) for name in OPS}
CATEGORY = {name: KIND_CATEGORY[op.kind] for name, op in OPS.items()}
_missing = [name for name, h in HANDLERS.items() if h is None]
_extra = [name[3:] for name in vars(StepRunner) if name.startswith("op_") and name[3:] not in OPS]
if _missing or _extra:
    raise ImportError(f"schedule.OPS and StepRunner disagree: no handler for {_missing}, handler without op {_extra}")
