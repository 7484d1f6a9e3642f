"""`--split-by-doc`: hold out whole documents of the training input as dev and test sets.

Two streaming passes over the training reader. The first counts the pairs of every document (a dict of 8-byte
seeded document hashes: memory grows with the number of documents, never with the text). Sorting the hashes
shuffles the documents (seeded, independent of file order); dev takes documents in that order until it holds
>= `dev_size` pairs, then test until >= `test_size`. The second pass is the training view's own iteration:
held-out pairs are set aside (dev + test are small by definition) and replayed by the dev / test views, so a
document never lands in two splits. Sizes count the pairs the reader yields (before cleaning, which may drop
some). Rejected records (malformed, filtered) have no document and are counted under train.
"""
from __future__ import annotations

from collections import Counter
from typing import Iterator, Optional

from .base import Pair, PrepareError, Reader, Record, doc_key


class DocSplit:
    def __init__(self, reader: Reader, sizes: dict[str, int], seed: int):
        self.reader, self.seed = reader, seed
        self.sizes = {split: n for split, n in sizes.items() if n > 0}
        self.route = self.choose(self.count_pairs())
        self.held: dict[str, list[Pair]] = {}
        self.views = {split: DocSplitView(self, split) for split in ("train", *self.sizes)}

    def key(self, rec: Record) -> Optional[int]:
        return doc_key(rec.doc, self.seed) if isinstance(rec, Pair) else None

    def count_pairs(self) -> Counter:
        counts: Counter = Counter()
        for rec in self.reader:
            if isinstance(rec, Pair):
                if rec.doc is None:
                    raise PrepareError(f"{rec.origin}: --split-by-doc needs a document id for every pair, but format "
                                       f"{self.reader.name!r} gives none here")
                counts[self.key(rec)] += 1
        return counts

    def choose(self, counts: Counter) -> dict[int, str]:
        order = iter(sorted(counts))
        route: dict[int, str] = {}
        docs, pairs = Counter(), Counter()
        for split, size in self.sizes.items():
            while pairs[split] < size:
                k = next(order, None)
                if k is None:
                    break
                route[k] = split
                docs[split] += 1
                pairs[split] += counts[k]
        total = sum(counts.values())
        if any(pairs[s] < n for s, n in self.sizes.items()) or len(route) == len(counts):
            wanted = " and ".join(f"{s} >= {n}" for s, n in self.sizes.items())
            raise PrepareError(f"{', '.join(self.reader.paths)}: --split-by-doc cannot hold out {wanted} pairs by "
                               f"document and keep training pairs: the input has {len(counts)} documents with "
                               f"{total} pairs")
        self.info = {"seed": self.seed, "requested": dict(self.sizes),
                     "documents": {"train": len(counts) - len(route), **docs},
                     "pairs": {"train": total - sum(pairs.values()), **pairs}}
        return route

    def train_records(self) -> Iterator[Record]:
        held: dict[str, list[Pair]] = {split: [] for split in self.sizes}
        for rec in self.reader:
            split = self.route.get(self.key(rec)) if isinstance(rec, Pair) else None
            if split:
                held[split].append(rec)
            else:
                yield rec
        self.held = held

    def held_records(self, split: str) -> Iterator[Record]:
        """The held-out pairs of `split`: from the training pass if it ran, else from a pass of their own."""
        held = self.held.pop(split, None)
        if held is not None:
            yield from held
            return
        for rec in self.reader:
            if isinstance(rec, Pair) and self.route.get(self.key(rec)) == split:
                yield rec


class DocSplitView(Reader):
    """One split of a `DocSplit`, with the reader interface. Only the training view lists the input files."""

    def __init__(self, source: DocSplit, split: str):
        base = source.reader
        self.source, self.split, self.name = source, split, base.name
        self.src_path, self.tgt_path = base.src_path, base.tgt_path
        self.src_lang, self.tgt_lang = base.src_lang, base.tgt_lang
        self.inline, self.meta_filter, self.documents = base.inline, None, None

    @property
    def paths(self) -> list[str]:
        return self.source.reader.paths if self.split == "train" else []

    def records(self) -> Iterator[Record]:
        return self.source.train_records() if self.split == "train" else self.source.held_records(self.split)
