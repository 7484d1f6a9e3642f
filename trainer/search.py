"""Batched beam search (beam 1 = greedy) over a whole-model `Seq2Seq`."""
from __future__ import annotations

import torch

from data_prep.binary import BOS_ID, EOS_ID, PAD_ID
from trainer.model import Seq2Seq


def _normalize(score: float, length: int, alpha: float) -> float:
    """Length-normalised score: log-prob / length^alpha (alpha 0 = raw sum, 1 = per-token mean)."""
    return score / (max(length, 1) ** alpha)


@torch.no_grad()
def beam_search(model: Seq2Seq, src: torch.Tensor, src_lengths: torch.Tensor, *, beam: int = 5,
                max_len: torch.Tensor | int = 100, length_penalty: float = 1.0) -> list[list[int]]:
    """src (batch, src_len) ids with EOS, src_lengths (batch,), max_len an int or (batch,) tensor of
    per-sentence limits on the hypothesis length (tokens before EOS) -> the best hypothesis per
    sentence as token ids (without BOS/EOS)."""
    model.eval()
    batch, device = src.shape[0], src.device
    enc, states = model.encode(src, src_lengths)
    if isinstance(max_len, int):
        max_len = torch.full((batch,), max_len, dtype=torch.long)
    limits = max_len.tolist()
    k = beam
    # every sentence's beam lives in rows [b*k, (b+1)*k)
    enc = enc.repeat_interleave(k, 0)
    mask = (src != PAD_ID).repeat_interleave(k, 0)
    states = [(h.repeat_interleave(k, 1), c.repeat_interleave(k, 1)) for h, c in states]
    scores = torch.full((batch, k), float("-inf"), device=device)
    scores[:, 0] = 0.0  # only one live hypothesis at the start
    tokens = torch.full((batch * k, 1), BOS_ID, dtype=torch.long, device=device)
    finished: list[list[tuple[float, list[int]]]] = [[] for _ in range(batch)]
    done = [False] * batch
    for t in range(max(limits) + 1):
        dec, states = model.decode(tokens[:, -1:], states)
        logp = torch.log_softmax(model.head.logits(enc, mask, dec)[:, -1].float(), dim=-1)  # (batch*k, V)
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
                    finished[b].append((_normalize(s, len(hyp) + 1, length_penalty), hyp))
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
        states = [(h[:, rows], c[:, rows]) for h, c in states]
        scores = new_scores
    return [max(f, key=lambda x: x[0])[1] if f else [] for f in finished]
