"""Dropout whose mask is a function of (seed, step, micro-batch, layer site, sentence row, position,
feature), not of a generator's state.

Every rank builds the same global micro-batch, so a row and a position name the same token in every
layout. A site's mask is drawn in blocks of BLOCK_ROWS rows of the global micro-batch, each block from a
generator seeded by (run seed, step, micro-batch, site, block), and a layer slices out the rows and positions
it computes: every layout gets the same masks as the single process, a run is the same run in any layout (up to
floating-point summation order), and a resumed run continues bitwise in any layout. A rank draws only the
blocks of the rows it computes: a data-parallel replica or a head shard draws its share, not the whole
micro-batch's (on an accelerator the whole micro-batch is drawn at once, one launch per site).

The keys travel with the call: a module's forward takes `masks`, the `DropoutSlice` of the global micro-batch
its input is (the interpreter makes one per forward); without one (ad-hoc use, the whole model on one process,
tests of single modules) it is ordinary dropout. Nothing is set from outside.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

_MIX = 0x9E3779B97F4A7C15  # odd 64-bit constant for mixing the key parts


def _key(*parts: int) -> int:
    h = 0
    for p in parts:
        h = ((h ^ (int(p) & 0xFFFFFFFFFFFFFFFF)) * _MIX + 0x632BE59BD9B4E019) & 0xFFFFFFFFFFFFFFFF
        h ^= h >> 29
    return h & 0x7FFFFFFFFFFFFFFF


BLOCK_ROWS = 8  # rows of the global micro-batch per draw on the CPU (part of the masks' definition)


def keep_mask(shape: tuple, keep: float, seed: int, device=None) -> torch.Tensor:
    """A bool tensor, True with probability `keep` (to 1/65536), from a generator seeded by `seed`:
    the four 16-bit lanes of uniform 64-bit random integers, the same for any thread count.

    On an accelerator the mask is drawn there, from that device's generator seeded the same way (the
    same mask for the same seed on every rank, so layouts still agree with each other; not the bits of
    the host draw): drawing on the host and copying costs more than the rest of a GPU step (the planner's
    H200 profile: ~48 of 55 ms, docs/BENCHMARKS.md 11)."""
    device = torch.device(device or "cpu")
    if device.type != "cpu":
        g = torch.Generator(device=device).manual_seed(seed)
        return torch.rand(shape, generator=g, device=device) < keep
    return keep_blocks(shape, keep, [seed] if shape[0] else [], max(1, shape[0]))


def keep_blocks(shape: tuple, keep: float, seeds: list, block_rows: int) -> torch.Tensor:
    """keep_mask on the host of `shape` cut along its first dimension into blocks of `block_rows` (the last may be
    shorter; one per seed), block k drawn as keep_mask(its shape, keep, seeds[k]): one draw into one buffer per
    block, one comparison for them all."""
    n = 1
    for d in shape[1:]:
        n *= d
    if len(seeds) != -(-shape[0] // block_rows):
        raise ValueError(f"{len(seeds)} seeds for {shape[0]} rows in blocks of {block_rows}")
    sizes = [min(block_rows, shape[0] - k * block_rows) * n for k in range(len(seeds))]
    words = [-(-e // 4) for e in sizes]
    buf = torch.empty(sum(words), dtype=torch.int64)
    g, at = torch.Generator(), 0
    for seed, w in zip(seeds, words):
        torch.randint(-2 ** 63, 2 ** 63 - 1, (w,), generator=g.manual_seed(seed), out=buf[at:at + w])
        at += w
    bits = buf.view(torch.int16) < (round(keep * 65536) - 32768)
    if all(e % 4 == 0 for e in sizes):  # the blocks' lanes lie end to end
        return bits.view(shape)
    starts = [4 * sum(words[:k]) for k in range(len(seeds))]
    return torch.cat([bits[a:a + e] for a, e in zip(starts, sizes)]).view(shape)


class DropoutKeys:
    """The masks of the global micro-batch `key` (seed, step, micro-batch), each drawn on first use and kept for the
    micro-batch. `widths`: global padded length per side ('src', 'tgt'); `rows`: the global micro-batch's row
    count. `at(row0, t0, rows)`: the slice a forward computes."""

    def __init__(self, key: tuple, rows: int, widths: dict, device=None):
        self.key, self.rows, self.widths = key, rows, widths
        self.device = torch.device(device or "cpu")
        self._masks: dict = {}  # (site, dtype) -> [(first row, mask of rows first.. (whole width))]

    def at(self, row0: int, t0: int, rows: int | None = None) -> "DropoutSlice":
        """The slice whose [0, 0] is global row `row0`, position `t0`; `rows`: how many rows it spans (None: to the
        micro-batch's end), which bounds what a gathered-token mask draws."""
        return DropoutSlice(self, row0, t0, rows)

    def rows_mask(self, site: int, side: str, p: float, feat: int, dtype, r0: int, r1: int) -> tuple:
        """(mask, first): site's mask, already scaled (0 or 1 / (1 - p) in `dtype`), over whole blocks of rows
        covering global rows [r0, r1) at the side's whole width; its row 0 is global row `first`."""
        held = self._masks.setdefault((site, dtype), [])
        for first, mask in held:
            if first <= r0 and r1 <= first + mask.shape[0]:
                return mask, first
        width, keep = self.widths[side], 1.0 - p
        if self.device.type != "cpu":  # one draw for the micro-batch
            first, last = 0, self.rows
            mask = keep_mask((self.rows, width, feat), keep, _key(*self.key, site), self.device).to(dtype)
        else:
            first, last = r0 // BLOCK_ROWS * BLOCK_ROWS, min(self.rows, -(-r1 // BLOCK_ROWS) * BLOCK_ROWS)
            seeds = [_key(*self.key, site, b) for b in range(first // BLOCK_ROWS, -(-last // BLOCK_ROWS))]
            # through uint8: bool -> float is 4x slower in this torch
            mask = keep_blocks((last - first, width, feat), keep, seeds, BLOCK_ROWS).view(torch.uint8).to(dtype)
        mask.mul_(1.0 / keep)
        held.append((first, mask))
        return mask, first


class DropoutSlice:
    """Where a forward's tensors sit in the global micro-batch of `keys`: their [0, 0] is row `row0`, position
    `t0`; `rows` rows (None: to the micro-batch's end)."""

    __slots__ = ("keys", "row0", "t0", "rows")

    def __init__(self, keys: DropoutKeys, row0: int, t0: int, rows: int | None = None):
        self.keys, self.row0, self.t0, self.rows = keys, row0, t0, rows

    def mask(self, site: int, side: str, p: float, n: int, width: int, feat: int, dtype,
             positions: torch.Tensor | None = None) -> torch.Tensor:
        """This slice's mask, already scaled; (n, width, feat), or (tokens, feat) for the flat `positions`
        (row * width + t) of an (n, width) slice."""
        if positions is None:
            mask, first = self.keys.rows_mask(site, side, p, feat, dtype, self.row0, self.row0 + n)
            r = self.row0 - first
            return mask[r:r + n, self.t0:self.t0 + width]
        end = self.keys.rows if self.rows is None else self.row0 + self.rows
        mask, first = self.keys.rows_mask(site, side, p, feat, dtype, self.row0, end)
        # the same tokens' rows of the drawn rows' mask, gathered on the device
        rows = torch.div(positions, width, rounding_mode="floor")
        at = (rows + (self.row0 - first)) * mask.shape[1] + (positions - rows * width + self.t0)
        return mask.view(-1, feat).index_select(0, at)


class KeyedDropout(nn.Module):
    """Dropout at `site` (a number unique in the model, the same in every layout) on tensors of `side`
    ('src' or 'tgt'): x is (rows, positions, features), or (tokens, features) with `positions` the
    flat indices (row * width + t) of the tokens in their (rows, width) layout."""

    def __init__(self, p: float, site: int, side: str):
        super().__init__()
        self.p, self.site, self.side = p, site, side

    def forward(self, x: torch.Tensor, masks: DropoutSlice | None = None, positions: torch.Tensor | None = None,
                width: int = 0) -> torch.Tensor:
        """`masks`: where `x` sits in the global micro-batch (None: ordinary dropout)."""
        if not self.training or self.p == 0:
            return x
        if masks is None:
            return F.dropout(x, self.p, True)
        n, w = (0, width) if positions is not None else x.shape[:2]
        return x * masks.mask(self.site, self.side, self.p, n, w, x.shape[-1], x.dtype, positions)

    def keyed_mask(self, masks: DropoutSlice | None, feat: int, dtype, positions: torch.Tensor,
                   width: int) -> torch.Tensor | None:
        """The scaled mask `forward(x, masks, positions, width)` would multiply a (tokens, feat) x by, drawn now (so
        that a compiled caller gets it as a tensor: a generator cannot be made inside a compiled region); None when
        there is no keyed mask (evaluation, p = 0, or ordinary dropout without `masks`)."""
        if not self.training or self.p == 0 or masks is None:
            return None
        return masks.mask(self.site, self.side, self.p, 0, width, feat, dtype, positions)

    def extra_repr(self) -> str:
        return f"p={self.p}, site={self.site}, side={self.side}"


class GivenMasks:
    """Masks drawn before a call, handed to it as tensors: a `DropoutSlice` for code that cannot draw them (a CUDA
    graph cannot make a generator, and a replay must not draw new ones). `masks[site]` is what
    `DropoutSlice.mask(site, ...)` gave for the call's tensors, so the call drops what eager would: the same
    keys, the same stream."""

    __slots__ = ("masks",)

    def __init__(self, masks: dict):
        self.masks = masks

    @staticmethod
    def draw(masks: DropoutSlice, dropouts: list, n: int, width: int, feat: int, dtype) -> dict:
        """{site: scaled mask (n, width, feat)} of each active KeyedDropout in `dropouts`, from the slice `masks`."""
        return {d.site: masks.mask(d.site, d.side, d.p, n, width, feat, dtype) for d in dropouts
                if d.training and d.p > 0}

    def mask(self, site: int, side: str, p: float, n: int, width: int, feat: int, dtype,
             positions: torch.Tensor | None = None) -> torch.Tensor:
        if positions is not None:
            raise ValueError("GivenMasks holds (rows, positions, features) masks, not gathered tokens")
        given = self.masks[site]
        if tuple(given.shape) != (n, width, feat) or given.dtype != dtype:
            raise ValueError(f"dropout site {site}: given a {tuple(given.shape)} {given.dtype} mask, the call needs "
                             f"({n}, {width}, {feat}) {dtype}")
        return given
