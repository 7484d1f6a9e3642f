"""What launch/translate.py, evaluate.py, score.py and average.py call: one process, no launcher.

Models: `--run RUN_DIR` with one or more `--checkpoint` (best | last | a checkpoint directory), or one or
more `--model FILE` (launch/export.py, launch/average.py); several make an ensemble. They run on CUDA when
torch sees a GPU, else on the CPU (`--device` chooses).

translate output (one input line -> one output line, or K with --n-best K; lines are never split or merged):
    plain        HYPOTHESIS
    --n-best K   INDEX<TAB>SCORE<TAB>HYPOTHESIS        K lines per input line, best first; INDEX counts input
                                                       lines from 0; SCORE = log p / (pieces + 1)^length_penalty
                                                       (a line cut into segments: summed, +1 per segment)
    --alignments ...<TAB>ALIGNMENT                     a last column of "s-t" pairs: target piece t attended most
                                                       to source piece s (SentencePiece pieces of the normalised
                                                       source and of the hypothesis, from 0; Pharaoh format)
score output (launch/score.py): LOGPROB<TAB>TOKENS<TAB>PER_TOKEN per pair (natural log of p(ref | src), target
pieces + end of sentence, their ratio), or one JSON object per line with --json.

Every file goes through the file layer (data_prep.files): inputs are regular files only; an output is written to a
temporary file renamed into place at the end, never onto a file the command reads (its input, its reference, a
model or checkpoint file it loads: compared by device and inode), never into the run it loads from (its
checkpoints and the trainer's files), and never through a link. Each command runs as one `files.command()`.
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import sys
import time
from dataclasses import dataclass
from typing import IO, Iterator

from data_prep.dataformat import files

INPUT_CHUNK = 256  # lines read before decoding when --buffer-size is not given
MAX_BUFFER_LINES = 1_000_000  # --buffer-size: lines held in memory at once


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    model = p.add_mutually_exclusive_group(required=True)
    model.add_argument("--run", help="run directory written by launch/train.py")
    model.add_argument("--model", action="append", help="a model file written by launch/export.py or "
                                                        "launch/average.py; repeat for an ensemble")
    p.add_argument("--checkpoint", action="append", help="with --run: best (default) | last | a checkpoint "
                                                         "directory; repeat for an ensemble")
    p.add_argument("--allow-unverified", action="store_true",
                   help="with --run: load a checkpoint without (or with a malformed) manifest.json, unchecked")
    p.add_argument("--device", default=None, help="cuda | cpu | cuda:N (default: cuda when available)")


def add_decode_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--beam", type=int, default=None, help="beam size (1 = greedy; default: decode.beam)")
    p.add_argument("--max-len-ratio", type=float, default=None,
                   help="longest hypothesis / source length (default: decode.max_len_ratio)")
    p.add_argument("--length-penalty", type=float, default=None,
                   help="rank by log-prob / length^A (0 = raw log-prob; default: decode.length_penalty)")
    p.add_argument("--batch-size", type=int, default=None, help="sentences per batch (default: decode.batch_size)")
    p.add_argument("--max-tokens", type=int, default=None,
                   help="padded source pieces per batch, 0 = no cap (default: decode.max_tokens)")
    p.add_argument("--max-line-bytes", type=int, default=None,
                   help="an input line longer than this (UTF-8 bytes) is not translated: its output line is empty, "
                        "and it is counted and reported on stderr; 0 = no cap (default: decode.max_line_bytes, 65536)")


@dataclass(frozen=True)
class Models:
    """Which models to load (add_model_arguments' flags): a run's checkpoints or model files."""

    run: str | None
    files: list[str] | None
    checkpoints: list[str] | None
    allow_unverified: bool
    device: str | None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "Models":
        return cls(args.run, args.model, args.checkpoint, args.allow_unverified, args.device)


def decode_flags(args: argparse.Namespace) -> dict:
    """add_decode_arguments' flags (None: the model's config decides), for trainer.inference.options."""
    return dict(beam=args.beam, max_len_ratio=args.max_len_ratio, length_penalty=args.length_penalty,
                batch_size=args.batch_size, max_tokens=args.max_tokens, max_line_bytes=args.max_line_bytes)


def one_command(main):
    """`main` as one command of the file layer: its reads and protections are its own (files.command). Running
    out of memory (sizes within their limits that this machine still cannot hold) is one line saying which flags
    to lower, not the allocator's traceback."""
    @functools.wraps(main)
    def run(args) -> int:
        with files.command():
            try:
                return main(args)
            except (MemoryError, RuntimeError) as e:
                if not isinstance(e, MemoryError) and "allocate" not in str(e) and "out of memory" not in str(e):
                    raise
                said = (str(e).strip().splitlines() or [type(e).__name__])[0][-200:]
                raise ValueError(f"out of memory ({said}): lower --batch-size, --max-tokens or --beam") from None
    return run


def protect_run(run_dir: str) -> None:
    """Nothing this command writes lands in the run it reads: not in its checkpoints or the trainer's other
    directories (a checkpoint file written over fails its checksum; a new one makes the checkpoint fail `verify`),
    nor on the files the trainer writes (its config, data manifest, SentencePiece models, metrics, lock)."""
    from trainer.artifacts import run_dir as names

    for name in names.RUN_DIR_DIRS:
        files.protect(os.path.join(run_dir, name), f"the run's {name}/, which only the trainer writes")
    for name in names.RUN_DIR_FILES:
        files.protect(os.path.join(run_dir, name), "a file of the run, which only the trainer writes")


def load_translator(models: Models, decode: dict):
    """The Translator of `models` (several: an ensemble), its decoding options those of the (first) model's config
    with the `decode` flags, checked here, once, before any line is read."""
    from trainer.inference.loading import ensemble, load_export, load_run

    if models.files:
        if models.checkpoints:
            raise ValueError("--checkpoint goes with --run (a model file holds one set of weights)")
        members = [load_export(path, models.device, decode) for path in models.files]
        names = models.files
    else:
        protect_run(models.run)
        names = models.checkpoints or ["best"]
        members = [load_run(models.run, which, models.device, allow_unverified=models.allow_unverified,
                            decode=decode) for which in names]
    return members[0] if len(members) == 1 else ensemble(members, names)


class Oversized:
    """Input lines left untranslated for being longer than the cap: counted, and named on stderr at the end."""

    def __init__(self, translator):
        self.translator, self.cap = translator, translator.options.max_line_bytes
        self.lines: list[int] = []

    def note(self, chunk: list[str], first: int, skipped: list[int] = ()) -> None:
        """`chunk`: lines from line `first` + 1 on; `skipped`: positions in it already left out while reading."""
        self.lines += [first + i + 1 for i, line in enumerate(chunk)
                       if i in skipped or self.translator.oversized(line, self.cap)]

    def report(self, name: str) -> None:
        if self.lines:
            shown = ", ".join(map(str, self.lines[:10])) + (" ..." if len(self.lines) > 10 else "")
            print(f"warning: {len(self.lines)} line(s) of {name} longer than --max-line-bytes {self.cap} were not "
                  f"translated (their output lines are empty): line {shown}", file=sys.stderr, flush=True)


def read_chunks(stream: IO[bytes], name: str, size: int, cap: int = 0) -> Iterator[tuple[list[str], list[int]]]:
    """Lists of up to `size` lines ('\\n'-terminated only, as read_lines), decoded as UTF-8 with the line
    number in the error, and the positions in the list of lines longer than `cap` bytes (0: no cap): those are
    given as "" and never held in memory whole (read past in 64 KiB pieces, like prepare's readers)."""
    chunk: list[str] = []
    oversized: list[int] = []
    number = 0
    while True:
        raw = stream.readline(cap + 1) if cap else stream.readline()
        if not raw:
            break
        number += 1
        if cap and len(raw) == cap + 1 and not raw.endswith(b"\n"):  # more than `cap` bytes before the newline
            while raw and not raw.endswith(b"\n"):
                raw = stream.readline(1 << 16)
            oversized.append(len(chunk))
            chunk.append("")
        else:
            try:
                chunk.append(raw.decode("utf-8").rstrip("\n").rstrip("\r"))
            except UnicodeDecodeError as e:
                raise ValueError(f"{name}:{number}: not UTF-8 ({e.reason} at byte {e.start})") from None
        if len(chunk) == size:
            yield chunk, oversized
            chunk, oversized = [], []
    if chunk:
        yield chunk, oversized


def _open_input(path):
    if path in (None, "-", "/dev/stdin"):
        files.reading_stdin()  # `< IN >> IN`: stdout onto the input is refused like --output onto it
        return sys.stdin.buffer, "stdin", None
    if not os.path.lexists(path):
        raise FileNotFoundError(f"--input {path}: no such file")
    f = files.open_read(path, "the input", flag="--input")
    total, last = 0, b"\n"
    for chunk in iter(lambda: f.read(1 << 20), b""):
        total, last = total + chunk.count(b"\n"), chunk[-1:]
    f.seek(0)
    return f, path, total + (last != b"\n")


def open_output(path: str | None, flag: str, what: str):
    """A context manager: stdout (None, "-" or /dev/stdout), or the file layer's replacement of `path`
    (files.replace: checked now, before any work, and renamed into place when the block ends)."""
    if path in (None, "-", "/dev/stdout"):
        return contextlib.closing(open(sys.stdout.fileno(), "w", encoding="utf-8", newline="\n", closefd=False))
    return files.replace(path, what, flag=flag)


def format_result(index: int, hyps, n_best: int, alignments: bool) -> str:
    lines = []
    for h in hyps[:n_best]:
        fields = [str(index), f"{h.score:.4f}", h.text] if n_best > 1 else [h.text]
        if alignments:
            fields.append(" ".join(f"{s}-{t}" for s, t in h.alignment))
        lines.append("\t".join(fields) + "\n")
    return "".join(lines)


@one_command
def translate_main(args) -> int:
    if args.n_best < 1:
        raise ValueError(f"--n-best {args.n_best}: must be >= 1")
    if not 0 <= (args.buffer_size or 0) <= MAX_BUFFER_LINES:
        raise ValueError(f"--buffer-size {args.buffer_size}: must be in 1 .. {MAX_BUFFER_LINES} (input lines read "
                         f"before decoding; 0 = {INPUT_CHUNK})")
    stream, name, total = _open_input(args.input)
    try:
        translator = load_translator(Models.from_args(args), decode_flags(args))
        if args.n_best > translator.options.beam:
            raise ValueError(f"--n-best {args.n_best} must be <= the beam size ({translator.options.beam})")
        with open_output(args.output, "--output", "the translations") as out:
            _translate_stream(translator, stream, name, total, out, args)
    finally:
        if stream is not sys.stdin.buffer:
            stream.close()
    return 0


def _translate_stream(translator, stream, name: str, total, out, args) -> None:
    from tqdm import tqdm

    oversized = Oversized(translator)
    bar = tqdm(total=total, unit="sent", file=sys.stderr, disable=None, dynamic_ncols=True, mininterval=1.0)
    started, sentences, pieces = time.perf_counter(), 0, 0
    try:
        for chunk, skipped in read_chunks(stream, name, args.buffer_size or INPUT_CHUNK, oversized.cap):
            oversized.note(chunk, sentences, skipped)
            results = translator.translate_nbest(chunk, n_best=args.n_best, alignments=args.alignments)
            out.write("".join(format_result(sentences + i, r, args.n_best, args.alignments)
                              for i, r in enumerate(results)))
            out.flush()
            sentences += len(chunk)
            pieces += sum(r[0].pieces for r in results)
            bar.update(len(chunk))
    finally:
        bar.close()
    oversized.report(name)
    seconds = max(time.perf_counter() - started, 1e-9)
    print(f"translated {sentences} sentences ({pieces} target pieces) in {seconds:.1f} s: "
          f"{sentences / seconds:.2f} sentences/s, {pieces / seconds:.1f} tokens/s", file=sys.stderr, flush=True)


def _read_lines(flag: str, path: str) -> list[str]:
    """A text file's lines (as read_lines), or one error naming the flag, the file and the line."""
    from trainer.inference.text import read_lines

    if not os.path.lexists(path):
        raise FileNotFoundError(f"{flag} {path}: no such file")
    try:
        return read_lines(path, flag)
    except UnicodeDecodeError:
        with files.open_read(path, "a text file", flag=flag) as f:
            for number, raw in enumerate(f, start=1):
                try:
                    raw.decode("utf-8")
                except UnicodeDecodeError as e:
                    raise ValueError(f"{flag} {path}:{number}: not UTF-8 ({e.reason} at byte {e.start} of the "
                                     f"line)") from None
        raise


def _read_pair(src_path: str, ref_path: str, ref_flag: str = "--ref") -> tuple[list[str], list[str]]:
    src, ref = _read_lines("--src", src_path), _read_lines(ref_flag, ref_path)
    if len(src) != len(ref):
        raise ValueError(f"--src {src_path} has {len(src)} lines but {ref_flag} {ref_path} has {len(ref)}")
    return src, ref


@one_command
def evaluate_main(args) -> int:
    from trainer.metrics import check_tokenize

    src, ref = _read_pair(args.src, args.ref)
    if not src:  # sacreBLEU has nothing to average over (an IndexError inside it)
        raise ValueError(f"--src {args.src} and --ref {args.ref} are empty: no sentence to evaluate")
    if args.tokenize:
        check_tokenize(args.tokenize, "--tokenize")
    base_hyps = _read_pair(args.src, args.baseline, "--baseline")[1] if args.baseline else None
    translator = load_translator(Models.from_args(args), decode_flags(args))
    output = open_output(args.output, "--output", "the translations") if args.output else contextlib.nullcontext()
    with output as out:  # refused now, before the decoding, if it would land on a file read
        oversized = Oversized(translator)
        oversized.note(src, 0)
        hyps = [n[0].text for n in translator.translate_nbest(src)]
        oversized.report(args.src)
        if out is not None:
            out.writelines(line + "\n" for line in hyps)
    return _report_scores(args, translator, src, ref, hyps, base_hyps)


def _report_scores(args, translator, src: list[str], ref: list[str], hyps: list[str], base_hyps) -> int:
    from trainer.metrics import check_tokenize, resolve_tokenize, score

    configured = translator.origin["config"]["decode"]["bleu_tokenize"]  # the (first) model's decode.bleu_tokenize
    tokenize = resolve_tokenize(args.tokenize or configured, translator.tgt_lang, ref)
    s = score(hyps, ref, check_tokenize(tokenize, "--tokenize"))
    result = {"bleu": round(s.bleu, 2), "chrf": round(s.chrf, 2), "signature": s.bleu_signature,
              "chrf_signature": s.chrf_signature, "sentences": len(src), "tokenize": tokenize}
    baseline = args.baseline
    if baseline:  # another system's output on the same source, scored the same way
        b = score(base_hyps, ref, tokenize)
        result["baseline"] = {"file": baseline, "bleu": round(b.bleu, 2), "chrf": round(b.chrf, 2)}
    if args.json:
        print(json.dumps(result))
        return 0
    if baseline:
        width = max(len("model"), len(os.path.basename(baseline)))
        print(f"{'':{width}}  {'BLEU':>6}  {'chrF':>6}")
        print(f"{'model':{width}}  {result['bleu']:6.2f}  {result['chrf']:6.2f}")
        print(f"{os.path.basename(baseline):{width}}  {result['baseline']['bleu']:6.2f}  "
              f"{result['baseline']['chrf']:6.2f}")
    else:
        print(f"BLEU {result['bleu']:.2f}")
        print(f"chrF {result['chrf']:.2f}")
    print(f"  {result['signature']}\n  {result['chrf_signature']}")
    for i in range(min(args.show, len(src))):
        print(f"\n[{i + 1}] source:     {src[i]}\n    reference:  {ref[i]}\n    hypothesis: {hyps[i]}")
    return 0


@one_command
def score_main(args) -> int:
    src, ref = _read_pair(args.src, args.ref)
    translator = load_translator(Models.from_args(args), dict(batch_size=args.batch_size, max_tokens=args.max_tokens))
    with open_output(args.output, "--output", "the scores") as out:
        scores = translator.score(src, ref)
        for logprob, tokens in scores:
            per_token = logprob / tokens if tokens else 0.0
            if args.json:
                out.write(json.dumps({"logprob": round(logprob, 4), "tokens": tokens,
                                      "per_token": round(per_token, 4)}) + "\n")
            else:
                out.write(f"{logprob:.4f}\t{tokens}\t{per_token:.4f}\n")
    return 0


@one_command
def average_main(args) -> int:
    from trainer.checkpoint import files as checkpoint
    from trainer.inference.loading import export_model, load_average

    protect_run(args.run)
    if args.checkpoints:
        names = args.checkpoints
    else:
        found = checkpoint.complete_checkpoints(args.run)
        if args.last < 1:
            raise ValueError(f"--last {args.last}: must be >= 1")
        if len(found) < args.last:
            raise ValueError(f"{checkpoint.root(args.run)} holds {len(found)} complete checkpoints, fewer than "
                             f"--last {args.last} (train with train.keep_last >= {args.last})")
        names = [os.path.join(checkpoint.root(args.run), n) for n in found[-args.last:]]
    translator = load_average(args.run, names, device="cpu")
    export_model(translator, args.out)
    print(f"averaged {', '.join(translator.origin['averaged'])} of {translator.origin['run_dir']} -> {args.out}")
    return 0


@one_command
def export_main(args) -> int:
    from trainer.artifacts.run_dir import CKPT_DIR
    from trainer.inference.loading import export_model, load_run

    protect_run(args.run)
    translator = load_run(args.run, args.checkpoint, device="cpu", allow_unverified=args.allow_unverified)
    export_model(translator, args.out)
    o = translator.origin
    print(f"exported {os.path.join(o['run_dir'], CKPT_DIR, o['checkpoint'])} (step {o['step']}) -> {args.out}")
    return 0
