"""What each instruction of a layout works on: the model's sizes, which layers each stage holds, and a
real global micro-batch cut into replicas, pipeline units, time chunks and head pieces by the
interpreter's own cutter (`trainer.parallel.cut`).
No timing here; `trainer.planner.costs` turns these shapes into seconds."""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

from trainer.data import Batch
from trainer.model.meta import shapes_only
from trainer.model.seq2seq import EncoderDecoderLayer, build_head, layer_builders
from trainer.parallel import deepspeed_adapter as dsa
from trainer.parallel.cut import ReplicaCut, cut_replica
from trainer.parallel.layout import LayoutError, LayoutSpec


@dataclass(frozen=True)
class Params:
    count: int  # elements
    tensors: int


def _count(modules) -> Params:
    params = [p for m in modules for p in m.parameters() if p.requires_grad]
    return Params(sum(p.numel() for p in params), len(params))


@dataclass(frozen=True)
class ModelDims:
    """The sizes of the model that the costs depend on, and its parameters per global layer."""

    emb: int
    hidden: int
    layers: int
    attention: str
    src_vocab: int
    tgt_vocab: int
    out_dim: int
    bidirectional_bottom: bool
    dropout: float
    layer_params: tuple  # Params of each global layer (0: embeddings, 1..L: pair layers)
    head_params: Params
    cfg: object = field(default=None, compare=False, repr=False)  # the model config they came from

    @classmethod
    def build(cls, model_cfg, src_vocab: int, tgt_vocab: int) -> "ModelDims":
        with shapes_only():  # sizes only: nothing is allocated
            layers = [c(**kw) for c, kw in layer_builders(model_cfg, src_vocab, tgt_vocab)]
            head = build_head(model_cfg, tgt_vocab)
        return cls(emb=model_cfg.emb_dim, hidden=model_cfg.hidden, layers=model_cfg.layers,
                   attention=model_cfg.attention, src_vocab=src_vocab, tgt_vocab=tgt_vocab,
                   out_dim=head.w_c.out_features, bidirectional_bottom=bool(model_cfg.bidirectional_bottom),
                   dropout=float(model_cfg.dropout), layer_params=tuple(_count([m]) for m in layers),
                   head_params=_count([head]), cfg=model_cfg)

    def pair_input(self, pair: int) -> int:
        """Input width of pair layer `pair` (0-based): the embeddings below the first, states above."""
        return self.emb if pair == 0 else self.hidden

    def describe(self) -> dict:
        return {"emb_dim": self.emb, "hidden": self.hidden, "layers": self.layers, "attention": self.attention,
                "src_vocab": self.src_vocab, "tgt_vocab": self.tgt_vocab}


@dataclass(frozen=True)
class Stage:
    """What one pipeline stage holds."""

    embeddings: bool
    pairs: tuple  # 0-based pair indices
    params: Params  # its layers (not the head)


def stages_of(dims: ModelDims, spec: LayoutSpec) -> list[Stage]:
    """Each stage's layers under the layout's partition_method (DeepSpeed's partition, computed
    without building anything); LayoutError if a stage would hold no pair layer (as the trainer)."""
    if spec.num_pp > dims.layers:
        raise LayoutError(f"parallel_layout.num_pp={spec.num_pp}: more pipeline stages than model.layers={dims.layers}")
    builders = layer_builders(dims.cfg, dims.src_vocab, dims.tgt_vocab)
    try:
        parts = dsa.layer_parts(builders, spec.num_pp, spec.partition_method)
    except dsa.StageError as e:
        raise LayoutError(str(e)) from None
    out = []
    for s in range(spec.num_pp):
        idx = range(parts[s], parts[s + 1])
        pairs = tuple(i - 1 for i in idx if builders[i][0] is EncoderDecoderLayer)
        if not pairs:
            raise LayoutError(f"parallel_layout.partition_method={spec.partition_method!r} gives stage {s} no "
                              f"EncoderDecoderLayer (layers {parts[s]}..{parts[s + 1] - 1})")
        params = Params(sum(dims.layer_params[i].count for i in idx), sum(dims.layer_params[i].tensors for i in idx))
        out.append(Stage(embeddings=0 in idx, pairs=pairs, params=params))
    return out


@dataclass(frozen=True)
class Chunk:
    """The rows and time steps one forward/backward instruction runs on."""

    rows: int
    width: int  # time steps (padded)
    lengths: tuple | None  # encoder: each row's real steps in this chunk (0 allowed); decoder: None

    @property
    def tokens(self) -> int:
        return self.rows * self.width


class Cut:
    """One global micro-batch cut for a layout by the interpreter's cutter (trainer.parallel.cut),
    every replica's share (memoised), with each chunk's and head piece's sizes."""

    def __init__(self, batch: Batch, spec: LayoutSpec):
        self.batch, self.spec = batch, spec
        self._chunks: dict = {}  # (replica, kind, unit, chunk) -> Chunk: each is asked for by every op on it

    @cached_property
    def _replicas(self) -> list[ReplicaCut]:
        return [cut_replica(self.spec, self.batch, d) for d in range(self.spec.num_dp)]

    def replica(self, d: int) -> Batch:
        return self._replicas[d].replica

    def units(self, d: int) -> list[Batch]:
        return self._replicas[d].units

    def chunk(self, d: int, kind: str, u: int, c: int) -> Chunk:
        key = (d, kind, u, c)
        if key not in self._chunks:
            cut = self._replicas[d]
            a, b = cut.chunks[kind][u][c]
            lengths = None if kind == "dec" else tuple(int(x) for x in cut.encoder_lengths(u, c))
            self._chunks[key] = Chunk(cut.units[u].size, b - a, lengths)
        return self._chunks[key]

    def piece(self, d: int, stage: int, unit: int = -1) -> Batch:
        """The rows one head instruction works on: a unit (per_unit) or this stage's shard."""
        return self._replicas[d].piece(self.spec, stage, unit)

    def global_rows(self, d: int, what: str, *where) -> tuple[int, int]:
        """Where in the global micro-batch ([start, stop) rows) replica d's unit (`"unit", u`) or head piece
        (`"piece", stage, unit`) sits."""
        cut = self._replicas[d]
        a, b = cut.unit_rows[where[0]] if what == "unit" else cut.piece_rows(self.spec, *where)
        return cut.row0 + a, cut.row0 + b


def head_work(piece: Batch) -> dict:
    """The sizes the head's cost depends on: rows R, source width S, target width T, real target tokens N."""
    return {"rows": piece.size, "src": int(piece.src.shape[1]), "tgt": int(piece.tgt_in.shape[1]),
            "tokens": piece.tgt_tokens}


__all__ = ["Chunk", "Cut", "ModelDims", "Params", "Stage", "head_work", "stages_of"]
