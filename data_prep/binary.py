"""The binarized dataset format shared by `data_prep.prepare` (writer) and the trainer (reader).

A split side (e.g. train source) is two raw little-endian files in DATA_DIR:

    {split}.{side}.bin   int32 token ids of every sentence, concatenated (no BOS/EOS)
    {split}.{side}.idx   int64 offsets, one more than the number of sentences;
                         sentence i is bin[idx[i]:idx[i+1]]

Both are written append-only (constant memory for any corpus size) and read back with
`np.memmap`, so loading never touches the text again. Token ids follow the SentencePiece
convention fixed in `SPECIAL_IDS`.
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from typing import BinaryIO, Iterable, Sequence

import numpy as np

from .userfiles import open_regular

TOKEN_DTYPE = np.dtype("<i4")
OFFSET_DTYPE = np.dtype("<i8")
SPECIAL_IDS = {"pad": 0, "unk": 1, "bos": 2, "eos": 3}
PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3
SIDES = ("src", "tgt")


def side_paths(data_dir: str, split: str, side: str) -> tuple[str, str]:
    base = os.path.join(data_dir, f"{split}.{side}")
    return base + ".bin", base + ".idx"


class TokenArrayWriter:
    """Appends sentences (sequences of token ids) to a split side; call `close()` at the end."""

    def __init__(self, data_dir: str, split: str, side: str):
        self.bin_path, self.idx_path = side_paths(data_dir, split, side)
        self._bin = open(self.bin_path + ".tmp", "wb")
        self._idx = open(self.idx_path + ".tmp", "wb")
        self._offset = 0
        self._idx.write(np.array([0], dtype=OFFSET_DTYPE).tobytes())
        self.count = 0

    def append(self, ids: Sequence[int]) -> None:
        arr = np.asarray(ids, dtype=TOKEN_DTYPE)
        self._bin.write(arr.tobytes())
        self._offset += len(arr)
        self._idx.write(np.array([self._offset], dtype=OFFSET_DTYPE).tobytes())
        self.count += 1

    def extend(self, many: Iterable[Sequence[int]]) -> None:
        for ids in many:
            self.append(ids)

    def append_many(self, tokens: np.ndarray, lengths: np.ndarray) -> None:
        """Append `len(lengths)` sentences at once: `tokens` holds their ids concatenated (same bytes as
        appending them one by one)."""
        self._bin.write(np.asarray(tokens, dtype=TOKEN_DTYPE).tobytes())
        ends = self._offset + np.cumsum(lengths, dtype=OFFSET_DTYPE)
        self._idx.write(ends.astype(OFFSET_DTYPE).tobytes())
        self._offset = int(ends[-1]) if len(ends) else self._offset
        self.count += len(lengths)

    def close(self) -> None:
        """Flush and move the files into place: a crash never leaves a half-written split visible."""
        for f, final in ((self._bin, self.bin_path), (self._idx, self.idx_path)):
            f.flush()
            os.fsync(f.fileno())
            f.close()
            os.replace(final + ".tmp", final)


@dataclass
class TokenArray:
    """Read-only view of one split side: `len(a)`, `a[i]` -> int32 array, `a.lengths`."""

    tokens: np.ndarray
    offsets: np.ndarray

    @classmethod
    def load(cls, data_dir: str, split: str, side: str) -> "TokenArray":
        bin_path, idx_path = side_paths(data_dir, split, side)
        for p in (bin_path, idx_path):
            if not os.path.exists(p):
                raise FileNotFoundError(f"{p}: missing binarized data (run `python -m data_prep.prepare`)")
        with open_data(idx_path) as f:
            offsets = np.fromfile(f, dtype=OFFSET_DTYPE)
        with open_data(bin_path) as f:
            size = os.fstat(f.fileno()).st_size // TOKEN_DTYPE.itemsize
            if len(offsets) == 0 or offsets[0] != 0 or offsets[-1] != size or np.any(np.diff(offsets) < 0):
                raise ValueError(f"{idx_path}: offsets do not match {bin_path} ({size} tokens); the dataset is corrupt")
            tokens = np.memmap(f, dtype=TOKEN_DTYPE, mode="r") if size else np.zeros(0, TOKEN_DTYPE)
        return cls(tokens=tokens, offsets=offsets)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int) -> np.ndarray:
        return np.asarray(self.tokens[self.offsets[i]:self.offsets[i + 1]])

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)


def load_pair(data_dir: str, split: str) -> tuple[TokenArray, TokenArray]:
    """Both sides of a split; raises if their sentence counts differ."""
    src, tgt = (TokenArray.load(data_dir, split, side) for side in SIDES)
    if len(src) != len(tgt):
        raise ValueError(f"{data_dir}: {split}.src has {len(src)} sentences but {split}.tgt has {len(tgt)}")
    return src, tgt


def open_data(path: str) -> BinaryIO:
    """A file of DATA_DIR opened for reading: the one place data files are opened. A regular file only (links
    followed): a FIFO would block the reader forever and a device (/dev/zero) never end."""
    return open_regular(path, "a data file")


def file_sha256(path: str) -> str:
    h = hashlib.sha256()
    with open_data(path) as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def files_checksum(data_dir: str, names: list[str]) -> str:
    """The manifest's `checksum`: sha256 over the binarized files' names and bytes, in name order."""
    h = hashlib.sha256()
    for name in sorted(names):
        h.update(name.encode() + b"\0")
        with open_data(os.path.join(data_dir, name)) as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


def first_out_of_range(tokens: np.ndarray, size: int, chunk: int = 1 << 24) -> int | None:
    """Index of the first token id outside 0..size-1, or None; a chunk at a time (one pass of min/max, so a
    large memory-mapped file is read once and never copied whole)."""
    for start in range(0, len(tokens), chunk):
        part = np.asarray(tokens[start:start + chunk])
        if part.size and (int(part.min()) < 0 or int(part.max()) >= size):
            return start + int(np.flatnonzero((part < 0) | (part >= size))[0])
    return None


def has_split(data_dir: str, split: str) -> bool:
    return all(os.path.exists(p) for side in SIDES for p in side_paths(data_dir, split, side))
