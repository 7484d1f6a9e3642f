"""The issue's hostile corpora at full size, through the real prepare CLI: time to the answer and peak memory.

    python -m benchmarks.reliability.hostile_inputs [--gib 2] [--work /tmp/hybrid-nmt-hostile]

Builds (once, in --work) the inputs of issue 11 with a payload of --gib GiB and runs
`python -m data_prep.prepare --train-src FILE --out DIR --workers 1` on each:
  zip-zeros        an OPUS zip whose two members are GiB of zeros (the archive is a few MB)
  zip-copies       an OPUS zip of repeated short lines ("copy" pairs; it wrote 343 MB of rejects.tsv before)
  gz-seg           a gzipped TMX with one <seg> of GiB of "a"
  tmx-whitespace   a plain TMX with GiB of whitespace between two <tu>s (read through, not refused)
  tmx-seg          a plain TMX with one <seg> of GiB of "a" (rejected as oversized, counted)
Reported per input: exit code, wall seconds, the prepare process's peak RSS (wait4: the kernel's exact
high-water mark) and the first line of its stderr. tests/test_hostile.py holds the small versions.
"""
from __future__ import annotations

import argparse
import gzip
import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path

from benchmarks.common import REPO
CHUNK = 1 << 24


def write_repeated(out, piece: bytes, total: int) -> None:
    block = piece * max(1, CHUNK // len(piece))
    left = total
    while left > 0:
        out.write(block[:left])
        left -= len(block)


def zip_members(path: Path, piece_src: bytes, piece_tgt: bytes, total: int) -> None:
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name, piece in (("C.en-ja.en", piece_src), ("C.en-ja.ja", piece_tgt)):
            info = zipfile.ZipInfo(name)
            info.compress_type = zipfile.ZIP_DEFLATED
            with zf.open(info, "w", force_zip64=True) as member:
                write_repeated(member, piece, total)


def tmx_around(out, filler: bytes, total: int, inside_seg: bool) -> None:
    tu = '<tu><tuv xml:lang="en"><seg>the cat</seg></tuv><tuv xml:lang="ja"><seg>猫</seg></tuv></tu>\n'.encode()
    out.write(b'<?xml version="1.0" encoding="UTF-8"?>\n<tmx version="1.4"><header srclang="en"/><body>\n' + tu)
    if inside_seg:
        out.write(b'<tu><tuv xml:lang="en"><seg>')
    write_repeated(out, filler, total)
    if inside_seg:
        out.write('</seg></tuv><tuv xml:lang="ja"><seg>猫</seg></tuv></tu>\n'.encode())
    out.write(tu + b"</body></tmx>\n")


def build(work: Path, total: int) -> dict[str, Path]:
    inputs = {"zip-zeros": work / "zeros.en-ja.zip", "zip-copies": work / "copies.en-ja.zip",
              "gz-seg": work / "seg.tmx.gz", "tmx-whitespace": work / "whitespace.tmx", "tmx-seg": work / "seg.tmx"}
    makers = {"zip-zeros": lambda p: zip_members(p, b"\0", b"\0", total),
              "zip-copies": lambda p: zip_members(p, b"copy\n", b"copy\n", total),
              "gz-seg": lambda p: tmx_around(gzip.open(p, "wb", compresslevel=6), b"a", total, True),
              "tmx-whitespace": lambda p: tmx_around(open(p, "wb"), b" \n", total, False),
              "tmx-seg": lambda p: tmx_around(open(p, "wb"), b"a", total, True)}
    for name, path in inputs.items():
        if not path.exists():
            tmp = path.with_name(path.name + ".tmp")
            makers[name](tmp)
            os.replace(tmp, path)
    return inputs


def run(path: Path, out: Path) -> dict:
    start = time.time()
    proc = subprocess.Popen([sys.executable, "-m", "data_prep.prepare", "--train-src", str(path), "--out", str(out),
                             "--workers", "1", "--overwrite"], cwd=REPO, stderr=subprocess.PIPE, text=True)
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    return {"code": os.waitstatus_to_exitcode(status), "wall_s": time.time() - start,
            "peak_rss_mb": usage.ru_maxrss / 1024, "stderr": (err.strip().splitlines() or [""])[-1][:160]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--gib", type=float, default=2.0)
    p.add_argument("--work", type=Path, default=Path("/tmp/hybrid-nmt-hostile"))
    args = p.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    inputs = build(args.work, int(args.gib * (1 << 30)))
    print("| input | file (MB) | exit | wall (s) | peak RSS (MB) | stderr |\n|---|---:|---:|---:|---:|---|")
    for name, path in inputs.items():
        r = run(path, args.work / f"out-{name}")
        print(f"| {name} | {path.stat().st_size / 1e6:.1f} | {r['code']} | {r['wall_s']:.1f} | {r['peak_rss_mb']:.0f} "
              f"| `{r['stderr'].replace(str(args.work) + '/', '')}` |", flush=True)


if __name__ == "__main__":
    main()
