"""Duplicate detection in a few bytes per pair: a set of 64-bit hashes in one numpy array.

A Python `set` of ints costs ~70 bytes per entry (the int object plus its slot), so remembering the pairs of a
10M-pair corpus took gigabytes. `UInt64Set` keeps the keys themselves in an open-addressing table (linear
probing, no deletions) of `uint64`, between 11 and 23 bytes per key depending on where the load factor is
between two doublings, and looks up / inserts whole arrays of keys at once.

`Deduplicator` applies the duplicate rules of `data_prep.clean` to the candidates of a chunk, in order, with
exactly the sequential semantics of two Python sets: a pair is a "duplicate" when its exact key was kept
before (earlier in the chunk or in an earlier chunk), else a "near_duplicate" when its near key was; only
kept pairs are remembered.
"""
from __future__ import annotations

import hashlib
from typing import Iterable, Optional

import numpy as np

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)  # Fibonacci hashing: spreads structured keys over the table


def hash64(texts: Iterable[str]) -> np.ndarray:
    """The 8-byte blake2b hash of each text as little-endian uint64 (equal to `data_prep.filters.pair_key`)."""
    digests = b"".join(hashlib.blake2b(t.encode(), digest_size=8).digest() for t in texts)
    return np.frombuffer(digests, dtype="<u8").astype(np.uint64)


class UInt64Set:
    """A set of uint64 values. Slot 0 marks an empty slot, so the key 0 is tracked by a flag of its own."""

    MAX_LOAD = 0.7

    def __init__(self, capacity: int = 1024):
        self._bits = max(4, int(capacity - 1).bit_length())
        self._table = np.zeros(1 << self._bits, dtype=np.uint64)
        self._has_zero = False
        self._count = 0  # keys in the table (the zero key not included)

    def __len__(self) -> int:
        return self._count + self._has_zero

    @property
    def nbytes(self) -> int:
        return self._table.nbytes

    def _slots(self, keys: np.ndarray) -> np.ndarray:
        return ((keys * _GOLDEN) >> np.uint64(64 - self._bits)).astype(np.int64)

    def contains(self, keys: np.ndarray) -> np.ndarray:
        """A bool array: which of `keys` are in the set."""
        keys = np.asarray(keys, dtype=np.uint64)
        found = np.zeros(len(keys), dtype=bool)
        found[keys == 0] = self._has_zero
        idx = np.flatnonzero(keys)
        pos, mask = self._slots(keys[idx]), len(self._table) - 1
        while idx.size:  # one probe step for every key still unresolved
            slot = self._table[pos]
            hit = slot == keys[idx]
            found[idx[hit]] = True
            go = (slot != 0) & ~hit
            idx, pos = idx[go], (pos[go] + 1) & mask
        return found

    def add(self, keys: np.ndarray) -> None:
        keys = np.unique(np.asarray(keys, dtype=np.uint64))
        if keys.size and keys[0] == 0:
            self._has_zero, keys = True, keys[1:]
        while self._count + len(keys) > self.MAX_LOAD * len(self._table):
            self._grow()
        self._insert(keys)

    def _insert(self, keys: np.ndarray) -> None:
        """Insert distinct non-zero keys; several may race for one empty slot: the one whose write stuck wins,
        the others probe on."""
        pos, mask = self._slots(keys), len(self._table) - 1
        while keys.size:
            slot = self._table[pos]
            empty = slot == 0
            self._table[pos[empty]] = keys[empty]
            won = empty & (self._table[pos] == keys)
            self._count += int(won.sum())
            go = ~won & (slot != keys)  # neither just placed nor already present
            keys, pos = keys[go], (pos[go] + 1) & mask

    def _grow(self) -> None:
        old = self._table[self._table != 0]
        self._bits += 1
        self._table = np.zeros(1 << self._bits, dtype=np.uint64)
        self._count = 0
        self._insert(old)


class Deduplicator:
    """The "duplicate" / "near_duplicate" rules over a stream of candidate pairs, chunk by chunk."""

    def __init__(self, exact: bool = True, near: bool = True):
        self.exact = UInt64Set() if exact else None
        self.near = UInt64Set() if near else None

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for s in (self.exact, self.near) if s is not None)

    def reasons(self, exact_keys: np.ndarray, near_keys: np.ndarray) -> list[Optional[str]]:
        """For each candidate in order: None (kept, its keys remembered), "duplicate" or "near_duplicate"."""
        n = len(exact_keys)
        seen_exact = self.exact.contains(exact_keys) if self.exact is not None else np.zeros(n, bool)
        seen_near = self.near.contains(near_keys) if self.near is not None else np.zeros(n, bool)
        fresh = ~(seen_exact | seen_near)
        # The common case, vectorized: no key repeats within the chunk where a repeat could matter (an exact key
        # not seen before, a near key of a pair that neither key rejects), so no pair's fate depends on another.
        if not self._repeats(exact_keys[~seen_exact], near_keys[fresh]):
            self._remember(exact_keys[fresh], near_keys[fresh])
            return [None if f else "duplicate" if e else "near_duplicate"
                    for f, e in zip(fresh.tolist(), seen_exact.tolist())]
        chunk_exact: set[int] = set()  # keys kept earlier in this chunk (bounded by the chunk size)
        chunk_near: set[int] = set()
        out: list[Optional[str]] = []
        kept = np.zeros(n, dtype=bool)
        for i, (e, k, se, sn) in enumerate(zip(exact_keys.tolist(), near_keys.tolist(), seen_exact.tolist(),
                                                seen_near.tolist())):
            if self.exact is not None and (se or e in chunk_exact):
                out.append("duplicate")
            elif self.near is not None and (sn or k in chunk_near):
                out.append("near_duplicate")
            else:
                out.append(None)
                kept[i] = True
                chunk_exact.add(e)
                chunk_near.add(k)
        self._remember(exact_keys[kept], near_keys[kept])
        return out

    def _repeats(self, exact_keys: np.ndarray, near_keys: np.ndarray) -> bool:
        return any(table is not None and len(np.unique(keys)) < len(keys)
                   for table, keys in ((self.exact, exact_keys), (self.near, near_keys)))

    def _remember(self, exact_keys: np.ndarray, near_keys: np.ndarray) -> None:
        for table, keys in ((self.exact, exact_keys), (self.near, near_keys)):
            if table is not None:
                table.add(keys)
