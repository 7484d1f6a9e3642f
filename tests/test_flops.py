"""Model FLOPs: the count matches the multiply-adds of the model's own matmuls on a batch."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
from torch.utils.flop_counter import FlopCounterMode

from trainer.config import ModelConfig
from trainer.data import collate
from trainer.model.flops import batch_flops, forward_flops
from trainer.model.seq2seq import build_model


def test_forward_flops_match_torch_flop_counter_for_a_single_sentence():
    """One sentence (no padding): torch's FlopCounterMode over the model's forward counts the same
    matmuls (the LSTM is counted by hand there, it has no FLOP formula in torch)."""
    cfg = ModelConfig(emb_dim=8, hidden=12, layers=2, attention="general", dropout=0.0)
    model = build_model(cfg, 30, 40).eval()
    batch = collate([np.array([5, 6, 7, 8])], [np.array([9, 10, 11])])
    with FlopCounterMode(display=False) as counter:
        enc, states = model.encode(batch.src, batch.src_lengths)
        dec, _ = model.decode(batch.tgt_in, states)
        model.head.logits(enc, batch.src_mask, dec)
    s, t = batch.src_tokens, int((batch.tgt_out != 0).sum())
    lstm = sum(8 * cfg.hidden * ((cfg.emb_dim if k == 0 else cfg.hidden) + cfg.hidden) for k in range(cfg.layers))
    counted = counter.get_total_flops() + lstm * (s + t)  # torch counts no LSTM FLOPs
    assert forward_flops(cfg, 40, s, t, s * t) == counted


def test_step_is_three_forwards_and_counts_real_tokens_only():
    cfg = ModelConfig(emb_dim=8, hidden=12, layers=2)
    short = collate([np.array([5, 6])], [np.array([9])])
    padded = collate([np.array([5, 6]), np.array([5, 6, 7, 8, 9])], [np.array([9]), np.array([9, 10, 11])])
    one = batch_flops(cfg, 40, short)
    assert one == 3 * forward_flops(cfg, 40, 3, 2, 6)
    assert batch_flops(cfg, 40, padded) == one + 3 * forward_flops(cfg, 40, 6, 4, 24)
    assert batch_flops(replace(cfg, attention="dot"), 40, short) < one
