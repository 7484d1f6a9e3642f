"""Validation during training: dev loss on every rank (the forward-only schedule), dev BLEU on rank 0
(a beam search of the whole model loaded from the checkpoint just written)."""
from __future__ import annotations

import math
import os

from trainer.parallel.layout import split_even
from trainer.state import capture_rng, restore_rng

SAMPLES = 8  # dev translations shown per validation (wandb table)


def dev_loss(session) -> float | None:
    """Mean token NLL of the first `decode.dev_max_sentences` dev pairs, in global micro-batches."""
    data, min_rows = session.dev_data, session.runtime.spec.min_rows
    n = min(len(data), session.cfg.decode.dev_max_sentences or len(data))
    if n < min_rows:
        return None
    parts = split_even(n, max(1, math.ceil(n / session.global_micro)))
    session.module.eval()
    nll = tokens = 0.0
    for a, b in parts:
        batch = data.batch(range(a, b))
        nll += session.runner.run(batch, train=False)["nll_sum"]
        tokens += batch.tgt_tokens
    session.module.train()
    return nll / tokens


def dev_bleu(session, ckpt: str) -> tuple[dict, list]:
    """Rank 0 decodes the dev set with the whole model loaded from the checkpoint `ckpt`; returns
    {dev_bleu, dev_chrf} (BLEU with the target language's tokenizer) and the first (source,
    reference, hypothesis) triples as samples."""
    from trainer.metrics import dev_scores
    from trainer.translator import Translator, read_lines

    cfg = session.cfg
    d = cfg.decode
    translator = Translator.from_run(session.run_dir, ckpt, device=session.runtime.device())
    src = read_lines(os.path.join(cfg.data.dir, "dev.src.txt"))
    ref = read_lines(os.path.join(cfg.data.dir, "dev.tgt.txt"))
    n = d.dev_max_sentences or len(src)
    hyps = translator.translate(src[:n], beam=d.dev_beam)
    samples = list(zip(src[:SAMPLES], ref[:SAMPLES], hyps[:SAMPLES]))
    return dev_scores(hyps, ref[:n], session.bleu_tokenize), samples


def evaluate(session, ckpt: str) -> tuple[dict, list]:
    """Dev loss (every rank) and dev BLEU (rank 0, the other ranks wait on the eval group); the RNG
    streams are left as they were, so a resumed run continues exactly. Returns the metrics and, on
    rank 0, sample translations."""
    rt = session.runtime
    row, rng, samples = {}, capture_rng(), []
    loss = dev_loss(session)
    scores = None
    if rt.is_rank0:
        scores, samples = dev_bleu(session, ckpt)
    scores = rt.broadcast_object(scores, src=0, group="eval")
    restore_rng(rng)
    if loss is not None:
        row.update(dev_loss=loss, dev_ppl=math.exp(min(loss, 50)))
    row.update(scores)
    return row, samples
