"""Validation during training: dev loss on every rank (the forward-only schedule), dev BLEU on rank 0
(a beam search of the whole model loaded from the checkpoint just written)."""
from __future__ import annotations

import math
import os

from trainer.parallel.layout import split_even
from trainer.checkpoint.state import capture_rng, restore_rng

SAMPLES = 8  # dev translations shown per validation (wandb table)


class Validator:
    """Validation of one run: what it needs, given once."""

    def __init__(self, *, runtime, runner, module, dev_data, global_micro: int, decode_cfg, data_dir: str,
                 run_dir: str, bleu_tokenize: str):
        self.rt, self.runner, self.module, self.data = runtime, runner, module, dev_data
        self.global_micro, self.decode, self.data_dir, self.run_dir = global_micro, decode_cfg, data_dir, run_dir
        self.bleu_tokenize = bleu_tokenize

    @property
    def sentences(self) -> int:
        """The dev pairs each validation scores and decodes (decode.dev_max_sentences, at most the dev set)."""
        return min(len(self.data), self.decode.dev_max_sentences or len(self.data))

    def dev_loss(self) -> float | None:
        """Mean token NLL of the first `decode.dev_max_sentences` dev pairs, in global micro-batches."""
        data, n = self.data, self.sentences
        if n < self.rt.spec.min_rows:
            return None
        self.module.eval()
        nll = tokens = 0.0
        for a, b in split_even(n, max(1, math.ceil(n / self.global_micro))):
            batch = data.batch(range(a, b))
            nll += self.runner.evaluate(batch)["nll_sum"]
            tokens += batch.tgt_tokens
        self.module.train()
        return nll / tokens

    def dev_bleu(self, ckpt: str, say=None) -> tuple[dict, list]:
        """Rank 0 decodes the dev set with the whole model loaded from the checkpoint `ckpt`; returns
        {dev_bleu, dev_chrf} (BLEU with the target language's tokenizer) and the first (source,
        reference, hypothesis) triples as samples. `say` (the run's console) hears first that it starts: a
        wide model's first decode takes most of a minute on a CPU."""
        from trainer.inference.loading import load_run
        from trainer.inference.text import read_lines
        from trainer.metrics import dev_scores

        translator = load_run(self.run_dir, ckpt, device=self.rt.device(), decode={"beam": self.decode.dev_beam})
        src = read_lines(os.path.join(self.data_dir, "dev.src.txt"))
        ref = read_lines(os.path.join(self.data_dir, "dev.tgt.txt"))
        n = min(len(src), self.decode.dev_max_sentences or len(src))
        if say is not None:
            say(f"dev BLEU: decoding {n} dev sentences (beam {self.decode.dev_beam}) with {os.path.basename(ckpt)}")
        hyps = translator.translate(src[:n])
        samples = list(zip(src[:SAMPLES], ref[:SAMPLES], hyps[:SAMPLES]))
        return dev_scores(hyps, ref[:n], self.bleu_tokenize), samples

    def evaluate(self, ckpt: str, say=None) -> tuple[dict, list]:
        """Dev loss (every rank) and dev BLEU (rank 0, the other ranks wait on the eval group); the RNG
        streams are left as they were, so a resumed run continues exactly. Returns the metrics and, on
        rank 0, sample translations; `say`: see dev_bleu."""
        rt = self.rt
        row, rng, samples = {}, capture_rng(), []
        loss = self.dev_loss()
        scores = None
        if rt.is_rank0:
            scores, samples = self.dev_bleu(ckpt, say)
        scores = rt.broadcast_object(scores, src=0, group="eval")
        restore_rng(rng)
        if loss is not None:
            row.update(dev_loss=loss, dev_ppl=math.exp(min(loss, 50)))
        row.update(scores)
        return row, samples
