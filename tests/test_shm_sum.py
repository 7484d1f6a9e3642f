"""Shared-memory gradient sums among the ranks of one host (trainer/parallel/shm_sum.py): the same bits as gloo's
sum, in pieces when larger than a slot, in either region; nothing left in /dev/shm; gloo where ranks are on
different hosts."""
from __future__ import annotations

import pytest

from tests.parallel_jobs import shared_memory_collectives
from trainer.parallel.layout import LayoutError, LayoutSpec
from trainer.parallel.shm_sum import _pieces


@pytest.mark.parametrize("world", [2, 3])
def test_shared_memory_sums_equal_gloos_and_leave_nothing_in_dev_shm(workers, world):
    out = workers.run(world, shared_memory_collectives, 1024)  # 1 KB slots: every tensor but the last in pieces
    for rank in out:
        # two ranks: the same bits (a + b == b + a); three: rank order, gloo's ring adds in another order
        assert rank["sum_equals_gloo"] if world == 2 else rank["sum_close_to_gloo"]
        assert rank["left_in_shm"] == []  # unlinked once every rank had it mapped
        assert rank["other_host"]  # ranks on two hosts: gloo
        assert rank["runtime_uses_it"]


def test_pieces_cover_every_element_once_in_order():
    import torch

    flat = [torch.arange(5), torch.arange(3), torch.arange(9)]
    pieces = list(_pieces(flat, 4))
    assert all(sum(b - a for _, a, b in p) <= 4 for p in pieces)
    seen = [(id(t), i) for p in pieces for t, a, b in p for i in range(a, b)]
    assert seen == [(id(t), i) for t in flat for i in range(t.numel())]


def test_the_layout_key_is_a_boolean():
    spec = LayoutSpec.from_ds_config({"parallel_layout": {"mode": "data", "shared_memory_sums": False}}, 2)
    assert spec.shared_memory_sums is False
    assert LayoutSpec.from_ds_config({"parallel_layout": {"mode": "data"}}, 2).shared_memory_sums is True
    with pytest.raises(LayoutError, match="shared_memory_sums"):
        LayoutSpec.from_ds_config({"parallel_layout": {"mode": "data", "shared_memory_sums": "yes"}}, 2)
