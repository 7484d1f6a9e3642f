"""`python -m data_prep.prepare`: parallel text -> filtered, SentencePiece-encoded, binarized DATA_DIR.

DATA_DIR layout (everything the trainer needs; the text inputs are never read again):

    manifest.json                 counts, vocabulary, normalisation flags, inputs (sha256), options, checksum
    spm.src.model / .vocab        SentencePiece models (identical copies with --joint-vocab);
    spm.tgt.model / .vocab        ids 0-3 are <pad> <unk> <s> </s> (data_prep.binary.SPECIAL_IDS)
    {split}.{src,tgt}.bin / .idx  token ids, see data_prep.binary (split: train, dev, test as given)
    {dev,test}.{src,tgt}.txt      normalised text of the kept dev/test pairs; line i is sentence i of the .bin
    rejects.tsv                   reason, origin ("file:line", "file:TU#n"), src, tgt of every rejected pair

Inputs (data_prep.readers; formats listed in --help): Moses / JPC / WAT line-aligned pairs, NTCIR PatentMT,
TSV, ParaPat type 1 and 2, ASPEC-JE, ASPEC-JC, TMX 1.4b / 1.1 (EuroPat, WIPO COPPA .tmx.gz, OPUS; streamed)
and OPUS Moses zips; `--format auto` (default) tells them apart where that is unambiguous. Readers reject
TUs without both languages ("missing_lang"), other pairs of a multi-pair ParaPat file ("other_pair") and,
with --min-score / --ipc, pairs by TMX metadata ("low_score", "ipc"). Document ids (patent, family, DOCID)
are counted per split in the manifest; --split-by-doc holds whole documents out as dev / test.

It runs in two streaming passes over chunks of pairs, spread over --workers processes with the output
independent of their number (data_prep.pipeline); memory does not grow with the corpus except by the
duplicate tables (data_prep.dedup: 8-byte hashes, two per kept training pair, ~12-23 bytes each):
  1. read, repair and normalise (data_prep.normalize), reject malformed pairs and those that fail the text
     rules of data_prep.clean (empty, too long, copies, wrong script, duplicates); kept training pairs go
     to a temporary TSV, kept dev/test pairs straight to their .txt files;
  2. train SentencePiece on a seeded sample (--spm-sample, chosen in one streaming read; a Japanese side's
     sample split into MeCab's words with --pretokenize auto, data_prep.vocab), encode (with number
     placeholders on both sides with --number-placeholders, data_prep.numbers), reject training pairs by
     length / ratio, binarize.
A pair is counted under the first reason that rejects it, in the order of `filters.REASONS` (which also
explains the ratio rule); rejects.tsv holds the raw text for malformed / invalid_utf8 and the normalised
text otherwise. Dev/test pairs are repaired like training pairs but only checked for malformed and empty
input: they are evaluation sets. Everything is built in DATA_DIR/.prepare-tmp and moved
into place at the end (manifest.json removed first and written last), so a failed or interrupted run (an error,
Ctrl-C, SIGTERM, SIGHUP) leaves the previous dataset untouched and no staging directory behind. One prepare at a
time: it holds DATA_DIR/.prepare.lock (data_prep.lock) from before it reads its inputs to its end; a second prepare
into the same --out is refused in one line naming the holder (it does not wait), never touching the first's
staging directory, and the trainer refuses a data.dir while a prepare holds it.

Every input is possibly hostile (docs/RELIABILITY.md, "Hostile input"): lines and TMX segments longer
than --max-line-bytes are rejected as "oversized" without being read whole, compressed input that
unpacks to more than --max-expansion times its size is refused, rejects.tsv keeps an excerpt of at most
`EXCERPT_CHARS` characters per field, an empty dev or test set is refused, DATA_DIR may only hold what
prepare wrote before (else --overwrite), and an unexpected error (even MemoryError) is one line saying
how far prepare got.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import sys
import threading
from collections import Counter
from datetime import datetime, timezone
from typing import Iterator, Optional

import sentencepiece as spm

from . import files, lock, numbers, vocab
from .binary import SIDES, file_sha256, files_checksum, side_paths
from .dataformat import PREPARE_LOCK
from .outdir import OutputDirError, check_output_dir, json_marker
from .clean import CleaningOptions, add_cleaning_arguments, base_lang
from .dedup import Deduplicator
from .filters import MAX_PIECES, RATIO_MIN_PIECES, RATIO_SAMPLE, REASONS, LengthFilter, median_ratio
from .normalize import REPAIRS
from .pipeline import (CleanTask, EncodeTask, Position, Stopped, WorkerLost, clean_split, default_workers,
                       encode_split, read_samples)
from .rejects import RejectLog, SplitStats
from .tsv import escape, tsv_line, unescape
from .readers import (FORMATS_HELP, READERS, DocSplit, InputLimits, MetaFilter, PrepareError, Reader,
                      add_reader_arguments, check_files_exist, detect_format, open_reader, readers_manifest)

SPLITS = ("train", "dev", "test")
MANIFEST_VERSION = 1
STAGE = ".prepare-tmp"
# Every name prepare writes into DATA_DIR (data_prep.outdir: anything else there is not ours).
OUTPUT_NAMES = ("manifest.json", "manifest.json.tmp", files.TEMP_PATTERN, "rejects.tsv", STAGE, PREPARE_LOCK,
                "spm.src.model",
                "spm.src.vocab", "spm.tgt.model", "spm.tgt.vocab",
                *(f"{split}.{side}.{ext}" for split in SPLITS for side in SIDES for ext in ("bin", "idx")),
                *(f"{split}.{side}.txt" for split in SPLITS[1:] for side in SIDES))
# escape / unescape are re-exported: rejects.tsv is escaped the same way as the temporary TSV
__all__ = ["build_parser", "escape", "main", "prepare", "unescape"]


def file_info(path: str) -> dict:
    h, size, lines, last = hashlib.sha256(), 0, 0, b"\n"
    with files.open_read(path, "an input file") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
            size += len(chunk)
            lines += chunk.count(b"\n")
            last = chunk[-1:]
    return {"path": os.path.abspath(path), "sha256": h.hexdigest(), "bytes": size, "lines": lines + (last != b"\n")}


def checksum(stage: str, names: list[str]) -> str:
    return files_checksum(stage, names)


def split_readers(args: argparse.Namespace) -> dict[str, Reader]:
    """One reader per given split, after every check that needs no output (files exist, Moses line counts).

    `--format auto` detects each split's format. The metadata filters (--min-score, --ipc) select from the
    training input only. With --split-by-doc, dev and test are documents held out of the training input
    (data_prep.readers.docsplit; its first pass over the input runs here)."""
    meta_filter = MetaFilter(args.min_score, args.score_prop, tuple(args.ipc or ()))
    options = {"src_lang": args.src_lang, "tgt_lang": args.tgt_lang, "inline": args.tmx_inline,
               "limits": InputLimits(max_line_bytes=args.max_line_bytes, max_expansion=args.max_expansion)}
    readers = {}
    for split in SPLITS:
        src, tgt = getattr(args, f"{split}_src"), getattr(args, f"{split}_tgt")
        if src is None and tgt is None:
            continue
        if src is not None:
            check_files_exist([p for p in (src, tgt) if p is not None])
        fmt = detect_format(src, tgt) if args.format == "auto" and src is not None else args.format
        if src is None or (fmt in READERS and READERS[fmt].two_files and tgt is None):
            raise PrepareError(f"--{split}-src and --{split}-tgt go together for format {fmt!r}")
        readers[split] = open_reader(fmt, src, tgt, **options, meta_filter=meta_filter if split == "train" else None)
    for reader in readers.values():
        reader.check()
    if args.split_by_doc:
        given = [f"--{s}-src" for s in readers if s != "train"]
        if given:
            raise PrepareError(f"--split-by-doc holds dev and test out of the training input; drop {' '.join(given)}")
        if min(args.dev_size, args.test_size) < 0 or args.dev_size + args.test_size == 0:
            raise PrepareError("--split-by-doc needs --dev-size N and/or --test-size N (pairs, >= 1)")
        readers = DocSplit(readers["train"], {"dev": args.dev_size, "test": args.test_size}, args.seed).views
    elif args.dev_size or args.test_size:
        raise PrepareError("--dev-size / --test-size go with --split-by-doc")
    return readers


def validate(args: argparse.Namespace) -> None:
    checks = [(args.vocab_size >= 8, "--vocab-size must be at least 8"),
              (args.min_len >= 0, "--min-len must be >= 0"),
              (args.max_len >= max(args.min_len, 1), "--max-len must be >= --min-len and >= 1"),
              (args.max_ratio >= 1.0, "--max-ratio must be >= 1"),
              (args.spm_sample >= 1, "--spm-sample must be >= 1"),
              (0 <= args.number_placeholders <= numbers.MAX_SLOTS,
               f"--number-placeholders must be 0-{numbers.MAX_SLOTS}"),
              (args.max_words >= 0, "--max-words must be >= 0 (0: no limit)"),
              (args.workers >= 0, "--workers must be >= 0 (0: one per core)"),
              (args.max_line_bytes >= 1, "--max-line-bytes must be >= 1"),
              (args.max_expansion >= 1, "--max-expansion must be >= 1"),
              (not os.path.isfile(args.out), f"--out {args.out} is a file, not a directory")]
    for ok, message in checks:
        if not ok:
            raise PrepareError(message)


def check_out(args: argparse.Namespace) -> None:
    """--out may hold only what prepare wrote before (its manifest proves it), unless --overwrite."""
    try:
        check_output_dir(args.out, owned=OUTPUT_NAMES, marker="manifest.json",
                         is_marker_ours=json_marker(["pairs_read", "checksum_files", "checksum"]),
                         overwrite=args.overwrite, flag="--overwrite", program="prepare",
                         leftovers=[STAGE, PREPARE_LOCK])
    except OutputDirError as e:
        raise PrepareError(f"--out {e}") from None


def check_inputs_kept(out: str) -> None:
    """No input is one of the files prepare writes into --out (by device and inode: another name or a hard link
    does not hide it): publishing would replace the input with its own output."""
    if not os.path.isdir(out):
        return
    for name in sorted(os.listdir(out)):
        read_as = files.was_read(os.path.join(out, name)) if name in OUTPUT_NAMES else None
        if read_as is not None:
            raise PrepareError(f"--out {out}: holds {name}, which is also an input of this run ({read_as}); prepare "
                               f"would replace it: copy the input elsewhere first, or choose another --out")


def prepare(args: argparse.Namespace, position: Optional[Position] = None) -> dict:
    """Build DATA_DIR from parsed options; returns the manifest. Raises `PrepareError` for user errors.
    `position` follows the work, for the message of an unexpected error."""
    position = position or Position()
    validate(args)
    check_out(args)  # before anything is written into --out (the lock file is written there)
    created_out = not os.path.isdir(args.out)
    held, former = hold_out(args.out)
    try:
        check_out(args)  # again: another prepare may have published into it before we held it
        readers = split_readers(args)
        inputs = [dict(split=split, **file_info(p)) for split, r in readers.items() for p in r.paths]
        check_inputs_kept(args.out)
        stage = make_stage(args.out, former)
        try:
            manifest = build(args, readers, inputs, stage, position)
            position.check_stop()
            position.step, position.origin, position.publishing = f"writing {args.out}", "", True
            publish(stage, args.out, manifest)  # a few renames; never left half done by a signal
            return manifest
        except BaseException:
            shutil.rmtree(stage, ignore_errors=True)
            raise
    except BaseException:
        if created_out and os.listdir(args.out) == [PREPARE_LOCK]:  # ours alone: gone again, while still held
            os.unlink(os.path.join(args.out, PREPARE_LOCK))
            os.rmdir(args.out)
        raise
    finally:
        lock.release(held)


def hold_out(out: str):
    """--out for this prepare alone, until it ends (an exclusive lock on --out/.prepare.lock, naming this process):
    a second prepare into it is refused in one line naming the holder (it does not wait: the first may run for
    hours); the trainer refuses a data.dir while it is held. Returns the open lock file and the holder a killed
    prepare left named there (None if none)."""
    files.make_dirs(out, "the data directory", "--out")
    try:
        return lock.hold(out, PREPARE_LOCK, where="--out", owner="prepare")
    except lock.Busy as e:
        holder = e.holder or "a process that did not say who it is"
        raise PrepareError(f"--out {out}: another prepare is writing it ({holder}); wait for it to end, or choose "
                           f"another --out") from None


def make_stage(out: str, former: Optional[str]) -> str:
    """This run's staging directory. One found there was left by a prepare that was killed (a live one would hold
    the lock this run holds): removed, saying so. Another prepare's staging directory is never touched: no
    other prepare runs while this one holds --out."""
    stage = os.path.join(out, STAGE)
    if os.path.lexists(stage):
        killed = f" ({former})" if former else ""
        print(f"prepare: {stage}: left by a prepare that was killed{killed}; removed", file=sys.stderr, flush=True)
        with files.errors(stage, "remove a killed prepare's staging directory"):
            if os.path.isdir(stage) and not os.path.islink(stage):
                shutil.rmtree(stage)
            else:
                os.unlink(stage)
    files.make_dirs(os.path.join(stage, "tmp"), "the staging directory")
    return stage


def build(args: argparse.Namespace, readers: dict[str, Reader], inputs: list[dict], stage: str,
          position: Position) -> dict:
    """Clean every split into `stage`, train the vocabulary on the kept training pairs, encode every split;
    returns the manifest."""
    stats = {split: SplitStats() for split in readers}
    rejects = RejectLog(os.path.join(stage, "rejects.tsv"))
    workers = args.workers or default_workers()
    cleaning = CleaningOptions.from_args(args)
    n_train, n_eval = read_splits(args, readers, inputs, stage, cleaning, stats, rejects, workers, position)
    check_left(args, stats, n_train, n_eval)
    position.check_stop()
    position.step, position.origin = "training SentencePiece", ""
    vocabulary = train_vocabulary(args, stage, n_train)
    lengths = LengthFilter(args.max_len, args.min_len, args.max_ratio,
                           expected_ratio=corpus_ratio(vocabulary["ratio_sample"], vocabulary["models"]))
    encode_splits(args, stage, vocabulary["models"], lengths, stats, rejects, workers, n_train, n_eval, position)
    rejects.close()
    shutil.rmtree(os.path.join(stage, "tmp"))
    return manifest_of(args, readers, inputs, stage, stats, cleaning, vocabulary, lengths)


def read_splits(args, readers: dict[str, Reader], inputs: list[dict], stage: str, cleaning: CleaningOptions,
                stats: dict, rejects: RejectLog, workers: int, position: Position) -> tuple[int, dict]:
    """Clean the training pairs into stage/tmp/pairs.tsv (deduplicated) and the other splits into their
    text files; returns how many of each were kept."""
    lines: dict[str, int] = {}  # progress totals: lines of each split's first file
    for i in inputs:
        lines.setdefault(i["split"], i["lines"])
    dedup = Deduplicator(cleaning.dedup, cleaning.near_dedup) if cleaning.dedup or cleaning.near_dedup else None
    n_train = 0
    position.step = "reading train"
    with files.create(os.path.join(stage, "tmp", "pairs.tsv"), "the kept training pairs") as f:
        for rec in clean_split(readers["train"], CleanTask(cleaning, True), dedup, stats["train"], rejects,
                               args.on_error, workers, lines["train"], "read train", position):
            f.write(tsv_line(rec))
            n_train += 1
    del dedup  # the only state that grows with the corpus, and done with
    n_eval = {}
    for split in [s for s in readers if s != "train"]:
        paths = {side: os.path.join(stage, f"{split}.{side}.txt") for side in SIDES}
        position.step, position.origin = f"reading {split}", ""
        with files.create(paths["src"], f"the {split} text") as fs, \
                files.create(paths["tgt"], f"the {split} text") as ft:
            n_eval[split] = 0
            for _, src, tgt in clean_split(readers[split], CleanTask(cleaning, False), None, stats[split], rejects,
                                           args.on_error, workers, lines.get(split), f"read {split}", position):
                fs.write(src + "\n")
                ft.write(tgt + "\n")
                n_eval[split] += 1
    return n_train, n_eval


def check_left(args, stats: dict, n_train: int, n_eval: dict) -> None:
    """Refuse a corpus with no training pair left, or a dev/test set with none (naming the likely fix)."""
    if n_train == 0:
        hint = ""
        if stats["train"].rejected["other_pair"] == stats["train"].pairs_read > 0:
            hint = (f": every row is of another language pair than --src-lang {args.src_lang} --tgt-lang "
                    f"{args.tgt_lang} (the defaults are en, ja); name the pair to keep, e.g. --src-lang cs "
                    f"--tgt-lang en for the cs-en rows of a ParaPat file")
        raise PrepareError(f"no training pair is left after filtering ({describe(stats['train'])}){hint}")
    for split, n in n_eval.items():
        if n == 0:  # the trainer would have nothing to evaluate (dev BLEU over no sentences)
            given = f"--{split}-src {getattr(args, f'{split}_src')}" if not args.split_by_doc else f"--{split}-size"
            raise PrepareError(f"{given}: no {split} pair is left ({describe(stats[split])}); give a {split} set "
                               f"with pairs, or leave it out")


def train_vocabulary(args, stage: str, n_train: int) -> dict:
    """SentencePiece on a seeded sample of the kept training pairs: the models, their sizes, how each side
    was pre-tokenized, and the sample (for the length ratio and the number placeholders)."""
    tmp = os.path.join(stage, "tmp")
    pretokenize = {side: vocab.pretokenizer_name(getattr(args, f"{side}_lang"), args.pretokenize) for side in SIDES}
    ratio_sample = read_samples(os.path.join(tmp, "pairs.tsv"), n_train, args.spm_sample, RATIO_SAMPLE, args.seed,
                                *vocab.sample_files(tmp, args.joint_vocab),
                                {side: vocab.word_segmenter(name) for side, name in pretokenize.items()},
                                args.number_placeholders)
    sizes = vocab.train_vocab(tmp, stage, joint=args.joint_vocab, vocab_size=args.vocab_size,
                              model_type=args.model_type, seed=args.seed, src_lang=args.src_lang,
                              tgt_lang=args.tgt_lang, pretokenize=pretokenize, number_slots=args.number_placeholders)
    return {"pretokenize": pretokenize, "ratio_sample": ratio_sample, "sizes": sizes,
            "models": {side: os.path.join(stage, f"spm.{side}.model") for side in SIDES}}


def encode_splits(args, stage: str, models: dict, lengths: LengthFilter, stats: dict, rejects: RejectLog,
                  workers: int, n_train: int, n_eval: dict, position: Position) -> None:
    """Every split's pairs as token ids (the training pairs through the length filters)."""
    slots = args.number_placeholders
    position.check_stop()
    position.step = "encoding train"
    pairs = os.path.join(stage, "tmp", "pairs.tsv")
    with files.text_reader(files.open_read(pairs, "the kept training pairs")) as f:
        encode_split(f, EncodeTask(models, lengths, tsv=True, number_slots=slots), stage, "train", stats["train"],
                     rejects, workers, n_train, position)
    if stats["train"].pairs_kept == 0:
        raise PrepareError(f"no training pair passes the length filters ({describe(stats['train'])})")
    for split, n in n_eval.items():
        position.check_stop()
        position.step = f"encoding {split}"
        encode_split(eval_pairs(stage, split), EncodeTask(models, None, tsv=False, number_slots=slots), stage, split,
                     stats[split], rejects, workers, n, position)


def manifest_of(args, readers: dict, inputs: list[dict], stage: str, stats: dict, cleaning: CleaningOptions,
                vocabulary: dict, lengths: LengthFilter) -> dict:
    """DATA_DIR/manifest.json: counts, the vocabulary, languages, what was applied, inputs and checksums."""
    sizes = vocabulary["sizes"]
    binarized = [os.path.basename(p) for split in readers for side in SIDES for p in side_paths(stage, split, side)]
    rejected = sum((s.rejected for s in stats.values()), Counter())
    manifest = {
        "version": MANIFEST_VERSION,
        "pairs_read": sum(s.pairs_read for s in stats.values()),
        "pairs_kept": sum(s.pairs_kept for s in stats.values()),
        "rejected": {r: rejected[r] for r in REASONS},
        "splits": {split: stats[split].as_dict() for split in SPLITS if split in stats},
        "vocab": {"joint": args.joint_vocab, "src_size": sizes.src_size, "tgt_size": sizes.tgt_size,
                  "requested_size": sizes.requested, "src_model": "spm.src.model", "tgt_model": "spm.tgt.model",
                  "model_type": args.model_type, "character_coverage": sizes.coverage, "byte_fallback": True,
                  "split_digits": True, "pretokenize": vocabulary["pretokenize"],
                  "ordinal_pieces": {side: vocab.ORDINAL_PREFIXES.get(base_lang(getattr(args, f"{side}_lang")) or "")
                                     for side in SIDES},
                  "src_model_sha256": file_info(os.path.join(stage, "spm.src.model"))["sha256"],
                  "tgt_model_sha256": file_info(os.path.join(stage, "spm.tgt.model"))["sha256"]},
        "languages": {"src": base_lang(args.src_lang), "tgt": base_lang(args.tgt_lang)},  # scoring, joining
        "numbers": number_config(vocabulary["ratio_sample"], args.number_placeholders),  # placeholders or None
        "normalize": cleaning.normalize_flags("src"),  # what the trainer applies to translation input
        "normalize_tgt": cleaning.normalize_flags("tgt"),
        "repaired": {r: sum(s.repaired[r] for s in stats.values()) for r in REPAIRS},
        "filters": {"order": list(REASONS), "dedup": not args.no_dedup, "max_len": args.max_len,
                    "min_len": args.min_len, "max_ratio": args.max_ratio, "ratio_min_pieces": RATIO_MIN_PIECES,
                    "median_tgt_src_ratio": lengths.expected_ratio, **cleaning.manifest()},
        "inputs": inputs,
        "format": args.format,
        **readers_manifest(readers),  # formats, documents per split, metadata_filters, split_by_doc
        "options": vars(args),
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "checksum_files": sorted(binarized),
        "checksum": checksum(stage, binarized),
        "file_sha256": {name: file_sha256(os.path.join(stage, name)) for name in sorted(binarized)},
    }
    assert manifest["pairs_read"] == manifest["pairs_kept"] + sum(manifest["rejected"].values()), manifest
    return manifest


def number_config(sample: list[tuple[str, str]], slots: int) -> Optional[dict]:
    """manifest["numbers"]: None without placeholders; else the slots and whether the target writes the
    numbers it shares with the source in full-width digits (most of them in a seeded sample of pairs)."""
    if not slots:
        return None
    matched = full = 0
    for src, tgt in sample:
        masked, nums = numbers.mask_source(src, slots)
        _, m, f = numbers.mask_target(tgt, nums, numbers.slot_counts(masked, len(nums)))
        matched, full = matched + m, full + f
    return {"slots": slots, "fullwidth": 2 * full > matched}


def corpus_ratio(sample: list[tuple[str, str]], models: dict[str, str]) -> float:
    """Median tgt/src piece ratio over a seeded sample of the training pairs (see data_prep.filters)."""
    pieces = [map(len, spm.SentencePieceProcessor(model_proto=vocab.read_model(models[side])).encode(
                  [pair[k] for pair in sample]))
              for k, side in enumerate(SIDES)]
    return median_ratio(zip(*pieces))


def eval_pairs(stage: str, split: str) -> Iterator[tuple[str, str, str]]:
    paths = [os.path.join(stage, f"{split}.{side}.txt") for side in SIDES]
    with files.text_reader(files.open_read(paths[0], f"the {split} text")) as fs, \
            files.text_reader(files.open_read(paths[1], f"the {split} text")) as ft:
        for i, (src, tgt) in enumerate(zip(fs, ft), start=1):
            yield f"{split}:{i}", src.rstrip("\n"), tgt.rstrip("\n")


def describe(stats: SplitStats) -> str:
    counts = ", ".join(f"{r}: {n}" for r, n in stats.rejected.items() if n) or "nothing rejected"
    return f"{stats.pairs_read} read; {counts}"


def publish(stage: str, out: str, manifest: dict) -> None:
    """Move the staged files into `out` (over prepare's own earlier output: check_out); drop stale files of splits
    this run did not produce; manifest last."""
    manifest_path = os.path.join(out, "manifest.json")
    with files.errors(manifest_path, "remove the earlier manifest"):
        if os.path.exists(manifest_path):
            os.remove(manifest_path)  # no manifest while the directory is a mix of old and new files
    for name in os.listdir(stage):
        with files.errors(os.path.join(out, name), "move the new file into place"):
            os.replace(os.path.join(stage, name), os.path.join(out, name))
    for split in set(SPLITS) - set(manifest["splits"]):
        for side in SIDES:
            for path in (*side_paths(out, split, side), os.path.join(out, f"{split}.{side}.txt")):
                if os.path.exists(path):
                    with files.errors(path, "remove a stale file"):
                        os.remove(path)
    os.rmdir(stage)
    with files.replace(manifest_path, "the manifest", own=True) as f:
        f.write(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m data_prep.prepare", description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=FORMATS_HELP)
    for split in SPLITS:
        p.add_argument(f"--{split}-src", required=split == "train",
                       help=f"{split} source file (single-file formats: the file holding both sides)")
        p.add_argument(f"--{split}-tgt", help=f"{split} target file (moses, ntcir only)")
    add_reader_arguments(p, sorted(READERS))
    p.add_argument("--out", required=True, metavar="DATA_DIR")
    p.add_argument("--vocab-size", type=int, default=8000,
                   help="pieces per side; a soft limit (a small corpus gets fewer), raised to the characters to "
                        "cover plus 256 byte pieces if smaller")
    p.add_argument("--joint-vocab", action="store_true", help="one SentencePiece model for both sides")
    p.add_argument("--model-type", choices=("unigram", "bpe"), default="unigram")
    p.add_argument("--pretokenize", choices=("auto", "none"), default="auto",
                   help="auto: SentencePiece learns Japanese pieces within MeCab's words (no piece spans words; "
                        "the data stays raw text, see data_prep/vocab.py); none: pieces from the raw text")
    p.add_argument("--number-placeholders", type=int, default=0, metavar="N",
                   help=f"numbers are copied: the first N distinct numbers of a source sentence become placeholders "
                        f"⟨n1⟩..⟨nN⟩, and the target's equal numbers the same (1-{numbers.MAX_SLOTS}; 0: off; see "
                        f"data_prep/numbers.py)")
    p.add_argument("--spm-sample", type=int, default=1_000_000, help="at most this many sentences per side train SPM")
    p.add_argument("--nfkc", action="store_true", help="Unicode NFKC normalisation")
    p.add_argument("--lowercase", action="store_true")
    p.add_argument("--max-len", type=int, default=MAX_PIECES,
                   help="reject training pairs with a side longer (pieces); translation cuts longer inputs")
    p.add_argument("--min-len", type=int, default=1, help="reject training pairs with a side shorter (pieces)")
    p.add_argument("--max-ratio", type=float, default=3.0,
                   help=f"reject training pairs whose piece-count ratio, scaled by the corpus' median tgt/src "
                        f"ratio, exceeds this (only when the longer side has >= {RATIO_MIN_PIECES} pieces)")
    p.add_argument("--no-dedup", action="store_true", help="keep duplicate training pairs (exact and near)")
    p.add_argument("--on-error", choices=("fail", "skip"), default="fail",
                   help="malformed lines / invalid UTF-8: stop with file:line, or reject and count them")
    p.add_argument("--seed", type=int, default=1, help="seed of the SentencePiece training sample and --split-by-doc")
    p.add_argument("--workers", type=int, default=0,
                   help="processes that clean and encode (0: one per core); the output does not depend on it")
    p.add_argument("--overwrite", action="store_true",
                   help="write into --out even if it holds files prepare did not write (those are left alone; "
                        "prepare's own names are replaced)")
    p.add_argument("--max-line-bytes", type=int, default=InputLimits.max_line_bytes, metavar="N",
                   help="reject (\"oversized\", counted) lines and TMX segments longer than N bytes, unread "
                        "(default: %(default)s)")
    p.add_argument("--max-expansion", type=float, default=InputLimits.max_expansion, metavar="X",
                   help="refuse a zip member or gzipped TMX that unpacks to more than X times its compressed size "
                        "(a decompression bomb; default: %(default)s)")
    add_cleaning_arguments(p)
    return p


def main(argv: Optional[list[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    position = Position()

    def stop(signum, frame) -> None:
        position.stop_signal = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
        if not (position.publishing or position.in_pool):
            raise Stopped(position.stop_signal)

    handled = files.STOP_SIGNALS if threading.current_thread() is threading.main_thread() else ()
    previous = {signum: signal.signal(signum, stop) for signum in handled  # SIGHUP: a closed terminal, a lost ssh
                if signal.getsignal(signum) is not signal.SIG_IGN}  # (left ignored under nohup)
    try:
        with files.command(signals=False):  # its own: a stop waits for the renames of the publish
            manifest = prepare(args, position)
    except PrepareError as e:
        return _error(str(e), 2)
    except OSError as e:  # the file layer's one line; any other names its file, or how far prepare got
        message = str(e) if isinstance(e, files.FileError) else (
            f"{e.filename}: {e.strerror or e}" if e.filename else f"{e.strerror or e} while {position}")
        return _error(message, 2)
    except (Stopped, KeyboardInterrupt):
        signame = position.stop_signal or "Ctrl-C"
        return _error(f"by {signame} while {position}; {args.out} is as it was before",
                      128 + (signal.SIGINT if signame == "Ctrl-C" else signal.Signals[signame]), "stopped")
    except MemoryError:
        return _error(f"out of memory while {position} (lower --workers, or check the input there)", 1)
    except WorkerLost as e:
        return _error(f"{e}, while {position}; {args.out} is as it was before", 1)
    except Exception as e:  # a bug, or input we did not foresee: one line, how far we got
        if os.environ.get("HNMT_TRACEBACK"):
            raise
        return _error(f"unexpected {type(e).__name__} while {position}: {e} (HNMT_TRACEBACK=1 shows where)", 1)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    kept = {split: s["pairs_kept"] for split, s in manifest["splits"].items()}
    rejected = {r: n for r, n in manifest["rejected"].items() if n}
    print(f"prepare: {args.out}: kept {kept}; rejected {rejected or 'none'}; vocab "
          f"{manifest['vocab']['src_size']}/{manifest['vocab']['tgt_size']}", file=sys.stderr)
    return 0


def _error(message: str, code: int, label: str = "error") -> int:
    print(f"prepare: {label}: {message.replace(chr(13), ' ').replace(chr(10), ' ')[:2000]}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
