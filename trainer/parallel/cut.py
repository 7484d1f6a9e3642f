"""How a layout cuts a global micro-batch: into replica slices, pipeline units, time chunks and head
pieces. The one cutter: the interpreter runs on these pieces and the planner prices them, so a change
here changes both.

    replica  split_even over num_dp; trimmed of padding columns no row of it uses
    units    split_even of the replica's rows into `micro_batches`, each trimmed again
    chunks   split_even of each unit's source / target width into `time_chunks`
    pieces   what one head instruction runs on: a unit (per_unit) or a stage's head shard of the replica:
             its rows (head_split=sentences) or every row at its block of decoder time chunks (=time)
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from trainer.data import Batch
from trainer.parallel.layout import LayoutSpec, head_blocks, head_shards, split_even, time_split


@dataclass
class ReplicaCut:
    """One replica's slice of a global micro-batch and its pipeline units and time chunks."""

    replica: Batch
    row0: int  # its first row in the global micro-batch
    units: list  # Batch per pipeline unit
    unit_rows: list  # [start, stop) of each unit in `replica`
    chunks: dict  # 'enc' | 'dec' -> per unit, [start, stop) of each time chunk

    def to(self, device) -> "ReplicaCut":
        """The same cut with the replica on `device` (one copy) and the units sliced from it there."""
        replica = self.replica.to(device)
        return ReplicaCut(replica, self.row0, [replica.rows(a, b) for a, b in self.unit_rows], self.unit_rows,
                          self.chunks)

    def piece_rows(self, spec: LayoutSpec, stage: int, unit: int = -1) -> tuple[int, int]:
        """[start, stop) rows of the replica one head instruction runs on: unit `unit`, or (-1) `stage`'s
        head shard."""
        if unit >= 0:
            return self.unit_rows[unit]
        return head_shards(spec, self.replica.size)[stage]

    def piece_cols(self, spec: LayoutSpec, stage: int, unit: int = -1) -> tuple[int, int] | None:
        """head_split=time: [start, stop) target positions of `stage`'s head piece (its block of the
        decoder time chunks of the one unit); None when pieces are whole rows."""
        if unit >= 0 or not time_split(spec):
            return None
        first, last = head_blocks(spec)[stage]
        dec = self.chunks["dec"][0]
        return dec[first][0], dec[last - 1][1]

    def piece_t0(self, spec: LayoutSpec, stage: int, unit: int = -1) -> int:
        """The first target position of a head piece (0 unless it is a block of time chunks)."""
        cols = self.piece_cols(spec, stage, unit)
        return 0 if cols is None else cols[0]

    def piece_chunks(self, spec: LayoutSpec, stage: int) -> range:
        """head_split=time: the decoder time chunks of `stage`'s head piece."""
        return range(*head_blocks(spec)[stage])

    def piece(self, spec: LayoutSpec, stage: int, unit: int = -1) -> Batch:
        if unit >= 0:
            return self.units[unit]
        rows = self.replica.rows(*self.piece_rows(spec, stage, unit))
        cols = self.piece_cols(spec, stage, unit)
        return rows if cols is None else rows.target_cols(*cols)

    def encoder_lengths(self, unit: int, chunk: int) -> np.ndarray:
        """Each row's real source steps inside encoder chunk `chunk` of `unit` (0 when it ended before)."""
        a, b = self.chunks["enc"][unit][chunk]
        return np.clip(self.units[unit].src_len - a, 0, b - a)


def cut_replica(spec: LayoutSpec, batch: Batch, replica: int) -> ReplicaCut:
    """Replica `replica`'s share of the global micro-batch `batch` (the same on every rank)."""
    start, stop = split_even(batch.size, spec.num_dp)[replica]
    rep = batch.rows(start, stop)
    unit_rows = split_even(rep.size, spec.micro_batches)
    units = [rep.rows(a, b) for a, b in unit_rows]
    chunks = {"enc": [split_even(u.src.shape[1], spec.time_chunks) for u in units],
              "dec": [split_even(u.tgt_in.shape[1], spec.time_chunks) for u in units]}
    return ReplicaCut(rep, start, units, unit_rows, chunks)
