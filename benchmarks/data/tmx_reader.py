"""TMX reading speed and memory: `TmxReader` (expat handlers that keep only the current <tu>) beside a bare
`xml.etree.ElementTree.iterparse` pass over the same file (parse, clear each <tu>, build no records: a lower
bound for any ElementTree-based reader, which is what data_prep used before the hostile-input limits).

    python -m benchmarks.data.tmx_reader [--tus 100000] [--repeat 3] [--work /tmp/hybrid-nmt-tmx] [--baseline COMMIT]

With --baseline, the TmxReader of that commit (data_prep/readers/tmx.py read with `git show`; e.g. 3be1b09,
the ElementTree reader before issue 11) runs beside them on the same files.

The file holds patent-like <tu>s (English / Japanese <seg>s with inline <b> markup, two <prop>s each), plain
and gzipped. Per file and reader: TU/s from CPU time (time.process_time, so other jobs on the machine matter
little; best of --repeat, the readers interleaved) and the peak memory traced by tracemalloc.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import time
import tracemalloc
import xml.etree.ElementTree as ET
from pathlib import Path

from benchmarks.common import REPO
from data_prep.readers import open_reader, write_tmx
from data_prep.readers.tmx import open_binary


def tus(n: int):
    for i in range(n):
        yield (f"The pump {i} has a <b>gear</b> wheel and a shaft, as shown in Fig. {i % 9}. " * 2,
               f"ポンプ{i}は歯車と軸を有する（図{i % 9}）。" * 2,
               {"score-bicleaner": "0.9", "source-document": f"EP{i // 10}"})


def reader_pass(path: Path) -> int:
    return sum(1 for _ in open_reader("tmx", str(path)))


def baseline_pass(commit: str):
    """The TmxReader of `commit`, loaded from git as a module of its own (it imports today's readers.base)."""
    source = subprocess.run(["git", "show", f"{commit}:data_prep/readers/tmx.py"], cwd=REPO,
                            check=True, capture_output=True, text=True).stdout
    module = type(sys)(f"tmx_{commit}")
    exec(compile(source.replace("from .base import", "from data_prep.readers.base import"), module.__name__, "exec"),
         module.__dict__)
    return lambda path: sum(1 for _ in module.TmxReader(str(path)))


def iterparse_pass(path: Path) -> int:
    n = 0
    with open_binary(str(path)) as f:
        for _, elem in ET.iterparse(f):
            if elem.tag == "tu":
                n += 1
                elem.clear()
    return n


def measure(fn, path: Path) -> tuple[float, int, int]:
    start = time.process_time()
    n = fn(path)
    seconds = time.process_time() - start
    tracemalloc.start()
    fn(path)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return seconds, n, peak


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tus", type=int, default=100_000)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--work", type=Path, default=Path("/tmp/hybrid-nmt-tmx"))
    p.add_argument("--baseline", metavar="COMMIT", help="also run the TmxReader of this commit")
    args = p.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    readers = {"TmxReader": reader_pass, "bare iterparse": iterparse_pass}
    if args.baseline:
        readers[f"TmxReader at {args.baseline}"] = baseline_pass(args.baseline)
    print("| file | reader | TU/s (CPU) | peak traced memory (MB) |\n|---|---|---:|---:|")
    for name in ("bench.tmx", "bench.tmx.gz"):
        path = args.work / name
        write_tmx(str(path), tus(args.tus))
        best = {r: (float("inf"), 0, 0) for r in readers}
        for _ in range(args.repeat):
            for label, fn in readers.items():
                result = measure(fn, path)
                best[label] = min(best[label], result)
        for label, (seconds, n, peak) in best.items():
            assert n == args.tus, (label, n)
            print(f"| {name} ({path.stat().st_size / 1e6:.0f} MB) | {label} | {n / seconds:,.0f} | {peak / 1e6:.2f} |")


if __name__ == "__main__":
    main()
