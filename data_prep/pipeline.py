"""The streaming passes of `data_prep.prepare`, cut into chunks and spread over worker processes.

Work goes in chunks of `CHUNK` records. What happens to a chunk is a pure function of the chunk (`CleanTask`:
repairs and text rules; `EncodeTask`: SentencePiece and the piece rules), computed in any of `--workers`
processes; the results are consumed in input order by the main process, which alone holds state: the
duplicate tables (data_prep.dedup), the counters, rejects.tsv and the output files. Chunk boundaries do not
depend on the number of workers, so the output is byte-identical for any --workers. At most 2 x workers + 1
chunks are in flight: memory does not grow with the corpus.

Workers are forked (on Linux; spawned elsewhere) when there is more than one chunk; `--workers 1` and inputs of
one chunk run everything in the main process. SentencePiece encodes with one thread per worker; its training
keeps its own fixed 2 threads (data_prep.vocab): a thread count that followed --workers might change the
model (floating-point sums split differently). On 2 cores, 2 workers beside the main process (reading,
deduplicating, writing) are ~1.5x faster end to end than one process, and 3 are no faster than 2
(docs/BENCHMARKS.md, section 5).
"""
from __future__ import annotations

import multiprocessing
import os
import signal
import sys
from collections import Counter, deque
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from itertools import chain, islice
from typing import Callable, Iterable, Iterator, Optional, TypeVar

import numpy as np
import sentencepiece as spm
from tqdm import tqdm

from . import files, numbers
from .binary import SIDES, TOKEN_DTYPE, UNK_ID, TokenArrayWriter
from .clean import CleaningOptions, Cleaner, dedup_keys
from .dedup import Deduplicator
from .filters import LengthFilter
from .readers import Malformed, Pair, Reader
from .vocab import read_model, sample_flags

from .rejects import RejectLog, SplitStats
from .tsv import parse_tsv_line

CHUNK = 2000  # records per task: large enough to amortise the transfer, small enough to keep memory flat
CHUNK_CHARS = 8 << 20  # ... and at most this much text per task, however long the lines (hostile input)
Local, Payload, Result = TypeVar("Local"), TypeVar("Payload"), TypeVar("Result")


def default_workers() -> int:
    """One worker per core this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


# --- order-preserving parallel map ----------------------------------------------------------------------------

_TASK: Optional[Callable] = None  # a worker process's task, installed once per pool


def _install(task: Callable) -> None:
    global _TASK
    _TASK = task
    # The main process handles Ctrl-C and SIGTERM (it removes its staging directory); workers leave quietly.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _run(payload):
    return _TASK(payload)


def parallel_map(task: Callable[[Payload], Result], items: Iterable[tuple[Local, Payload]],
                 workers: int, position: Optional[Position] = None) -> Iterator[tuple[Local, Result]]:
    """(local, task(payload)) for each (local, payload) of `items`, in order. `local` stays in this process;
    `task` and the payloads go to the workers. At most 2 x workers payloads are in flight.

    A worker that ends abruptly (the kernel's OOM killer, a stray signal) breaks the pool: the payloads then in
    flight are sent again to a new pool, at most POOL_RESTARTS times per call (one pass over a split), each said in
    one line on stderr; nothing is lost or repeated, because results are consumed in order and a task is a pure
    function of its payload. One more break is `WorkerLost`, naming how the worker ended.

    While the pool runs, `position.in_pool` tells prepare's signal handler not to raise: an exception raised
    inside the executor's `submit` (which holds its shutdown lock) deadlocks the executor's shutdown. A stop
    is then acted on here, between payloads."""
    items = iter(items)
    head = list(islice(items, 2))
    if workers <= 1 or len(head) < 2:
        for local, payload in chain(head, items):
            yield local, task(payload)
        return
    # fork: workers start in milliseconds with everything imported (the tasks are also picklable for spawn)
    context = multiprocessing.get_context("fork" if sys.platform.startswith("linux") else "spawn")
    check = position.check_stop if position is not None else (lambda: None)
    todo: Iterator = chain(head, items)
    if position is not None:
        position.in_pool = True
    try:
        for restart in range(POOL_RESTARTS + 1):
            pending: deque = deque()  # [local, payload, future] in order; future None until submitted
            try:
                yield from _pool_map(task, todo, workers, context, check, pending)
                return
            except BrokenProcessPool as e:
                ended = str(e)
            if restart == POOL_RESTARTS:
                raise WorkerLost(f"{ended} ({POOL_RESTARTS + 1} pools broken in this pass; the kernel's OOM killer "
                                 f"sends SIGKILL: lower --workers, or see `dmesg`)")
            print(f"prepare: {ended}; its {len(pending)} chunk(s) in flight go to a new pool of workers (restart "
                  f"{restart + 1} of at most {POOL_RESTARTS})", file=sys.stderr, flush=True)
            todo = chain([(local, payload) for local, payload, _ in pending], todo)
    finally:
        if position is not None:
            position.in_pool = False


POOL_RESTARTS = 2  # pools started again after a worker ended abruptly, per parallel_map call


class WorkerLost(RuntimeError):
    """A worker process ended abruptly once more than POOL_RESTARTS allow."""


def _pool_map(task: Callable, todo: Iterator, workers: int, context, check: Callable,
              pending: deque) -> Iterator[tuple]:
    """parallel_map's work in one pool; `pending` holds what was taken from `todo` and not yet yielded, so that a
    broken pool's work can be given to the next. A break is BrokenProcessPool saying how the worker ended."""
    with ProcessPoolExecutor(workers, mp_context=context, initializer=_install, initargs=(task,)) as pool:
        try:
            for local, payload in todo:
                check()
                pending.append([local, payload, None])
                pending[-1][2] = pool.submit(_run, payload)
                if len(pending) > 2 * workers:
                    yield _first_result(pending, check)
            while pending:
                yield _first_result(pending, check)
        except BrokenProcessPool as e:
            raise BrokenProcessPool(how_workers_ended(pool, e)) from e


def _first_result(pending: deque, check: Callable) -> tuple:
    local, _, future = pending[0]
    result = future.result()
    pending.popleft()
    check()
    return local, result


def how_workers_ended(pool: ProcessPoolExecutor, error: BaseException) -> str:
    """"a worker process (pid 123) ended by SIGKILL", from the exit codes of the broken pool's processes, once all
    have ended (the executor ends the others with SIGTERM: a code other than that comes first)."""
    processes = dict(getattr(pool, "_processes", None) or {})  # CPython's own, read only: {pid: Process}
    pool.shutdown(wait=True)  # (its manager thread joins every process)
    codes = [(code, pid) for pid, p in processes.items() if (code := p.exitcode) is not None]
    codes.sort(key=lambda c: c[0] == -signal.SIGTERM)
    if not codes:
        cause = str(error.__cause__ or "").strip().splitlines()
        return "a worker process ended abruptly" + (f" ({cause[-1][:300]})" if cause else "")
    code, pid = codes[0]
    how = f"by {signal.Signals(-code).name}" if code < 0 else f"with exit code {code}"
    return f"a worker process (pid {pid}) ended {how}"


def batched(items: Iterable, n: int, size: Optional[Callable] = None, max_size: int = CHUNK_CHARS) -> Iterator[list]:
    """Lists of `n` items; with `size`, a list is also cut once its items' sizes reach `max_size`."""
    it = iter(items)
    if size is None:
        while batch := list(islice(it, n)):
            yield batch
        return
    batch, total = [], 0
    for item in it:
        batch.append(item)
        total += size(item)
        if len(batch) == n or total >= max_size:
            yield batch
            batch, total = [], 0
    if batch:
        yield batch


def record_chars(record) -> int:
    """Characters of a reader's record (`Pair` or `Malformed`)."""
    return len(record.src) + len(record.tgt)


def row_chars(row) -> int:
    """Characters of a pass-2 row: a TSV line, or an (origin, src, tgt) tuple."""
    return len(row) if isinstance(row, str) else len(row[1]) + len(row[2])


class Stopped(BaseException):
    """SIGTERM or SIGINT: unwinds like Ctrl-C, so that prepare removes its staging directory."""


@dataclass
class Position:
    """How far prepare got, for the one-line message of an unexpected error (MemoryError, a bug) or a stop."""

    step: str = "starting"
    origin: str = ""  # the last record read
    # Set by prepare's signal handler, which also raises `Stopped`; checked per record read and between
    # steps, because an exception raised in a handler can be swallowed (when the signal lands in a callback
    # Python ignores exceptions from, e.g. an at-fork hook while the worker pool starts).
    stop_signal: str = ""
    publishing: bool = False  # moving the finished files into place: a signal then waits until it is done
    in_pool: bool = False  # parallel_map's worker pool runs: a signal is acted on between its payloads

    def __str__(self) -> str:
        return self.step + (f", after {self.origin}" if self.origin else "")

    def check_stop(self) -> None:
        if self.stop_signal:
            raise Stopped(self.stop_signal)


def tracked(records: Iterable, position: Optional[Position]) -> Iterator:
    if position is None:
        yield from records
        return
    for rec in records:
        if position.stop_signal:
            raise Stopped(position.stop_signal)
        position.origin = rec.origin
        yield rec


def progress(total: Optional[int], desc: str, unit: str) -> tqdm:
    return tqdm(total=total, desc=desc, unit=unit, disable=None, file=sys.stderr, leave=False)


# --- pass 1: repair, clean, deduplicate -----------------------------------------------------------------------

@dataclass
class CleanedChunk:
    outcomes: list[tuple[str, str, str, Optional[str]]]  # (origin, src, tgt, reason) in order
    per_pair: list[int]  # outcomes of each input pair (more than one with --long split)
    dedup_at: list[int]  # which outcomes the duplicate rules judge, and their keys:
    exact: np.ndarray
    near: np.ndarray
    repaired: Counter = field(default_factory=Counter)
    long_split: Counter = field(default_factory=Counter)


@dataclass
class CleanTask:
    """Repairs and text rules (`Cleaner.clean_text`) of a chunk of (origin, src, tgt)."""

    options: CleaningOptions
    train: bool

    def __call__(self, pairs: list[tuple[str, str, str]]) -> CleanedChunk:
        cleaner = Cleaner(self.options, self.train, deduplicate=False)  # duplicates: in input order, in clean_split
        outcomes, per_pair = [], []
        for origin, src, tgt in pairs:
            cleaned = cleaner.clean_text(origin, src, tgt)
            outcomes.extend(cleaned)
            per_pair.append(len(cleaned))
        which, exact, near = dedup_keys(outcomes)
        return CleanedChunk([(o.origin, o.src, o.tgt, o.reason) for o in outcomes], per_pair, which, exact, near,
                            cleaner.repaired, cleaner.long_split)


def clean_split(reader: Reader, task: CleanTask, dedup: Optional[Deduplicator], stats: SplitStats,
                rejects: RejectLog, on_error: str, workers: int, total: Optional[int],
                desc: str, position: Optional[Position] = None) -> Iterator[tuple[str, str, str]]:
    """Pass 1 of one split: (origin, src, tgt) of the pairs that are well-formed and pass the text rules and,
    with `dedup`, the duplicate rules; every other record is counted in `stats` and logged in `rejects`."""
    chunks = ((records, [(r.origin, r.src, r.tgt) for r in records if isinstance(r, Pair)])
              for records in batched(tracked(reader, position), CHUNK, record_chars))
    bar = progress(total, desc, " lines")
    for records, chunk in parallel_map(task, chunks, workers, position):
        stats.repaired.update(chunk.repaired)
        stats.long_split.update(chunk.long_split)
        reasons = {i: r for i, r in zip(chunk.dedup_at, dedup.reasons(chunk.exact, chunk.near)) if r} if dedup else {}
        per_pair, at = iter(chunk.per_pair), 0
        for rec in records:
            stats.pairs_read += 1
            if isinstance(rec, Malformed):
                if on_error == "fail" and rec.fatal:  # readers' selections (missing_lang, ...) never stop
                    raise rec.error()
                rejects.add(stats, rec.reason, rec.origin, rec.src, rec.tgt)
                continue
            n = next(per_pair)
            stats.pairs_read += n - 1  # --long split: each sentence pair counts as read
            for i in range(at, at + n):
                origin, src, tgt, reason = chunk.outcomes[i]
                reason = reason or reasons.get(i)
                if reason:
                    rejects.add(stats, reason, origin, src, tgt)
                else:
                    yield origin, src, tgt
            at += n
        bar.update(len(records))
    bar.close()


# --- between the passes: the SentencePiece and ratio samples --------------------------------------------------

def read_samples(pairs_tsv: str, n: int, spm_sample: int, ratio_sample: int, seed: int, src_file: str,
                 tgt_file: str, segmenters: Optional[dict] = None, number_slots: int = 0) -> list[tuple[str, str]]:
    """One read of the `n` kept training pairs: writes a seeded sample of `spm_sample` of them to the
    SentencePiece input files (data_prep.vocab.sample_files) -- with number placeholders if `number_slots`
    (data_prep.numbers), each side's lines through its word segmenter if `segmenters` has one
    (data_prep.vocab.word_segmenter) -- and returns another of `ratio_sample` pairs (as read)."""
    segmenters = segmenters or {}
    seg_src, seg_tgt = (segmenters.get(side) or (lambda text: text) for side in ("src", "tgt"))
    spm_flags, ratio_flags = sample_flags(n, spm_sample, seed), sample_flags(n, ratio_sample, f"ratio:{seed}")
    ratio_pairs = []
    fs = files.create(src_file, "a SentencePiece sample")
    ft = fs if tgt_file == src_file else files.create(tgt_file, "a SentencePiece sample")
    with files.text_reader(files.open_read(pairs_tsv, "the kept training pairs")) as f, fs, ft:
        for line, for_spm, for_ratio in zip(f, spm_flags, ratio_flags):
            if for_spm or for_ratio:
                _, src, tgt = parse_tsv_line(line)
                if for_spm:
                    masked = numbers.mask_pair(src, tgt, number_slots)
                    fs.write(seg_src(masked[0]) + "\n")
                    ft.write(seg_tgt(masked[1]) + "\n")
                if for_ratio:
                    ratio_pairs.append((src, tgt))
    return ratio_pairs


# --- pass 2: encode, length rules, binarize -------------------------------------------------------------------

@dataclass
class EncodedChunk:
    tokens: dict[str, np.ndarray]  # side -> ids of the kept pairs, concatenated
    lengths: dict[str, np.ndarray]  # side -> ids per kept pair
    unk: dict[str, int]
    rejected: list[tuple[str, str, str, str]]  # (reason, origin, src, tgt) in order


@dataclass
class EncodeTask:
    """SentencePiece-encode a chunk of pairs and apply the piece rules (`lengths`; None: keep all).
    `tsv`: the chunk is lines of the temporary TSV, else (origin, src, tgt) tuples."""

    model_files: dict[str, str]
    lengths: Optional[LengthFilter]
    tsv: bool
    number_slots: int = 0  # encode with number placeholders (data_prep.numbers); rejects keep the text as read

    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items() if k != "_models"}  # workers load their own

    def models(self) -> dict[str, spm.SentencePieceProcessor]:
        if "_models" not in self.__dict__:
            self._models = {side: spm.SentencePieceProcessor(model_proto=read_model(path), num_threads=1)
                            for side, path in self.model_files.items()}
        return self._models

    def __call__(self, rows: list) -> EncodedChunk:
        pairs = [parse_tsv_line(r) for r in rows] if self.tsv else rows
        models = self.models()
        texts = [numbers.mask_pair(p[1], p[2], self.number_slots) for p in pairs]  # (0 slots: as they are)
        ids = {side: models[side].encode([t[k] for t in texts]) for k, side in enumerate(SIDES)}
        rejected = []
        if self.lengths:
            keep = []
            for p, src_ids, tgt_ids in zip(pairs, ids["src"], ids["tgt"]):
                reason = self.lengths.reason(len(src_ids), len(tgt_ids))
                keep.append(not reason)
                if reason:
                    rejected.append((reason, *p))
            if rejected:
                ids = {side: [x for x, k in zip(side_ids, keep) if k] for side, side_ids in ids.items()}
        lengths = {side: np.fromiter(map(len, ids[side]), np.int64, len(ids[side])) for side in SIDES}
        tokens = {side: np.fromiter(chain.from_iterable(ids[side]), TOKEN_DTYPE, int(lengths[side].sum()))
                  for side in SIDES}
        return EncodedChunk(tokens, lengths, {s: int(np.count_nonzero(tokens[s] == UNK_ID)) for s in SIDES}, rejected)


def encode_split(rows: Iterable, task: EncodeTask, stage: str, split: str, stats: SplitStats, rejects: RejectLog,
                 workers: int, total: int, position: Optional[Position] = None) -> None:
    """Pass 2 of one split: encode `rows` (see `EncodeTask`) and append the kept pairs to `{split}.{src,tgt}`."""
    writers = {side: TokenArrayWriter(stage, split, side) for side in SIDES}
    bar = progress(total, f"encode {split}", " pairs")
    for n, chunk in parallel_map(task, ((len(b), b) for b in batched(rows, CHUNK, row_chars)), workers,
                                 position):
        for reason, origin, src, tgt in chunk.rejected:
            rejects.add(stats, reason, origin, src, tgt)
        for side in SIDES:
            writers[side].append_many(chunk.tokens[side], chunk.lengths[side])
            stats.tokens[side] += len(chunk.tokens[side])
            stats.unk[side] += chunk.unk[side]
        stats.pairs_kept += len(chunk.lengths["src"])
        bar.update(n)
    bar.close()
    for w in writers.values():
        w.close()
