"""Measure this machine's profile (`python launch/plan.py --calibrate --config MODEL.yaml --out FILE`):
the model's real layers timed at a few shapes, per precision (bf16, fp32) and thread count (1, 2); how
much slower each runs while a second process computes on the other core; gloo transfers and
collectives between two ranks; DeepSpeed's optimizer step. Writes the profile format of
trainer/planner/profile.py, with the load average before and after and what the rest of the machine took
meanwhile (other processes' CPU and the hypervisor's steal, in cores: numbers taken on a busy machine are not
worth planning with, and the file says so). It runs under the allocator training runs with (launch/plan.py).

Each timing is the median of repeats after warm-up, in milliseconds.
"""
from __future__ import annotations

import json
import os
import time

import numpy as np
import torch

from data_prep.dataformat import files
from trainer.data import BatchStream, ParallelData, read_manifest
from trainer.model.dropout import DropoutKeys, keep_mask
from trainer.model.lstm_stack import run_packed
from trainer.model.seq2seq import build_head
from trainer.observe import cpu_threads
from trainer.training import memory, tuning
from trainer.planner import calibrate_ranks
from trainer.planner.profile import stamp
from trainer.planner.shapes import ModelDims
from trainer.planner.timing import dtype_of, timed_ms

QUIET_LOAD = 1.5  # load average before it above which the numbers are flagged
QUIET_OTHERS = 0.1  # cores other processes (or the hypervisor) took on average during it, above which likewise


class Sizes:
    def __init__(self, quick: bool, global_batch: int):
        top = max(8, global_batch)
        self.rows = sorted({r for r in (2, 4, 8, 16, 32, 64, 128) if r <= top} | {top})
        self.steps = (4, 12, 32)
        self.tokens = (256, 1024, 4096)
        self.elements = (1 << 16, 1 << 18, 1 << 20)
        self.copy_bytes = (1 << 16, 1 << 20, 1 << 23)
        self.head_pieces = 16
        self.reps = 7
        self.threads = (1, 2)
        self.settings = [(1, 1), (2, 1), (4, 1), (8, 1), (1, 2), (2, 2), (1, 4)]  # (units, chunks) run for real
        self.interpreter_batches = 4
        if quick:
            self.settings, self.interpreter_batches = [(1, 1), (2, 2)], 1
            self.rows = sorted({2, min(8, top), top})
            self.steps, self.tokens, self.head_pieces, self.reps = (3, 8), (64, 256), 4, 2
            self.elements, self.copy_bytes = (1 << 12, 1 << 14), (1 << 12, 1 << 16)


# ---- one component at a time (also run by the background process of calibrate_ranks) ----
def lstm_points(in_dim: int, hidden: int, dtype, sizes: Sizes) -> dict:
    torch.manual_seed(0)
    lstm = torch.nn.LSTM(in_dim, hidden, batch_first=True).to(dtype)
    out = {"fused_fwd": [], "fused_bwd": [], "packed_fwd": [], "packed_bwd": []}
    for rows in sizes.rows:
        for steps in sizes.steps:
            x = torch.randn(rows, steps, in_dim, dtype=dtype, requires_grad=True)
            state = tuple(torch.randn(1, rows, hidden, dtype=dtype, requires_grad=True) for _ in range(2))
            lengths = np.full(rows, steps, dtype=np.int64)
            for name, run in (("fused", lambda: lstm(x, state)), ("packed", lambda: run_packed(lstm, x, lengths, state))):
                out[f"{name}_fwd"].append([rows, steps, timed_ms(run, sizes.reps)])

                def backward(y, run=run):
                    torch.autograd.backward(y[0], torch.ones_like(y[0]))
                out[f"{name}_bwd"].append([rows, steps, timed_ms(backward, sizes.reps, setup=run)])
    return out


def embedding_points(dims: ModelDims, dtype, sizes: Sizes) -> dict:
    torch.manual_seed(0)
    out = {}
    for side, vocab in (("src", dims.src_vocab), ("tgt", dims.tgt_vocab)):
        table = torch.nn.Embedding(vocab, dims.emb).to(dtype)
        fwd, bwd = [], []
        for tokens in sizes.tokens:
            ids = torch.randint(4, vocab, (1, tokens))
            fwd.append([tokens, timed_ms(lambda: table(ids), sizes.reps)])
            bwd.append([tokens, timed_ms(lambda y: y.backward(torch.ones_like(y)), sizes.reps, setup=lambda: table(ids))])
        out[f"{side}_fwd"], out[f"{side}_bwd"] = fwd, bwd
    return out


def mask_points(dtype, sizes: Sizes) -> list:
    def draw(n):
        return keep_mask((n,), 0.8, 12345).to(dtype).mul_(1.25)
    return [[n, timed_ms(lambda: draw(n), sizes.reps)] for n in sizes.elements]


def copy_points(sizes: Sizes) -> list:
    out = []
    for nbytes in sizes.copy_bytes:
        src, dst = torch.randn(nbytes // 4), torch.empty(nbytes // 4)
        out.append([2 * nbytes, timed_ms(lambda: dst.copy_(src), sizes.reps)])  # bytes read + written
    return out


def head_pieces(cfg, global_batch: int, sizes: Sizes) -> list:
    """Pieces of real batches (rows sorted by length, as units and shards are) of several sizes."""
    stream = BatchStream(ParallelData(cfg.data.dir, "train"), max_sentences=global_batch,
                         max_tokens=cfg.data.max_tokens, seed=cfg.train.seed, bucket_batches=cfg.data.bucket_batches,
                         min_batch=cfg.data.min_batch_sentences)
    pieces = []
    for i in range(sizes.head_pieces):
        batch = stream.next()
        rows = sizes.rows[i % len(sizes.rows)]
        start = (i * 7) % max(1, batch.size - rows + 1) if batch.size > rows else 0
        pieces.append(batch.rows(start, min(batch.size, start + rows)))
    return pieces


def head_points(cfg, dims: ModelDims, dtype, pieces: list, sizes: Sizes) -> list:
    torch.manual_seed(0)
    head = build_head(cfg.model, dims.tgt_vocab).to(dtype)
    tuning.configure_head(head, cfg.train, torch.device("cpu"))  # the chunk and projection training would run
    out = []
    for piece in pieces:
        enc = torch.randn(piece.size, piece.src.shape[1], dims.hidden, dtype=dtype, requires_grad=True)
        dec = torch.randn(piece.size, piece.tgt_in.shape[1], dims.hidden, dtype=dtype, requires_grad=True)
        keys = DropoutKeys((1, 1, 0), piece.size, {"src": piece.src.shape[1], "tgt": piece.tgt_in.shape[1]})

        def step():
            loss, _ = head(enc, piece.src_mask, dec, piece.tgt_out, masks=keys.at(0, 0))
            (loss * 1e-3).backward()
        step()  # draws the mask once, as the first head of a micro-step does (priced separately)
        out.append([piece.size, int(piece.src.shape[1]), int(piece.tgt_in.shape[1]), piece.tgt_tokens,
                    timed_ms(step, sizes.reps)])
    return out


def micro_step_ms(batch, sizes: Sizes) -> float:
    """The interpreter's work before a micro-step's first instruction: the replica and its units cut."""
    return timed_ms(lambda: [batch.rows(a, a + 16) for a in range(0, batch.size, 16)], sizes.reps)


def interpreter_overhead(table: dict, dims: ModelDims, precision: str, threads: int, batches: list,
                         runs: list) -> dict:
    """{op: ms}: what one instruction of each type took in real one-rank micro-steps
    (calibrate_ranks.interpreter_runs) beyond what the layer tables price it at: the interpreter's
    and DeepSpeed's Python, the slicing, the bookkeeping of states and leaves. Least squares through
    the origin over every (units, chunks) setting."""
    from trainer.parallel.layout import LayoutSpec
    from trainer.planner.costs import MicroStepCosts
    from trainer.planner.profile import MeasuredDevice
    from trainer.planner.shapes import Cut, stages_of

    bare = {**table, "overhead": {**table["overhead"], "instruction_ms": {}, "micro_step_ms": 0.0}}
    device = MeasuredDevice({"_path": "calibration", "layers": {precision: {str(threads): bare}}}, precision, threads)
    residual: dict = {}
    for run in runs:
        spec = LayoutSpec("single", 1, 1, micro_batches=run["units"], time_chunks=run["chunks"])
        stages = stages_of(dims, spec)
        predicted: dict = {}
        for batch in batches:
            costs = MicroStepCosts(device, dims, spec, stages, Cut(batch, spec), 2 if precision == "bf16" else 4)
            for (_, ins), parts in costs.parts.items():
                predicted[ins.op] = predicted.get(ins.op, 0.0) + sum(parts.values())
        for op, (seconds, count) in run["ops"].items():
            r = residual.setdefault(op, [0.0, 0])
            r[0] += seconds - predicted.get(op, 0.0)
            r[1] += count
    return {op: round(max(0.0, 1000 * s / n), 5) for op, (s, n) in residual.items() if n}


def layer_table(build, cfg, dims, precision: str, threads: int, sizes: Sizes, pieces: list, batches: list,
                quick: bool) -> dict:
    """Every component's timings at one precision and thread count, and what the interpreter adds."""
    dtype = dtype_of(precision)
    torch.set_num_threads(threads)
    _say(f"{precision}, {threads} thread(s): layers")
    lstm_dims = sorted({(dims.pair_input(k), dims.hidden) for k in range(dims.layers)}
                       | ({(dims.emb, dims.hidden // 2)} if dims.bidirectional_bottom else set()))
    table = {"lstm": {f"{i}x{h}": lstm_points(i, h, dtype, sizes) for i, h in lstm_dims},
             "embedding": embedding_points(dims, dtype, sizes), "mask": mask_points(dtype, sizes),
             "copy": copy_points(sizes), "head": head_points(cfg, dims, dtype, pieces, sizes),
             "overhead": {"micro_step_ms": micro_step_ms(batches[0], sizes)}}
    opt = calibrate_ranks.optimizer_points(build, cfg, dims, precision, threads, quick)
    table["optimizer"], table["overhead"]["backward_ms"] = opt["points"], opt["backward_ms"]
    _say(f"{precision}, {threads} thread(s): the interpreter on one rank")
    runs = calibrate_ranks.interpreter_runs(build, cfg, dims, precision, threads, batches, sizes.settings)
    table["interpreter_runs"] = runs
    table["overhead"]["instruction_ms"] = interpreter_overhead(table, dims, precision, threads, batches, runs)
    return table


def calibrate(cfg, out_path: str, quick: bool = False, global_batch: int = 64) -> dict:
    """Measure and write the profile; `global_batch`: the largest head piece (rows) to time."""
    if os.path.exists(out_path):
        raise FileExistsError(f"--out {out_path}: exists; choose another path (calibration never overwrites a file)")
    if not os.path.isdir(os.path.dirname(os.path.abspath(out_path))):
        raise FileNotFoundError(f"--out {out_path}: no such directory")
    vocab = read_manifest(cfg.data.dir)["vocab"]
    dims = ModelDims.build(cfg.model, vocab["src_size"], vocab["tgt_size"])
    sizes = Sizes(quick, global_batch)
    if memory.allocator_in_use() != memory.training_allocator():
        _say(f"running under {memory.allocator_in_use()}, training under {memory.training_allocator()}: the prices "
             f"will be off (start it as python launch/plan.py --calibrate, which runs as training does)")
    load_before = os.getloadavg()
    others = cpu_threads.OthersClock()  # the load average after counts the calibration's own two processes
    started = time.time()
    threads_before = torch.get_num_threads()
    pieces = head_pieces(cfg, global_batch, sizes)
    stream = BatchStream(ParallelData(cfg.data.dir, "train"), max_sentences=global_batch,
                         max_tokens=cfg.data.max_tokens, seed=cfg.train.seed + 1, bucket_batches=cfg.data.bucket_batches,
                         min_batch=cfg.data.min_batch_sentences)
    batches = [stream.next() for _ in range(sizes.interpreter_batches)]
    layers: dict = {"model": dims.describe()}
    build = calibrate_ranks.world_of_one(cfg)  # DeepSpeed's step and the interpreter, built as a run builds them
    try:
        for precision in ("bf16", "fp32"):
            layers[precision] = {str(threads): layer_table(build, cfg, dims, precision, threads, sizes, pieces,
                                                           batches, quick) for threads in sizes.threads}
    finally:
        build.close()
    torch.set_num_threads(threads_before)
    _say("two ranks at once (contention) and gloo transfers")
    contention = {p: calibrate_ranks.contention(cfg, dims, p, quick) for p in ("bf16", "fp32")}
    transfers = {"gloo": calibrate_ranks.transfers(cfg, quick)}
    name = tuning.cpu_name()
    profile = {
        "device": {"name": name, "type": "cpu", "cores": os.cpu_count(), "torch": torch.__version__},
        "measured_on": stamp(f"{name} ({os.cpu_count()} cores)"),
        "datasheet": None,
        "layers": layers, "contention": contention, "transfers": transfers,
        "measured_by": f"python launch/plan.py --calibrate --config CONFIG --out {os.path.basename(out_path)}"
                       + (" --quick" if quick else ""),
        "conditions": conditions(load_before, os.getloadavg(), others.cores(), time.time() - started, quick),
        "sources": {"layers": "measured: the model's own modules (nn.LSTM fused and packed, Embedding, the head with "
                              "keyed dropout, keep_mask, DeepSpeed's optimizer step) on random data of the model's "
                              "sizes and on pieces of real batches; median of repeats after warm-up",
                    "contention": "measured: each component alone and while a second process runs the same component "
                                  "on the other core (1 thread each); the ratio. 'step': a whole training step of "
                                  "the model, the ceiling's measurement; the planner applies it to every component",
                    "transfers": "measured: two processes through ParallelRuntime on loopback gloo (the trainer's verbs)"},
    }
    if "warning" in profile["conditions"]:
        _say(profile["conditions"]["warning"])
    with files.replace(out_path, "the device profile", flag="--out", ours=lambda _: False) as f:  # never over a file
        f.write(json.dumps(profile, indent=1) + "\n")
    _say(f"wrote {out_path} in {profile['conditions']['seconds']} s")
    return profile


def conditions(load_before, load_after, beside: dict | None, seconds: float, quick: bool) -> dict:
    """What the numbers were measured under, and a warning where the machine was not quiet: other processes (or
    the hypervisor) taking over QUIET_OTHERS cores meanwhile; where /proc/stat cannot say, a load average over
    QUIET_LOAD before it."""
    out = {"load_average_before": [round(x, 2) for x in load_before],
           "load_average_after": [round(x, 2) for x in load_after], "seconds": round(seconds, 1), "quick": quick,
           "allocator": memory.allocator_in_use(), "beside": beside}
    # what ran beside it decides where it is known: a load average before it also counts work that just ended
    # (a validation's calibration right after another's runs read 1.64 with 0.005 cores used beside it)
    out["quiet"] = (load_before[0] <= QUIET_LOAD if beside is None else max(beside.values()) <= QUIET_OTHERS)
    if not out["quiet"]:
        why = (f"load average {load_before[0]:.1f} > {QUIET_LOAD} before it" if beside is None else
               f"other processes took {beside['others']:.2f} cores and the hypervisor {beside['steal']:.2f} during "
               f"it (> {QUIET_OTHERS})")
        out["warning"] = f"{why}: measured on a busy machine, the numbers are not worth planning with"
    return out


def _say(msg: str) -> None:
    print(f"calibrate: {msg}", flush=True)

