"""The Checkpointer: what the training loop asks to save a step and what a run restores from.

It owns the TrainState's snapshot (with what the engine, the data stream and the layout hold) and its restore,
the collective write (trainer.checkpoint.collective), the structure checks (trainer.checkpoint.structure) and
the layout conversion (optimizer state by global layer and name: trainer.checkpoint.optimizer, the piece a
sharded optimizer replaces). A restore reads and checks every file of this rank first, all ranks agree, and
only then is anything copied into the model, the optimizer, the engine or the stream.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Callable

from trainer.checkpoint import files, structure
from trainer.checkpoint.collective import CollectiveWriter, agree
from trainer.checkpoint.files import CheckpointError
from trainer.checkpoint.optimizer import LayerKeyedOptimizerState
from trainer.checkpoint.sharded_optimizer import ShardedOptimizerState
from trainer.checkpoint.resume import RunIdentity, check_compatible, choose
from trainer.checkpoint.state import TrainState, reseed, restore_rng
from trainer.parallel.layout import LayoutSpec, rank_of

# the dev evaluation of a save: decodes from the weights just written (a directory); returns its metrics row and
# whether this checkpoint is the best so far
Evaluate = Callable[[str], tuple[dict, bool]]


def latest(run_dir: str) -> str | None:
    """The name of the run's newest complete checkpoint, or None."""
    return files.read_pointer(run_dir, files.LATEST)


@dataclasses.dataclass
class _Read:
    """This rank's share of a checkpoint, read and checked, not yet copied anywhere."""

    weights: list  # (module, state dict)
    optimizer: dict  # part -> {param name: {key: tensor}}
    rng: dict | None  # None when the layout changed (the streams are reseeded)


class Checkpointer:
    """Checkpoints of one run on this rank. `runtime`: the ParallelRuntime (its verbs carry the ranks' agreement);
    `module`, `engine`, `stream`: what a checkpoint holds the state of; `identity`: what a checkpoint must match;
    `config`: the resolved run config (plain values) recorded with every checkpoint."""

    def __init__(self, *, run_dir: str, runtime, module, engine, stream, identity: RunIdentity, config: dict,
                 keep_last: int, faults=None, optimizer_state=None):
        self.run_dir, self.rt, self.module, self.engine, self.stream = run_dir, runtime, module, engine, stream
        self.identity, self.config, self.keep_last = identity, config, keep_last
        self.optimizer_state = optimizer_state or _optimizer_state(engine, module, runtime)
        self.writer = CollectiveWriter(run_dir, runtime, module, self.optimizer_state, faults)

    # ---- names the loop's messages use ----
    @staticmethod
    def name(step: int) -> str:
        return files.step_name(step)

    def latest(self) -> str | None:
        return latest(self.run_dir)

    # ---- saving ----
    def snapshot(self, state: TrainState) -> TrainState:
        """`state` with what DeepSpeed, the data stream and the layout hold right now."""
        e = self.engine
        return dataclasses.replace(
            state, stream=self.stream.state_dict(), engine=e.counters(), lr_scheduler=e.lr_scheduler_state(),
            lr_schedule_steps=e.lr_schedule_length() or 0,
            optimizer=self.writer.optimizer_summary, layout=self.rt.spec.to_dict(), world_size=self.rt.world_size,
            batching=self.identity.batching, data_checksum=self.identity.data_checksum or "", config=self.config)

    def save(self, state: TrainState, evaluate: Evaluate | None = None) -> dict:
        """Write the checkpoint of `state.step`, every rank together. `evaluate` runs on the files written before
        they are committed, so its metrics and the best-so-far (it may update `state`) are part of the
        checkpoint. Returns its metrics row ({} without). A failure on any rank is the same CheckpointError on
        every rank, and no partial checkpoint is left."""
        step = state.step
        weights = self.writer.write_rank_files(step)
        row, best = evaluate(weights) if evaluate is not None else ({}, False)
        meta = {"step": step, "epoch": self.stream.epoch, "data_checksum": self.identity.data_checksum,
                "layout": self.rt.spec.to_dict(), **row}
        self.writer.commit(step, self.snapshot(state).to_dict(), meta, best, self.keep_last)
        return row

    # ---- restoring ----
    def choose(self, which: str, log=print) -> str | None:
        """Rank 0: the checkpoint `train.resume` names (None: a new run); CheckpointError if there is none to
        trust, or a new run would write over checkpoints."""
        return choose(self.run_dir, which, log=log)

    def restore(self, ckpt: str | None) -> tuple[TrainState, list[str]]:
        """Load `ckpt` (None: a new run) into this rank: weights, optimizer state, RNG (same layout; else
        reseeded), the engine's LR schedule and counters, the data position. Returns its TrainState and what to
        tell the user. Every rank calls it; any rank's problem is the same CheckpointError on all of them,
        raised before anything was copied."""
        if ckpt is None:
            return TrainState(), []
        path = os.path.join(ckpt, files.TRAIN_STATE)
        ts = structure.train_state(files.read_json(path), path)
        structure.lr_scheduler(ts.lr_scheduler, self.engine.lr_scheduler_state(), path)
        notes = [f"resume: from {ckpt} (step {ts.step})"]
        notes += [f"resume: FORCED although {p}" for p in check_compatible(self.identity, ckpt, ts)]
        same_layout = LayoutSpec.from_dict(ts.layout) == self.rt.spec and ts.world_size == self.rt.world_size
        read, error = None, None
        try:  # every rank reads its own layers: all of them learn of any rank's failure, or the others would wait
            read = self._read(ckpt, ts.optimizer, same_layout)
        except CheckpointError as e:
            error = str(e)
        _, errors = agree(self.rt, error)
        if errors:
            forced = (" (train.resume_force=true resumes onto other data, batching or model settings, but weights "
                      "of another shape cannot be loaded: start a new run)" if self.identity.force else "")
            raise CheckpointError(f"cannot resume from {ckpt}: {errors[0]}{forced}")
        self._apply(read, ts)
        if not same_layout:
            reseed(self.identity.seed, ts.step, self.rt.rank)
            then, spec = ts.layout, self.rt.spec
            notes.append(f"resume: layout changed ({then.get('mode')} {then.get('num_pp')}x{then.get('num_dp')} on "
                         f"{ts.world_size} ranks -> {spec.mode} {spec.num_pp}x{spec.num_dp}): weights and optimizer "
                         f"state restored, RNG streams reseeded")
        return ts, notes

    def _read(self, ckpt: str, summary: dict, same_layout: bool) -> _Read:
        """This rank's files of `ckpt`, each checked against what it is loaded into (trainer.checkpoint.structure),
        after the checkpoint's layer files against the whole model (no layer missing, none beyond it)."""
        structure.layer_files(ckpt, self.identity.model["layers"])
        module = self.module
        wanted = [(module.layers[i], files.model_file(ckpt, files.layer_name(module.first_layer + i)))
                  for i in range(len(module.layers))]
        if module.head is not None:
            wanted.append((module.head, files.model_file(ckpt, files.HEAD)))
        weights = []
        for layer, path in wanted:
            state = _load(path)
            structure.weights(state, layer, path)
            weights.append((layer, state))
        expected = self.optimizer_state.expected()
        paths = {part: files.optim_file(ckpt, part) for part in expected}
        parts = {part: _load(path) for part, path in paths.items()}
        structure.optimizer(parts, paths, expected, summary)
        rng = None
        if same_layout:
            path = files.rng_file(ckpt, self.rt.rank)
            rng = _load(path)
            structure.rng(rng, path)
        return _Read(weights, parts, rng)

    def _apply(self, read: _Read, ts: TrainState) -> None:
        for layer, state in read.weights:
            layer.load_state_dict(state)
        self.optimizer_state.scatter(read.optimizer, ts.optimizer)
        if read.rng is not None:
            restore_rng(read.rng)
        self.engine.load_lr_scheduler_state(ts.lr_scheduler)
        self.engine.load_counters(ts.engine, ts.step)
        self.stream.load_state_dict(ts.stream)  # forced with other batching: same epoch and batch count


def _optimizer_state(engine, module, runtime) -> LayerKeyedOptimizerState:
    """Where the optimizer keeps its state: whole per replica, or sharded over the replicas (ZeRO stage 1)."""
    layout = runtime.layout
    if engine.zero_stage:
        return ShardedOptimizerState(engine, module, layout.replica, runtime,
                                     replica0=rank_of(layout.spec, layout.stage, 0))
    return LayerKeyedOptimizerState(engine, module, layout.replica)


def _load(path: str):
    """A file of the checkpoint; a missing one is a CheckpointError (this run's model or layout wants a file the
    checkpoint's did not write)."""
    try:
        return files.load(path)
    except FileNotFoundError:
        raise CheckpointError(f"{path}: missing (model.* differs from the checkpoint's?)") from None
