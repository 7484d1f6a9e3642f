"""What train.cuda_graphs captures (trainer.model.graphs): the decoder LSTM stack of a stage and the attention-softmax
head's token loss, forward and backward, as flat functions of tensors (their dropout masks drawn before, as
inputs: trainer.model.dropout.GivenMasks). Each returns None where the call must stay eager, and the caller runs
the eager code it would have run anyway.

Not captured: the encoder (packed by the host lengths of each batch, so its shapes change with every batch's
lengths, not only its width), the embeddings, communication, the optimizer, evaluation, and stages whose weight
gradients are deferred (their backward queues work for later: trainer.model.weight_grads).
"""
from __future__ import annotations

import torch

from trainer.model.dropout import DropoutSlice, GivenMasks
from trainer.model.graphs import GraphCache
from trainer.model.lstm_stack import decode_stack


def decode(cache: GraphCache, pairs: list, y: torch.Tensor, states: list, masks: DropoutSlice | None):
    """`decode_stack(pairs, y, states, masks)` replayed from the cache: (top outputs, each layer's (h, c)), or None
    where it stays eager (an empty time chunk, dropout without keyed masks, a layer without a state)."""
    hidden = pairs[-1].decoder.hidden_size
    drops = [p.dec_dropout for p in pairs]
    if y.shape[1] == 0 or any(s is None for s in states) or (masks is None and any(d.training and d.p for d in drops)):
        return None
    given = GivenMasks.draw(masks, drops, y.shape[0], y.shape[1], hidden, y.dtype) if masks is not None else {}
    sites = sorted(given)
    flat_states = [t for st in states for t in st]
    layers = len(pairs)

    def run(y, *rest):
        hs = rest[:2 * layers]
        out, out_states = decode_stack(pairs, y, [(hs[2 * k], hs[2 * k + 1]) for k in range(layers)],
                                       GivenMasks(dict(zip(sites, rest[2 * layers:]))))
        return (out, *[t for st in out_states for t in st])

    inputs = (y, *flat_states, *[given[s] for s in sites])
    differentiable = (y.requires_grad, *[t.requires_grad for t in flat_states], *[False] * len(sites))
    params = [p for pair in pairs for p in pair.decoder.parameters() if p.requires_grad]
    bucket = ("dec", pairs[0].index, layers, tuple(p.stack for p in pairs), tuple(sites))
    outs = cache.call("decode", run, inputs, differentiable, params, bucket)
    return outs[0], [(outs[1 + 2 * k], outs[2 + 2 * k]) for k in range(layers)]


def head_loss(cache: GraphCache, head, enc: torch.Tensor, src_mask: torch.Tensor, dec: torch.Tensor,
              target: torch.Tensor, positions: torch.Tensor, masks: DropoutSlice | None):
    """`head(enc, src_mask, dec, target, positions, masks)` (loss_sum, nll_sum) replayed from the cache, or None
    where it stays eager (dropout without keyed masks)."""
    keep = head.dropout.keyed_mask(masks, head.w_c.out_features, head.w_c.weight.dtype, positions, target.shape[1])
    if keep is None and head.dropout.training and head.dropout.p > 0:
        return None

    def run(enc, src_mask, dec, target, positions, *keep):
        return head.token_loss(enc, src_mask, dec, target, positions, keep[0] if keep else None)

    inputs = (enc, src_mask, dec, target, positions, *([keep] if keep is not None else []))
    differentiable = (enc.requires_grad, False, dec.requires_grad, False, False, *([False] if keep is not None else []))
    params = [p for p in head.parameters() if p.requires_grad]
    bucket = ("head", head.loss_chunk_rows, head.loss_projection, keep is not None)
    loss, nll = cache.call("head", run, inputs, differentiable, params, bucket)
    return loss, nll
