"""Batched beam search (beam 1 = greedy) and forced decoding over whole-model `Seq2Seq`s.

Several models with the same vocabularies decode as one ensemble: each step's next-token distribution is
the average of theirs (in probability, as fairseq and OpenNMT-py do), and attention weights are averaged
too. One model is an ensemble of one.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import torch

from data_prep.dataformat import BOS_ID, EOS_ID, PAD_ID
from trainer.model import Seq2Seq


@dataclass
class Hypothesis:
    tokens: list[int]  # without BOS/EOS
    score: float  # what the beam ranks by: log-prob / (length + 1)^alpha
    logprob: float  # log p(tokens + EOS | source), natural log
    alignment: list[int] = field(default_factory=list)  # per token, the source position attended most


def _normalize(score: float, length: int, alpha: float) -> float:
    """Length-normalised score: log-prob / length^alpha (alpha 0 = raw sum, 1 = per-token mean)."""
    return score / (max(length, 1) ** alpha)


class Ensemble:
    """Models that share source and target vocabularies, scored as one."""

    def __init__(self, models: Seq2Seq | Sequence[Seq2Seq]):
        self.models = [models] if isinstance(models, Seq2Seq) else list(models)
        for m in self.models:
            m.eval()

    def start(self, src: torch.Tensor, src_lengths: torch.Tensor, k: int) -> list:
        """Encode once per model; every sentence's beam lives in rows [b*k, (b+1)*k)."""
        mask = (src != PAD_ID).repeat_interleave(k, 0)
        state = []
        for m in self.models:
            enc, inits = m.encode(src, src_lengths)
            state.append((enc.repeat_interleave(k, 0), mask,
                          [(h.repeat_interleave(k, 1), c.repeat_interleave(k, 1)) for h, c in inits]))
        return state

    def step(self, state: list, last: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, list]:
        """last (rows, 1) tokens -> log-probs (rows, vocab), attention (rows, src_len), next state."""
        logps, attns, new_state = [], [], []
        for m, (enc, mask, states) in zip(self.models, state):
            dec, states = m.decode(last, states)
            logits, attn = m.head.logits_and_attention(enc, mask, dec)
            logps.append(torch.log_softmax(logits[:, -1].float(), dim=-1))
            attns.append(attn[:, -1].float())
            new_state.append((enc, mask, states))
        if len(logps) == 1:
            return logps[0], attns[0], new_state
        logp = torch.logsumexp(torch.stack(logps), dim=0) - math.log(len(logps))
        return logp, torch.stack(attns).mean(0), new_state

    @staticmethod
    def reorder(state: list, rows: torch.Tensor) -> list:
        return [(enc, mask, [(h[:, rows], c[:, rows]) for h, c in states]) for enc, mask, states in state]

    @torch.no_grad()
    def force(self, src: torch.Tensor, src_lengths: torch.Tensor, tgt_in: torch.Tensor,
              tgt_out: torch.Tensor) -> torch.Tensor:
        """Teacher-forced log p(tgt_out[b] | src[b]) per token (batch, tgt_len), 0 at PAD."""
        logps = []
        for m in self.models:
            enc, inits = m.encode(src, src_lengths)
            dec, _ = m.decode(tgt_in, inits)
            logp = torch.log_softmax(m.head.logits(enc, src != PAD_ID, dec).float(), dim=-1)
            logps.append(logp.gather(2, tgt_out.clamp(min=0).unsqueeze(-1)).squeeze(-1))
        logp = logps[0] if len(logps) == 1 else torch.logsumexp(torch.stack(logps), 0) - math.log(len(logps))
        return logp.masked_fill(tgt_out == PAD_ID, 0.0)


@torch.no_grad()
def beam_search_nbest(models: Seq2Seq | Sequence[Seq2Seq] | Ensemble, src: torch.Tensor,
                      src_lengths: torch.Tensor, *, beam: int = 5, max_len: torch.Tensor | int = 100,
                      length_penalty: float = 1.0, n_best: int = 1) -> list[list[Hypothesis]]:
    """src (batch, src_len) ids with EOS, src_lengths (batch,), max_len an int or (batch,) tensor of
    per-sentence limits on the hypothesis length (tokens before EOS) -> per sentence its `n_best`
    (<= beam) best hypotheses, best first."""
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


def beam_search(models, src: torch.Tensor, src_lengths: torch.Tensor, *, beam: int = 5,
                max_len: torch.Tensor | int = 100, length_penalty: float = 1.0) -> list[list[int]]:
    """The best hypothesis per sentence as token ids (without BOS/EOS); see `beam_search_nbest`."""
    best = beam_search_nbest(models, src, src_lengths, beam=beam, max_len=max_len, length_penalty=length_penalty)
    return [h[0].tokens if h else [] for h in best]
