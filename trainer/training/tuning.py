"""Settings whose best value depends on the machine, measured on the machine itself (not guessed from its
vendor's name), once, and cached.

`train.loss_chunk_rows=0` (the default) on a CPU: the rows of logits the head's loss works on at a time
(trainer.model.seq2seq._chunked_loss). A chunk's logits should stay in cache while the softmax, the loss
and the logits' gradient pass over them, and the GEMMs that make and consume them should be large enough
to run at speed; where that balance lies depends on the CPU's caches and matrix units (an AMD EPYC and an
Intel Xeon with AMX disagree), the precision, the threads and the vocabulary. So it is timed here, on the
loss itself at the model's width and vocabulary, for a few candidate sizes (well under a second each at
enja-small), and the fastest is kept in a cache file keyed by what decides it. On an accelerator it is
8192 (each chunk costs ~15 launches there: as few chunks as memory allows).

`train.loss_projection=auto` (the default) on a CPU: whether the loss's output projection runs as one GEMM
per chunk or one GEMM over all rows (then the chunks' passes in place). A GEMM per call packs the weight
again, which in fp32 on an AMD EPYC costs more than the chunks' cache gains, and in bf16 does not; so both
are timed at the chosen chunk, as above, and the faster is cached. On an accelerator: whole.

bf16 against fp32 on a CPU: with AMX (Intel Xeon) or fast bf16 units a bf16 step is much cheaper; on a CPU
without them (an Intel Xeon that exposes AVX-512-bf16 but no AMX: a whole enja-small step 1.36x slower than
fp32, docs/BENCHMARKS.md) it is dearer, and on an AVX2-only AMD EPYC, where PyTorch emulates it, 47x dearer. A run
in bf16 times one GEMM of the model's width in both precisions on one core, once per machine (cached), and says so
when bf16 is the slower: the precision changes the numbers, not only the speed, so it stays the user's choice, unless the
JSON says `"bf16": {"enabled": "auto"}` (bf16_choice), as the quickstart's does.
"""
from __future__ import annotations

import json
import os
import platform
import time

import torch

from data_prep.dataformat import files, userfiles
from trainer.model.seq2seq import LOSS_CHUNK_ROWS, projected_cross_entropy

CANDIDATES = (128, 256, 512, 1024)
PROJECTIONS = ("chunked", "whole")
TOKENS = 1024  # target tokens of the timed loss: about half a 64-pair batch of enja-small
REPEATS = 3
MAX_CACHE_BYTES = 1 << 20


def cache_path() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "hybrid-nmt", "tuning.json")


def cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo's on Linux, where `platform.processor()` says only x86_64)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _key(width: int, vocab: int, dtype: torch.dtype) -> str:
    return (f"loss_chunk_rows|{cpu_name()}|threads {torch.get_num_threads()}|torch {torch.__version__}|"
            f"{str(dtype).replace('torch.', '')}|width {width}|vocab {vocab}")


def _read_cache() -> dict:
    try:
        data = userfiles.read_json(cache_path(), MAX_CACHE_BYTES, "the tuning cache")
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}  # no cache yet, or a damaged or foreign one: measure again


def _write_cache(key: str, value: int | float) -> None:
    """Add `key` to the cache file (a temporary file renamed in place: a reader never sees half of it).
    A cache that cannot be written costs a measurement next time, nothing else."""
    path = cache_path()
    data = _read_cache()
    data[key] = value
    try:
        files.make_dirs(os.path.dirname(path), "the cache directory")
        with files.replace(path, "the tuning cache", own=True) as f:  # our own file, read above
            f.write(json.dumps(data, indent=1, sort_keys=True))
    except OSError:
        pass


def time_loss_chunks(width: int, vocab: int, dtype: torch.dtype, candidates=CANDIDATES,
                     tokens: int = TOKENS, projections=("chunked",)) -> dict:
    """{(chunk rows, projection): seconds} of the chunked loss (forward with its gradients, as the head runs it)
    per candidate chunk and each of `projections` (train.loss_projection's chunked, whole), the best of REPEATS
    after one warm-up, on this process's threads; the cases take turns, so that a machine that slows down or
    speeds up meanwhile favours none of them."""
    cases = [(rows, proj) for rows in candidates for proj in projections]
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(tokens, width, generator=gen).to(dtype)
    weight = (torch.randn(vocab, width, generator=gen) * width ** -0.5).to(dtype).requires_grad_(True)
    bias = torch.zeros(vocab, dtype=dtype, requires_grad=True)
    hidden.requires_grad_(True)
    target = torch.randint(4, vocab, (tokens,), generator=gen)
    out = {case: float("inf") for case in cases}
    for rep in range(REPEATS + 1):
        for rows, proj in cases:
            start = time.perf_counter()
            loss, _ = projected_cross_entropy(hidden, weight, bias, target, 0.1, rows, proj == "whole")
            loss.backward()
            if rep:  # the first turn warms up
                out[rows, proj] = min(out[rows, proj], time.perf_counter() - start)
            hidden.grad = weight.grad = bias.grad = None
    return out


def loss_chunk_rows(configured: int, device: torch.device, width: int, vocab: int, dtype: torch.dtype
                    ) -> tuple[int, str]:
    """The loss chunk to run with, and where it came from (for the run's log)."""
    if configured:
        return configured, "train.loss_chunk_rows"
    if device.type != "cpu":
        return LOSS_CHUNK_ROWS["accelerator"], "the accelerator's default"
    return _fastest(_key(width, vocab, dtype), lambda v: isinstance(v, int) and v in CANDIDATES,
                    lambda: {rows: s for (rows, _), s in time_loss_chunks(width, vocab, dtype).items()})


def loss_projection(configured: str, device: torch.device, width: int, vocab: int, dtype: torch.dtype, rows: int
                    ) -> tuple[str, str]:
    """train.loss_projection to run with ('chunked' or 'whole') at a chunk of `rows`, and where it came from."""
    if configured != "auto":
        return configured, "train.loss_projection"
    if device.type != "cpu":
        return "whole", "the accelerator's default"
    key = f"loss_projection|{_key(width, vocab, dtype).split('|', 1)[1]}|rows {rows}"
    return _fastest(key, lambda v: v in PROJECTIONS, lambda: {
        proj: s for (_, proj), s in time_loss_chunks(width, vocab, dtype, candidates=(rows,),
                                                      projections=PROJECTIONS).items()})


def _fastest(key: str, valid, time_options) -> tuple:
    """(the fastest option of `time_options()` ({option: seconds}), where it came from), cached under `key`; the
    cache's value when `valid(value)`, without measuring."""
    spread = {}

    def measure():
        spread.update(time_options())
        return min(spread, key=spread.get)

    best, fresh = _cached(key, valid, measure)
    if not fresh:
        return best, f"measured on this machine earlier ({cache_path()})"
    shown = ", ".join(f"{option}: {1000 * s:.1f} ms" for option, s in spread.items())
    return best, f"measured now ({shown}; cached in {cache_path()})"


def head_settings(train_cfg, device: torch.device, width: int, vocab: int, dtype: torch.dtype
                  ) -> tuple[int, str, str, str]:
    """(loss chunk rows, where from, loss projection, where from) for a head of this shape on `device`: what a
    training run takes (train.loss_chunk_rows, train.loss_projection; measured where they are 0 / auto)."""
    rows, origin = loss_chunk_rows(train_cfg.loss_chunk_rows, device, width, vocab, dtype)
    projection, projection_origin = loss_projection(train_cfg.loss_projection, device, width, vocab, dtype, rows)
    return rows, origin, projection, projection_origin


def configure_head(head, train_cfg, device: torch.device) -> None:
    """Give `head` (an AttentionSoftmaxHead, in its final dtype) the loss settings a training run on `device`
    would: for a measurement that should time what training runs (the planner's calibration)."""
    rows, _, projection, _ = head_settings(train_cfg, device, head.proj.in_features, head.proj.out_features,
                                           head.proj.weight.dtype)
    head.loss_chunk_rows, head.loss_projection = rows, projection


def _cached(key: str, valid, measure):
    """(value, measured now?): the cache's value for `key` when `valid(value)`, else `measure()`, cached."""
    cached = _read_cache().get(key)
    if valid(cached):
        return cached, False
    value = measure()
    _write_cache(key, value)
    return value, True


BF16_SLOWER = 1.15  # bf16 time over fp32 time above which a bf16 run is told


GEMM_ROUNDS = 7  # turns of each precision after a warm-up turn, at most ...
GEMM_BUDGET_S = 1.0  # ... and no more once the timed turns (at least 2) have taken this long
GEMM_TURN_S = 0.002  # a precision's turn: calls until it has taken this long (one call at least)
GEMM_LONG_S = 0.05  # a call this long is the GEMM's own time (a stall of milliseconds is a few % of it): no repeats


def gemm_seconds(width: int, dtypes, rows: int = 512, rounds: int = GEMM_ROUNDS) -> dict:
    """{dtype: seconds of one (rows x width) @ (width x 4 width) product} (an LSTM layer's input GEMM) on this
    process's threads: the fastest single call of each dtype, the dtypes taking turns (calls timed one by one
    until the turn has lasted GEMM_TURN_S, two at least) for `rounds` turns after a warm-up turn; fewer where every
    call takes GEMM_LONG_S or the turns take GEMM_BUDGET_S (an emulated bf16 at a large width: seconds a call). At
    a small width a call takes microseconds, while a thread pool waking up or another process taking the core (a
    test suite, a second rank) costs milliseconds (an fp32 call at width 32 on 2 threads beside a test suite: 34 us
    at best, 43 us the median, 38 ms the worst of 200): the best of three calls, one dtype after the other, once
    gave fp32 8x bf16's time on an AVX2-only CPU that emulates bf16 at 27x fp32's, and the cache kept it. The
    fastest of hundreds of calls is the machine's."""
    gen = torch.Generator().manual_seed(0)
    a32 = torch.randn(rows, width, generator=gen)
    b32 = torch.randn(width, 4 * width, generator=gen)
    pairs = {dtype: (a32.to(dtype), b32.to(dtype)) for dtype in dtypes}
    best = {dtype: float("inf") for dtype in dtypes}
    timed_from = 0.0
    for turn in range(rounds + 1):
        if turn == 1:
            timed_from = time.perf_counter()
        elif turn > 1 and (all(t >= GEMM_LONG_S for t in best.values())
                           or turn > 2 and time.perf_counter() - timed_from > GEMM_BUDGET_S):
            break  # calls this long are not a wake-up's microseconds
        for dtype, (a, b) in pairs.items():
            turn_start, calls = time.perf_counter(), 0
            while True:
                start = time.perf_counter()
                torch.mm(a, b)
                end = time.perf_counter()
                if turn:  # the first turn warms up
                    best[dtype] = min(best[dtype], end - start)
                calls += 1
                if end - start >= GEMM_LONG_S or (end - turn_start >= GEMM_TURN_S and calls >= min(turn + 1, 2)):
                    break  # (two calls at least: a turn's first call may pay for the other dtype's)
    return best


def bf16_over_fp32(width: int) -> tuple[float, str]:
    """(bf16 time over fp32 time of a GEMM of the model's width on one core of this CPU, where from): measured once
    per CPU, torch and width, then cached. On one thread, whatever the run's: the question is whether the core has
    fast bf16 units, and a product on several threads waits at every call for each of them to run, which beside other
    work (a second rank, a test suite) is most of an fp32 call's time at a small width (on 2 threads of an AVX2-only
    EPYC beside a test suite, the fastest of hundreds of fp32 calls at width 32 took 799 us in one process and 34 us
    in the next, bf16's 1,480 us both times). (A value cached by the earlier timing, of three calls on the run's
    threads, is under another key and measured again.)"""
    key = f"bf16_over_fp32 one thread|{cpu_name()}|torch {torch.__version__}|width {width}"

    def measure() -> float:
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            t = gemm_seconds(width, (torch.bfloat16, torch.float32))
        finally:
            torch.set_num_threads(threads)
        return round(t[torch.bfloat16] / t[torch.float32], 3)

    ratio, fresh = _cached(key, lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < 10000,
                           measure)
    return ratio, "measured now" if fresh else "measured on this machine earlier"


def bf16_choice(device_type: str, width: int) -> tuple[bool, str]:
    """`"bf16": {"enabled": "auto"}` decided for this device: (bf16?, the line that says why). CUDA: bf16 where
    the GPU has it (torch.cuda.is_bf16_supported: Ampere and later), fp32 elsewhere (fp16 stays an explicit
    choice: it needs loss scaling). A CPU: bf16 where a GEMM of the model's width runs in it at most BF16_SLOWER
    times fp32's time (AMX, AVX-512 bf16: faster; an AVX2-only AMD EPYC, where PyTorch emulates bf16: 47x
    slower, and its LSTM leaves oneDNN), else fp32. Other accelerators: bf16."""
    if device_type == "cuda":
        on = torch.cuda.is_bf16_supported()
        why = "the GPU " + ("runs bf16" if on else "has no bf16 (before Ampere; fp16 with loss scaling is a choice)")
    elif device_type == "cpu":
        ratio, origin = bf16_over_fp32(width)
        on = ratio <= BF16_SLOWER
        why = f"a bf16 GEMM at width {width} takes {ratio:.2f}x fp32's time on this CPU ({origin})"
    else:
        on, why = True, f"the {device_type} device"
    return on, f"precision: bf16.enabled=auto -> {'bf16' if on else 'fp32'}: {why}"


def precision_notes(device: torch.device, precision: str, width: int) -> list[str]:
    """One line for the run's log when it trains in bf16 (`precision`: bf16 | fp16 | fp32) on a CPU where bf16
    was measured slower than fp32."""
    if device.type != "cpu" or precision != "bf16":
        return []
    ratio, origin = bf16_over_fp32(width)
    if ratio < BF16_SLOWER:
        return []
    return [f"note: bf16 is {ratio:.1f}x slower than fp32 on this CPU (a GEMM at width {width}, {origin}; no AMX?): "
            f"\"bf16\": {{\"enabled\": false}} (or \"auto\") in the DeepSpeed JSON may train faster"]


def stack_layers(configured: str, device: torch.device, precision: str, residual: bool = False) -> tuple[bool, str]:
    """train.stack_layers as it applies, and why. auto: one call per side for fp32 on CUDA, where cuDNN's 4-layer
    stack took 30.5 ms forward and backward against 36.1 for the layers one at a time; a call per layer elsewhere:
    in bf16 the stack launched 20% more kernels on a host-bound step (19.9 against 17.0-18.3 ms; the patent run
    35.0 against 30.8 ms per step), and on a CPU they are level (H200 and Intel Xeon, 2026-12-04:
    benchmarks/results/gpu/2026-12-04-v2, docs/gpu.md). `residual` (model.residual): a call per layer, whatever is
    configured (trainer.config refuses on with it)."""
    if residual:
        return False, f"train.stack_layers={configured}: by layer (model.residual adds between the layers)"
    if configured != "auto":
        return configured == "on", f"train.stack_layers={configured}"
    on = device.type == "cuda" and precision == "fp32"
    return on, f"train.stack_layers=auto: {'stacked' if on else 'by layer'} for {precision} on {device.type}"


def set_tf32(on: bool, device: torch.device) -> list[str]:
    """train.tf32 applied to torch's two switches (cuBLAS matmuls and cuDNN, which torch leaves on by default for
    cuDNN alone), and said: on CUDA what fp32 work runs in, elsewhere nothing."""
    torch.backends.cuda.matmul.allow_tf32 = on
    torch.backends.cudnn.allow_tf32 = on
    if device.type != "cuda":
        return []
    runs_in = "in TF32" if on else "in full fp32 (TF32 off)"
    return [f"tf32: fp32 matmuls and cuDNN {runs_in} (train.tf32={str(on).lower()}; bf16 and fp16 work is not affected)"]


class CompileRefused(ValueError):
    """train.compile_head where it is not known to train correctly."""


def compile_head(head, device: torch.device) -> None:
    """train.compile_head: the head's loss (AttentionSoftmaxHead.token_loss: tensors in, its dropout mask drawn
    before) compiled by torch.compile with dynamic shapes: one graph for every token count and width (the loss's
    chunk loop guards only its number of chunks). Refused on CUDA: the first GPU check (2026-12-04) trained nothing
    with the head's forward compiled (grad norm 0 at every step), and compiled and eager have not yet been shown
    equal there (the GPU check's compile gate, benchmarks/gpu/gpu_gates.py, compares them)."""
    if device.type == "cuda":
        raise CompileRefused("train.compile_head=true is refused on CUDA: the GPU check of 2026-12-04 trained "
                             "nothing with it (grad norm 0 at every step), and its compiled/eager gate has not passed "
                             "on a GPU since; train without it (the eager head is the one checked there)")
    head.token_loss = torch.compile(head.token_loss, dynamic=True)


class GraphsRefused(ValueError):
    """train.cuda_graphs=on where there is no CUDA."""


def check_cuda_graphs(setting: str, device_type: str) -> None:
    """train.cuda_graphs=on needs CUDA: refused in one line before anything starts (a dry run too)."""
    if setting == "on" and device_type != "cuda":
        raise GraphsRefused(f"train.cuda_graphs=on needs CUDA, and this process would train on {device_type}: use "
                            f"auto (graphs where CUDA is, eager elsewhere) or off")


def graph_cache(setting: str, device: torch.device, rank: int):
    """train.cuda_graphs as it applies on this rank: a GraphCache of CUDA graphs (auto: each new shape proved
    against eager first), or None (off, or auto without CUDA: the eager step, unchanged)."""
    if setting == "off" or device.type != "cuda":
        return None
    from trainer.model.graphs import CudaBackend, GraphCache

    return GraphCache(CudaBackend(), prove=setting == "auto", say=lambda text: print(f"rank {rank}: {text}", flush=True))


def graph_notes(setting: str, device: torch.device) -> list[str]:
    if setting == "off":
        return []
    if device.type != "cuda":
        return [f"cuda_graphs: train.cuda_graphs={setting} without CUDA: the eager step"]
    proof = "; each new shape proved against eager first" if setting == "auto" else ""
    return [f"cuda_graphs: the decoder stack and the head's loss replayed as CUDA graphs per batch shape "
            f"(train.cuda_graphs={setting}{proof}; not yet run on a GPU)"]
