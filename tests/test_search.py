"""trainer.model.search.beam_search: exact on a tiny model where greedy is not optimal, greedy at beam 1,
batched = one sentence at a time, and per-sentence max_len respected."""
from __future__ import annotations

from dataclasses import replace
from itertools import product

import pytest
import torch

from data_prep.binary import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from trainer.config import ModelConfig
from trainer.model.search import Ensemble, Hypothesis, _normalize, beam_search, beam_search_nbest
from trainer.model.seq2seq import build_model

torch.set_num_threads(1)

TINY = ModelConfig(emb_dim=4, hidden=4, layers=1, bidirectional_bottom=False, attention="general",
                   dropout=0.0, label_smoothing=0.0, tie_embeddings=False)
VOCAB = 6  # pad, unk, bos, eos + two real tokens
EMITTABLE = [UNK_ID, EOS_ID, 4, 5]  # beam search never emits PAD or BOS
SRC = torch.tensor([[4, 5, 4, EOS_ID]])
SRC_LEN = torch.tensor([4])
MAX_LEN = 3


def tiny_model(seed: int):
    """Every weight ~ N(0, 2^2): far from the small init, so distributions are peaked and varied."""
    model = build_model(TINY, VOCAB, VOCAB, seed=seed).eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(2.0 * torch.randn(p.shape, generator=gen))
    return model


@torch.no_grad()
def next_logp(model, src, src_len, prefix: list[int]) -> torch.Tensor:
    """log p(. | BOS + prefix) over the whole vocabulary, by a full teacher-forced pass."""
    enc, inits = model.encode(src, src_len)
    dec, _ = model.decode(torch.tensor([[BOS_ID] + prefix]), inits)
    return torch.log_softmax(model.head.logits(enc, src != PAD_ID, dec)[0, -1], dim=-1)


@torch.no_grad()
def sequence_logp(model, src, src_len, hyp: list[int]) -> float:
    """Raw log p(hyp + EOS | src), teacher-forced."""
    enc, inits = model.encode(src, src_len)
    dec, _ = model.decode(torch.tensor([[BOS_ID] + hyp]), inits)
    logp = torch.log_softmax(model.head.logits(enc, src != PAD_ID, dec)[0], dim=-1)
    return float(logp[torch.arange(len(hyp) + 1), torch.tensor(hyp + [EOS_ID])].sum())


def exhaustive(model, src, src_len, max_len: int) -> list[tuple[float, list[int]]]:
    """Every hypothesis of at most max_len tokens, scored, best first."""
    real = [t for t in EMITTABLE if t != EOS_ID]
    hyps = [list(h) for n in range(max_len + 1) for h in product(real, repeat=n)]
    return sorted(((sequence_logp(model, src, src_len, h), h) for h in hyps), key=lambda x: -x[0])


def greedy(model, src, src_len, max_len: int) -> list[int]:
    hyp: list[int] = []
    while len(hyp) < max_len:
        logp = next_logp(model, src, src_len, hyp)
        logp[[PAD_ID, BOS_ID]] = float("-inf")
        tok = int(logp.argmax())
        if tok == EOS_ID:
            break
        hyp.append(tok)
    return hyp


def find_model_where_greedy_is_not_best():
    """The first seed whose unique best hypothesis has >= 2 tokens and starts with a token greedy
    does not pick, so the search must keep a worse first step alive to find it."""
    for seed in range(200):
        model = tiny_model(seed)
        ranked = exhaustive(model, SRC, SRC_LEN, MAX_LEN)
        (best_score, best), (second_score, _) = ranked[0], ranked[1]
        g = greedy(model, SRC, SRC_LEN, MAX_LEN)
        if (len(best) >= 2 and g[:1] != best[:1] and best_score - second_score > 1e-3
                and best_score - sequence_logp(model, SRC, SRC_LEN, g) > 1e-2):
            return model, best, g, len(ranked)
    raise AssertionError("no seed in 0..199 gives a tiny model where greedy is not optimal")


def test_beam_search_finds_the_best_sequence_and_beam_1_is_greedy():
    model, best, greedy_hyp, n_hyps = find_model_where_greedy_is_not_best()
    assert n_hyps == 1 + 3 + 9 + 27
    # a beam at least as wide as the whole search space makes the search exact
    assert beam_search(model, SRC, SRC_LEN, beam=n_hyps, max_len=MAX_LEN, length_penalty=0.0) == [best]
    assert beam_search(model, SRC, SRC_LEN, beam=1, max_len=MAX_LEN, length_penalty=0.0) == [greedy_hyp]
    assert greedy_hyp != best


def pad_sources(sentences: list[list[int]]):
    width = max(len(s) for s in sentences) + 1
    src = torch.full((len(sentences), width), PAD_ID, dtype=torch.long)
    for row, s in enumerate(sentences):
        src[row, :len(s) + 1] = torch.tensor(s + [EOS_ID])
    return src, torch.tensor([len(s) + 1 for s in sentences])


def test_batched_search_equals_one_sentence_at_a_time():
    cfg = replace(TINY, emb_dim=8, hidden=8, layers=2, bidirectional_bottom=True, attention="concat")
    model = build_model(cfg, 12, 12, seed=4).eval()
    gen = torch.Generator().manual_seed(4)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen))
        model.head.proj.bias[EOS_ID] += 3.0  # some hypotheses end early, others run to their limit
    gen = torch.Generator().manual_seed(0)
    sentences = [torch.randint(4, 12, (n,), generator=gen).tolist() for n in (2, 7, 4, 1, 5)]
    limits = torch.tensor([4, 12, 7, 3, 9])
    src, lengths = pad_sources(sentences)
    ended_early = hit_limit = 0
    for beam, alpha in ((1, 0.0), (3, 1.0), (4, 0.0)):
        batched = beam_search(model, src, lengths, beam=beam, max_len=limits, length_penalty=alpha)
        alone = []
        for i, s in enumerate(sentences):
            one_src, one_len = pad_sources([s])
            alone += beam_search(model, one_src, one_len, beam=beam, max_len=limits[i:i + 1],
                                 length_penalty=alpha)
        assert batched == alone, (beam, alpha)
        assert len({tuple(h) for h in batched}) > 2  # the sentences really get different outputs
        assert all(len(h) <= n for h, n in zip(batched, limits.tolist()))
        ended_early += sum(len(h) < n for h, n in zip(batched, limits.tolist()))
        hit_limit += sum(len(h) == n for h, n in zip(batched, limits.tolist()))
    assert ended_early and hit_limit  # sentences finish at different steps within one batch


def test_per_sentence_max_len_is_respected():
    model = build_model(replace(TINY, emb_dim=6, hidden=6), 10, 10, seed=1).eval()
    with torch.no_grad():
        model.head.proj.bias[EOS_ID] = -20.0  # never wants to stop, so every hypothesis hits its limit
    src, lengths = pad_sources([[4, 5, 6], [7, 8], [9, 4, 5, 6, 7], [5]])
    limits = torch.tensor([0, 1, 4, 2])
    for beam in (1, 3):
        hyps = beam_search(model, src, lengths, beam=beam, max_len=limits, length_penalty=1.0)
        assert [len(h) for h in hyps] == limits.tolist(), beam
        assert all(t not in (PAD_ID, BOS_ID, EOS_ID) for h in hyps for t in h)
    # an int limit applies to every sentence
    assert [len(h) for h in beam_search(model, src, lengths, beam=2, max_len=3)] == [3, 3, 3, 3]


@torch.no_grad()
def _loop_reference(models, src: torch.Tensor, src_lengths: torch.Tensor, *, beam: int = 5,
                    max_len: torch.Tensor | int = 100, length_penalty: float = 1.0,
                    n_best: int = 1) -> list[list[Hypothesis]]:
    """The search as it was written first: a Python loop over each sentence's candidates per step (a
    device sync per sentence and step); kept here as the reference the batched search must equal."""
    if not 1 <= n_best <= beam:
        raise ValueError(f"n-best {n_best} must be between 1 and the beam size {beam}")
    scorer = models if isinstance(models, Ensemble) else Ensemble(models)
    batch, device = src.shape[0], src.device
    if isinstance(max_len, int):
        max_len = torch.full((batch,), max_len, dtype=torch.long)
    limits = max_len.tolist()
    k = beam
    state = scorer.start(src, src_lengths, k)
    scores = torch.full((batch, k), float("-inf"), device=device)
    scores[:, 0] = 0.0  # only one live hypothesis at the start
    tokens = torch.full((batch * k, 1), BOS_ID, dtype=torch.long, device=device)
    aligned = torch.zeros((batch * k, 0), dtype=torch.long, device=device)  # attended source position per token
    finished: list[list[Hypothesis]] = [[] for _ in range(batch)]
    done = [False] * batch
    for t in range(max(limits) + 1):
        logp, attn, state = scorer.step(state, tokens[:, -1:])
        vocab = logp.shape[-1]
        logp[:, PAD_ID] = logp[:, BOS_ID] = float("-inf")
        # a sentence at its limit may only end, so no hypothesis grows past max_len tokens
        at_limit = torch.tensor([t >= n for n in limits], device=device).repeat_interleave(k)
        logp.masked_fill_(at_limit.unsqueeze(1) & (torch.arange(vocab, device=device) != EOS_ID), float("-inf"))
        cand = (scores.unsqueeze(-1) + logp.view(batch, k, vocab)).view(batch, -1)
        top_scores, top_idx = cand.topk(min(2 * k, cand.shape[1]), dim=-1)
        new_scores = torch.full((batch, k), float("-inf"), device=device)
        new_rows = torch.zeros(batch, k, dtype=torch.long, device=device)
        new_tok = torch.full((batch, k), EOS_ID, dtype=torch.long, device=device)
        for b in range(batch):
            if done[b]:
                continue
            slot = 0
            for s, i in zip(top_scores[b].tolist(), top_idx[b].tolist()):
                if s == float("-inf"):
                    break
                row, tok = divmod(i, vocab)
                if tok == EOS_ID:
                    hyp = tokens[b * k + row, 1:].tolist()
                    finished[b].append(Hypothesis(hyp, _normalize(s, len(hyp) + 1, length_penalty), s,
                                                  aligned[b * k + row].tolist()))
                else:
                    new_scores[b, slot], new_rows[b, slot], new_tok[b, slot] = s, row, tok
                    slot += 1
                if slot == k or len(finished[b]) >= k:
                    break
            if len(finished[b]) >= k or slot == 0 or t >= limits[b]:
                done[b] = True
                new_scores[b] = float("-inf")
        if all(done):
            break
        rows = (new_rows + torch.arange(batch, device=device).unsqueeze(1) * k).view(-1)
        tokens = torch.cat([tokens[rows], new_tok.view(-1, 1)], dim=1)
        aligned = torch.cat([aligned[rows], attn.argmax(-1)[rows].view(-1, 1)], dim=1)
        state = scorer.reorder(state, rows)
        scores = new_scores
    return [sorted(f, key=lambda h: -h.score)[:n_best] for f in finished]


def test_batched_search_equals_the_per_sentence_loop():
    """Every hypothesis of every n-best list (tokens, score, log-prob, alignment) equals what the loop over
    each sentence's candidates gives, over random models, beams, limits and length penalties."""
    for seed in range(6):
        cfg = replace(TINY, emb_dim=8, hidden=8, layers=2, attention=("dot", "general", "concat")[seed % 3])
        model = build_model(cfg, 9, 9, seed=seed).eval()
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(torch.randn(p.shape, generator=gen))
            model.head.proj.bias[EOS_ID] += float(seed % 4)
        sentences = [torch.randint(4, 9, (int(n),), generator=gen).tolist()
                     for n in torch.randint(1, 9, (5 + seed,), generator=gen)]
        limits = torch.randint(1, 12, (len(sentences),), generator=gen)
        src, lengths = pad_sources(sentences)
        for beam, alpha, n_best in ((1, 0.0, 1), (2, 1.0, 2), (5, 0.6, 3), (6, 1.0, 6)):
            got = beam_search_nbest(model, src, lengths, beam=beam, max_len=limits, length_penalty=alpha,
                                    n_best=n_best)
            want = _loop_reference(model, src, lengths, beam=beam, max_len=limits, length_penalty=alpha,
                                   n_best=n_best)
            assert len(got) == len(want)
            for g, w in zip(got, want):
                assert [h.tokens for h in g] == [h.tokens for h in w], (seed, beam)
                assert [h.alignment for h in g] == [h.alignment for h in w]
                assert [h.score for h in g] == pytest.approx([h.score for h in w], rel=1e-6)
                assert [h.logprob for h in g] == pytest.approx([h.logprob for h in w], rel=1e-6)
