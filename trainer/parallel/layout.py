"""The parallel layout: one validated object that knows how the job is split.

Read from the DeepSpeed JSON's own section ``"parallel_layout"`` (DeepSpeed already owns
``pipeline`` and ``hybrid_engine``) and checked before anything is built. Nothing here talks to other
processes: `group_members` says which ranks form each process group, `ParallelLayout` where one rank
sits; the runtime (`trainer.parallel.runtime`) creates the groups from them.

Modes (the paper's comparison, Ono et al. 2019):

    single    1 rank, the whole model
    data      num_dp replicas of the whole model (DeepSpeed's own data parallelism)
    pipeline  LSTM pair layers as num_pp pipeline stages; the head on the last stage only
    hybrid    LSTM pair layers as num_pp stages; the attention-softmax head data-parallel over the
              ranks of the pipeline: the last stage splits the top encoder/decoder outputs by
              sentences, every rank runs the head on its shard, head gradients are summed over ALL
              ranks. With num_dp > 1 this is the grid: num_dp replicas of the pipeline ("grid" is
              accepted as a name for it).

Rows: the global micro-batch (train_micro_batch_size_per_gpu x num_dp sentences, at most) is split
by sentences into num_dp replica slices; a replica slice into `micro_batches` pipeline units (and
its time axis into `time_chunks`); in hybrid mode the replica slice is split again into num_pp head
shards.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MODES = ("single", "data", "pipeline", "hybrid", "grid")
HEAD_SPLITS = ("sentences", "time")
SECTION = "parallel_layout"
PARTITION_DEFAULT = "type:EncoderDecoderLayer"


class LayoutError(ValueError):
    """A bad layout; the message names the JSON key."""


@dataclass(frozen=True)
class LayoutSpec:
    mode: str
    num_pp: int
    num_dp: int
    micro_batches: int = 1
    time_chunks: int = 1
    partition_method: str = PARTITION_DEFAULT
    head_shares: tuple = ()  # hybrid: relative head rows per stage (e.g. (5, 4): the last stage, which also
                             # assembles the top outputs and owns the head, gets fewer); () = equal
    head_schedule: str = "after_forward"  # hybrid: after_forward | per_unit (trainer.parallel.schedule)
    defer_weight_grads: bool = False  # LSTM weight gradients after the rank's last backward, on the stages
    #                                   after the first (stepwise kernel; trainer.parallel.schedule)
    head_split: str = "sentences"  # hybrid: the head's shards by sentences, or by time (blocks of time chunks)
    defer_head_weight_grads: bool = False  # the head projection's weight gradient where the rank would wait
    #                                        (pipeline, hybrid, grid; trainer.parallel.schedule)
    overlap_grad_sums: bool = True  # the replicas' gradient sums start as groups become final in the backward
    #                                 (data, grid; trainer.parallel.interpreter), not all at reduce_grads
    shared_memory_sums: bool = True  # CPU: the gradient sums and the head's broadcast among ranks of one host
    #                                  through shared memory instead of gloo's TCP (trainer.parallel.shm_sum)

    @property
    def world_size(self) -> int:
        return self.num_pp * self.num_dp

    @property
    def head_parallel(self) -> bool:
        """True when the head is replicated on every stage (hybrid/grid), False when it lives on
        the last stage only (single, data, pipeline)."""
        return self.mode in ("hybrid", "grid") and self.num_pp > 1

    @property
    def min_rows(self) -> int:
        """Fewest sentences a global micro-batch must have so that no replica, unit or shard is empty."""
        per_replica = max(self.micro_batches, self.num_pp if self.head_parallel else 1)
        return per_replica * self.num_dp

    def to_dict(self) -> dict:
        """JSON-ready (checkpoints record the layout they were written in)."""
        return {**self.__dict__, "head_shares": list(self.head_shares)}

    @classmethod
    def from_dict(cls, d: dict) -> "LayoutSpec | None":
        """A layout recorded by `to_dict` (older records lack newer keys: their defaults); None if unreadable."""
        try:
            known = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
            return cls(**{**known, "head_shares": tuple(known.get("head_shares", ()))})
        except TypeError:
            return None

    @classmethod
    def from_ds_config(cls, ds_config: dict, world_size: int) -> "LayoutSpec":
        section = check_section(ds_config.get(SECTION, {"mode": "single" if world_size == 1 else "data"}))
        known = {"mode", "num_pp", "num_dp", "micro_batches", "time_chunks", "partition_method", "head_shares",
                 "head_schedule", "defer_weight_grads", "head_split", "defer_head_weight_grads", "overlap_grad_sums",
                 "shared_memory_sums"}
        for key in section:
            if key not in known:
                raise LayoutError(f"{SECTION}.{key}: unknown key (known: {', '.join(sorted(known))})")
        mode = section.get("mode")
        if not isinstance(mode, str) or mode not in MODES:
            raise LayoutError(f"{SECTION}.mode={mode!r}: unknown mode (one of {', '.join(MODES)})")
        for key in ("num_pp", "num_dp", "micro_batches", "time_chunks"):
            value = section.get(key, 1)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise LayoutError(f"{SECTION}.{key}={_short(value)}: must be an integer >= 1")
        for key in ("partition_method", "head_schedule"):
            if not isinstance(section.get(key, ""), str):
                raise LayoutError(f"{SECTION}.{key}={_short(section[key])}: must be a string")
        defaults = {"single": (1, 1), "data": (1, world_size), "pipeline": (world_size, 1),
                    "hybrid": (world_size, 1), "grid": (world_size, 1)}[mode]
        num_pp = section.get("num_pp", defaults[0] if "num_dp" not in section else world_size // section["num_dp"])
        num_dp = section.get("num_dp", max(1, world_size // num_pp))
        for key, value in (("num_pp", num_pp), ("num_dp", num_dp),
                           ("micro_batches", section.get("micro_batches", 1)),
                           ("time_chunks", section.get("time_chunks", 1))):
            if not isinstance(value, int) or value < 1:
                raise LayoutError(f"{SECTION}.{key}={value!r}: must be an integer >= 1")
        shares = section.get("head_shares", [])
        if (not isinstance(shares, list) or (shares and len(shares) != num_pp)
                or not all(isinstance(w, (int, float)) and not isinstance(w, bool) and w > 0 for w in shares)):
            raise LayoutError(f"{SECTION}.head_shares={shares!r}: must be a list of num_pp={num_pp} positive "
                              f"numbers (relative head rows per stage), or left out for equal shares")
        head_schedule = section.get("head_schedule", "after_forward")
        if head_schedule not in ("after_forward", "per_unit"):
            raise LayoutError(f"{SECTION}.head_schedule={head_schedule!r}: one of after_forward, per_unit")
        defer, defer_head = section.get("defer_weight_grads", False), section.get("defer_head_weight_grads", False)
        overlap, shm = section.get("overlap_grad_sums", True), section.get("shared_memory_sums", True)
        for key, value in (("defer_weight_grads", defer), ("defer_head_weight_grads", defer_head),
                           ("overlap_grad_sums", overlap), ("shared_memory_sums", shm)):
            if not isinstance(value, bool):
                raise LayoutError(f"{SECTION}.{key}={_short(value)}: must be true or false")
        if defer_head and num_pp < 2:
            raise LayoutError(f"{SECTION}.defer_head_weight_grads=true fills a pipeline stage's waits: it needs "
                              f"num_pp >= 2 (now {num_pp}); leave it false")
        head_split = section.get("head_split", "sentences")
        if head_split not in HEAD_SPLITS:
            raise LayoutError(f"{SECTION}.head_split={_short(head_split)}: one of {', '.join(HEAD_SPLITS)}")
        spec = cls(mode=mode, num_pp=num_pp, num_dp=num_dp, micro_batches=section.get("micro_batches", 1),
                   time_chunks=section.get("time_chunks", 1),
                   partition_method=section.get("partition_method", PARTITION_DEFAULT),
                   head_shares=tuple(shares), head_schedule=head_schedule, defer_weight_grads=defer,
                   head_split=head_split, defer_head_weight_grads=defer_head, overlap_grad_sums=overlap,
                   shared_memory_sums=shm)
        spec._check_head_options()
        spec.check_world(world_size)
        return spec

    def _check_head_options(self) -> None:
        """The head's options that only some layouts can take (messages name the keys to change)."""
        if self.head_split == "time" and self.head_parallel:
            if self.head_schedule != "after_forward" or self.micro_batches != 1 or self.time_chunks < self.num_pp:
                raise LayoutError(f"{SECTION}.head_split=time gives each stage a block of the time chunks of one "
                                  f"unit: it needs head_schedule=after_forward, micro_batches=1 and time_chunks >= "
                                  f"num_pp={self.num_pp} (now {self.head_schedule}, {self.micro_batches}, "
                                  f"{self.time_chunks})")
        if self.defer_head_weight_grads and self.head_schedule == "per_unit" and self.head_parallel:
            raise LayoutError(f"{SECTION}.defer_head_weight_grads=true: not with head_schedule=per_unit (its heads' "
                              f"gradients go back to the last stage during the backward, where the deferred one "
                              f"would be in the way); use head_schedule=after_forward or leave it false")
        if self.head_schedule == "per_unit" and self.head_parallel and self.micro_batches < self.num_pp:
            raise LayoutError(f"{SECTION}.head_schedule=per_unit runs each unit's head on one stage: micro_batches="
                              f"{self.micro_batches} must be >= num_pp={self.num_pp}")

    def check_world(self, world_size: int) -> None:
        if self.num_pp * self.num_dp != world_size:
            raise LayoutError(f"{SECTION}: num_pp x num_dp = {self.num_pp} x {self.num_dp} = "
                              f"{self.num_pp * self.num_dp} != world size {world_size} (ranks launched)")
        if self.mode == "single" and world_size != 1:
            raise LayoutError(f"{SECTION}.mode=single needs 1 rank, launched {world_size}")
        if self.mode == "data" and self.num_pp != 1:
            raise LayoutError(f"{SECTION}.mode=data: num_pp must be 1, got {self.num_pp}")
        if self.mode in ("pipeline", "hybrid", "grid") and self.num_pp < 2 and world_size > 1:
            raise LayoutError(f"{SECTION}.mode={self.mode}: num_pp must be >= 2, got {self.num_pp}")

    def check_model(self, model_cfg, min_batch: int, micro_batch_per_rank: int) -> None:
        """Checks that need the model config and batch sizes; messages name the key to change."""
        if self.num_pp > model_cfg.layers:
            raise LayoutError(f"{SECTION}.num_pp={self.num_pp}: more pipeline stages than model.layers="
                              f"{model_cfg.layers} (each stage needs at least one encoder/decoder pair layer)")
        if self.time_chunks > 1 and model_cfg.bidirectional_bottom:
            raise LayoutError(f"{SECTION}.time_chunks={self.time_chunks}: a bidirectional bottom encoder "
                              f"(model.bidirectional_bottom=true) cannot be cut along time; use time_chunks=1")
        if self.defer_weight_grads and model_cfg.lstm_kernel not in ("stepwise", "auto"):
            raise LayoutError(f"{SECTION}.defer_weight_grads=true: only the stepwise LSTM kernel defers its weight "
                              f"gradients; set model.lstm_kernel=stepwise or auto (now {model_cfg.lstm_kernel}) or "
                              f"leave it false")
        if model_cfg.tie_embeddings and self.num_pp > 1:
            raise LayoutError(f"model.tie_embeddings=true: the target embedding lives on stage 0 and the head "
                              f"on {'every stage' if self.head_parallel else 'the last stage'} in "
                              f"{SECTION}.mode={self.mode}; untie them or use single/data")
        if self.min_rows > min_batch:
            raise LayoutError(f"data.min_batch_sentences={min_batch}: the layout needs at least {self.min_rows} "
                              f"sentences per batch ({SECTION}: {self.num_dp} replicas x "
                              f"max(micro_batches={self.micro_batches}, head shards="
                              f"{self.num_pp if self.head_parallel else 1})); raise data.min_batch_sentences")
        if micro_batch_per_rank * self.num_dp < min_batch:
            raise LayoutError(f"train_micro_batch_size_per_gpu={micro_batch_per_rank} x num_dp={self.num_dp} is "
                              f"smaller than data.min_batch_sentences={min_batch}")


def check_section(section):
    """The JSON's parallel_layout, if it is an object (a list or a bare mode name would be read key by key)."""
    if not isinstance(section, dict):
        raise LayoutError(f"{SECTION}={_short(section)}: must be an object, e.g. "
                          f"{{\"mode\": \"hybrid\", \"num_pp\": 2, \"num_dp\": 1}}")
    return section


def layout_world(ds: dict) -> int:
    """The world size a DeepSpeed JSON's parallel_layout asks for (num_pp x num_dp; 1 without a layout)."""
    section = check_section(ds.get(SECTION, {}))
    degrees = [section.get(k, 1) for k in ("num_pp", "num_dp")]
    for key, value in zip(("num_pp", "num_dp"), degrees):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise LayoutError(f"{SECTION}.{key}={_short(value)}: must be an integer >= 1")
    return degrees[0] * degrees[1]


def _short(value) -> str:
    """A JSON value as the user wrote it, cut short."""
    import json

    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


def split_weighted(n: int, weights) -> list[tuple[int, int]]:
    """[start, stop) of consecutive pieces of range(n) sized in proportion to `weights`, each at least
    one row when n >= len(weights) (largest remainders get the rounding)."""
    total, k = float(sum(weights)), len(weights)
    exact = [n * w / total for w in weights]
    sizes = [max(1 if n >= k else 0, int(x)) for x in exact]
    while sum(sizes) > n:  # the minimum of one row overshot: take from the largest
        sizes[max(range(k), key=lambda i: sizes[i])] -= 1
    for i in sorted(range(k), key=lambda i: sizes[i] - exact[i])[:n - sum(sizes)]:
        sizes[i] += 1
    starts = np.cumsum([0] + sizes)
    return [(int(starts[i]), int(starts[i + 1])) for i in range(k)]


def split_even(n: int, parts: int) -> list[tuple[int, int]]:
    """[start, stop) of `parts` near-equal consecutive pieces of range(n) (earlier pieces larger)."""
    sizes = [n // parts + (1 if i < n % parts else 0) for i in range(parts)]
    starts = np.cumsum([0] + sizes)
    return [(int(starts[i]), int(starts[i + 1])) for i in range(parts)]


def rank_of(spec: LayoutSpec, stage: int, replica: int) -> int:
    """Global rank of (stage, replica): DeepSpeed's PipeDataParallelTopology order (axes pipe, data)."""
    return stage * spec.num_dp + replica


def group_members(spec: LayoutSpec) -> dict[str, list[list[int]]]:
    """Every process group of the layout by name, as lists of global ranks (each rank in exactly one
    list per name). The runtime creates (and checks) its groups from this, and the schedule replay
    takes the groups of every collective from it, so both see the same ranks.

        world  every rank
        pipe   the stages of one pipeline replica (head gradients into the owner, its broadcast)
        data   the replicas of one stage (DeepSpeed's data-parallel all-reduce)
    """
    stages, replicas = range(spec.num_pp), range(spec.num_dp)
    return {"world": [list(range(spec.world_size))],
            "pipe": [[rank_of(spec, s, d) for s in stages] for d in replicas],
            "data": [[rank_of(spec, s, d) for d in replicas] for s in stages]}


@dataclass(frozen=True)
class ParallelLayout:
    """A LayoutSpec placed at one global rank: which stage and replica it is, and how the rows of a
    global micro-batch are split among replicas, pipeline units and head shards. Pure arithmetic;
    the process groups live in `trainer.parallel.runtime.ParallelRuntime`."""

    spec: LayoutSpec
    rank: int

    @property
    def stage(self) -> int:
        return self.rank // self.spec.num_dp

    @property
    def replica(self) -> int:
        return self.rank % self.spec.num_dp

    @property
    def stage_ranks(self) -> list[int]:
        """Global rank of each stage of this rank's pipeline."""
        return [rank_of(self.spec, s, self.replica) for s in range(self.spec.num_pp)]

    @property
    def num_pp(self) -> int:
        return self.spec.num_pp

    @property
    def num_dp(self) -> int:
        return self.spec.num_dp

    @property
    def is_last(self) -> bool:
        return self.stage == self.spec.num_pp - 1

    def head_shards(self, rows: int) -> list[tuple[int, int]]:
        """Row ranges of the replica slice handled by each stage's head replica."""
        return head_shards(self.spec, rows)


def time_split(spec: LayoutSpec) -> bool:
    """True when the hybrid's head shards are blocks of time chunks (`head_split=time`)."""
    return spec.head_split == "time" and spec.head_parallel


def head_blocks(spec: LayoutSpec) -> list[tuple[int, int]]:
    """head_split=time: [start, stop) of the decoder time chunks whose head each stage runs, in stage
    order (stage 0 the earliest: its block is complete first), by `head_shares` or near-equal. The
    first positions hold the most real tokens (shorter sentences have ended), so equal blocks give
    the earlier stages more head work, and the last stage, which also ran the last forward, less."""
    if spec.head_shares:
        return split_weighted(spec.time_chunks, spec.head_shares)
    return split_even(spec.time_chunks, spec.num_pp)


def head_shards(spec: LayoutSpec, rows: int) -> list[tuple[int, int]]:
    """Row ranges of a replica slice of `rows` sentences handled by each stage's head (hybrid: shards by
    `head_shares` or equal; otherwise all on the last stage)."""
    if not spec.head_parallel:
        return [(0, 0)] * (spec.num_pp - 1) + [(0, rows)]
    if time_split(spec):  # every stage's head runs on all rows, at its block of positions (head_blocks)
        return [(0, rows)] * spec.num_pp
    if spec.head_shares:
        return split_weighted(rows, spec.head_shares)
    return split_even(rows, spec.num_pp)
