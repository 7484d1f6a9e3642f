"""Text in, text out on one process: batched beam search over one model or an ensemble, with the text
pipeline of the data (trainer.inference.text: normalisation, number and formula placeholders, segmentation
of long lines, detokenisation) and forced scoring of given references. Where the model comes from (a run's
checkpoint, an average, an exported file, an ensemble): trainer.inference.loading.

What happens to one input line (`Translator.translate_nbest`): the text pipeline gives its segments as
piece ids (none for an empty line, none for a line over the byte cap); the segments of all lines are
decoded in length-sorted batches (at most `decode.batch_size` sentences and `decode.max_tokens` padded
source pieces); each line's segment hypotheses are joined back into text.
"""
from __future__ import annotations

import numpy as np
import torch

from data_prep.dataformat import EOS_ID, PAD_ID
from trainer.data import collate
from trainer.inference.options import DecodeOptions
from trainer.inference.text import TextPipeline, Translated
from trainer.model.search import Ensemble, Hypothesis, beam_search_nbest
from trainer.model.seq2seq import Seq2Seq
from trainer.model.tensors import to_device

MAX_HYPOTHESES = 8192  # a beam search batch holds at most this many (sentences x beam): rows of vocabulary scores


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


class Translator:
    """Models (one, or an ensemble's) with the text pipeline of their data and the decoding options, built
    complete: `origin` says where the models came from (trainer.inference.loading)."""

    def __init__(self, model: Seq2Seq | list[Seq2Seq], text: TextPipeline, options: DecodeOptions, device=None,
                 origin: dict | None = None):
        self.device = torch.device(device or default_device())
        self.models = [m.to(self.device).eval() for m in (model if isinstance(model, list) else [model])]
        self.text, self.options, self.origin = text, options, dict(origin or {})

    @property
    def model(self) -> Seq2Seq:
        return self.models[0]

    @property
    def tgt_lang(self) -> str | None:
        return self.text.tgt_lang

    def batches(self, lengths: list[int], batch_size: int, max_tokens: int) -> list[list[int]]:
        """Indices into `lengths` (source pieces), longest first, cut into batches of at most `batch_size`
        sentences and `max_tokens` padded source pieces (0: no token cap; a batch holds at least one)."""
        order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
        out: list[list[int]] = []
        for i in order:
            if out and len(out[-1]) < batch_size and (not max_tokens or
                                                      (len(out[-1]) + 1) * (lengths[out[-1][0]] + 1) <= max_tokens):
                out[-1].append(i)
            else:
                out.append([i])
        return out

    def translate_ids(self, src_ids: list[list[int]], *, beam: int, max_len_ratio: float, max_len_add: int,
                      length_penalty: float, batch_size: int, max_tokens: int = 0,
                      n_best: int = 1) -> list[list[Hypothesis]]:
        out: list[list[Hypothesis]] = [[] for _ in src_ids]
        batch_size = max(1, min(batch_size, MAX_HYPOTHESES // beam))  # the search's rows: sentences x beam
        for idx in self.batches([len(s) for s in src_ids], batch_size, max_tokens):
            lengths = np.array([len(src_ids[i]) + 1 for i in idx])  # with EOS; on the host, as the encoder wants
            src = np.full((len(idx), int(lengths.max())), PAD_ID, dtype=np.int64)
            for row, i in enumerate(idx):
                src[row, :lengths[row]] = src_ids[i] + [EOS_ID]
            max_len = torch.from_numpy((lengths.astype(np.float32) * np.float32(max_len_ratio)).astype(np.int64)
                                       + max_len_add)
            hyps = beam_search_nbest(self.models, to_device(src, self.device), torch.from_numpy(lengths), beam=beam,
                                     max_len=max_len, length_penalty=length_penalty, n_best=n_best)
            for i, h in zip(idx, hyps):
                out[i] = h
        return out

    @staticmethod
    def oversized(line: str, cap: int) -> bool:
        """Longer than `cap` UTF-8 bytes (cap 0: never). Such a line is not translated: it would be cut into
        thousands of segments, each decoded to the maximum length (a 2 MB line without spaces: 16k segments,
        no output after minutes), and hold up every line after it."""
        return bool(cap) and len(line) > cap // 4 and len(line.encode("utf-8", "surrogatepass")) > cap

    def translate_nbest(self, lines: list[str], *, n_best: int = 1, alignments: bool = False,
                        **flags) -> list[list[Translated]]:
        """Per line its `n_best` translations, best first, decoded with the Translator's options (`flags`: some of
        them changed for this call, e.g. beam=2; checked as any DecodeOptions). For a line cut into segments, the
        k-th translation joins every segment's k-th best. A line over max_line_bytes gets an empty translation
        (the callers count and report it)."""
        o = self.options.with_flags(**flags)
        sources = [([], ([], [])) if self.oversized(line, o.max_line_bytes) else self.text.source(line)
                   for line in lines]
        flat = [ids for segments, _ in sources for ids in segments]
        hyps = iter(self.translate_ids(flat, n_best=n_best, beam=o.beam, max_len_ratio=o.max_len_ratio,
                                       max_len_add=o.max_len_add, length_penalty=o.length_penalty,
                                       batch_size=o.batch_size, max_tokens=o.max_tokens))
        out = []
        for segments, held in sources:
            seg_hyps = [next(hyps) for _ in segments]
            out.append([self.text.join(segments, [h[min(k, len(h) - 1)] if h else Hypothesis([], 0.0, 0.0)
                                                  for h in seg_hyps], held, o.length_penalty, alignments)
                        for k in range(n_best)])
        return out

    def translate(self, lines: list[str], **flags) -> list[str]:
        """The best translation of each line (`flags`: as translate_nbest's)."""
        return [n[0].text for n in self.translate_nbest(lines, **flags)]

    # ---- forced decoding ----
    @torch.no_grad()
    def score(self, src_lines: list[str], tgt_lines: list[str]) -> list[tuple[float, int]]:
        """log p(target | source) of given pairs (natural log, end-of-sentence included) and the number of
        target pieces it covers (+1 for the end of sentence), by teacher-forced decoding, in batches of the
        Translator's options. No segmentation: the pair is scored whole. An empty source or target scores
        (0.0, 0)."""
        o = self.options
        pairs = [self.text.pair(s, t) for s, t in zip(src_lines, tgt_lines)]
        src, tgt = [p[0] for p in pairs], [p[1] for p in pairs]
        keep = [i for i in range(len(src)) if src[i] and tgt[i]]
        out: list[tuple[float, int]] = [(0.0, 0)] * len(src)
        scorer = Ensemble(self.models)
        lengths = [len(src[i]) + len(tgt[i]) for i in keep]
        for batch in self.batches(lengths, o.batch_size, o.max_tokens):
            idx = [keep[j] for j in batch]
            b = collate([np.array(src[i]) for i in idx], [np.array(tgt[i]) for i in idx]).to(self.device)  # pinned, async
            order = sorted(range(len(idx)), key=lambda r: -len(src[idx[r]]))  # collate's row order
            logp = scorer.force(b.src, b.src_lengths, b.tgt_in, b.tgt_out)
            for row, r in enumerate(order):
                out[idx[r]] = (float(logp[row].sum()), len(tgt[idx[r]]) + 1)
        return out
