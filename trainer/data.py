"""Batches from the binarized dataset: length-bucketed, seeded, identical on every rank.

Every rank builds the same global batches from the same seed, so lengths, masks and targets never
travel between ranks; each rank cuts out the rows it needs (see `trainer.parallel.layout`).
"""
from __future__ import annotations

import copy
import os
from dataclasses import dataclass

import numpy as np
import torch

from data_prep.dataformat import (BOS_ID, EOS_ID, MANIFEST, MAX_SPM_BYTES, OFFSET_DTYPE, PAD_ID, PREPARE_LOCK, SIDES,
                                  SPM_MODELS, TOKEN_DTYPE, TokenArray, file_sha256, files, files_checksum,
                                  first_out_of_range, has_split, load_pair, lock, open_data, side_paths, userfiles)
from trainer.model.tensors import round_count, to_device


@dataclass
class Batch:
    """A padded batch, rows sorted by source length (longest first).

    src (batch, src_len) ids + EOS, src_lengths (batch,), tgt_in (batch, tgt_len) = BOS + y,
    tgt_out (batch, tgt_len) = y + EOS, PAD elsewhere: tensors, on the host or on the device.
    src_len, tgt_len: the same lengths as host numpy arrays (tgt_len counts y + EOS). Everything a step
    decides from lengths (trimming, token counts, packed sequences, the head's token positions) reads
    these, so nothing waits for the device to hand a length back (trainer.observe.op_counter).
    ids: the distinct ids of src and of tgt_in as host numpy arrays (the embedding rows the batch touches),
    when it was collated from host data; None otherwise.
    multiple: src and tgt widths are padded up to a multiple of it (data.length_multiple), here and in every
    slice `rows` trims: on an accelerator each distinct shape loads or tunes kernels once.
    """

    src: torch.Tensor
    src_lengths: torch.Tensor
    tgt_in: torch.Tensor
    tgt_out: torch.Tensor
    src_len: np.ndarray | None = None
    tgt_len: np.ndarray | None = None
    ids: tuple | None = None
    multiple: int = 1

    def __post_init__(self):
        if self.src_len is None:  # built from tensors alone (tests, tools): read the lengths once
            self.src_len = np.asarray(self.src_lengths.cpu(), dtype=np.int64)
        if self.tgt_len is None:
            self.tgt_len = np.asarray((self.tgt_out != PAD_ID).sum(1).cpu(), dtype=np.int64)

    @property
    def size(self) -> int:
        return len(self.src_len)

    @property
    def tgt_tokens(self) -> int:
        return int(self.tgt_len.sum())

    @property
    def src_tokens(self) -> int:
        return int(self.src_len.sum())

    @property
    def attn_pairs(self) -> int:
        """Sum over sentences of target tokens x source tokens (the attention's work)."""
        return int((self.src_len * self.tgt_len).sum())

    @property
    def src_mask(self) -> torch.Tensor:
        return self.src != PAD_ID

    def rows(self, start: int, stop: int, trim: bool = True) -> "Batch":
        """Rows [start, stop); with trim, padding columns no row of the slice uses are dropped."""
        src, tgt_in, tgt_out = self.src[start:stop], self.tgt_in[start:stop], self.tgt_out[start:stop]
        src_len, tgt_len = self.src_len[start:stop], self.tgt_len[start:stop]
        if trim and stop > start:
            s, t = padded_width(int(src_len.max()), self.multiple), padded_width(int(tgt_len.max()), self.multiple)
            src, tgt_in, tgt_out = src[:, :s], tgt_in[:, :t], tgt_out[:, :t]
        return Batch(src.contiguous(), self.src_lengths[start:stop].contiguous(), tgt_in.contiguous(),
                     tgt_out.contiguous(), src_len, tgt_len, multiple=self.multiple)

    def target_cols(self, start: int, stop: int) -> "Batch":
        """Target positions [start, stop) of every row, the source whole (a head piece cut along time);
        tgt_len counts each row's real tokens inside the slice."""
        tgt_len = np.clip(self.tgt_len - start, 0, max(0, stop - start))
        return Batch(self.src, self.src_lengths, self.tgt_in[:, start:stop].contiguous(),
                     self.tgt_out[:, start:stop].contiguous(), self.src_len, tgt_len, multiple=self.multiple)

    def to(self, device) -> "Batch":
        """On `device`; from the host to an accelerator through pinned memory, without blocking the host
        (the lengths stay on the host)."""
        device = torch.device(device)
        tensors = (self.src, self.src_lengths, self.tgt_in, self.tgt_out)
        if device.type != "cpu" and all(t.device.type == "cpu" for t in tensors):
            tensors = tuple(to_device(t, device) for t in tensors)
        else:
            tensors = tuple(t.to(device) for t in tensors)
        return Batch(*tensors, self.src_len, self.tgt_len, self.ids, self.multiple)

    def token_positions(self, width: int | None = None, round_bits: int = 4) -> np.ndarray:
        """Flat positions (row * width + t) of the real target tokens in a (batch, width) layout
        (width: the padded target length, tgt_out's by default), row-major, plus the first padded
        positions needed to round the count up (`round_count`): the rows the head runs on. Host-side:
        computing it from `tgt_out != PAD` on the device would need the count back on the host."""
        width = width or self.tgt_out.shape[1]
        real = np.arange(width)[None, :] < self.tgt_len[:, None]  # (batch, width)
        n = int(self.tgt_len.sum())
        extra = round_count(n, round_bits) - n
        flat = real.reshape(-1)
        if extra:
            flat = flat.copy()
            flat[np.flatnonzero(~flat)[:extra]] = True
        return np.flatnonzero(flat)


def padded_width(width: int, multiple: int) -> int:
    """`width` rounded up to a multiple of `multiple` (1: as it is)."""
    return width if multiple <= 1 else -(-width // multiple) * multiple


def collate(src_seqs: list[np.ndarray], tgt_seqs: list[np.ndarray], multiple: int = 1) -> Batch:
    """Padded tensors of the pairs, rows sorted by source length (longest first, stable), built with
    whole-array numpy operations (no per-row tensor work); each width padded up to a multiple of `multiple`."""
    src_all = [np.asarray(x, dtype=np.int64) for x in src_seqs]
    tgt_all = [np.asarray(y, dtype=np.int64) for y in tgt_seqs]
    order = np.argsort([-len(x) for x in src_all], kind="stable")
    src_len = np.array([len(src_all[i]) for i in order], dtype=np.int64)
    tgt_len = np.array([len(tgt_all[i]) for i in order], dtype=np.int64)
    n, rows = len(order), np.arange(len(order))
    src = np.full((n, padded_width(int(src_len.max()) + 1, multiple)), PAD_ID, dtype=np.int64)
    tgt_in = np.full((n, padded_width(int(tgt_len.max()) + 1, multiple)), PAD_ID, dtype=np.int64)
    tgt_out = np.full_like(tgt_in, PAD_ID)
    r, c = _positions(src_len)
    if len(r):
        src[r, c] = np.concatenate([src_all[i] for i in order])
    src[rows, src_len] = EOS_ID
    r, c = _positions(tgt_len)
    if len(r):
        y = np.concatenate([tgt_all[i] for i in order])
        tgt_in[r, c + 1] = y
        tgt_out[r, c] = y
    tgt_in[:, 0] = BOS_ID
    tgt_out[rows, tgt_len] = EOS_ID
    return Batch(torch.from_numpy(src), torch.from_numpy(src_len + 1), torch.from_numpy(tgt_in),
                 torch.from_numpy(tgt_out), src_len + 1, tgt_len + 1, (np.unique(src), np.unique(tgt_in)), multiple)


def _positions(lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(row, column) of every token of rows with these lengths, row-major."""
    rows = np.repeat(np.arange(len(lengths)), lengths)
    starts = np.cumsum(lengths) - lengths
    return rows, np.arange(int(lengths.sum())) - np.repeat(starts, lengths)


def make_batches(src_len: np.ndarray, tgt_len: np.ndarray, *, max_sentences: int, max_tokens: int,
                 seed: int, epoch: int, bucket_batches: int, shuffle: bool = True,
                 min_batch: int = 1) -> tuple[list[np.ndarray], int]:
    """Index arrays of the batches of one epoch, and the number of pairs left out.

    Shuffle (seeded by seed and epoch), sort windows of `bucket_batches` batches by length, cut
    batches of at most `max_sentences` pairs and at most `max_tokens` padded src+tgt tokens
    (+1 each for EOS/BOS), then shuffle the batch order. A window's last batch smaller than
    `min_batch` (the rows the layout must split it into) is carried into the next window; only the
    epoch's final remainder (< min_batch pairs) is left out, and counted. Deterministic: every rank
    gets the same list.
    """
    n = len(src_len)
    rng = np.random.default_rng([seed, epoch])
    order = rng.permutation(n) if shuffle else np.arange(n)
    window = max_sentences * bucket_batches
    batches, carry = [], order[:0]
    for w in range(0, n, window):
        idx = np.concatenate([carry, order[w:w + window]])
        if shuffle:
            idx = idx[np.lexsort((tgt_len[idx], src_len[idx]))]
        start = 0
        while start < len(idx):
            stop = min(start + max_sentences, len(idx))
            if max_tokens:
                s_max = t_max = 0
                for j in range(start, stop):
                    s_max = max(s_max, src_len[idx[j]] + 1)
                    t_max = max(t_max, tgt_len[idx[j]] + 1)
                    if (j - start + 1) * (s_max + t_max) > max_tokens and j - start >= min_batch:
                        stop = j
                        break
            batches.append(idx[start:stop])
            start = stop
        carry = order[:0]
        if len(batches[-1]) < min_batch:
            carry = batches.pop()
    if shuffle:
        perm = rng.permutation(len(batches))
        batches = [batches[i] for i in perm]
    return batches, len(carry)


class ParallelData:
    """One split of DATA_DIR: the two TokenArrays and batch construction. The token ids are checked against the
    vocabulary (`vocab`: the manifest's, read from DATA_DIR if not given) on the arrays loaded, the ones batches
    are cut from: each file is opened once, so a file replaced after a separate check cannot slip in (an
    out-of-vocabulary id was an IndexError in the embedding). The files are memory-mapped, so each batch's ids are
    checked too (a min and a max collate has already found): a file written over while training is one line."""

    def __init__(self, data_dir: str, split: str, length_multiple: int = 1, vocab: dict | None = None):
        self.data_dir, self.split, self.length_multiple = data_dir, split, length_multiple
        self.src, self.tgt = load_pair(data_dir, split)
        self.src_len, self.tgt_len = self.src.lengths, self.tgt.lengths
        if len(self.src) == 0:  # found before training starts, not as a crash in the first dev evaluation
            raise ValueError(f"{data_dir}: the {split} split holds no sentence pair; prepare the data again with a "
                             f"non-empty --{split}-src (data_prep.prepare now refuses an empty one)")
        vocab = vocab if vocab is not None else read_manifest(data_dir)["vocab"]
        self.sizes = {side: vocab[f"{side}_size"] for side in SIDES}
        for side, array in zip(SIDES, (self.src, self.tgt)):
            check_ids(array, self.sizes[side], side_paths(data_dir, split, side)[0], side)

    def __len__(self) -> int:
        return len(self.src)

    def batch(self, indices) -> Batch:
        b = collate([self.src[i] for i in indices], [self.tgt[i] for i in indices], self.length_multiple)
        for side, ids in zip(SIDES, b.ids):  # sorted: the first is the least, the last the greatest
            if ids[0] < 0 or ids[-1] >= self.sizes[side]:
                bad = int(ids[0] if ids[0] < 0 else ids[-1])
                raise ValueError(f"{side_paths(self.data_dir, self.split, side)[0]}: id {bad} in a batch of the "
                                 f"{self.split} split, outside the {_SIDE_NAMES[side]} vocabulary of "
                                 f"{self.sizes[side]} pieces: the file was written over after it was loaded and "
                                 f"checked; prepare the data again")
        return b

    def padded(self, length_multiple: int) -> "ParallelData":
        """The same split (its arrays already loaded and checked), its batches padded to `length_multiple`."""
        other = copy.copy(self)
        other.length_multiple = length_multiple
        return other


_SIDE_NAMES = {"src": "source", "tgt": "target"}


def check_ids(array: TokenArray, size: int, path: str, side: str) -> None:
    """Every token id of `array` (loaded from `path`) inside the vocabulary of `size` pieces (one numpy min/max
    pass), or a ValueError naming the file, the token and its sentence."""
    bad = first_out_of_range(array.tokens, size)
    if bad is not None:
        sentence = int(np.searchsorted(array.offsets, bad, side="right")) - 1
        raise ValueError(f"{path}: token {bad} (sentence {sentence}, its token {bad - int(array.offsets[sentence])}) "
                         f"has id {int(array.tokens[bad])}, outside the {_SIDE_NAMES[side]} vocabulary of {size} "
                         f"pieces: the file is damaged; prepare the data again (data.verify=checksums compares every "
                         f"file with the manifest)")


@dataclass(frozen=True)
class RunData:
    """What a run trains on, read once: DATA_DIR's manifest, and its train and dev splits loaded and checked."""

    manifest: dict
    train: ParallelData
    dev: ParallelData | None


def load_run_data(data_dir: str, verify_mode: str = "ids") -> RunData:
    """DATA_DIR for a run: the manifest, the files compared with it (`data.verify`: `verify`), then the train and
    dev splits loaded, each file opened once and its token ids checked on the arrays the run trains on."""
    manifest = read_manifest(data_dir)
    verify(data_dir, manifest, verify_mode)
    vocab = manifest["vocab"]
    dev = ParallelData(data_dir, "dev", vocab=vocab) if has_split(data_dir, "dev") else None
    return RunData(manifest, ParallelData(data_dir, "train", vocab=vocab), dev)


class BatchStream:
    """Endless stream of global training batches with a resumable position (epoch, index)."""

    def __init__(self, data: ParallelData, *, max_sentences: int, max_tokens: int, seed: int,
                 bucket_batches: int, min_batch: int = 1):
        self.data, self.seed = data, seed
        self.kw = dict(max_sentences=max_sentences, max_tokens=max_tokens, bucket_batches=bucket_batches)
        self.min_batch = min_batch
        self.epoch, self.index, self.left_out = 0, 0, 0
        self._batches = None
        self._ends = None  # pairs handed out after each batch of the epoch (cumulative sizes)
        self._left_out_by_epoch: dict[int, int] = {}

    def _epoch_batches(self):
        if self._batches is None:
            self._batches, self.left_out = make_batches(self.data.src_len, self.data.tgt_len, seed=self.seed,
                                                        epoch=self.epoch, min_batch=self.min_batch, **self.kw)
            if not self._batches:
                raise ValueError(f"{self.data.data_dir}: no training batch has >= {self.min_batch} sentences "
                                 f"(data.min_batch_sentences={self.min_batch}; the {self.data.split} split holds "
                                 f"{len(self.data)} pairs): lower data.min_batch_sentences (a layout needs at least "
                                 f"replicas x max(units, head shards)) or prepare more data")
            self._ends = np.cumsum([len(b) for b in self._batches])
            self._left_out_by_epoch[self.epoch] = self.left_out
        return self._batches

    def next_indices(self) -> np.ndarray:
        batches = self._epoch_batches()
        if self.index >= len(batches):
            self.epoch, self.index, self._batches = self.epoch + 1, 0, None
            batches = self._epoch_batches()
        b = batches[self.index]
        self.index += 1
        return b

    def next(self) -> Batch:
        return self.data.batch(self.next_indices())

    def position(self) -> "EpochPosition":
        """How far through the corpus the batches handed out so far reach."""
        self._epoch_batches()
        done = int(self._ends[self.index - 1]) if self.index else 0
        return EpochPosition(self.epoch, done, int(self._ends[-1]))

    def left_out_of(self, epoch: int) -> int:
        """The pairs epoch `epoch` leaves out (its final remainder, fewer than min_batch): known once its batches
        were made, else made again (deterministic: seed and epoch)."""
        if epoch not in self._left_out_by_epoch:
            self._left_out_by_epoch[epoch] = make_batches(self.data.src_len, self.data.tgt_len, seed=self.seed,
                                                          epoch=epoch, min_batch=self.min_batch, **self.kw)[1]
        return self._left_out_by_epoch[epoch]

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "index": self.index}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.index, self._batches = state["epoch"], state["index"], None


@dataclass(frozen=True)
class EpochPosition:
    """Where the stream stands: `epoch` (from 0), `pairs` of it handed out, of the `total` it trains on (the
    corpus less the pairs it leaves out)."""

    epoch: int
    pairs: int
    total: int

    @property
    def fraction(self) -> float:
        return self.pairs / self.total if self.total else 0.0

    @property
    def epochs_done(self) -> int:
        """Epochs whose every batch was handed out (an epoch's last batch taken finishes it)."""
        return self.epoch + (self.pairs >= self.total)

    @property
    def percent(self) -> int:
        """Rounded down: 100 only once the epoch's last batch was handed out."""
        return 100 * self.pairs // max(1, self.total)

    def describe(self) -> str:
        """`epoch 1 (37%)`: epochs counted from 1, as a reader counts them (the metrics' `epoch` counts from 0)."""
        return f"epoch {self.epoch + 1} ({self.percent}%)"


class Prefetcher:
    """A `BatchStream` read `ahead` batches in advance on a background thread (collate is numpy work, which
    runs while the step's kernels do), with the position of the batches handed out: `state_dict`,
    `epoch` and `position` are the consumer's, not the thread's, so a checkpoint resumes exactly."""

    def __init__(self, stream: BatchStream, ahead: int):
        from concurrent.futures import ThreadPoolExecutor

        self._stream, self.ahead = stream, max(1, ahead)
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="batches")
        self._queue: list = []
        self._state, self.epoch, self._position = stream.state_dict(), stream.epoch, None

    def _one(self):
        batch = self._stream.next()
        return batch, self._stream.state_dict(), self._stream.epoch, self._stream.position()

    def _fill(self) -> None:
        while len(self._queue) < self.ahead:
            self._queue.append(self._pool.submit(self._one))

    def next(self) -> Batch:
        self._fill()
        batch, self._state, self.epoch, self._position = self._queue.pop(0).result()
        self._fill()
        return batch

    def position(self) -> EpochPosition:
        """The position after the batches handed out (before the first, or after a restore: the stream's own;
        nothing is read ahead until the first `next`)."""
        if self._position is None:
            assert not self._queue, "read ahead before a batch was handed out"
            self._position = self._stream.position()
        return self._position

    def left_out_of(self, epoch: int) -> int:
        return self._stream.left_out_of(epoch)

    def state_dict(self) -> dict:
        return dict(self._state)

    def load_state_dict(self, state: dict) -> None:
        self._drain()
        self._stream.load_state_dict(state)
        self._state, self.epoch, self._position = self._stream.state_dict(), self._stream.epoch, None

    def _drain(self) -> None:
        for future in self._queue:
            future.result()
        self._queue.clear()

    def close(self) -> None:
        self._drain()
        self._pool.shutdown()


MAX_MANIFEST_BYTES = 64 << 20  # DATA_DIR's manifest: kilobytes (a sha256 per binarized file)


def read_manifest(data_dir: str) -> dict:
    """DATA_DIR/manifest.json, checked for what the trainer reads from it: read through the file layer like any user
    file (a regular file, size-capped, strict JSON), so that a bad one is a one-line error naming it."""
    path = os.path.join(data_dir, MANIFEST)
    writer = lock.held_by(os.path.join(data_dir, PREPARE_LOCK))
    if writer is not None:  # its files would be part old, part new
        raise ValueError(f"data.dir={data_dir}: data_prep.prepare is writing it ({writer}); wait for it to end")
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: not found; data.dir must be a directory written by data_prep.prepare")
    manifest = userfiles.read_json(path, MAX_MANIFEST_BYTES, "the data manifest")
    vocab = manifest.get("vocab") if isinstance(manifest, dict) else None
    sizes_ok = isinstance(vocab, dict) and all(type(vocab.get(k)) is int and vocab[k] > 0
                                               for k in ("src_size", "tgt_size"))
    if not (sizes_ok and isinstance(manifest.get("checksum"), str)):
        raise ValueError(f"{path}: not a manifest written by data_prep.prepare (no vocab sizes or checksum)")
    return manifest


def verify(data_dir: str, manifest: dict, mode: str = "ids") -> None:
    """Refuse data that disagrees with its manifest before anything is built (`data.verify`), naming the file:
    every mode but "none" compares each split's pair count and each file's size with the manifest (a stat per
    file) and each SentencePiece model's size with the manifest's vocabulary (check_vocabulary); "checksums" also
    compares every binarized file with the sha256 prepare recorded (the whole manifest checksum for older
    manifests); "full" also the SentencePiece models' sha256 and the manifest's checksum over all the binarized
    files: every byte the manifest vouches for. (The token ids, which a flipped byte almost always puts outside the
    vocabulary, are checked whatever the mode, on the arrays loaded: ParallelData.)"""
    if mode == "none":
        return
    check_sizes(data_dir, manifest)
    if mode in ("checksums", "full"):
        _verify_checksums(data_dir, manifest, whole=mode == "full")
    check_vocabulary(data_dir, manifest)


def check_sizes(data_dir: str, manifest: dict) -> None:
    """Each split's files against the manifest's counts, by size alone: the .idx holds pairs + 1 offsets, the
    .bin the split's tokens of its side (manifests without token counts: the .idx only). A split the manifest
    does not list must not be there; one it lists may be gone whole (a dev set removed: trained without one),
    not in part. Refused naming the file and both counts."""
    where = os.path.join(data_dir, MANIFEST)
    splits = manifest.get("splits")
    if not isinstance(splits, dict):
        raise ValueError(f"{where}: has no 'splits' (pairs per split): not a manifest written by data_prep.prepare")
    for split in ("train", "dev", "test"):
        entry, present = splits.get(split), [p for side in SIDES for p in side_paths(data_dir, split, side)
                                             if os.path.lexists(p)]
        if entry is None and present:
            raise ValueError(f"{present[0]}: the data manifest lists no {split} split; the file is not prepare's "
                             f"(remove it, or prepare the data again)")
        if not present:
            continue
        pairs = entry.get("pairs_kept") if isinstance(entry, dict) else None
        if type(pairs) is not int or pairs < 0:
            raise ValueError(f"{where}: splits.{split}.pairs_kept={pairs!r}: not a count of pairs")
        tokens = entry.get("tokens") if isinstance(entry.get("tokens"), dict) else {}
        for side in SIDES:
            bin_path, idx_path = side_paths(data_dir, split, side)
            _check_size(idx_path, (pairs + 1) * OFFSET_DTYPE.itemsize,
                        lambda n: f"holds {n // OFFSET_DTYPE.itemsize - 1} pairs where the data manifest says {pairs}")
            if type(tokens.get(side)) is int:
                _check_size(bin_path, tokens[side] * TOKEN_DTYPE.itemsize,
                            lambda n: f"holds {n // TOKEN_DTYPE.itemsize} tokens where the data manifest says "
                                      f"{tokens[side]}")


def check_vocabulary(data_dir: str, manifest: dict) -> None:
    """Each side's SentencePiece model holds as many pieces as the manifest's vocabulary size, which sizes the model
    and bounds its token ids: a data dir mixed from two prepares (a manifest of 400 pieces beside a model of 304) is
    refused naming the file and both sizes, in every data.verify mode but none (full's sha256 of the models
    compares them only with the hash the same manifest recorded)."""
    import sentencepiece as spm

    for side in SIDES:
        path = os.path.join(data_dir, os.path.basename(str(manifest["vocab"].get(f"{side}_model") or SPM_MODELS[side])))
        if not os.path.lexists(path):
            raise ValueError(f"{path}: missing (the data manifest lists its vocabulary); prepare the data again")
        proto = files.read_bytes(path, MAX_SPM_BYTES, "a SentencePiece model of data.dir")
        try:
            pieces = spm.SentencePieceProcessor(model_proto=proto).get_piece_size()
        except (RuntimeError, OSError, ValueError):
            raise ValueError(f"{path}: not a SentencePiece model; prepare the data again") from None
        want = manifest["vocab"][f"{side}_size"]
        if pieces != want:
            raise ValueError(f"{path}: {pieces} pieces where the data manifest says {want} ({side}_size): the "
                             f"vocabulary is not the one the data was encoded with (two prepares into one --out?); "
                             f"prepare the data again")


def _check_size(path: str, want: int, says) -> None:
    try:
        with open_data(path) as f:  # a regular file, or refused naming what it is
            have = os.fstat(f.fileno()).st_size
    except FileNotFoundError:
        raise ValueError(f"{path}: missing (the data manifest lists its split); prepare the data again") from None
    if have != want:
        exact = "" if have % 8 == 0 else f" ({have} bytes, not whole numbers)"
        raise ValueError(f"{path}: {says(have)}{exact}: the file changed after prepare wrote it; prepare the data "
                         f"again")


def _verify_checksums(data_dir: str, manifest: dict, whole: bool = False) -> None:
    """Each binarized file against its sha256 in the manifest; `whole`: also the SentencePiece models and the
    manifest's one checksum over the binarized files (the only hash of a manifest from before per-file ones)."""
    per_file = dict(manifest["file_sha256"]) if isinstance(manifest.get("file_sha256"), dict) else {}
    names = [os.path.basename(str(n)) for n in manifest.get("checksum_files") or []]
    if whole:
        vocab = manifest["vocab"]
        per_file.update({os.path.basename(str(vocab.get(f"{side}_model") or SPM_MODELS[side])): want for side in SIDES
                         if isinstance(want := vocab.get(f"{side}_model_sha256"), str)})
    for name, want in sorted(per_file.items()):
        path = os.path.join(data_dir, os.path.basename(str(name)))
        if not os.path.lexists(path):
            raise ValueError(f"{path}: missing (the data manifest lists it)")
        if file_sha256(path) != want:
            raise ValueError(f"{path}: sha256 differs from the data manifest's: the file changed after prepare "
                             f"wrote it; prepare the data again")
    if names and (whole or not manifest.get("file_sha256")):
        missing = [p for p in (os.path.join(data_dir, n) for n in names) if not os.path.lexists(p)]
        if missing:
            raise ValueError(f"{missing[0]}: missing (the data manifest lists it)")
        if files_checksum(data_dir, names) != manifest.get("checksum"):
            older = "" if manifest.get("file_sha256") else " (this older manifest has no per-file sha256 to name the file)"
            raise ValueError(f"{data_dir}: the binarized files ({', '.join(names)}) do not match the manifest's "
                             f"checksum{older}; prepare the data again")


__all__ = ["Batch", "BatchStream", "ParallelData", "Prefetcher", "RunData", "collate", "check_ids", "has_split",
           "load_run_data", "make_batches", "padded_width", "read_manifest", "TokenArray", "verify"]
