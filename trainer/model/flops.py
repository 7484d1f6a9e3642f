"""Model FLOPs of a training step: the multiply-adds the model needs for the real tokens of a batch,
independent of the layout (what a layout adds — padding, the decoder over padded positions, copies,
the optimizer — is not model work).

Counted (2 FLOPs per multiply-add), per forward pass:
    encoder LSTM layer k   8 H (in_k + H) per real source token (input and recurrent GEMMs, 4 gates)
    decoder LSTM layer k   8 H (in_k + H) per real target token
    attention              per real target token: 2 H^2 (general: W_a h) + 4 H S (scores and
                           context over the S source tokens of its sentence); concat: 2 H (2H) + ...
    attentional layer      2 (2H) D per real target token (tanh(W_c [c; h]), D = its output width)
    output projection      2 D V per real target token
Backward is twice the forward (the gradients w.r.t. inputs and weights), so a step is 3x forward.
Elementwise work (gates' nonlinearities, softmax, loss) is left out, as is customary for MFU.
"""
from __future__ import annotations


def forward_flops(cfg, tgt_vocab: int, src_tokens: int, tgt_tokens: int, attn_pairs: int) -> float:
    """cfg: the model config; attn_pairs: sum over sentences of (target tokens x source tokens)."""
    h, e = cfg.hidden, cfg.emb_dim
    out_dim = e if cfg.tie_embeddings else h
    dec = sum(8 * h * ((e if k == 0 else h) + h) for k in range(cfg.layers))
    enc = dec
    if cfg.bidirectional_bottom:  # two directions of hidden/2 in the bottom encoder layer
        enc += 2 * 8 * (h // 2) * (e + h // 2) - 8 * h * (e + h)
    if cfg.attention == "general":  # W_a h_t, then scores and context over the source: 2H each per pair
        attn = 2 * h * h * tgt_tokens + 4 * h * attn_pairs
    elif cfg.attention == "concat":  # W [h_t; h_s] once per token of each side, v and context per pair
        attn = 2 * h * h * (tgt_tokens + src_tokens) + 4 * h * attn_pairs
    else:
        attn = 4 * h * attn_pairs
    head = (2 * 2 * h * out_dim + 2 * out_dim * tgt_vocab) * tgt_tokens
    return float(enc * src_tokens + dec * tgt_tokens + attn + head)


def batch_flops(cfg, tgt_vocab: int, batch) -> float:
    """Forward + backward model FLOPs of a `trainer.data.Batch` (from its host lengths)."""
    return 3 * forward_flops(cfg, tgt_vocab, batch.src_tokens, batch.tgt_tokens, batch.attn_pairs)
