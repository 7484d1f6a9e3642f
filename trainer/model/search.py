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
from trainer.model.seq2seq import Seq2Seq


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
    """src (batch, src_len) ids with EOS, src_lengths (batch,) (best on the host: the encoder packs by
    them), max_len an int or (batch,) tensor of per-sentence limits on the hypothesis length (tokens
    before EOS) -> per sentence its `n_best` (<= beam) best hypotheses, best first.

    Every sentence's beam advances in the same tensor operations: each step takes the 2k best
    continuations of each sentence, finishes the EOS ones and keeps the k best others, in score order,
    stopping a sentence at k finished hypotheses (as a per-sentence loop over the candidates would), with
    no value read back to the host but one flag per step (are all sentences done?). Finished hypotheses
    collect in device buffers that are read once, at the end."""
    if not 1 <= n_best <= beam:
        raise ValueError(f"n-best {n_best} must be between 1 and the beam size {beam}")
    scorer = models if isinstance(models, Ensemble) else Ensemble(models)
    batch, device, k = src.shape[0], src.device, beam
    if isinstance(max_len, int):
        max_len = torch.full((batch,), max_len, dtype=torch.long)
    longest = int(max_len.max()) if batch else 0  # on the host (max_len is made there from host lengths)
    limits = max_len.to(device)
    state = scorer.start(src, src_lengths, k)
    scores = torch.full((batch, k), float("-inf"), device=device)
    scores[:, 0] = 0.0  # only one live hypothesis at the start
    tokens = torch.full((batch * k, 1), BOS_ID, dtype=torch.long, device=device)
    aligned = torch.zeros((batch * k, 0), dtype=torch.long, device=device)  # attended source position per token
    # finished hypotheses: k per sentence at most, plus a scratch slot (k) that unused candidates write to
    fin = _Finished(batch, k, longest + 1, device)
    done = torch.zeros(batch, dtype=torch.bool, device=device)
    offsets = torch.arange(batch, device=device).unsqueeze(1) * k
    for t in range(longest + 1):
        logp, attn, state = scorer.step(state, tokens[:, -1:])
        vocab = logp.shape[-1]
        logp[:, PAD_ID] = logp[:, BOS_ID] = float("-inf")
        # a sentence at its limit may only end, so no hypothesis grows past max_len tokens
        at_limit = (limits <= t).repeat_interleave(k)
        logp.masked_fill_(at_limit.unsqueeze(1) & (torch.arange(vocab, device=device) != EOS_ID), float("-inf"))
        cand = (scores.unsqueeze(-1) + logp.view(batch, k, vocab)).view(batch, -1)
        top_scores, top_idx = cand.topk(min(2 * k, cand.shape[1]), dim=-1)  # (batch, C), best first
        row, tok = top_idx // vocab, top_idx % vocab
        valid = (top_scores > float("-inf")) & ~done.unsqueeze(1)
        is_eos, grows = valid & (tok == EOS_ID), valid & (tok != EOS_ID)
        # candidates are taken in score order until the beam is full or k hypotheses are finished
        full_after = (grows.cumsum(1) >= k) | (fin.count.unsqueeze(1) + is_eos.cumsum(1) >= k)
        taken = valid & (full_after.cumsum(1) - full_after.long() == 0)
        ends, keeps = taken & is_eos, taken & grows
        fin.add(ends, top_scores, offsets + row, tokens, aligned, t, length_penalty)
        slot = torch.where(keeps, keeps.cumsum(1) - 1, k)  # kept candidates fill slots 0.. in order
        new_scores, new_rows, new_tok = (_into_slots(slot, values, fill, k) for values, fill in
                                         ((top_scores, float("-inf")), (row, 0), (tok, EOS_ID)))
        done |= (fin.count >= k) | (keeps.sum(1) == 0) | (limits <= t)
        if bool(done.all()):  # the step's one read-back
            break
        new_scores.masked_fill_(done.unsqueeze(1), float("-inf"))
        rows = (new_rows + offsets).view(-1)
        tokens = torch.cat([tokens[rows], new_tok.view(-1, 1)], dim=1)
        aligned = torch.cat([aligned[rows], attn.argmax(-1)[rows].view(-1, 1)], dim=1)
        state = scorer.reorder(state, rows)
        scores = new_scores
    return [sorted(f, key=lambda h: -h.score)[:n_best] for f in fin.hypotheses()]


def _into_slots(slot: torch.Tensor, values: torch.Tensor, fill, k: int) -> torch.Tensor:
    """(batch, k): values[b, j] at slot[b, j] where that is < k, `fill` elsewhere (slot k is scratch)."""
    out = torch.full((values.shape[0], k + 1), fill, dtype=values.dtype, device=values.device)
    return out.scatter_(1, slot, values)[:, :k].contiguous()


class _Finished:
    """Finished hypotheses of a batched beam search, on the device: per sentence up to k, in the order
    they finished (what the sort keeps among equal scores)."""

    def __init__(self, batch: int, k: int, width: int, device):
        self.k = k
        self.count = torch.zeros(batch, dtype=torch.long, device=device)
        self.tokens = torch.zeros(batch, k + 1, width, dtype=torch.long, device=device)
        self.align = torch.zeros(batch, k + 1, width, dtype=torch.long, device=device)
        self.length = torch.zeros(batch, k + 1, dtype=torch.long, device=device)
        self.score = torch.zeros(batch, k + 1, device=device)
        self.logprob = torch.zeros(batch, k + 1, device=device)

    def add(self, ends, top_scores, rows, tokens, aligned, t: int, alpha: float) -> None:
        """The candidates `ends` (batch, C) end here: hypotheses of t tokens, taken from beam `rows`."""
        batch, c = ends.shape
        pos = torch.where(ends, self.count.unsqueeze(1) + ends.cumsum(1) - 1, self.k)  # slot k: scratch
        hyp = tokens[rows.view(-1), 1:].view(batch, c, t)
        self.tokens[:, :, :t].scatter_(1, pos.unsqueeze(-1).expand(batch, c, t), hyp)
        self.align[:, :, :t].scatter_(1, pos.unsqueeze(-1).expand(batch, c, t), aligned[rows.view(-1)].view(batch, c, t))
        self.length.scatter_(1, pos, torch.full_like(pos, t))
        self.logprob.scatter_(1, pos, top_scores)
        self.score.scatter_(1, pos, top_scores / float(max(t + 1, 1)) ** alpha)
        self.count += ends.sum(1)

    def hypotheses(self) -> list[list[Hypothesis]]:
        """Everything read back to the host at once."""
        count, length = self.count.tolist(), self.length.tolist()
        tokens, align = self.tokens.tolist(), self.align.tolist()
        score, logprob = self.score.tolist(), self.logprob.tolist()
        return [[Hypothesis(tokens[b][i][:length[b][i]], score[b][i], logprob[b][i], align[b][i][:length[b][i]])
                 for i in range(count[b])] for b in range(len(count))]


def beam_search(models, src: torch.Tensor, src_lengths: torch.Tensor, *, beam: int = 5,
                max_len: torch.Tensor | int = 100, length_penalty: float = 1.0) -> list[list[int]]:
    """The best hypothesis per sentence as token ids (without BOS/EOS); see `beam_search_nbest`."""
    best = beam_search_nbest(models, src, src_lengths, beam=beam, max_len=max_len, length_penalty=length_penalty)
    return [h[0].tokens if h else [] for h in best]
