"""trainer.model.seq2seq: padding never leaks, the loss and attention match a hand computation, time chunks
and packing give the same states as one whole call, and per-layer seeding is stable."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from data_prep.binary import BOS_ID, EOS_ID, PAD_ID
from trainer.config import ModelConfig
from trainer.data import collate
from trainer.model.seq2seq import (AttentionSoftmaxHead, EncoderDecoderLayer, build_model, projected_cross_entropy,
                           token_positions)

torch.set_num_threads(1)

SRC_VOCAB, TGT_VOCAB = 13, 11
BASE = ModelConfig(emb_dim=6, hidden=8, layers=2, bidirectional_bottom=False, attention="general",
                   dropout=0.0, label_smoothing=0.1, tie_embeddings=False)
ATOL = 1e-6


def pad_batch(pairs: list[tuple[list[int], list[int]]], extra_src: int = 0, extra_tgt: int = 0):
    """(src ids, tgt ids) without EOS/BOS -> src, src_lengths, tgt_in, tgt_out, as trainer.data.collate
    lays them out (but in the given row order), with `extra_*` all-PAD columns appended."""
    n = len(pairs)
    s = max(len(x) for x, _ in pairs) + 1 + extra_src
    t = max(len(y) for _, y in pairs) + 1 + extra_tgt
    src = torch.full((n, s), PAD_ID, dtype=torch.long)
    tgt_in = torch.full((n, t), PAD_ID, dtype=torch.long)
    tgt_out = torch.full((n, t), PAD_ID, dtype=torch.long)
    lengths = torch.zeros(n, dtype=torch.long)
    for row, (x, y) in enumerate(pairs):
        src[row, :len(x) + 1] = torch.tensor(x + [EOS_ID])
        lengths[row] = len(x) + 1
        tgt_in[row, :len(y) + 1] = torch.tensor([BOS_ID] + y)
        tgt_out[row, :len(y) + 1] = torch.tensor(y + [EOS_ID])
    return src, lengths, tgt_in, tgt_out


def random_ids(gen: torch.Generator, n: int, vocab: int) -> list[int]:
    return torch.randint(4, vocab, (n,), generator=gen).tolist()


def logits_of(model, src, lengths, tgt_in):
    enc, inits = model.encode(src, lengths)
    dec, _ = model.decode(tgt_in, inits)
    return model.head.logits(enc, src != PAD_ID, dec)


@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("attention", ["dot", "general", "concat"])
def test_padding_never_changes_a_real_position(attention, bidirectional):
    cfg = replace(BASE, attention=attention, bidirectional_bottom=bidirectional)
    model = build_model(cfg, SRC_VOCAB, TGT_VOCAB, seed=3).eval()
    gen = torch.Generator().manual_seed(0)
    pair = (random_ids(gen, 3, SRC_VOCAB), random_ids(gen, 2, TGT_VOCAB))
    longer = [(random_ids(gen, 7, SRC_VOCAB), random_ids(gen, 6, TGT_VOCAB)),
              (random_ids(gen, 5, SRC_VOCAB), random_ids(gen, 4, TGT_VOCAB))]

    alone = pad_batch([pair])
    batch = pad_batch([longer[0], pair, longer[1]])
    assert batch[0].shape[1] > alone[0].shape[1] and batch[2].shape[1] > alone[2].shape[1]

    with torch.no_grad():
        ref = logits_of(model, alone[0], alone[1], alone[2])[0]
        got = logits_of(model, batch[0], batch[1], batch[2])[1, :ref.shape[0]]
        torch.testing.assert_close(got, ref, atol=ATOL, rtol=0)

        # the batch loss with the neighbours' targets blanked out is the pair's own loss
        ref_loss, ref_nll = model(*alone)
        tgt_out = batch[3].clone()
        tgt_out[[0, 2]] = PAD_ID
        loss, nll = model(batch[0], batch[1], batch[2], tgt_out)
    torch.testing.assert_close(loss, ref_loss, atol=ATOL, rtol=0)
    torch.testing.assert_close(nll, ref_nll, atol=ATOL, rtol=0)
    assert abs(ref_loss - ref_nll) > 1e-3  # smoothing on, so the two must differ


def test_head_loss_and_general_attention_match_hand_computation():
    torch.manual_seed(0)
    hidden, vocab, eps = 4, 7, 0.2
    head = AttentionSoftmaxHead(hidden=hidden, tgt_vocab=vocab, attention="general", dropout=0.0,
                                label_smoothing=eps).eval()
    with torch.no_grad():
        head.proj.weight.mul_(30.0)  # peaked logits, so smoothing moves the loss well past the tolerance
    enc = torch.randn(2, 3, hidden)
    dec = torch.randn(2, 4, hidden)
    src_mask = torch.tensor([[True, True, True], [True, True, False]])
    target = torch.tensor([[4, 5, 6, EOS_ID], [5, EOS_ID, PAD_ID, PAD_ID]])

    # Luong general: score(h_t, h_s) = h_t^T W h_s with W = w_a.weight^T, padded sources excluded
    w_a, w_c = head.w_a.weight, head.w_c.weight
    logits = torch.zeros(2, 4, vocab)
    for b in range(2):
        real = enc[b][src_mask[b]]
        for t in range(4):
            h = dec[b, t]
            scores = torch.stack([h @ w_a.t() @ hs for hs in real])
            alpha = torch.exp(scores - scores.max())
            alpha = alpha / alpha.sum()
            context = (alpha.unsqueeze(1) * real).sum(0)
            attn = torch.tanh(w_c @ torch.cat([context, h]))
            logits[b, t] = head.proj.weight @ attn + head.proj.bias
    with torch.no_grad():
        torch.testing.assert_close(head.logits(enc, src_mask, dec), logits, atol=1e-5, rtol=0)
        # a padded source position really is ignored: changing it changes nothing
        enc2 = enc.clone()
        enc2[1, 2] = 100.0
        torch.testing.assert_close(head.logits(enc2, src_mask, dec), logits, atol=1e-5, rtol=0)

        loss_sum, nll_sum = head(enc, src_mask, dec, target)

    logp = torch.log_softmax(logits.detach(), dim=-1)
    want_loss = want_nll = 0.0
    tokens = 0
    for b in range(2):
        for t in range(4):
            y = int(target[b, t])
            if y == PAD_ID:
                continue
            tokens += 1
            nll = -float(logp[b, t, y])
            smooth = -float(logp[b, t].mean())
            want_nll += nll
            want_loss += (1 - eps) * nll + eps * smooth
    assert tokens == 6
    assert loss_sum.item() == pytest.approx(want_loss, abs=1e-4)
    assert nll_sum.item() == pytest.approx(want_nll, abs=1e-4)
    assert abs(want_loss - want_nll) > 0.1  # smoothing changes the loss by far more than the tolerance


def _kept(keep: torch.Tensor) -> torch.Tensor:
    """token_positions of a target whose real tokens are `keep`, as a mask of keep's shape."""
    target = torch.where(keep, torch.tensor(5), torch.tensor(PAD_ID))
    return torch.zeros(keep.numel(), dtype=torch.bool).index_fill(0, token_positions(target), True).view_as(keep)


def test_head_row_count_is_rounded_with_padded_positions_only():
    gen = torch.Generator().manual_seed(4)
    for n in (1, 7, 8, 9, 17, 100, 333, 1000, 1500):
        keep = torch.zeros(64, 40, dtype=torch.bool)
        keep.view(-1)[torch.randperm(keep.numel(), generator=gen)[:n]] = True
        got = _kept(keep)
        count = int(got.sum())
        assert bool((got | ~keep).all())  # every real token kept
        assert n <= count <= n * 9 / 8  # at most 1/8 more rows
        assert count % (1 << max(0, count.bit_length() - 4)) == 0, (n, count)  # only the top 4 binary digits
    # fewer padded positions than needed: all of them are added, nothing else
    keep = torch.ones(5, 7, dtype=torch.bool)
    keep[0, 5:] = False  # 33 tokens round to 36, but only 2 positions are free
    assert bool(_kept(keep).all())
    # 1000 distinct counts become a few dozen shapes
    shapes = {int(_kept((torch.arange(2000) < n).view(1, -1)).sum()) for n in range(200, 1200)}
    assert len(shapes) <= 8 * 3


def test_host_token_positions_equal_the_device_ones():
    """The batcher's positions (host lengths, no device read) are the ones found from the target."""
    gen = torch.Generator().manual_seed(5)
    for n in (1, 3, 17, 64):
        lengths = torch.randint(0, 30, (n,), generator=gen)
        batch = collate([torch.randint(4, 50, (int(k) + 1,), generator=gen).numpy() for k in lengths],
                        [torch.randint(4, 50, (int(k),), generator=gen).numpy() for k in lengths])
        want = token_positions(batch.tgt_out)
        assert torch.equal(torch.from_numpy(batch.token_positions()), want)
        piece = batch.rows(n // 3, n)  # trimmed rows: positions in the piece's own width
        assert torch.equal(torch.from_numpy(piece.token_positions()), token_positions(piece.tgt_out))


@pytest.mark.parametrize("whole", [False, True], ids=["chunked", "whole"])  # train.loss_projection
@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_projected_cross_entropy_ignores_pad_rows_in_loss_and_gradients(eps, whole):
    gen = torch.Generator().manual_seed(2)
    tokens, dim, vocab = 300, 6, 17  # more than one 128-row chunk
    hidden = torch.randn(tokens, dim, generator=gen, requires_grad=True)
    weight = torch.randn(vocab, dim, generator=gen, requires_grad=True)
    bias = torch.randn(vocab, generator=gen, requires_grad=True)
    target = torch.randint(4, vocab, (tokens,), generator=gen)
    target[torch.randperm(tokens, generator=gen)[:40]] = PAD_ID  # rows added by the rounding
    real = target != PAD_ID

    loss, nll = projected_cross_entropy(hidden, weight, bias, target, eps, 128, whole)
    (loss * 0.5).backward()
    logits = hidden[real] @ weight.t() + bias
    want_nll = torch.nn.functional.cross_entropy(logits, target[real], reduction="sum")
    want = torch.nn.functional.cross_entropy(logits, target[real], reduction="sum", label_smoothing=eps)
    want_grads = torch.autograd.grad(want * 0.5, (hidden, weight, bias))
    torch.testing.assert_close(loss, want, atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(nll, want_nll.detach(), atol=1e-4, rtol=1e-5)
    for got, expected in zip((hidden.grad, weight.grad, bias.grad), want_grads):
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)
    assert torch.all(hidden.grad[~real] == 0)


@pytest.mark.parametrize("whole", [False, True], ids=["chunked", "whole"])
def test_projection_weight_gradients_deferred_equal_the_immediate_ones(whole):
    """parallel_layout.defer_head_weight_grads queues the projection's weight and bias gradients: run later, they
    are the ones the immediate backward gives, in either train.loss_projection."""
    from trainer.model.weight_grads import WeightGradQueue, deferred_weight_grads

    gen = torch.Generator().manual_seed(3)
    hidden = torch.randn(200, 6, generator=gen, requires_grad=True)
    weight = torch.randn(17, 6, generator=gen, requires_grad=True)
    bias = torch.randn(17, generator=gen, requires_grad=True)
    target = torch.randint(4, 17, (200,), generator=gen)
    grads = []
    for queue in (None, WeightGradQueue()):
        with deferred_weight_grads(queue):
            loss, _ = projected_cross_entropy(hidden, weight, bias, target, 0.1, 64, whole)
            (loss * 0.5).backward()
        if queue is not None:
            assert len(queue) == 1 and weight.grad is None
            queue.run()
        grads.append([t.grad for t in (hidden, weight, bias)])
        hidden.grad = weight.grad = bias.grad = None
    for now, later in zip(*grads):
        torch.testing.assert_close(later, now, atol=0, rtol=0)


@pytest.mark.parametrize("bidirectional", [False, True])
def test_encoder_final_state_is_taken_at_each_rows_true_end(bidirectional):
    cfg = replace(BASE, bidirectional_bottom=bidirectional)
    model = build_model(cfg, SRC_VOCAB, TGT_VOCAB, seed=1).eval()
    row = torch.tensor([[5, 6, 7, EOS_ID]])
    padded = torch.cat([row, torch.full((1, 5), PAD_ID)], dim=1)
    lengths = torch.tensor([4])
    with torch.no_grad():
        enc_a, inits_a = model.encode(row, lengths)
        enc_b, inits_b = model.encode(padded, lengths)
        # a state taken at the last (padded) column instead would differ
        _, inits_c = model.encode(padded, torch.tensor([padded.shape[1]]))
    for (ha, ca), (hb, cb) in zip(inits_a, inits_b):
        assert ha.shape == (1, 1, cfg.hidden)
        torch.testing.assert_close(hb, ha, atol=ATOL, rtol=0)
        torch.testing.assert_close(cb, ca, atol=ATOL, rtol=0)
    assert not torch.allclose(inits_c[-1][0], inits_a[-1][0], atol=1e-4)
    torch.testing.assert_close(enc_b[:, :4], enc_a, atol=ATOL, rtol=0)
    assert torch.all(enc_b[:, 4:] == 0)


def test_time_chunks_carry_state_like_one_whole_call():
    model = build_model(replace(BASE, layers=2), SRC_VOCAB, TGT_VOCAB, seed=2).eval()
    gen = torch.Generator().manual_seed(1)
    pairs = [(random_ids(gen, n, SRC_VOCAB), random_ids(gen, m, TGT_VOCAB)) for n, m in [(6, 7), (2, 3), (4, 1)]]
    src, lengths, tgt_in, _ = pad_batch(pairs)  # src widths 7, 3, 5; tgt 8, 4, 2
    cuts = [(0, 3), (3, 5), (5, 7)]
    assert any(int(((lengths - a).clamp(0, b - a) == 0).sum()) for a, b in cuts)  # some row idles in a chunk

    with torch.no_grad():
        for k, pair in enumerate(model.pairs):
            x = model.embeddings.embed_src(src) if k == 0 else torch.randn(3, src.shape[1], BASE.hidden, generator=gen)
            whole_out, whole_state = pair.encode(x, lengths)
            outs, state = [], None
            for a, b in cuts:
                out, state = pair.encode(x[:, a:b], (lengths - a).clamp(0, b - a), state)
                outs.append(out)
            torch.testing.assert_close(torch.cat(outs, 1), whole_out, atol=ATOL, rtol=0)
            for got, want in zip(state, whole_state):
                torch.testing.assert_close(got, want, atol=ATOL, rtol=0)

            y = model.embeddings.embed_tgt(tgt_in) if k == 0 else torch.randn(3, tgt_in.shape[1], BASE.hidden,
                                                                              generator=gen)
            init = pair.decoder_init(whole_state)
            whole_dec, whole_dstate = pair.decode(y, init)
            outs, dstate = [], init
            for a, b in [(0, 3), (3, 6), (6, 8)]:
                out, dstate = pair.decode(y[:, a:b], dstate)
                outs.append(out)
            torch.testing.assert_close(torch.cat(outs, 1), whole_dec, atol=ATOL, rtol=0)
            for got, want in zip(dstate, whole_dstate):
                torch.testing.assert_close(got, want, atol=ATOL, rtol=0)


def test_encoder_chunk_with_all_rows_idle_keeps_state():
    layer = EncoderDecoderLayer(index=0, emb_dim=3, hidden=4, dropout=0.0).eval()
    state = (torch.randn(1, 2, 4), torch.randn(1, 2, 4))
    with torch.no_grad():
        out, new = layer.encode(torch.randn(2, 2, 3), torch.tensor([0, 0]), state)
    assert torch.all(out == 0)
    assert torch.equal(new[0], state[0]) and torch.equal(new[1], state[1])


def test_build_model_seeds_each_global_layer_by_its_index():
    cfg = replace(BASE, emb_dim=8, hidden=8)  # equal widths, so layers 1.. have the same shapes
    two = build_model(replace(cfg, layers=2), SRC_VOCAB, TGT_VOCAB, seed=5)
    three = build_model(replace(cfg, layers=3), SRC_VOCAB, TGT_VOCAB, seed=5)
    again = build_model(replace(cfg, layers=3), SRC_VOCAB, TGT_VOCAB, seed=5)
    other = build_model(replace(cfg, layers=3), SRC_VOCAB, TGT_VOCAB, seed=6)

    sd3, sd_again, sd_other = three.state_dict(), again.state_dict(), other.state_dict()
    assert sd3.keys() == sd_again.keys()
    assert all(torch.equal(sd3[k], sd_again[k]) for k in sd3)
    assert not any(torch.equal(sd3[k], sd_other[k]) for k in sd3 if k.endswith("weight"))

    sd2 = two.state_dict()
    assert set(sd2) < set(sd3) and any(k.startswith("pairs.2.") for k in sd3)
    for k in sd2:
        assert torch.equal(sd2[k], sd3[k]), k  # shared layers (embeddings, pairs 0-1, head) identical
    # each index gets its own seed: pairs 1 and 2 have equal shapes but different weights
    p1, p2 = three.pairs[1].state_dict(), three.pairs[2].state_dict()
    assert all(p1[k].shape == p2[k].shape for k in p1)
    assert not any(torch.equal(p1[k], p2[k]) for k in p1)


def test_tie_embeddings_shares_the_target_embedding_parameter():
    tied = build_model(replace(BASE, tie_embeddings=True), SRC_VOCAB, TGT_VOCAB)
    assert tied.head.proj.weight is tied.embeddings.tgt.weight
    assert tied.head.w_c.weight.shape == (BASE.emb_dim, 2 * BASE.hidden)
    assert sum(p is tied.embeddings.tgt.weight for p in tied.parameters()) == 1  # counted once
    # a gradient through the head lands on the embedding table
    src, lengths, tgt_in, tgt_out = pad_batch([([4, 5], [6, 7, 8])])
    tied.embeddings.tgt.weight.grad = None
    enc, inits = tied.encode(src, lengths)
    dec, _ = tied.decode(tgt_in, inits)
    tied.head(enc.detach(), src != PAD_ID, dec.detach(), tgt_out)[0].backward()
    assert tied.embeddings.tgt.weight.grad is not None
    assert tied.embeddings.tgt.weight.grad.abs().sum() > 0

    untied = build_model(BASE, SRC_VOCAB, TGT_VOCAB)
    assert untied.head.proj.weight is not untied.embeddings.tgt.weight


def test_residual_layers_add_their_input_above_the_bottom_layer_and_are_never_stacked():
    """model.residual: each side of a layer above the bottom one returns its input plus what the same layer
    without it returns (the same weights: no parameter is added); the bottom layer, whose input is the
    embedding, is unchanged. In evaluation (no dropout between layers) a plain model runs its layers as one call
    per side, a residual one a call per layer, and padding still never leaks (zero stays zero)."""
    from trainer.model.lstm_stack import runs_of_layers

    cfg = replace(BASE, emb_dim=8, hidden=8, layers=3)
    plain = build_model(cfg, SRC_VOCAB, TGT_VOCAB, seed=4).eval()
    res = build_model(replace(cfg, residual=True), SRC_VOCAB, TGT_VOCAB, seed=4).eval()
    assert plain.state_dict().keys() == res.state_dict().keys()
    assert [p.residual for p in res.pairs] == [False, True, True] and not any(p.residual for p in plain.pairs)
    gen = torch.Generator().manual_seed(3)
    pairs = [(random_ids(gen, n, SRC_VOCAB), random_ids(gen, m, TGT_VOCAB)) for n, m in [(6, 5), (3, 2)]]
    src, lengths, tgt_in, tgt_out = pad_batch(pairs)
    x = torch.randn(2, src.shape[1], 8, generator=gen) * (src != PAD_ID).unsqueeze(-1)
    y = torch.randn(2, tgt_in.shape[1], 8, generator=gen)
    with torch.no_grad():
        for k, (a, b) in enumerate(zip(plain.pairs, res.pairs)):
            (out_a, st_a), (out_b, st_b) = a.encode(x, lengths), b.encode(x, lengths)
            torch.testing.assert_close(out_b, out_a + x if k else out_a, atol=ATOL, rtol=0)
            assert torch.all(out_b[1, lengths[1]:] == 0)  # padded positions stay zero
            torch.testing.assert_close(st_b[0], st_a[0], atol=ATOL, rtol=0)  # the recurrence is the layer's own
            dec_a, _ = a.decode(y, a.decoder_init(st_a))
            dec_b, _ = b.decode(y, b.decoder_init(st_b))
            torch.testing.assert_close(dec_b, dec_a + y if k else dec_a, atol=ATOL, rtol=0)
        emb = plain.embeddings.embed_src(src)
        assert [len(r) for r in runs_of_layers(list(plain.pairs), "dec", emb)] == [3]
        assert [len(r) for r in runs_of_layers(list(res.pairs), "dec", emb)] == [1, 1, 1]
        assert not torch.allclose(logits_of(res, src, lengths, tgt_in), logits_of(plain, src, lengths, tgt_in))
        # the whole model equals its layers called one by one, with the adds
        h = res.embeddings.embed_tgt(tgt_in)
        _, inits = res.encode(src, lengths)
        for pair, init in zip(res.pairs, inits):
            h, _ = pair.decode(h, init)
        torch.testing.assert_close(res.decode(tgt_in, inits)[0], h, atol=ATOL, rtol=0)
