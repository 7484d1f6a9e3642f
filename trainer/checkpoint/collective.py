"""Saving and loading a whole training state across ranks (the file format is `trainer.artifacts.checkpoint`).

A save is three collective phases, each ending with every rank learning whether any rank failed
(a full disk, an unwritable run directory), so that all of them stop together with the same error
and no partial checkpoint is ever renamed into place:
  1. rank 0 creates `step_N.tmp`;
  2. every rank writes its files (weights and optimizer state of the layers it holds, replica 0
     only; its RNG states);
  3. (after the caller's dev evaluation, which decodes from the files of phase 2) rank 0 writes
     train_state.json, meta.json and the checksum manifest, renames, updates the pointers, prunes.
"""
from __future__ import annotations

import os
from typing import Optional

from trainer.checkpoint import files as ck
from trainer.checkpoint.state import capture_rng, gather_optimizer_state, restore_rng, scatter_optimizer_state


class Persistence:
    def __init__(self, run_dir: str, runtime, module, engine, faults=None):
        self.run_dir, self.runtime, self.module, self.engine = run_dir, runtime, module, engine
        self.layout = runtime.layout
        self.faults = faults
        self.rank = runtime.rank
        self.files: dict = {}
        self.optimizer_summary: dict = {}  # the optimizer's step, hyperparameters and loss scaler, as of the last save

    def _agree(self, error: Optional[str], step: int, what: str, payload=None) -> list:
        """Every rank learns every rank's error (and `payload`); all raise the same CheckpointError if
        there is one. Returns every rank's payload."""
        gathered = self.runtime.all_gather_object((payload, error))
        errors = [e for _, e in gathered if e]
        if errors:
            if self.rank == 0:
                ck.abandon(self.run_dir, step)
            raise ck.CheckpointError(f"saving checkpoint {ck.step_name(step)} failed while {what}: "
                                     f"{'; '.join(errors)}. Earlier checkpoints are intact; training stopped.")
        return [p for p, _ in gathered]

    def write_rank_files(self, step: int) -> str:
        """Phases 1 and 2; returns the temporary directory (complete weights, for a dev decode)."""
        error = None
        if self.rank == 0:
            try:
                ck.begin(self.run_dir, step)
            except OSError as e:
                error = f"rank 0: {e}"
        self._agree(error, step, "creating its directory")
        tmp = os.path.join(ck.root(self.run_dir), ck.step_name(step) + ".tmp")
        parts, self.optimizer_summary = gather_optimizer_state(self.engine, self.module)  # collective in bf16 DP
        files, error = {}, None
        try:
            if self.layout.replica == 0:
                for offset, layer in enumerate(self.module.layers):
                    part = ck.layer_name(self.module.first_layer + offset)
                    files[os.path.basename(ck.model_file(tmp, part))] = ck.write_torch(ck.model_file(tmp, part),
                                                                                     layer.state_dict())
                if self.module.owns_head:
                    files[os.path.basename(ck.model_file(tmp, ck.HEAD))] = ck.write_torch(
                        ck.model_file(tmp, ck.HEAD), self.module.head.state_dict())
                for part, params in parts.items():
                    files[os.path.basename(ck.optim_file(tmp, part))] = ck.write_torch(ck.optim_file(tmp, part),
                                                                                     params)
            path = ck.rng_file(tmp, self.rank)
            if self.faults is not None:
                self.faults.check_disk(self.rank, step, path)
            files[os.path.basename(path)] = ck.write_torch(path, capture_rng())
        except OSError as e:
            error = f"rank {self.rank}: {e.filename or tmp}: {e.strerror or e}"
        gathered = self._agree(error, step, "writing its files", payload=files)
        self.files = {name: entry for rank_files in gathered for name, entry in rank_files.items()}
        return tmp

    def commit(self, step: int, train_state: dict, meta: dict, best: bool, keep_last: int) -> str:
        """Phase 3 (call on every rank after `write_rank_files`)."""
        error = None
        if self.rank == 0:
            tmp = os.path.join(ck.root(self.run_dir), ck.step_name(step) + ".tmp")
            try:
                files = dict(self.files)
                files[ck.TRAIN_STATE] = ck.write_json(os.path.join(tmp, ck.TRAIN_STATE), train_state)
                files[ck.META] = ck.write_json(os.path.join(tmp, ck.META), meta)
                ck.finalize(self.run_dir, step, files)
                if best:
                    ck.mark_best(self.run_dir, step)
                ck.prune(self.run_dir, keep_last)
            except OSError as e:
                error = f"rank 0: {e.filename or tmp}: {e.strerror or e}"
        self._agree(error, step, "finalizing")
        return os.path.join(ck.root(self.run_dir), ck.step_name(step))

    def load(self, ckpt: str, summary: dict, same_layout: bool) -> None:
        """This rank's weights, optimizer state and (same layout only) RNG states from `ckpt`."""
        for offset, layer in enumerate(self.module.layers):
            _load_weights(layer, ck.model_file(ckpt, ck.layer_name(self.module.first_layer + offset)))
        if self.module.head is not None:
            _load_weights(self.module.head, ck.model_file(ckpt, ck.HEAD))
        parts = {}
        for part in self._owned_parts():
            parts[part] = ck.load(ck.optim_file(ckpt, part))
        missing = scatter_optimizer_state(self.engine, self.module, parts, summary)
        if missing:
            raise ck.CheckpointError(f"{ckpt}: no optimizer state for {', '.join(missing[:5])} "
                                     f"(model.* differs from the checkpoint's?)")
        if same_layout:
            restore_rng(ck.load(ck.rng_file(ckpt, self.rank)))

    def _owned_parts(self) -> list[str]:
        parts = [ck.layer_name(self.module.first_layer + i) for i in range(len(self.module.layers))]
        return parts + ([ck.HEAD] if self.module.owns_head else [])


def _load_weights(module, path: str) -> None:
    """A checkpoint file's weights into `module`, its names and shapes compared first: another vocabulary
    or width (a forced resume onto other data or model.*) is one CheckpointError naming the tensor, not
    torch's size-mismatch traceback."""
    state = ck.load(path)
    if not isinstance(state, dict):
        raise ck.CheckpointError(f"{path}: not a state dict")
    want = module.state_dict()
    for name, tensor in want.items():
        got = state.get(name)
        if got is None:
            raise ck.CheckpointError(f"{path}: no {name} (model.* differs from the checkpoint's?)")
        if tuple(getattr(got, "shape", ())) != tuple(tensor.shape):
            raise ck.CheckpointError(f"{path}: {name} has shape {tuple(getattr(got, 'shape', ()))}, this run's "
                                     f"model needs {tuple(tensor.shape)} (another vocabulary or model.* size)")
    extra = sorted(set(state) - set(want))
    if extra:
        raise ck.CheckpointError(f"{path}: holds {extra[0]}, which this run's model does not have (model.* differs)")
    module.load_state_dict(state)
