"""A Transformer beside ours on enja-small: test BLEU after the same wall-clock training budget on this CPU.

    python -m benchmarks.peers.transformer_peer [--work /tmp/hybrid-nmt-bench] [--minutes 10] [--precisions bf16 fp32]
                                          [--threads 2] [--venv WORK/onmt-venv] [--seed 1] [--batch-tokens 1024]
                                          [--no-record]

The peer is OpenNMT-py 3.5.1's Transformer, in the virtual environment benchmarks/peers/opennmt_peer.py builds
(default WORK/onmt-venv, shared with that benchmark): 3+3 layers, d_model 256, 4 heads, FFN 1024, dropout 0.1
(attention too), sinusoidal position encoding, label smoothing 0.1, the classic layer (biases in attention and
feed-forward, which OpenNMT-py 3.5 leaves out by default), nothing shared, fp32 (OpenNMT-py's CPU path has no
bf16), Adam (0.9, 0.998) with the noam schedule, batches of --batch-tokens tokens. Its default, 1024, is about
ours' 64 pairs per step (OpenNMT-py counts a batch's pairs times its longer padded side, ~15 positions here:
~70 pairs). The usual 4096 (~270 pairs) costs ~4x the time per step, and on two cores a step of it takes a second
or more, so a 10-minute budget would give the Transformer a few hundred updates; at 1024 it gets about four times
as many for the same pairs seen. --batch-tokens 4096 runs the usual size. Ours is the enja-small reference
(trainer/configs/enja_small.yaml, ds_configs/single.json: 64 pairs per step) in each of --precisions, one process
of --threads threads, through the real CLI (benchmarks/common.py::train). Both read the same 8k BPE pieces
per side: the peer's corpus is ours' prepared data (WORK/enja_small: the very training pairs ours trains on)
written back as pieces, and its vocabularies are those pieces (`piece_corpus`).

The budget: --minutes of training wall time for each, from its first step on: start-up (ours' loading of its
binarized data before its loop; OpenNMT-py's reading and sorting of the corpus before its loop's first batch,
printed), the final checkpoint and translation are not counted; whatever data work falls between steps is.
Ours stops through train.max_time_min; OpenNMT-py has no wall-clock stop, so opennmt_runner.py --budget-s hands
its loop no batch once the budget is spent, and it saves its checkpoint as at its last step. Neither validates
during the budget.

Schedules, each sized to the steps its system takes in the budget on this CPU: before the budget, each side
trains PROBE_STEPS steps (not counted) and the steps expected in the budget are the budget over its seconds
per step after PROBE_WARMUP (`expected_steps`). Ours: its reference schedule (100 warm-up steps, then linear
decay to 0) over that many steps (train.max_steps). The Transformer: noam with a warm-up of WARMUP_SHARE of its
expected steps (at most the usual 4000), because 4000 steps is more than a Transformer takes in minutes on two
cores and it would end still warming up; its learning_rate factor keeps the peak at PEAK_LR, which is what the
usual factor 2 with warm-up 4000 gives a d_model-256 model (2 x 256^-0.5 x 4000^-0.5 = 1.98e-3) and ours' peak
too (single.json's lr 2e-3). After the peak it decays as noam does (1/sqrt(step)), to about 0.3 of the peak at
the end of the budget. A tenth of the run is between the Transformer paper's 4% (4000 of 100k steps) and what
short runs on small data use.

Test BLEU: the 500 test sentences, beam 5 on both sides (the peer: length penalty avg, as ours' 1.0, and
max_length_ratio 2 like ours' decode.max_len_ratio), sacreBLEU 13a against small_parallel_enja's tokenized
Japanese, as benchmarks/quality/bleu.py scores ours: ours through launch/evaluate.py --tokenize 13a, the peer's
pieces decoded by our target SentencePiece model and scored by the same function (trainer.metrics.score).
Decoding runs on --threads threads too; its wall time (the process, model loading included) is reported apart.

Run it on a quiet machine: with another busy process on two cores, the two threads of a run wait for each other
at every operator (a step of the peer took ten times as long here with one other process running); the output
says when the load average was high. Prints a markdown table, writes WORK/transformer_peer.json and, for a budget
of at least RECORD_MINUTES minutes and without --no-record, appends records (question peers, table
"transformer") for `python -m benchmarks.results render`. A shorter budget is a smoke run: printed, never
recorded.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

from benchmarks import results as records
from benchmarks.common import ENJA, REPO, VOCAB_SIZE, ds_variant, metrics, prepare_enja, train
from benchmarks.peers.opennmt_peer import (PEER, PeerError, _run_peer_tool, peer_data, peer_venv, threads_env,
                                           train_peer)
from data_prep.dataformat import SPM_MODELS

D_MODEL = 256
PEAK_LR = 2e-3
WARMUP_SHARE = 0.1
MAX_WARMUP = 4000
PROBE_STEPS, PROBE_WARMUP = 20, 4
BEAM = 5
RECORD_MINUTES = 5.0
STEP_CAP = 1_000_000  # the peer's train_steps: the budget stops it long before
TRANSFORMER = "Transformer 3+3, d_model 256, 4 heads, FFN 1024"


def expected_steps(budget_s: float, seconds_per_step: float) -> int:
    """Steps a system takes in `budget_s` at its probe's rate (at least 1)."""
    if not seconds_per_step > 0:
        raise PeerError(f"a probe measured {seconds_per_step} s per step; cannot size a schedule on it")
    return max(1, int(budget_s / seconds_per_step))


def probe_rate(rows: list[tuple[int, float]], warmup: int = PROBE_WARMUP) -> float:
    """Seconds of training wall time per step from (step, training wall seconds at its end) rows, after `warmup`."""
    timed = [r for r in rows if r[0] >= warmup]
    if len(timed) < 2:
        raise PeerError(f"a probe logged {len(rows)} steps; need two after step {warmup}")
    (s0, t0), (s1, t1) = timed[0], timed[-1]
    return (t1 - t0) / (s1 - s0)


def noam(steps: int) -> tuple[int, float]:
    """(warmup_steps, learning_rate factor) for a run of about `steps` steps: warm-up WARMUP_SHARE of them (at most
    MAX_WARMUP), the factor that puts noam's peak (factor x d_model^-0.5 x warmup^-0.5) at PEAK_LR."""
    warmup = min(MAX_WARMUP, max(1, round(WARMUP_SHARE * steps)))
    return warmup, PEAK_LR * math.sqrt(D_MODEL * warmup)


def transformer_options(*, warmup: int, learning_rate: float, batch_tokens: int) -> dict:
    """OpenNMT-py 3.5.1 training options of the peer's Transformer (the data and vocabularies come apart)."""
    return {"encoder_type": "transformer", "decoder_type": "transformer", "enc_layers": 3, "dec_layers": 3,
            "hidden_size": D_MODEL, "word_vec_size": D_MODEL, "heads": 4, "transformer_ff": 1024,
            "dropout": [0.1], "attention_dropout": [0.1], "position_encoding": True,
            "add_qkvbias": True, "add_ffnbias": True, "label_smoothing": 0.1, "model_dtype": "fp32",
            "param_init": 0.0, "param_init_glorot": True, "optim": "adam", "adam_beta1": 0.9, "adam_beta2": 0.998,
            "decay_method": "noam", "warmup_steps": warmup, "learning_rate": learning_rate, "max_grad_norm": 0.0,
            "batch_type": "tokens", "batch_size": batch_tokens, "normalization": "tokens", "accum_count": [1],
            "src_vocab_size": VOCAB_SIZE, "tgt_vocab_size": VOCAB_SIZE}


def piece_corpus(data: Path, out: Path) -> dict[str, Path]:
    """DATA's training pairs and test source (ours' prepared ids) as space-separated SentencePiece pieces in OUT:
    train.en, train.ja, test.en. Written again when DATA's manifest changed."""
    import sentencepiece as spm

    from data_prep.binary import TokenArray
    from trainer.data import read_manifest

    files = {"train_src": out / "train.en", "train_tgt": out / "train.ja", "test_src": out / "test.en"}
    stamp, checksum = out / "source.json", read_manifest(str(data)).get("checksum")
    if stamp.exists() and json.loads(stamp.read_text()).get("checksum") == checksum and all(
            p.exists() for p in files.values()):
        return files
    out.mkdir(parents=True, exist_ok=True)
    for p in (out / "vocab.src", out / "vocab.tgt", stamp):  # from other data: built again
        p.unlink(missing_ok=True)
    models = {side: spm.SentencePieceProcessor(model_file=str(data / name)) for side, name in SPM_MODELS.items()}
    for key, path in files.items():
        split, side = key.split("_")
        ids = TokenArray.load(str(data), split, side)
        sp = models[side]
        path.write_text("".join(" ".join(sp.id_to_piece(int(i)) for i in ids[n]) + "\n" for n in range(len(ids))),
                        encoding="utf-8")
    test_lines = len((ENJA / "test.en").read_text(encoding="utf-8").splitlines())
    if len(files["test_src"].read_text(encoding="utf-8").splitlines()) != test_lines:
        raise PeerError(f"{data}: its test source does not have the {test_lines} lines of {ENJA / 'test.en'}")
    stamp.write_text(json.dumps({"data": str(data), "checksum": checksum}))
    return files


def train_transformer(python: Path, root: Path, name: str, options: dict, threads: int, seed: int,
                      budget_s: float | None = None, steps: int = STEP_CAP) -> dict:
    """The peer trained (`steps` steps, or until `budget_s`): steps done, training wall s (from its loop's first
    batch), its checkpoint, the seconds its loop waited for that batch, and its (step, training wall s) rows."""
    timeout = int((budget_s or 3600) + 1800)
    train_peer(python, root, name, options, threads, steps, PROBE_WARMUP, timeout=timeout, budget_s=budget_s,
               seed=seed)
    run = root / "runs" / name
    rows = [json.loads(line) for line in (run / "steps.jsonl").read_text().splitlines()]
    checkpoints = sorted(run.glob("model_step_*.pt"), key=lambda p: int(p.stem.rsplit("_", 1)[1]))
    if not checkpoints:
        raise PeerError(f"{run}: OpenNMT-py saved no checkpoint; log {run / 'train.log'}")
    return {"steps": rows[-1]["step"], "train_s": rows[-1]["train_s"], "checkpoint": checkpoints[-1],
            "first_batch_s": rows[0]["loop_s"] - rows[0]["train_s"],
            "rows": [(r["step"], r["train_s"]) for r in rows]}


def translate_transformer(python: Path, checkpoint: Path, src: Path, spm_model: Path,
                          threads: int) -> tuple[list[str], float]:
    """The peer's beam search over `src` (pieces), its output decoded to text: (lines, wall seconds)."""
    import sentencepiece as spm

    from trainer.inference.text import one_line

    run = checkpoint.parent
    config = {"model": str(checkpoint), "src": str(src), "output": str(run / "test.pieces"), "beam_size": BEAM,
              "length_penalty": "avg", "alpha": 1.0, "max_length_ratio": 2.0, "gpu": -1, "seed": 1}
    (run / "translate.json").write_text(json.dumps(config, indent=1))
    started = time.monotonic()
    _run_peer_tool(python, "translate", run / "translate.json", run / "translate.log", [], 3600, threads)
    wall = time.monotonic() - started
    sp = spm.SentencePieceProcessor(model_file=str(spm_model))
    lines = (run / "test.pieces").read_text(encoding="utf-8").split("\n")[:-1]
    return [one_line(sp.decode_pieces(line.split())) for line in lines], wall


def score_13a(hyps: list[str]) -> dict:
    """BLEU (13a) and chrF of `hyps` against small_parallel_enja's test references, as launch/evaluate.py scores."""
    from trainer.inference.text import read_lines
    from trainer.metrics import score

    s = score(hyps, read_lines(str(ENJA / "test.ja")), "13a")
    return {"bleu": round(s.bleu, 2), "chrf": round(s.chrf, 2), "signature": s.bleu_signature}


def ours(args, data: Path, precision: str) -> dict:
    """Ours in `precision`: a probe, then the budgeted run over the schedule it sizes, then test BLEU."""
    cfg = ds_variant(args.work, "single", f"tf_peer_ours_{precision}", bf16={"enabled": precision == "bf16"})
    seed = (f"train.seed={args.seed}",)
    probe = f"tf_peer_ours_{precision}_probe"
    train(args.work, probe, cfg, 1, args.threads, PROBE_STEPS, data, extra=seed)
    rate = probe_rate([(r["step"], r["wall_s"]) for r in metrics(args.work / "runs" / probe)])
    planned = expected_steps(60 * args.minutes, rate)
    name = f"tf_peer_ours_{precision}"
    train(args.work, name, cfg, 1, args.threads, planned, data, timeout=int(60 * args.minutes + 1800),
          extra=(*seed, f"train.max_time_min={args.minutes}"))
    run = args.work / "runs" / name
    timed = [r for r in metrics(run) if "wall_s" in r]
    last = timed[-1]
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "launch/evaluate.py", "--run", str(run), "--checkpoint", "last",
                           "--src", str(ENJA / "test.en"), "--ref", str(ENJA / "test.ja"), "--tokenize", "13a",
                           "--beam", str(BEAM), "--output", str(run / "test_13a.hyp"), "--json"],
                          cwd=REPO, capture_output=True, text=True, env=threads_env(args.threads))
    if proc.returncode != 0:
        raise PeerError(f"launch/evaluate.py on {run} failed ({proc.returncode}): {proc.stderr.strip()[-500:]}")
    test = json.loads(proc.stdout.strip().splitlines()[-1])
    return {"system": "ours", "model": "enja-small", "precision": precision, "steps": last["step"],
            "expected_steps": planned, "probe_s_per_step": rate, "train_s": last["wall_s"],
            "decode_s": time.monotonic() - started, "schedule": f"warm-up 100, linear decay to 0 at step {planned}",
            "batch": "64 pairs", "test": {k: test[k] for k in ("bleu", "chrf", "signature")}}


def peer(args, python: Path, data: Path) -> dict:
    """OpenNMT-py's Transformer: its pieces and vocabularies, a probe, the budgeted run, test BLEU."""
    folder = args.work / "transformer_peer"
    files = piece_corpus(data, folder)
    root = peer_data(python, args.work, "transformer_peer", (files["train_src"], files["train_tgt"]))
    probe_options = transformer_options(warmup=MAX_WARMUP, learning_rate=2.0, batch_tokens=args.batch_tokens)
    probe = train_transformer(python, root, "probe", probe_options, args.threads, args.seed, steps=PROBE_STEPS)
    rate = probe_rate(probe["rows"])
    planned = expected_steps(60 * args.minutes, rate)
    warmup, factor = noam(planned)
    options = transformer_options(warmup=warmup, learning_rate=factor, batch_tokens=args.batch_tokens)
    run = train_transformer(python, root, "transformer", options, args.threads, args.seed, budget_s=60 * args.minutes)
    hyps, decode_s = translate_transformer(python, run["checkpoint"], files["test_src"], data / SPM_MODELS["tgt"],
                                           args.threads)
    (run["checkpoint"].parent / "test_13a.hyp").write_text("".join(h + "\n" for h in hyps), encoding="utf-8")
    return {"system": f"{PEER}, Transformer", "model": TRANSFORMER, "precision": "fp32", "steps": run["steps"],
            "expected_steps": planned, "probe_s_per_step": rate, "train_s": run["train_s"],
            "first_batch_s": run["first_batch_s"], "decode_s": decode_s,
            "schedule": f"noam, warm-up {warmup}, factor {factor:.3g} (peak {PEAK_LR:g})",
            "batch": f"{args.batch_tokens} tokens", "options": options, "test": score_13a(hyps)}


def table(rows: list[dict], *, threads: int, minutes: float, cpu: str) -> list[str]:
    """The markdown table of the runs."""
    out = ["| system | precision | threads | minutes | steps done | test BLEU (13a) | train wall s | decode wall s "
           "| CPU |", "|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        out.append(f"| {r['system']} | {r['precision']} | {threads} | {minutes:g} | {r['steps']} | "
                   f"{r['test']['bleu']:.2f} | {r['train_s']:.0f} | {r['decode_s']:.0f} | {cpu} |")
    return out


def to_records(rows: list[dict], args, busy: bool) -> list[dict]:
    """A record per system of the peers question, table "transformer": test BLEU after the same wall budget."""
    command = records.command("benchmarks.peers.transformer_peer")
    return [records.record("peers", "transformer", command=command, settings={
        "system": r["system"], "model": r["model"], "precision": r["precision"], "threads": args.threads,
        "minutes": args.minutes, "batch": r["batch"], "schedule": r["schedule"], "seed": args.seed,
        "corpus": "small_parallel_enja (500 test sentences, beam 5)", "tokenize": r["test"]["signature"]},
        figures={"test_bleu": r["test"]["bleu"], "test_chrf": r["test"]["chrf"], "steps": r["steps"],
                 "train_s": round(r["train_s"], 1), "decode_s": round(r["decode_s"], 1)},
        note="a busy machine: not a measurement of record" if busy else None) for r in rows]


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", type=Path, default=Path("/tmp/hybrid-nmt-bench"))
    p.add_argument("--minutes", type=float, default=10.0, help="training wall time of each system")
    p.add_argument("--precisions", nargs="+", choices=("bf16", "fp32"), default=["bf16"], help="ours' (the peer: fp32)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--venv", type=Path, help="the peer's virtual environment (default WORK/onmt-venv)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--batch-tokens", type=int, default=1024, help="the Transformer's batch (OpenNMT-py batch_type tokens)")
    p.add_argument("--no-record", action="store_true", help="print and write WORK/transformer_peer.json only")
    args = p.parse_args()
    if not args.minutes > 0 or args.threads < 1 or args.batch_tokens < 1:
        sys.exit("transformer_peer: --minutes, --threads and --batch-tokens must be positive")
    args.work = args.work.resolve()
    args.work.mkdir(parents=True, exist_ok=True)
    return args


def main() -> None:
    args = parse_args()
    load = [os.getloadavg()[0]]
    try:
        python = peer_venv((args.venv or args.work / "onmt-venv").resolve())
        data = prepare_enja(args.work)
        rows = [peer(args, python, data)]
        load.append(os.getloadavg()[0])
        for precision in args.precisions:
            rows.append(ours(args, data, precision))
            load.append(os.getloadavg()[0])
    except PeerError as e:
        sys.exit(f"transformer_peer: {e}")
    cpu, cores = records.machine(), len(os.sched_getaffinity(0))  # as its records name it
    busy = max(load) > cores + 1
    print(f"\n{cpu}: each system trained {args.minutes:g} min on {args.threads} threads; load average (1 min) "
          f"{min(load):.1f}-{max(load):.1f}")
    print("\n".join(table(rows, threads=args.threads, minutes=args.minutes, cpu=cpu)))
    for r in rows:
        print(f"{r['system']} ({r['precision']}): batch {r['batch']}, {r['schedule']}; the probe's "
              f"{1000 * r['probe_s_per_step']:.0f} ms per step gave {r['expected_steps']} expected steps"
              + (f"; its loop's first batch took {r['first_batch_s']:.1f} s (start-up, not counted)"
                 if "first_batch_s" in r else ""))
    if busy:
        print(f"the machine was busy (load average up to {max(load):.1f} on {cores} cores): not a measurement of record")
    out = {"command": records.command("benchmarks.peers.transformer_peer"), "cpu": cpu, "threads": args.threads,
           "minutes": args.minutes, "load_average_1min": load, "busy": busy, "runs": rows}
    (args.work / "transformer_peer.json").write_text(json.dumps(out, indent=1, default=str))
    print(f"wrote {args.work / 'transformer_peer.json'}")
    if args.no_record or args.minutes < RECORD_MINUTES:
        why = "--no-record" if args.no_record else f"a budget under {RECORD_MINUTES:g} minutes is a smoke run"
        print(f"no records appended ({why})")
    else:
        records.write(to_records(rows, args, busy))


if __name__ == "__main__":
    main()
