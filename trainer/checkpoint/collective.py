"""Writing one checkpoint across ranks, and the ranks' agreement (the file format: trainer.checkpoint.files).

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

from trainer.checkpoint import files as ck
from trainer.checkpoint.state import capture_rng


def agree(runtime, error: str | None, payload=None) -> tuple[list, list[str]]:
    """Every rank's payload and every rank's error (a collective: every rank calls it together)."""
    gathered = runtime.all_gather_object((payload, error))
    return [p for p, _ in gathered], [e for _, e in gathered if e]


class CollectiveWriter:
    """Writes checkpoints of one run on every rank: `write_rank_files`, then `commit`. `optimizer_state`: the
    piece that gathers the optimizer state (trainer.checkpoint.optimizer)."""

    def __init__(self, run_dir: str, runtime, module, optimizer_state, faults=None):
        self.run_dir, self.runtime, self.module, self.optimizer_state = run_dir, runtime, module, optimizer_state
        self.rank, self.replica = runtime.rank, runtime.layout.replica
        self.faults = faults
        self.files: dict = {}
        self.optimizer_summary: dict = {}  # the optimizer's step, hyperparameters and loss scaler, as of the last save

    def _agree(self, error: str | None, step: int, what: str, payload=None) -> list:
        """All ranks raise the same CheckpointError if any failed (rank 0 removes the partial directory)."""
        payloads, errors = agree(self.runtime, error, payload)
        if errors:
            if self.rank == 0:
                ck.abandon(self.run_dir, step)
            raise ck.CheckpointError(f"saving checkpoint {ck.step_name(step)} failed while {what}: "
                                     f"{'; '.join(errors)}. Earlier checkpoints are intact; training stopped.")
        return payloads

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
        parts, self.optimizer_summary = self.optimizer_state.gather()
        files, error = {}, None
        try:
            files.update(self._write_weights(tmp))
            if self.optimizer_state.writes():
                for part, params in parts.items():
                    files[os.path.basename(ck.optim_file(tmp, part))] = ck.write_torch(ck.optim_file(tmp, part), params)
            path = ck.rng_file(tmp, self.rank)
            if self.faults is not None:
                self.faults.check_disk(self.rank, step, path)
            files[os.path.basename(path)] = ck.write_torch(path, capture_rng())
        except OSError as e:
            error = f"rank {self.rank}: {e.filename or tmp}: {e.strerror or e}"
        gathered = self._agree(error, step, "writing its files", payload=files)
        self.files = {name: entry for rank_files in gathered for name, entry in rank_files.items()}
        return tmp

    def _write_weights(self, tmp: str) -> dict:
        """Replica 0: the weights of this rank's layers and (the owner) the head; {file name: manifest entry}."""
        if self.replica != 0:
            return {}
        module, files = self.module, {}
        parts = [(ck.layer_name(module.first_layer + i), layer) for i, layer in enumerate(module.layers)]
        if module.owns_head:
            parts.append((ck.HEAD, module.head))
        for part, layer in parts:
            files[os.path.basename(ck.model_file(tmp, part))] = ck.write_torch(ck.model_file(tmp, part),
                                                                             ck.compact(layer.state_dict()))
        return files

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
