"""An instruction's seconds on a device: its shapes (trainer.planner.shapes) priced by a device
(profile.MeasuredDevice or roofline.RooflineDevice), following what the interpreter's handler for it
does (trainer/parallel/interpreter.py):

    forward      embeddings (stage 0) + each local pair layer's LSTM over the chunk (encoder: one fused
                 call over the all-real steps and the per-step packed path over the ragged tail, as
                 model.lstm_stack.run_bulk_then_packed), dropout on each output; a dropout site draws its mask
                 the first time it is used in a micro-step: on the host the row blocks of the rows this rank
                 computes (its replica's, its head shard's), on an accelerator the whole global micro-batch
    backward     the same layers' backward (+ the embeddings' dense gradient on stage 0)
    head         forward + backward of the head on the piece (+ assembling the top outputs and placing
                 their gradients on the last stage); with defer_head_weight_grads less the projection's weight
                 gradient, which `head_weight_grads` prices (HEAD_WEIGHT_GRAD_SHARE of the head's step)
    send/recv    posting a message; its bytes travel over the link (`transfer`)
    collectives  gloo/NCCL between the group's ranks; the replicas' gradient sum (reduce_grads) in place, the
                 embedding tables by the rows the micro-batch touches (trainer.parallel.replica_grads)
    optimizer    DeepSpeed's step on the rank's own parameters; it all-reduces the gradient norm over
                 the pipeline partway (`inner_sync`)
Each cost is kept by component (lstm, head, ...) so that the slowdown of ranks sharing a host can be
applied per component.
"""
from __future__ import annotations

from trainer.model.dropout import BLOCK_ROWS
from trainer.parallel.layout import LayoutSpec
from trainer.parallel.schedule import OPS, Instr, global_programs
from trainer.planner.shapes import Chunk, Cut, ModelDims, Stage

NORM_BEFORE = 0.4  # share of DeepSpeed's step before its gradient-norm all-reduce (fp32 copies + norms)


def head_weight_grad_share(dims: ModelDims) -> float:
    """The projection's weight gradient's share of a head step (forward + backward): its GEMM, 2 D V FLOPs per
    token, over the step's 3 x (attentional layer 4 H D + projection 2 D V); the softmax's elementwise work
    (not counted) makes the real share somewhat lower."""
    d, v = dims.out_dim, dims.tgt_vocab
    return 2 * d * v / (3 * (4 * dims.hidden * d + 2 * d * v))
METRICS_BYTES = 16  # the loss sums all-reduced each micro-step (2 x float64)


def _stage_of(spec: LayoutSpec, rank: int) -> tuple[int, int]:
    return rank // spec.num_dp, rank % spec.num_dp


def encoder_counts(lengths, start: int, stop: int) -> list[int]:
    """Active rows at each step in [start, stop) of rows with these lengths."""
    return [sum(1 for n in lengths if n > t) for t in range(start, stop)]


class MicroStepCosts:
    """Every instruction's cost in one micro-step of `spec` on one global micro-batch."""

    def __init__(self, device, dims: ModelDims, spec: LayoutSpec, stages: list[Stage], cut: Cut,
                 dtype_bytes: int, boundary: bool = True, stacked: bool = False):
        self.device, self.dims, self.spec, self.stages, self.cut = device, dims, spec, stages, cut
        self.bytes = dtype_bytes
        self.stacked = stacked  # a stage's layers one LSTM call per side (train.stack_layers; never with dropout)
        self.programs = global_programs(spec, boundary=boundary)
        self.parts: dict = {}  # (rank, ins) -> {component: seconds}
        self.posts: dict = {}  # (rank, ins) -> seconds an async collective takes from its caller's core (`post`)
        self.sizes: dict = {}  # (rank, ins) -> bytes moved (send/recv/collective)
        for rank, prog in self.programs.items():
            self._walk(rank, prog)

    # ---- the simulator's callbacks ----
    def cost(self, rank: int, ins: Instr) -> float:
        return sum(self.parts.get((rank, ins), {}).values())

    def post(self, rank: int, ins: Instr) -> float:
        return self.posts.get((rank, ins), 0.0)

    def transfer(self, rank: int, ins: Instr) -> float:
        return self.device.p2p(self.sizes.get((rank, ins), 0))[1]

    def slowdown(self, rank: int, ins: Instr) -> float:
        parts = self.parts.get((rank, ins), {})
        total = sum(parts.values())
        if total <= 0:
            return 1.0
        return sum(self.device.slowdown(c) * s for c, s in parts.items()) / total

    def inner_sync(self, rank: int, ins: Instr):
        if ins.op != "optimizer_step" or self.spec.num_pp < 2 or not self.programs_boundary:
            return None
        latency = self.device.collective("all_reduce", 4, self.spec.num_pp)
        return "pipe", NORM_BEFORE * self.cost(rank, ins), latency

    @property
    def programs_boundary(self) -> bool:
        return any(i.op == "reduce_grads" for i in self.programs[0])

    # ---- pricing ----
    def _walk(self, rank: int, prog: list[Instr]) -> None:
        stage, replica = _stage_of(self.spec, rank)
        dev, spec = self.device, self.spec
        masks_drawn: dict = {}  # site -> the global row ranges drawn this micro-step
        top_ready = grads_ready = False
        deferred = any(i.op == "head_weight_grads" for i in prog)
        share, later = head_weight_grad_share(self.dims), 0.0  # the head's deferred weight gradients, so far
        for ins in prog:
            op = OPS[ins.op]
            parts = {"overhead": dev.instruction(ins.op)}
            if ins.op in ("forward", "backward"):
                self._layers(parts, stage, replica, ins, masks_drawn)
            elif ins.op == "head":
                piece = self.cut.piece(replica, stage, ins.unit)
                w = {"rows": piece.size, "src": int(piece.src.shape[1]), "tgt": int(piece.tgt_in.shape[1])}
                parts["head"] = dev.head_step(w["rows"], w["src"], w["tgt"], piece.tgt_tokens)
                if deferred:
                    later += share * parts["head"]
                    parts["head"] *= 1 - share
                parts["overhead"] += dev.backward_call
                if self.dims.dropout > 0:
                    parts["mask"] = self._mask("head", self.dims.out_dim, "tgt", masks_drawn,
                                               self.cut.global_rows(replica, "piece", stage, ins.unit))
                    parts["copy"] = 2 * dev.copy_bytes(3 * piece.tgt_tokens * self.dims.out_dim * self.bytes)
                if stage == spec.num_pp - 1:
                    if not top_ready:
                        parts["copy"] = parts.get("copy", 0.0) + self._assemble(replica, ins)
                        top_ready = ins.unit < 0
                    parts["copy"] = parts.get("copy", 0.0) + self._place(replica, piece, not grads_ready)
                    grads_ready = True
            elif ins.op == "head_weight_grads":
                parts["head"], later = later, 0.0
            elif ins.op == "scatter_shard":
                piece = self.cut.piece(replica, ins.peer // spec.num_dp, ins.unit)
                self.sizes[(rank, ins)] = self._shard_bytes(piece)
                if not top_ready:
                    parts["copy"] = self._assemble(replica, ins)
                    top_ready = ins.unit < 0
                parts["comm"] = dev.p2p(self.sizes[(rank, ins)])[0]
            elif ins.op == "send_shard_grad":
                self.sizes[(rank, ins)] = self._shard_bytes(self.cut.piece(replica, stage, ins.unit))
                parts["comm"] = dev.p2p(self.sizes[(rank, ins)])[0]
            elif ins.op == "gather_grad":
                piece = self.cut.piece(replica, ins.peer // spec.num_dp, ins.unit)
                parts["copy"] = self._place(replica, piece, not grads_ready)
                grads_ready = True
            elif ins.op in ("send_forward", "send_backward"):
                ch = self.cut.chunk(replica, ins.kind, ins.unit, ins.chunk)
                self.sizes[(rank, ins)] = ch.tokens * self.dims.hidden * self.bytes
                parts["comm"] = dev.p2p(self.sizes[(rank, ins)])[0]
            elif op.kind == "collective":
                parts.update(self._collective(rank, stage, ins))
            elif ins.op == "optimizer_step":
                if self.programs_boundary:
                    own = self.stages[stage].params
                    count, tensors = own.count, own.tensors
                    if stage == spec.num_pp - 1:
                        count, tensors = count + self.dims.head_params.count, tensors + self.dims.head_params.tensors
                    parts["optimizer"] = dev.optimizer(count, tensors)
            self.parts[(rank, ins)] = parts

    def _layers(self, parts: dict, stage: int, replica: int, ins: Instr, masks_drawn: dict) -> None:
        dev, dims, here = self.device, self.dims, self.stages[stage]
        ch = self.cut.chunk(replica, ins.kind, ins.unit, ins.chunk)
        side = "src" if ins.kind == "enc" else "tgt"
        direction = "fwd" if ins.op == "forward" else "bwd"
        lstm = copy = mask = 0.0
        rows = self.cut.global_rows(replica, "unit", ins.unit)
        if here.embeddings:
            parts["embedding"] = dev.embed(side, direction, ch.tokens)
            if dims.dropout > 0:
                if direction == "fwd":
                    mask += self._mask(f"emb_{side}", dims.emb, side, masks_drawn, rows)
                copy += dev.copy_bytes(3 * ch.tokens * dims.emb * self.bytes)
        for call in self._calls(here.pairs, ins.kind):
            lstm += self._lstm(direction, ins.kind, call[0], dims.pair_input(call[0]), ch, above=len(call) - 1)
        for k in here.pairs:
            if dims.dropout > 0:
                if direction == "fwd":
                    mask += self._mask(f"{ins.kind}{k}", dims.hidden, side, masks_drawn, rows)
                copy += dev.copy_bytes(3 * ch.tokens * dims.hidden * self.bytes)
        if direction == "bwd":
            parts["overhead"] += dev.backward_call
            copy += dev.copy_bytes(2 * ch.tokens * dims.hidden * self.bytes)  # the (out * grad) products
        parts.update(lstm=lstm, copy=copy, mask=mask)

    def _calls(self, pairs: tuple, kind: str) -> list[tuple]:
        """The stage's layers as the model calls them (trainer.model.lstm_stack.runs_of_layers): one call per
        layer, or stacked, one call over consecutive layers (a bidirectional bottom encoder stays alone)."""
        if not self.stacked or self.dims.dropout > 0:
            return [(k,) for k in pairs]
        calls: list[list] = []
        for k in pairs:
            alone = kind == "enc" and k == 0 and self.dims.bidirectional_bottom
            if calls and not alone and not (kind == "enc" and calls[-1][-1] == 0 and self.dims.bidirectional_bottom):
                calls[-1].append(k)
            else:
                calls.append([k])
        return [tuple(c) for c in calls]

    def _lstm(self, direction: str, kind: str, pair: int, in_dim: int, ch: Chunk, above: int = 0) -> float:
        """One LSTM call: the layer `pair` (input `in_dim`) and `above` more stacked on it."""
        dev, hidden = self.device, self.dims.hidden
        if kind == "dec":
            return dev.lstm_fused(direction, in_dim, hidden, ch.rows, ch.width, above)
        if pair == 0 and self.dims.bidirectional_bottom:  # two directions of hidden/2, packed all the way
            return 2 * dev.lstm_packed(direction, in_dim, hidden // 2, encoder_counts(ch.lengths, 0, ch.width))
        bulk = min(ch.lengths) if ch.lengths else 0
        cost = dev.lstm_fused(direction, in_dim, hidden, ch.rows, bulk, above) if bulk else 0.0
        if bulk < ch.width:
            cost += dev.lstm_packed(direction, in_dim, hidden, encoder_counts(ch.lengths, bulk, ch.width), above)
            cost += dev.copy_bytes(2 * ch.tokens * hidden * self.bytes)  # pad back, cat onto the bulk
        return cost

    def _mask(self, site: str, feat: int, side: str, drawn: dict, rows: tuple[int, int]) -> float:
        """A site's mask for the global rows `rows` ([start, stop)), as trainer.model.dropout draws it: on the host
        the blocks of rows covering them unless an earlier draw of this micro-step covers them, on an
        accelerator the whole global micro-batch once."""
        batch = self.cut.batch
        if getattr(self.device, "masks_by_rows", False):
            first = rows[0] // BLOCK_ROWS * BLOCK_ROWS
            last = min(batch.size, -(-rows[1] // BLOCK_ROWS) * BLOCK_ROWS)
        else:
            first, last = 0, batch.size
        held = drawn.setdefault(site, [])
        if any(a <= rows[0] and rows[1] <= b for a, b in held):
            return 0.0
        held.append((first, last))
        width = batch.src.shape[1] if side == "src" else batch.tgt_in.shape[1]
        return self.device.dropout_mask((last - first) * int(width) * feat)

    def _shard_bytes(self, piece) -> int:
        return piece.size * (int(piece.src.shape[1]) + int(piece.tgt_in.shape[1])) * self.dims.hidden * self.bytes

    def _assemble(self, replica: int, ins: Instr) -> float:
        """Last stage: the replica's (or the unit's) top outputs concatenated and padded."""
        src = self.cut.replica(replica) if ins.unit < 0 else self.cut.units(replica)[ins.unit]
        nbytes = src.size * (int(src.src.shape[1]) + int(src.tgt_in.shape[1])) * self.dims.hidden * self.bytes
        return self.device.copy_bytes(2 * nbytes)

    def _place(self, replica: int, piece, allocate: bool) -> float:
        """Last stage: a piece's gradients added into the replica's (allocated at the first one)."""
        rep = self.cut.replica(replica)
        cost = self.device.copy_bytes(3 * self._shard_bytes(piece))
        if allocate:
            cost += self.device.copy_bytes(rep.size * (int(rep.src.shape[1]) + int(rep.tgt_in.shape[1]))
                                           * self.dims.hidden * self.bytes)
        return cost

    def _collective(self, rank: int, stage: int, ins: Instr) -> dict:
        dev, spec, dims = self.device, self.spec, self.dims
        head_bytes = dims.head_params.count * self.bytes
        if ins.op == "reduce_metrics":
            return {"comm": dev.collective("all_reduce", METRICS_BYTES, spec.world_size)}
        if ins.op == "reduce_grads":
            if spec.num_dp < 2:
                return {}
            own = self.stages[stage].params.count + (dims.head_params.count if stage == spec.num_pp - 1 else 0)
            parts = {}
            if self.stages[stage].embeddings:  # the tables by the rows the batch touches: gathered, put back
                batch = self.cut.batch
                ids = batch.ids or (batch.src.unique(), batch.tgt_in.unique())
                rows = len(ids[0]) + len(ids[1])
                own -= (dims.src_vocab + dims.tgt_vocab - rows) * dims.emb
                parts["copy"] = dev.copy_bytes(4 * rows * dims.emb * self.bytes)
            # in place, one collective per tensor (trainer.parallel.replica_grads)
            return {**parts, "comm": dev.collective("all_reduce", own * self.bytes, spec.num_dp, self.bytes)}
        # the runtime's async verbs, one collective per head tensor in place; on a CPU rank of one thread, what
        # gloo's thread does for them (the process's CPU time of the verb, measured) is taken from the caller's core
        name = "reduce" if ins.op == "reduce_head_grads" else "broadcast"
        self.posts[(rank, ins)] = dev.collective_cpu(name, head_bytes, spec.num_pp)
        return {"comm": dev.collective(name, head_bytes, spec.num_pp)}
