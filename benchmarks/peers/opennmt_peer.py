"""Single rank against OpenNMT-py 3.5.1: the same model and batches, sentence pairs/s side by side in one run.

    python -m benchmarks.peers.opennmt_peer [--work /tmp/hybrid-nmt-bench] [--steps 60] [--warmup 5] [--threads 2]
                                      [--venv WORK/onmt-venv] [--rounds 1] [--ours KEY=VALUE ...]
                                      [--ours-b KEY=VALUE ...] [--profile]

The peer lives in its own virtual environment (default WORK/onmt-venv, built on first use and reused):
torch pinned to the CPU wheel of requirements.txt first, then `opennmt-py==3.5.1 --no-deps` and the few
packages it imports at start-up, each pinned (PEER_PACKAGES). Nothing goes into requirements.txt or the
interpreter running this script.

Same model as the enja-small reference, read from trainer/configs/enja_small.yaml and ds_configs/single.json
(`peer_options`): emb/hidden 256, 2+2 unidirectional LSTM layers, general (Luong) attention, dropout 0.2,
label smoothing 0.1, Adam (lr, betas, clipping of the JSON; not the learning-rate schedule, which does not
change a step's work), 64 sentence pairs per step, an 8k vocabulary per side (word-level for OpenNMT-py,
read by its own pipeline; our BPE data for ours; the English side has only ~6.6k word types, so the
peer's source vocabulary is that), on ../shared/data/small_parallel_enja. Runs, each for --steps steps on
--threads threads:

* OpenNMT-py without and with input feeding (`input_feed 0|1`), fp32 (its CPU path has no bf16);
* ours single rank through the real CLI (benchmarks/common.py::train), fp32 and bf16;
* with --ours-b, ours single in fp32 once more with those overrides: a setting's A/B in the same rounds.

How each is timed: the same part of a step on both sides, forward + loss + backward + optimizer step of
the step's batches, not fetching them. Ours: `step_time_s` of metrics.jsonl. OpenNMT-py: a clock around
`Trainer._gradient_accumulation` (benchmarks/peers/opennmt_runner.py), one line per step. pairs/s = pairs over
the steps after --warmup / their summed step times. The peer's wall time between steps (batch
preparation and reporting added) is in the JSON as `wall_pairs_per_s`. With --rounds R every run is
repeated R times, interleaved, and the median round is reported.

Prints a markdown table (pairs/s, src+tgt tokens per pair as a check that both sides do comparable work,
and the ratio to OpenNMT-py without and with input feeding), the load average seen during the runs (the
ratios mean little on a busy machine), and writes WORK/opennmt_peer.json.

With --profile, after the rounds, the fp32 pair of the goal (OpenNMT-py without input feeding, ours single)
runs once more each under torch.profiler over the steps after --warmup (ours: `train.profile_steps`,
trainer/observe/profiling.py; the peer: the same profiler around its clocked steps, opennmt_runner.py). It
prints where the step's CPU time goes on each side: each trainer's phases, the operators grouped by what they
compute, and the operators whose self CPU ms per step differ most; and how many milliseconds of ours' step
stand between the measured ratio and 1.2x. The profiler adds a little to every operator on both sides, so its
steps are a little longer than the unprofiled rounds'.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path


from benchmarks import results as records
from benchmarks.common import ENJA, REPO, VOCAB_SIZE, cpu_model, ds_variant, prepare_enja, summarise, train
from trainer.artifacts.run_dir import PROFILE_DIR, TIMING_DIR, rank_file

RUNNER = Path(__file__).resolve().parent / "opennmt_runner.py"
MARKER = ".hybrid-nmt-peer.json"
# Installed with --no-deps after torch: OpenNMT-py and what it imports when its entry points start
# (found by importing them in a bare venv). Not spacy: see opennmt_runner.py.
PEER_PACKAGES = ("opennmt-py==3.5.1", "pyonmttok==1.37.1", "numpy==2.4.6", "pyyaml==6.0.3",
                 "configargparse==1.7.1", "sacrebleu==2.6.0", "portalocker==3.2.0", "regex==2026.5.9",
                 "tabulate==0.9.0", "colorama==0.4.6", "lxml==6.0.2", "rapidfuzz==3.14.3",
                 "pyahocorasick==2.2.0", "fasttext-wheel==0.9.2")
ATTENTION = {"dot": "dot", "general": "general", "concat": "mlp"}  # ours -> OpenNMT-py global_attention
PEER = "OpenNMT-py 3.5.1"  # as the records name the peer


class PeerError(RuntimeError):
    """The peer's environment or run failed; the message says where."""


def torch_pin() -> str:
    """torch's pin in requirements.txt, restricted to the CPU build (a plain pin may pull a CUDA wheel)."""
    for line in (REPO / "requirements.txt").read_text().splitlines():
        if line.strip().startswith("torch=="):
            version = line.split("==", 1)[1].strip()
            return f"torch=={version}" if "+" in version else f"torch=={version}+cpu"
    raise PeerError(f"{REPO / 'requirements.txt'}: no torch== pin to copy")


def _pip(python: Path, args: list[str], venv: Path) -> None:
    cmd = [str(python), "-m", "pip", "install", "--disable-pip-version-check", "-q", *args]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    except subprocess.TimeoutExpired:
        raise PeerError(f"could not build the peer's environment {venv}: `pip install {' '.join(args)}` gave no "
                        f"answer in 30 minutes (is the package registry reachable?)") from None
    if proc.returncode != 0:
        lines = [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.strip() and "is ignored" not in ln]
        lines = [ln for ln in lines if ln.startswith("ERROR:")][:1] or lines  # pip's first error says what
        raise PeerError(f"could not build the peer's environment {venv}: `pip install {' '.join(args)}` failed "
                        f"(no network to the package registry, or a pinned release missing?): "
                        f"{lines[-1] if lines else 'no output'}")


def peer_venv(venv: Path) -> Path:
    """The peer's interpreter: VENV/bin/python, built here unless VENV has this script's marker for the
    same packages. A VENV this script did not make is never touched."""
    python = venv / "bin" / "python"
    wanted = {"packages": [torch_pin(), *PEER_PACKAGES], "runner_check": None}
    marker = venv / MARKER
    if venv.exists():
        if not marker.exists():
            raise PeerError(f"--venv {venv}: exists and was not made by this script (no {MARKER}); "
                            f"name another folder or remove it")
        try:
            done = json.loads(marker.read_text())
        except ValueError:
            done = {}
        if done.get("packages") == wanted["packages"] and done.get("runner_check"):
            return python
        shutil.rmtree(venv)  # ours, from an older package list or an interrupted build
    print(f"building the peer's environment in {venv} (OpenNMT-py 3.5.1, torch CPU) ...", flush=True)
    proc = subprocess.run([sys.executable, "-m", "venv", str(venv)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise PeerError(f"could not create a virtual environment in {venv}: {proc.stderr.strip()[-300:]}")
    marker.write_text(json.dumps(wanted))
    _pip(python, [torch_pin()], venv)
    _pip(python, ["--no-deps", *PEER_PACKAGES], venv)
    try:
        check = subprocess.run([str(python), str(RUNNER), "check"], capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired:
        raise PeerError(f"the peer's environment {venv} was built but OpenNMT-py did not start in 10 minutes") from None
    if check.returncode != 0:
        raise PeerError(f"the peer's environment {venv} was built but OpenNMT-py does not start: "
                        f"{check.stderr.strip().splitlines()[-1] if check.stderr.strip() else check.returncode}")
    info = json.loads(check.stdout.strip().splitlines()[-1])
    if info.get("cuda"):
        raise PeerError(f"{venv}: torch {info['torch']} is a CUDA build; the peer runs the CPU wheel")
    marker.write_text(json.dumps({**wanted, "runner_check": info}))
    return python


def peer_options(config: Path, ds_config: Path) -> dict:
    """OpenNMT-py training options for the model and batches of our config + DeepSpeed JSON."""
    from trainer.config import ConfigError, load_config

    try:
        model = load_config(str(config)).model
    except ConfigError as e:
        raise PeerError(str(e)) from None
    try:
        return _mirror(config, model, ds_config, json.loads(ds_config.read_text()))
    except (OSError, ValueError, KeyError, TypeError, IndexError) as e:
        raise PeerError(f"{ds_config}: no value for the peer's options ({type(e).__name__}: {e})") from None


def _mirror(config: Path, model, ds_config: Path, ds: dict) -> dict:
    for key, value in (("model.bidirectional_bottom", model.bidirectional_bottom),
                       ("model.tie_embeddings", model.tie_embeddings)):
        if value:
            raise PeerError(f"{config}: {key}=true has no mirror in this benchmark's OpenNMT-py options")
    optimizer = ds["optimizer"]
    if optimizer["type"].lower() != "adam":
        raise PeerError(f"{ds_config}: optimizer.type={optimizer['type']!r}; the peer mirrors Adam only")
    params = optimizer["params"]
    return {"encoder_type": "rnn", "decoder_type": "rnn", "rnn_type": "LSTM", "layers": model.layers,
            "word_vec_size": model.emb_dim, "hidden_size": model.hidden,
            "global_attention": ATTENTION[model.attention], "dropout": [model.dropout],
            "label_smoothing": model.label_smoothing, "optim": "adam", "learning_rate": params["lr"],
            "adam_beta1": params["betas"][0], "adam_beta2": params["betas"][1],
            "max_grad_norm": ds.get("gradient_clipping", 0.0), "batch_type": "sents",
            "batch_size": ds["train_micro_batch_size_per_gpu"],
            "accum_count": [ds.get("gradient_accumulation_steps", 1)], "normalization": "tokens",
            "src_vocab_size": VOCAB_SIZE, "tgt_vocab_size": VOCAB_SIZE}


def threads_env(threads: int) -> dict:
    """This environment with `threads` OpenMP/MKL threads and unbuffered Python (a peer's tool, or ours' decoding)."""
    return dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))


def _run_peer_tool(python: Path, tool: str, config: Path, log: Path, extra: list[str], timeout: int,
                   threads: int = 1) -> None:
    env = threads_env(threads)
    try:
        with log.open("w") as out:
            proc = subprocess.run([str(python), str(RUNNER), tool, "-config", str(config), *extra],
                                  cwd=config.parent, env=env, stdout=out, stderr=subprocess.STDOUT, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise PeerError(f"OpenNMT-py {tool} did not finish in {timeout} s; log {log}") from None
    if proc.returncode != 0:
        tail = [ln for ln in log.read_text().splitlines() if ln.strip()][-1:]
        raise PeerError(f"OpenNMT-py {tool} failed ({proc.returncode}); log {log}: {tail[0] if tail else ''}")


def peer_data(python: Path, work: Path, folder: str = "onmt",
              corpus: tuple[Path, Path] = (ENJA / "train.en", ENJA / "train.ja")) -> Path:
    """WORK/FOLDER/: OpenNMT-py's corpus config for `corpus` (source, target text: by default small_parallel_enja's
    words) and its vocabularies of the corpus's space-separated tokens (built once)."""
    root = work / folder
    root.mkdir(parents=True, exist_ok=True)
    base = {"src_vocab": str(root / "vocab.src"), "tgt_vocab": str(root / "vocab.tgt"),
            "save_data": str(root / "samples"), "overwrite": True,
            "data": {"corpus_1": {"path_src": str(corpus[0]), "path_tgt": str(corpus[1]), "weight": 1}}}
    # OpenNMT-py reads -config as YAML, of which JSON is a subset
    (root / "data.json").write_text(json.dumps(base, indent=1))
    if not (root / "vocab.tgt").exists():
        for path in corpus:
            if not path.exists():
                raise PeerError(f"{path}: not found" + (" (the shared data folder beside the checkout)"
                                                         if path.parent == ENJA else ""))
        _run_peer_tool(python, "build_vocab", root / "data.json", root / "build_vocab.log", ["-n_sample", "-1"], 1800)
    return root


def train_peer(python: Path, root: Path, name: str, options: dict, threads: int, steps: int, warmup: int,
               timeout: int = 7200, profile: tuple[int, int] | None = None, budget_s: float | None = None,
               seed: int = 1) -> dict:
    """ROOT/runs/NAME: OpenNMT-py trained `steps` steps (or until `budget_s` seconds have passed since its training
    loop's first batch: opennmt_runner.py --budget-s), its checkpoint saved at the end; its steps' throughput after
    `warmup`."""
    run = root / "runs" / name
    if run.exists():
        shutil.rmtree(run)
    run.mkdir(parents=True)
    config = {**json.loads((root / "data.json").read_text()), **options, "save_model": str(run / "model"),
              "train_steps": steps, "valid_steps": 10 * steps, "save_checkpoint_steps": 10 * steps,
              "report_every": max(1, steps // 10), "num_workers": 0, "seed": seed, "world_size": 1, "gpu_ranks": []}
    (run / "config.json").write_text(json.dumps(config, indent=1))
    # num_workers 0: batches are made in the process between steps, as ours are; DataLoader workers would
    # compete with the 2 compute threads for the cores during steps.
    extra = ["--threads", str(threads), "--steps-file", str(run / "steps.jsonl")]
    if budget_s is not None:
        extra += ["--budget-s", str(budget_s)]
    if profile:  # (after step, steps): torch.profiler over that window, to RUN/profile.json
        extra += ["--profile-from", str(profile[0]), "--profile-steps", str(profile[1]),
                  "--profile-out", str(run / "profile.json")]
    _run_peer_tool(python, "train", run / "config.json", run / "train.log", extra, timeout, threads)
    rows = [json.loads(line) for line in (run / "steps.jsonl").read_text().splitlines()]
    timed = [r for r in rows if r["step"] > warmup]
    if not timed:
        raise PeerError(f"{run / 'steps.jsonl'}: no step after the {warmup} warm-up steps")
    seconds = sum(r["step_time_s"] for r in timed)
    pairs = sum(r["pairs"] for r in timed)
    return {"steps": len(timed), "step_ms_median": 1000 * statistics.median(r["step_time_s"] for r in timed),
            "step_ms_mean": 1000 * seconds / len(timed), "pairs_per_s": pairs / seconds,
            "wall_pairs_per_s": pairs / sum(r["wall_s"] for r in timed),
            "tokens_per_pair": sum(r["src_tokens"] + r["tgt_tokens"] for r in timed) / pairs}


# Operator groups for the side-by-side profile (first match wins; names are torch's aten operators).
OP_GROUPS = (("LSTM kernels (oneDNN, forward and backward)", ("mkldnn_rnn", "lstm")),
             ("GEMMs (mm, addmm, bmm)", ("aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear")),
             ("optimizer (Adam, clipping's norm)", ("adam", "_foreach", "aten::sqrt", "aten::lerp", "aten::addcdiv",
                                                   "aten::addcmul_", "linalg_vector_norm", "clip", "Optimizer.")),
             ("softmax and loss", ("softmax", "nll_loss", "aten::amax", "aten::max", "aten::exp", "aten::gather",
                                   "aten::addcmul", "aten::log", "CrossEntropy", "aten::scatter")),
             ("dropout masks", ("bernoulli", "aten::random_", "aten::lt", "dropout")),
             ("copies and layout", ("copy", "clone", "aten::cat", "contiguous", "pad", "aten::index",
                                    "aten::empty", "aten::to", "aten::stack", "aten::slice", "aten::select")))


def op_group(name: str) -> str:
    low = name.lower()
    for label, keys in OP_GROUPS:
        if any(k.lower() in low for k in keys):
            return label
    return "everything else (elementwise, autograd bookkeeping)"


def profiled_pair(python: Path, root: Path, options: dict, args, data: Path) -> dict:
    """One profiled run of each side of the goal, ours over OpenNMT-py (fp32): their profile files' contents."""
    window = args.steps - args.warmup
    run = train_peer(python, root, "input_feed0_profiled", {**options, "input_feed": 0}, args.threads, args.steps,
                     args.warmup, profile=(args.warmup, window))
    peer = json.loads((root / "runs" / "input_feed0_profiled" / "profile.json").read_text())
    peer["pairs_per_s"] = run["pairs_per_s"]
    name = "peer_ours_fp32_profiled"
    cfg = ds_variant(args.work, "single", name, bf16={"enabled": False})
    train(args.work, name, cfg, 1, args.threads, args.steps, data, config=str(args.config),
          extra=(*args.ours, f"train.profile_from={args.warmup}", f"train.profile_steps={window}"))
    ours = json.loads((args.work / "runs" / name / PROFILE_DIR / rank_file(0)).read_text())
    timing = json.loads((args.work / "runs" / name / TIMING_DIR / rank_file(0)).read_text())["seconds_per_step"]
    ours["phases"] = {k: 1000 * v for k, v in timing.items() if v >= 0.0005}
    ours["pairs_per_s"] = summarise(args.work / "runs" / name, warmup=args.warmup)["pairs_per_s"]
    return {"OpenNMT-py": peer, "ours": ours}


def report_profiles(profiles: dict, results: dict, top: int = 12) -> dict:
    """Print where each side's step goes and what stands between ours and 1.2x; returns the tables."""
    peer, ours = profiles["OpenNMT-py"], profiles["ours"]
    no_feed = results["OpenNMT-py, no input feeding", "fp32"]
    mine = results["ours single", "fp32"]
    # pairs per step are the same (the batch size); the goal in ms per step of ours at the rounds' speed:
    need_ms = 1000 * 64 / (1.2 * no_feed["pairs_per_s"])
    have_ms = 1000 * 64 / mine["pairs_per_s"]
    print(f"\nours over OpenNMT-py in milliseconds (median round, fp32): ours {have_ms:.1f} ms per 64 pairs against "
          f"{need_ms:.1f} for 1.2x OpenNMT-py ({1000 * 64 / no_feed['pairs_per_s']:.1f}): "
          + (f"{have_ms - need_ms:.1f} ms to remove" if have_ms > need_ms else "met"))
    print(f"\nunder torch.profiler (fp32, steps {ours['steps'][0]}-{ours['steps'][1]}): ms per step")
    print("| | OpenNMT-py, no input feeding | ours single |")
    print("|---|---:|---:|")
    print(f"| step (wall) | {peer['wall_ms_per_step']:.1f} | {ours['wall_ms_per_step']:.1f} |")
    print(f"| self CPU of all operators | {peer['self_cpu_ms_per_step']:.1f} | {ours['self_cpu_ms_per_step']:.1f} |")
    print(f"| phases, as each trainer has them | "
          + ", ".join(f"{k} {v:.1f}" for k, v in peer["phases"].items()) + " | "
          + ", ".join(f"{k} {v:.1f}" for k, v in ours["phases"].items()) + " |")
    groups = {}
    for side, prof in (("peer", peer), ("ours", ours)):
        for name, op in prof["ops"].items():
            g = groups.setdefault(op_group(name), {"peer": 0.0, "ours": 0.0})
            g[side] += op["self_ms"]
    print("\n| operators, self CPU ms per step | OpenNMT-py | ours | ours - OpenNMT-py |")
    print("|---|---:|---:|---:|")
    for label, g in sorted(groups.items(), key=lambda kv: -abs(kv[1]["ours"] - kv[1]["peer"])):
        print(f"| {label} | {g['peer']:.1f} | {g['ours']:.1f} | {g['ours'] - g['peer']:+.1f} |")
    names = set(peer["ops"]) | set(ours["ops"])

    def ms(prof, n):
        return prof["ops"].get(n, {}).get("self_ms", 0.0)

    rows = sorted(names, key=lambda n: -abs(ms(ours, n) - ms(peer, n)))[:top]
    print(f"\n| operator (the {top} that differ most) | OpenNMT-py ms (calls) | ours ms (calls) | ours - OpenNMT-py |")
    print("|---|---:|---:|---:|")
    for n in rows:
        pc, oc = peer["ops"].get(n, {}).get("calls", 0), ours["ops"].get(n, {}).get("calls", 0)
        print(f"| {n[:60]} | {ms(peer, n):.2f} ({pc:.0f}) | {ms(ours, n):.2f} ({oc:.0f}) | {ms(ours, n) - ms(peer, n):+.2f} |")
    return {"goal_ms": {"ours": have_ms, "needed": need_ms}, "groups": groups,
            "wall_ms": {"peer": peer["wall_ms_per_step"], "ours": ours["wall_ms_per_step"]},
            "phases": {"peer": peer["phases"], "ours": ours["phases"]},
            "operators": [{"op": n, "peer_ms": ms(peer, n), "ours_ms": ms(ours, n)} for n in rows]}


def median_round(rounds: list[dict]) -> dict:
    ordered = sorted(rounds, key=lambda r: r["pairs_per_s"])
    return {**ordered[(len(ordered) - 1) // 2], "rounds_pairs_per_s": [r["pairs_per_s"] for r in rounds]}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", type=Path, default=Path("/tmp/hybrid-nmt-bench"))
    p.add_argument("--venv", type=Path, help="the peer's virtual environment (default WORK/onmt-venv)")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--warmup", type=int, default=5, help="steps left out of the timing at the start of each run")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--config", type=Path, default=REPO / "trainer" / "configs" / "enja_small.yaml")
    p.add_argument("--ours", nargs="*", default=[], metavar="KEY=VALUE",
                   help="config overrides for our runs only (e.g. train.loss_chunk_rows=512)")
    p.add_argument("--ours-b", nargs="+", default=None, metavar="KEY=VALUE",
                   help="one more fp32 run of ours single in every round, with these overrides on top of --ours: an "
                        "A/B of a setting, side by side with the rest (e.g. train.loss_projection=chunked)")
    p.add_argument("--profile", action="store_true", help="after the rounds, profile one fp32 run of each side "
                   "of the goal (ours over OpenNMT-py) and print where the steps differ")
    args = p.parse_args()
    if args.steps <= args.warmup:
        sys.exit(f"--steps {args.steps}: must be more than --warmup {args.warmup}")
    args.work = args.work.resolve()
    args.work.mkdir(parents=True, exist_ok=True)
    return args


def rounds_of(args, python: Path, options: dict, root: Path, data: Path) -> tuple[dict, list[float]]:
    """Every run in every round, interleaved: {(label, precision): [summary per round]}, and the load averages."""
    load = [os.getloadavg()[0]]
    runs = [("OpenNMT-py, no input feeding", "fp32", 0), ("OpenNMT-py, input feeding", "fp32", 1),
            ("ours single", "fp32", None), ("ours single", "bf16", None)]
    if args.ours_b:
        runs.append((f"ours single, {' '.join(args.ours_b)}", "fp32", "b"))
    rounds = {(label, precision): [] for label, precision, _ in runs}
    for _ in range(args.rounds):
        for label, precision, feed in runs:
            if feed in (0, 1):
                r = train_peer(python, root, f"input_feed{feed}", {**options, "input_feed": feed}, args.threads,
                               args.steps, args.warmup)
            else:
                name = f"peer_ours_{precision}" + ("_b" if feed == "b" else "")
                cfg = ds_variant(args.work, "single", name, bf16={"enabled": precision == "bf16"})
                train(args.work, name, cfg, 1, args.threads, args.steps, data, config=str(args.config),
                      extra=tuple(args.ours) + (tuple(args.ours_b) if feed == "b" else ()))
                r = {k: v for k, v in summarise(args.work / "runs" / name, warmup=args.warmup).items() if k != "timing"}
                r["tokens_per_pair"] = r["tokens_per_s"] / r["pairs_per_s"]
            rounds[label, precision].append(r)
            load.append(os.getloadavg()[0])
            print(f"{label} ({precision}): {r['pairs_per_s']:.0f} pairs/s, median step {r['step_ms_median']:.0f} ms",
                  flush=True)
    return {key: median_round(rs) for key, rs in rounds.items()}, load


def main() -> None:
    args = parse_args()
    try:
        python = peer_venv((args.venv or args.work / "onmt-venv").resolve())
        options = peer_options(args.config, REPO / "ds_configs" / "single.json")
        root = peer_data(python, args.work)
        data = prepare_enja(args.work)
        results, load = rounds_of(args, python, options, root, data)
        profiled = profiled_pair(python, root, options, args, data) if args.profile else None
    except PeerError as e:
        sys.exit(f"opennmt_peer: {e}")
    out = {"command": " ".join(sys.argv), "cpu": cpu_model(), "threads": args.threads, "steps": args.steps,
           "warmup": args.warmup, "load_average_1min": load, "busy": report(results, load, args),
           "peer_packages": [torch_pin(), *PEER_PACKAGES], "peer_options": options,
           "runs": {f"{label} {precision}": r for (label, precision), r in results.items()}}
    if profiled:
        out["profile"] = report_profiles(profiled, results)
    (args.work / "opennmt_peer.json").write_text(json.dumps(out, indent=1))
    print(f"wrote {args.work / 'opennmt_peer.json'}")
    records.write(to_records(results, args, busy=out["busy"]))


def to_records(results: dict, args, busy: bool) -> list[dict]:
    """Each run's median round as a record of the peers question: who, precision, pairs/s (each round's too), ms per
    step, src+tgt tokens per pair, and ours over OpenNMT-py without and with input feeding, measured side by side."""
    no_feed = results["OpenNMT-py, no input feeding", "fp32"]["pairs_per_s"]
    feed = results["OpenNMT-py, input feeding", "fp32"]["pairs_per_s"]
    out = []
    for (label, precision), r in results.items():
        peer = label.startswith("OpenNMT-py")
        settings = {"system": f"{PEER}, {label.split(', ', 1)[1]}" if peer else "ours",
                    "model": "enja-small", "precision": precision, "layout": f"single {args.threads} threads",
                    "threads": args.threads, "pairs_per_step": 64}
        overrides = [*args.ours, *(label.split(", ", 1)[1].split() if label.startswith("ours single, ") else [])]
        if overrides and not peer:
            settings["overrides"] = " ".join(overrides)
        out.append(records.record("peers", "runs", command=records.command("benchmarks.peers.opennmt_peer"),
                                  settings=settings, note="a busy machine: not a measurement of record" if busy else None,
                                  figures={"pairs_per_s": r["pairs_per_s"], "pairs_per_s_by_round": r["rounds_pairs_per_s"],
                                           "step_ms_median": r["step_ms_median"], "tokens_per_pair": r.get("tokens_per_pair")},
                                  ratios={"over_opennmt_no_input_feeding": r["pairs_per_s"] / no_feed,
                                          "over_opennmt_input_feeding": r["pairs_per_s"] / feed}))
    return out


def report(results: dict, load: list[float], args) -> bool:
    """Print the table and the goals against OpenNMT-py; True when the machine was busy during the runs."""
    no_feed = results["OpenNMT-py, no input feeding", "fp32"]["pairs_per_s"]
    feed = results["OpenNMT-py, input feeding", "fp32"]["pairs_per_s"]
    print(f"\n{cpu_model()}, {args.threads} threads, {args.steps} steps of 64 pairs ({args.warmup} warm-up), "
          f"load average (1 min) {min(load):.1f}-{max(load):.1f} during the runs")
    print("| run | precision | pairs/s | median step (ms) | src+tgt tokens per pair | vs OpenNMT-py no input feeding "
          "| vs OpenNMT-py input feeding |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for (label, precision), r in results.items():
        print(f"| {label} | {precision} | {r['pairs_per_s']:.0f} | {r['step_ms_median']:.0f} | "
              f"{r['tokens_per_pair']:.1f} | {r['pairs_per_s'] / no_feed:.2f}x | {r['pairs_per_s'] / feed:.2f}x |")
    fp32, bf16 = results["ours single", "fp32"]["pairs_per_s"], results["ours single", "bf16"]["pairs_per_s"]
    print(f"\nours over OpenNMT-py: fp32 >= 1.2x OpenNMT-py without input feeding: {fp32 / no_feed:.2f}x "
          f"({'met' if fp32 >= 1.2 * no_feed else 'not met'}); bf16 >= 2x OpenNMT-py with input feeding: "
          f"{bf16 / feed:.2f}x ({'met' if bf16 >= 2 * feed else 'not met'})")
    ours, peer = results["ours single", "fp32"], results["OpenNMT-py, no input feeding", "fp32"]
    by_round = [o / p for o, p in zip(ours.get("rounds_pairs_per_s", [ours["pairs_per_s"]]),
                                      peer.get("rounds_pairs_per_s", [peer["pairs_per_s"]]))]
    print(f"fp32 / OpenNMT-py without input feeding by round: {', '.join(f'{r:.2f}x' for r in by_round)}; per "
          f"src+tgt token (ours' BPE pieces against its words): "
          f"{ours['pairs_per_s'] * ours['tokens_per_pair'] / (peer['pairs_per_s'] * peer['tokens_per_pair']):.2f}x")
    for (label, precision), b in results.items():
        if label.startswith("ours single, "):  # --ours-b: the setting against the defaults, round by round
            pairs = zip(b.get("rounds_pairs_per_s", [b["pairs_per_s"]]),
                        ours.get("rounds_pairs_per_s", [ours["pairs_per_s"]]))
            print(f"{label[len('ours single, '):]} against ours single ({precision}) by round: "
                  + ", ".join(f"{x / y:.2f}x" for x, y in pairs))
    cores = len(os.sched_getaffinity(0))
    busy = max(load) > cores + 1  # the runs' own threads account for about `cores`
    if busy:
        print(f"the machine was busy (1-minute load average up to {max(load):.1f} on {cores} cores): other work took "
              f"cores from these runs unevenly, so the ratios are not a measurement of record; rerun on a quiet machine")
    return busy


if __name__ == "__main__":
    main()
