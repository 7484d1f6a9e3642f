"""trainer.model.dropout: keyed masks are a function of the key and the row, drawn in row blocks, so that a slice
gets the whole micro-batch's rows and a rank draws only the rows it computes."""
from __future__ import annotations

import pytest
import torch

from trainer.model import dropout
from trainer.model.dropout import BLOCK_ROWS, DropoutKeys, keep_blocks, keep_mask

ROWS, WIDTHS, FEAT, P = 30, {"src": 5, "tgt": 7}, 6, 0.3


def whole(site: int = 4, rows: int = ROWS) -> torch.Tensor:
    """The site's mask over the whole micro-batch, as the single process draws it."""
    return DropoutKeys((1, 2, 0), rows, WIDTHS).at(0, 0).mask(site, "tgt", P, rows, 7, FEAT, torch.float32)


@pytest.fixture
def drawn(monkeypatch) -> list:
    """Every host draw's element count."""
    seen, real = [], dropout.keep_blocks

    def counting(shape, *args, **kw):
        seen.append(torch.Size(shape).numel())
        return real(shape, *args, **kw)

    monkeypatch.setattr(dropout, "keep_blocks", counting)
    return seen


@pytest.mark.parametrize("rows,row0,n,t0,width", [(ROWS, 0, ROWS, 0, 7), (ROWS, 16, 8, 0, 7), (ROWS, 3, 7, 2, 4),
                                                  (ROWS, 13, 17, 1, 6), (ROWS, 29, 1, 6, 1), (14, 7, 7, 0, 7),
                                                  (14, 8, 6, 0, 7), (14, 0, 7, 0, 7), (11, 10, 1, 3, 2)])
def test_a_slice_is_the_whole_micro_batchs_mask_there_and_draws_only_the_blocks_it_covers(drawn, rows, row0, n, t0,
                                                                                         width):
    """Also where the micro-batch's rows are no multiple of a block's (14 = 8 + 6: a replica's 7 rows of it, a
    second replica's block of 6)."""
    ref = whole(rows=rows)
    drawn.clear()
    got = DropoutKeys((1, 2, 0), rows, WIDTHS).at(row0, t0).mask(4, "tgt", P, n, width, FEAT, torch.float32)
    assert torch.equal(got, ref[row0:row0 + n, t0:t0 + width])
    first, last = row0 // BLOCK_ROWS * BLOCK_ROWS, min(rows, -(-(row0 + n) // BLOCK_ROWS) * BLOCK_ROWS)
    assert sum(drawn) == (last - first) * WIDTHS["tgt"] * FEAT  # the blocks covering the slice, no more


def test_blocks_sites_and_steps_draw_different_masks_with_the_asked_rate():
    m = whole()
    blocks = [m[a:a + BLOCK_ROWS] for a in range(0, 3 * BLOCK_ROWS, BLOCK_ROWS)]
    assert not torch.equal(blocks[0], blocks[1]) and not torch.equal(blocks[1], blocks[2])
    assert not torch.equal(m, whole(site=5))
    assert m.unique().tolist() == [0.0, pytest.approx(1 / (1 - P))]
    bits = keep_mask((1 << 20,), 0.8, 99)
    for lane in range(4):  # every 16-bit lane of a 64-bit draw is uniform
        assert abs(bits[lane::4].float().mean().item() - 0.8) < 0.005


def test_a_gathered_token_mask_of_a_shard_draws_its_rows_only(drawn):
    """The head's mask on a shard's tokens (flat positions of its (rows, width) layout), as a head shard takes it."""
    ref = whole()
    row0, n, t0, width = 10, 9, 1, 5
    positions = torch.tensor([0, 3, 4, 7, 12, 20, 44])  # row * width + t within the shard
    drawn.clear()
    got = DropoutKeys((1, 2, 0), ROWS, WIDTHS).at(row0, t0, n).mask(4, "tgt", P, 0, width, FEAT, torch.float32,
                                                                  positions)
    rows, cols = positions // width, positions % width
    assert torch.equal(got, ref[row0 + rows, t0 + cols])
    assert sum(drawn) == 2 * BLOCK_ROWS * WIDTHS["tgt"] * FEAT  # rows 8-23, not the micro-batch


def test_blocks_drawn_together_are_the_blocks_drawn_alone():
    """keep_blocks's one buffer and one comparison give each block its own keep_mask, also where a block's
    elements are not a whole number of 64-bit draws (3 x 5 x 7 per row)."""
    for shape in ((19, 4, 8), (19, 5, 7), (15, 3, 4)):
        seeds = [11, 12, 13]
        together = keep_blocks(shape, 0.7, seeds, 7)
        alone = [keep_mask((min(7, shape[0] - 7 * k), *shape[1:]), 0.7, s) for k, s in enumerate(seeds)]
        assert torch.equal(together, torch.cat(alone))
    with pytest.raises(ValueError, match="2 seeds for 15 rows in blocks of 7"):
        keep_blocks((15, 3, 4), 0.7, [1, 2], 7)


def test_the_mask_does_not_depend_on_the_thread_count():
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = keep_mask((9, 11, 13), 0.7, 5)
        torch.set_num_threads(2)
        assert torch.equal(one, keep_mask((9, 11, 13), 0.7, 5))
    finally:
        torch.set_num_threads(before)
