"""The GPU check's gates: what would have caught the compiled head that trained nothing on CUDA (2026-12-04: grad
norm 0.0 at every logged step, the loss stuck at 8.99, and the check passed it because it only asked for a finite
loss).

- `training_gates(rows)`: a run's metrics rows: every logged grad norm finite and non-zero, and the loss falling
  over the run (the mean of the last logged rows below the first row's);
- `compiled_eager_pair(device, ...)`: the head's loss (AttentionSoftmaxHead.token_loss, what train.compile_head
  compiles) eager and compiled on the same fixed batches, keyed dropout on, forward and backward: the losses and
  every gradient within the precision's tolerance, and how many graphs torch.compile made for batches of several
  token counts and widths (the bound the trainer relies on).

- `graphs_gate(off_rows, on_rows, precision)`: a run with train.cuda_graphs on against the same run off: every
  logged step's loss and grad norm within the precision's tolerance, and (on CUDA) graphs captured.

All run on the CPU in the tests (tests/test_compiled_head.py), as in the check's --device cpu rehearsal.
"""
from __future__ import annotations

import math

TOLERANCE = {"fp32": 1e-4, "bf16": 3e-2, "fp16": 1e-2}  # relative, of the loss and of each gradient's largest element


def training_gates(rows: list[dict]) -> dict:
    """{'grad_norm_ok', 'loss_falls', 'ok', ...} from a run's metrics rows (each with 'loss', most with 'grad_norm')."""
    norms = [r.get("grad_norm") for r in rows if "grad_norm" in r]
    losses = [r["loss"] for r in rows if isinstance(r.get("loss"), (int, float))]
    bad = [n for n in norms if not (isinstance(n, (int, float)) and math.isfinite(n) and n > 0)]
    tail = losses[-max(1, len(losses) // 3):]
    falls = len(losses) >= 2 and sum(tail) / len(tail) < losses[0]
    return {"grad_norms": len(norms), "grad_norm_bad": bad[:5], "grad_norm_ok": bool(norms) and not bad,
            "loss_first": losses[0] if losses else None, "loss_last": losses[-1] if losses else None,
            "loss_falls": falls, "ok": bool(norms) and not bad and falls}


def graphs_gate(off_rows: list[dict], on_rows: list[dict], precision: str, need_graphs: bool = True) -> dict:
    """{'steps', 'max_rel_diff': {'loss', 'grad_norm'}, 'captured', 'ok', ...}: the metrics rows of a run with
    train.cuda_graphs on against the same run off, step by step (the logged steps both have). `need_graphs`: the
    on-run must say it captured graphs (its rows' cuda_graphs; not on a CPU, where they are eager)."""
    off = {r["step"]: r for r in off_rows if "loss" in r}
    on = {r["step"]: r for r in on_rows if "loss" in r}
    steps = sorted(set(off) & set(on))
    diff = {}
    for key in ("loss", "grad_norm"):
        pairs = [(on[s].get(key), off[s].get(key)) for s in steps]
        pairs = [(a, b) for a, b in pairs if isinstance(a, (int, float)) and isinstance(b, (int, float))]
        diff[key] = max((abs(a - b) / max(abs(b), 1e-12) for a, b in pairs), default=None)
    captured = max((r.get("cuda_graphs") or 0 for r in on_rows), default=0)
    tol = TOLERANCE[precision]
    ok = (len(steps) >= 2 and all(v is not None and v <= tol for v in diff.values())
          and (captured > 0 or not need_graphs))
    return {"steps": steps, "max_rel_diff": diff, "tolerance": tol, "captured": captured,
            "memory_mib": max((r.get("cuda_graphs_mib") or 0 for r in on_rows), default=0), "ok": ok}


def _batches(vocab: int, shapes: list[tuple[int, int, int]], seed: int):
    import numpy as np

    from trainer.data import collate

    rng = np.random.default_rng(seed)
    for rows, src_max, tgt_max in shapes:
        src = [rng.integers(4, vocab, int(rng.integers(1, src_max))) for _ in range(rows)]
        tgt = [rng.integers(4, vocab, int(rng.integers(1, tgt_max))) for _ in range(rows)]
        yield collate(src, tgt)


def _loss_and_grads(head, batch, hidden: int, device, dtype, step: int):
    import torch

    from trainer.model.dropout import DropoutKeys
    from trainer.model.tensors import to_device

    gen = torch.Generator().manual_seed(step)
    b = batch.to(device)
    enc = torch.randn(b.size, b.src.shape[1], hidden, generator=gen).to(device, dtype).requires_grad_()
    dec = torch.randn(b.size, b.tgt_in.shape[1], hidden, generator=gen).to(device, dtype).requires_grad_()
    keys = DropoutKeys((7, step, 0), b.size, {"src": b.src.shape[1], "tgt": b.tgt_in.shape[1]}, device)
    positions = to_device(b.token_positions(), device)
    head.zero_grad()
    loss, _ = head(enc, b.src_mask, dec, b.tgt_out, positions, keys.at(0, 0))
    (loss / max(1, b.tgt_tokens)).backward()
    return loss.detach().float(), [t.grad.float() for t in (enc, dec)] + [p.grad.float() for p in head.parameters()]


def compiled_eager_pair(device: str = "cpu", precision: str = "bf16", hidden: int = 64, vocab: int = 500,
                        shapes: list | None = None) -> dict:
    """The head's loss and gradients eager and compiled (torch.compile of token_loss, dynamic shapes, as
    train.compile_head does it) on the same batches; {'ok', 'max_rel_diff', 'graphs', ...}."""
    import torch
    from torch._dynamo.utils import counters

    from trainer.model.seq2seq import AttentionSoftmaxHead
    from trainer.model.tensors import round_count

    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[precision]
    dev = torch.device(device)
    shapes = shapes or [(16, 12, 14), (9, 20, 9), (24, 7, 17), (13, 15, 21)]
    heads = []
    for _ in range(2):  # eager, compiled: the same weights
        torch.manual_seed(0)
        head = AttentionSoftmaxHead(hidden=hidden, tgt_vocab=vocab, attention="general", dropout=0.3,
                                    label_smoothing=0.1).to(dev, dtype)
        head.loss_chunk_rows, head.loss_projection = (8192, "whole") if dev.type != "cpu" else (128, "chunked")
        heads.append(head)
    eager, compiled = heads
    torch._dynamo.reset()
    counters.clear()
    compiled.token_loss = torch.compile(compiled.token_loss, dynamic=True)
    worst, rows = 0.0, []
    for step, batch in enumerate(_batches(vocab, shapes, seed=3)):
        le, ge = _loss_and_grads(eager, batch, hidden, dev, dtype, step)
        lc, gc = _loss_and_grads(compiled, batch, hidden, dev, dtype, step)
        diffs = [float((lc - le).abs() / le.abs().clamp_min(1e-12))]
        diffs += [float((c - e).abs().max() / e.abs().max().clamp_min(1e-12)) for c, e in zip(gc, ge)]
        zero = [i for i, g in enumerate(gc) if not bool(g.abs().sum() > 0)]
        rows.append({"tokens": int(batch.tgt_tokens), "loss_eager": float(le), "loss_compiled": float(lc),
                     "max_rel_diff": max(diffs), "zero_grads": zero})
        worst = max(worst, max(diffs))
    graphs = int(counters["stats"].get("unique_graphs", 0))
    # per number of loss chunks the batches need (the chunk loop's only guards), however many shapes: one graph,
    # and one more where a count lands exactly on a chunk boundary (torch specialises that size)
    bound = 2 * len({-(-round_count(r["tokens"]) // eager.loss_chunk_rows) for r in rows})
    ok = worst <= TOLERANCE[precision] and not any(r["zero_grads"] for r in rows) and graphs <= bound
    return {"device": str(dev), "precision": precision, "batches": rows, "max_rel_diff": worst,
            "tolerance": TOLERANCE[precision], "graphs": graphs, "graph_bound": bound, "ok": ok}
