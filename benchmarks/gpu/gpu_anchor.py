"""The anchor on the same device: the smallest PyTorch program a user would write for our model, to hold every
row of the GPU check against (issue: every row at least its tokens/s).

One multi-layer `nn.LSTM` per side (the decoder starts from the encoder's final states, packed sources), Luong
"general" attention over the top encoder states for all target positions at once (no input feeding, as ours),
tanh(W_c [c; h]), the output projection, label-smoothed cross-entropy summed and divided by the target tokens;
autocast bf16 (or fp32), `torch.optim.Adam(fused=True)`, gradient clipping at 1.0. No DeepSpeed, no pipeline, no
keyed dropout (dropout 0, as the patent run), no checkpoint, no metrics but the loss read every 50 steps. The same
batches as the trainer's (trainer.data: the same DATA_DIR, batch size, seed and length-bucketing), moved to the
device through pinned memory.

    python -m benchmarks.gpu.gpu_anchor --data DIR [--batch 128] [--steps 200] [--warmup 50] [--precision bf16]
        [--emb 1024] [--hidden 1024] [--layers 4] [--device cuda] [--threads N] [--out FILE.json]

Prints and writes (--out) pairs/s and tokens/s (source + target tokens, as the trainer's tokens_per_s counts
them) over the steps after --warmup, timed with the device synchronised at the window's two ends only.
--threads: torch's threads (default: torch's own, the host's cores); the GPU check's CPU path gives 1, as its
training runs have (train.threads=1): with two threads on a 2-core machine busy with other work (the suite in
two pytest-xdist workers, 2026-12-06, AMD EPYC with AVX2 only) a step took 1.87 s against 32.5 ms quiet, 57x
(OpenMP waiting on a thread that is not running): the anchor measured the machine's load, not the program.
"""
from __future__ import annotations

import argparse
import json
import time


def build(src_vocab: int, tgt_vocab: int, emb: int, hidden: int, layers: int):
    import torch
    from torch import nn
    from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

    class Anchor(nn.Module):
        def __init__(self):
            super().__init__()
            self.src_emb = nn.Embedding(src_vocab, emb, padding_idx=0)
            self.tgt_emb = nn.Embedding(tgt_vocab, emb, padding_idx=0)
            self.encoder = nn.LSTM(emb, hidden, layers, batch_first=True)
            self.decoder = nn.LSTM(emb, hidden, layers, batch_first=True)
            self.w_a = nn.Linear(hidden, hidden, bias=False)
            self.w_c = nn.Linear(2 * hidden, hidden, bias=False)
            self.proj = nn.Linear(hidden, tgt_vocab)

        def forward(self, src, src_lengths, tgt_in, tgt_out):
            packed = pack_padded_sequence(self.src_emb(src), src_lengths, batch_first=True)
            enc, state = self.encoder(packed)
            enc, _ = pad_packed_sequence(enc, batch_first=True, total_length=src.shape[1])
            dec, _ = self.decoder(self.tgt_emb(tgt_in), state)
            scores = (self.w_a(dec) @ enc.transpose(1, 2)).masked_fill((src == 0).unsqueeze(1), float("-inf"))
            context = torch.softmax(scores.float(), -1).to(enc.dtype) @ enc
            logits = self.proj(torch.tanh(self.w_c(torch.cat([context, dec], -1))))
            return nn.functional.cross_entropy(logits.flatten(0, 1).float(), tgt_out.flatten(), ignore_index=0,
                                               label_smoothing=0.1, reduction="sum")

    return Anchor()


def cpu_precision(asked: str) -> tuple[str, str | None]:
    """(the precision the anchor runs in on this CPU, a note where it is not `asked`). Where PyTorch does not run
    bf16 in oneDNN (torch.ops.mkldnn._is_mkldnn_bf16_supported() false: an AVX2-only CPU), a multi-layer nn.LSTM
    under autocast bf16 fails in PyTorch itself ("could not create a primitive descriptor for the LSTM forward
    propagation primitive", torch 2.11 and 2.13, AMD EPYC with AVX2 only, 2026-12-06): the program a user would
    write cannot run there, so the anchor runs in fp32 and says so."""
    import torch

    if asked != "bf16" or torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return asked, None
    return "fp32", ("fp32, not bf16: PyTorch runs no bf16 in oneDNN on this CPU, and nn.LSTM under autocast bf16 "
                    "fails there (could not create a primitive descriptor for the LSTM forward propagation primitive)")


def batches(data: str, batch: int, seed: int = 1):
    """The trainer's batches of the first epoch, endlessly (trainer.data.make_batches, 100-batch length windows)."""
    from trainer.data import ParallelData, make_batches

    train = ParallelData(data, "train")
    epoch = 0
    while True:
        idx, _ = make_batches(train.src_len, train.tgt_len, max_sentences=batch, max_tokens=0, seed=seed, epoch=epoch,
                              bucket_batches=100)
        for i in idx:
            yield train.batch(i)
        epoch += 1


def run(args) -> dict:
    import torch

    from trainer.data import read_manifest

    dev = torch.device(args.device)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    vocab = read_manifest(args.data)["vocab"]
    model = build(vocab["src_size"], vocab["tgt_size"], args.emb, args.hidden, args.layers).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, betas=(0.9, 0.98), eps=1e-9, fused=dev.type == "cuda")
    precision, note = cpu_precision(args.precision) if dev.type == "cpu" else (args.precision, None)
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    stream, losses, pairs, tokens = batches(args.data, args.batch), [], 0, 0
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    for step in range(args.steps):
        if step == args.warmup:
            sync()
            start, pairs, tokens = time.perf_counter(), 0, 0
        b = next(stream)
        src, tgt_in, tgt_out = (t.pin_memory().to(dev, non_blocking=True) if dev.type == "cuda" else t
                                for t in (b.src, b.tgt_in, b.tgt_out))
        with torch.autocast(dev.type, dtype=dtype, enabled=dtype != torch.float32):
            loss = model(src, torch.from_numpy(b.src_len), tgt_in, tgt_out) / b.tgt_tokens
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        pairs, tokens = pairs + b.size, tokens + b.src_tokens + b.tgt_tokens
        if step % 50 == 0 or step == args.steps - 1:
            losses.append(round(float(loss.detach()), 4))
    sync()
    seconds = time.perf_counter() - start
    steps = args.steps - args.warmup
    return {"program": "anchor (nn.LSTM x2, autocast, fused Adam)", "device": str(dev), "precision": precision,
            **({"precision_asked": args.precision, "note": note} if note else {}),
            "threads": torch.get_num_threads(), "batch": args.batch, "emb": args.emb, "hidden": args.hidden,
            "layers": args.layers, "steps": steps,
            "warmup": args.warmup, "pairs_per_s": pairs / seconds, "tokens_per_s": tokens / seconds,
            "step_ms_mean": 1000 * seconds / steps, "losses": losses,
            "peak_memory_mib": torch.cuda.max_memory_allocated() / 2 ** 20 if dev.type == "cuda" else None}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--precision", choices=("bf16", "fp32"), default="bf16")
    p.add_argument("--emb", type=int, default=1024)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--device", default="cuda")
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    if not 0 <= args.warmup < args.steps:
        p.error("--warmup must be below --steps")
    result = run(args)
    print(json.dumps(result))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
