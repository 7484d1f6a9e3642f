"""`python -m data_prep.prepare` at scale: end-to-end pairs/s and peak memory at 1M and 2M pairs.

    python -m benchmarks.data.prepare_scale [--pairs 1000000 2000000] [--source enja|demo] [--workers 0]
                                       [--work /tmp/hybrid-nmt-bench] [-- extra prepare options]

The corpus repeats a base set of real pairs (`enja`: ../shared/data/small_parallel_enja/train, 50k pairs) or
of patent-claim-like pairs (`demo`: 100k from data_prep.demo_corpus, ~5x longer sentences). Round r > 0
appends " r" to both sides, except that every 20th pair is repeated verbatim (an exact duplicate) and every
20th with a capitalised source (a near duplicate): ~10% of the pairs are rejected, and each duplicate table
holds ~0.9 keys per input pair (nearly the worst case for their memory). The 1M corpus is the first half of
the 2M one.

prepare runs as it would for a user: Moses input, an 8k BPE vocabulary per side (as benchmarks/common.py; a
unigram model of this corpus tops out at ~3.5k pieces and trains far longer), --spm-sample at its default (1M
sentences per side) unless given after --, --workers as given (0: one per core). Reported per size: wall time,
pairs read/s, CPU seconds of the whole tree (wait4; unlike wall time, hardly affected by other jobs on the
machine), peak memory of the process tree polled every 0.05 s (sum of PSS, which counts pages shared by the
forked workers once, and sum of RSS, which counts them in every process; polling can miss a short spike), the
largest single process's exact peak RSS (the kernel's high-water mark, via wait4: SentencePiece training, the
usual peak, runs in the main process with no workers alive), and the load average before and after.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import psutil

from benchmarks import results as records
from benchmarks.common import ENJA, REPO
from data_prep.dataformat import MANIFEST

POLL_S = 0.05


def base_pairs(source: str) -> list[tuple[str, str]]:
    if source == "enja":
        en, ja = ((ENJA / f"train.{lang}").read_text(encoding="utf-8").splitlines() for lang in ("en", "ja"))
        return list(zip(en, ja))
    from data_prep.demo_corpus import generate
    return generate(pairs=100_000, dev=0, test=0, seed=1)["train"]


def write_corpus(base: list[tuple[str, str]], pairs: int, prefix: Path) -> tuple[Path, Path]:
    paths = prefix.with_suffix(".en"), prefix.with_suffix(".ja")
    if all(p.exists() for p in paths):
        return paths
    with open(paths[0], "w", encoding="utf-8") as fs, open(paths[1], "w", encoding="utf-8") as ft:
        for k in range(pairs):
            rnd, i = divmod(k, len(base))
            src, tgt = base[i]
            if rnd and i % 20 == 0:
                pass  # exact duplicate of round 0
            elif rnd and i % 20 == 10:
                src = src[:1].upper() + src[1:]  # near duplicate (case) of round 0
            elif rnd:
                src, tgt = f"{src} {rnd}", f"{tgt} {rnd}"
            fs.write(src + "\n")
            ft.write(tgt + "\n")
    return paths


def tree_memory(root: psutil.Process) -> tuple[int, int]:
    """(sum of PSS, sum of RSS) over `root` and its descendants, in bytes."""
    pss = rss = 0
    for p in (root, *root.children(recursive=True)):
        try:
            info = p.memory_full_info()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        pss, rss = pss + info.pss, rss + info.rss
    return pss, rss


def run_prepare(argv: list[str]) -> dict:
    load_before = os.getloadavg()
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "data_prep.prepare", *argv], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    root, peak_pss, peak_rss = psutil.Process(proc.pid), 0, 0
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        try:
            pss, rss = tree_memory(root)
        except psutil.NoSuchProcess:
            pss = rss = 0
        peak_pss, peak_rss = max(peak_pss, pss), max(peak_rss, rss)
        time.sleep(POLL_S)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    output = proc.stdout.read()
    if proc.returncode != 0:
        sys.exit(f"prepare failed ({proc.returncode}):\n{output[-4000:]}")
    return {"wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime, "peak_pss_mb": peak_pss / 2**20,
            "peak_rss_sum_mb": peak_rss / 2**20, "max_process_rss_mb": usage.ru_maxrss / 1024,
            "load_before": load_before,
            "load_after": os.getloadavg(), "output": output.strip().splitlines()[-1]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pairs", type=int, nargs="+", default=[1_000_000, 2_000_000])
    p.add_argument("--source", choices=("enja", "demo"), default="enja")
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--work", type=Path, default=Path("/tmp/hybrid-nmt-bench"))
    p.add_argument("--keep", action="store_true", help="keep the corpora and DATA_DIRs")
    p.add_argument("extra", nargs="*", help="more prepare options (after --)")
    args = p.parse_args()
    work = args.work / "prepare_scale"
    work.mkdir(parents=True, exist_ok=True)
    base = base_pairs(args.source)
    results = []
    for pairs in args.pairs:
        src, tgt = write_corpus(base, pairs, work / f"{args.source}_{pairs}")
        out = work / f"data_{args.source}_{pairs}"
        argv = ["--format", "moses", "--train-src", str(src), "--train-tgt", str(tgt), "--out", str(out),
                "--src-lang", "en", "--tgt-lang", "ja", "--vocab-size", "8000", "--model-type", "bpe",
                "--workers", str(args.workers), *args.extra]
        r = run_prepare(argv)
        manifest = json.loads((out / MANIFEST).read_text(encoding="utf-8"))
        r.update(pairs=pairs, source=args.source, pairs_per_s=manifest["pairs_read"] / r["wall_s"],
                 pairs_kept=manifest["pairs_kept"], rejected={k: v for k, v in manifest["rejected"].items() if v},
                 workers=manifest["options"]["workers"], command=f"python -m data_prep.prepare {' '.join(argv)}")
        results.append(r)
        print(json.dumps(r), file=sys.stderr)
        if not args.keep:
            shutil.rmtree(out)
            for path in (src, tgt):
                path.unlink()
    print(f"cores: {psutil.cpu_count()}, source: {args.source}, workers: {args.workers or 'one per core'}, "
          f"extra options: {' '.join(args.extra) or 'none'}")
    print("| pairs | wall (s) | pairs/s | CPU (s) | peak PSS, tree (MB) | peak RSS, tree sum (MB) "
          "| largest process peak RSS (MB) | load before / after |")
    print("|---:|---:|---:|---:|---:|---:|---:|---|")
    for r in results:
        print(f"| {r['pairs']:,} | {r['wall_s']:.1f} | {r['pairs_per_s']:,.0f} | {r['cpu_s']:.0f} | "
              f"{r['peak_pss_mb']:.0f} | {r['peak_rss_sum_mb']:.0f} | {r['max_process_rss_mb']:.0f} | "
              f"{r['load_before'][0]:.1f} / {r['load_after'][0]:.1f} |")
    if len(results) >= 2:
        first, last = results[0], results[-1]
        for key in ("peak_pss_mb", "max_process_rss_mb"):
            print(f"{key} at {last['pairs']:,} vs {first['pairs']:,} pairs: "
                  f"{100 * (last[key] / first[key] - 1):+.1f}%")
    tag = "".join(f"_{x.lstrip('-')}" for x in args.extra)
    path = work / f"prepare_scale_{args.source}_workers{args.workers}{tag}.json"
    path.write_text(json.dumps(results, indent=1))
    print(f"results: {path}")
    records.write([to_record(r, args) for r in results])


def to_record(r: dict, args) -> dict:
    """One prepare run as a record of the data question."""
    corpus = f"{args.source}, " + (" ".join(args.extra) if args.extra else "defaults")
    return records.record("data", "prepare at scale", command=records.command("benchmarks.data.prepare_scale"),
                          settings={"corpus": corpus, "pairs": r["pairs"], "workers": r["workers"]},
                          figures={"wall_s": r["wall_s"], "pairs_per_s": r["pairs_per_s"], "cpu_s": r["cpu_s"],
                                   "peak_pss_tree_mb": r["peak_pss_mb"], "peak_rss_largest_process_mb": r["max_process_rss_mb"],
                                   "pairs_kept": r["pairs_kept"], "load_before": r["load_before"][0],
                                   "load_after": r["load_after"][0]})


if __name__ == "__main__":
    main()
