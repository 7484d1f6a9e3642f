"""The records and the page made from them.

    python -m benchmarks.results render [--check]      docs/BENCHMARKS.md from benchmarks/results/*.jsonl
    python -m benchmarks.results gpu OUT_DIR --command CMD --commit C --date D [--time T] [--prefix P] [--machine M]
                                                       a GPU check's $OUT as records of the gpu question

`render --check` writes nothing and exits 1 when the page on disk differs from what the records make.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from benchmarks.common import REPO


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.results", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="what", required=True)
    r = sub.add_parser("render", help="write docs/BENCHMARKS.md from the records")
    r.add_argument("--check", action="store_true", help="write nothing; exit 1 when the page differs")
    g = sub.add_parser("gpu", help="append a GPU check's records (from the files of its $OUT)")
    g.add_argument("out_dir", type=Path)
    g.add_argument("--command", required=True, help="the command that ran the check on the device")
    g.add_argument("--commit", required=True, help="the commit the device ran")
    g.add_argument("--date", required=True, help="YYYY-MM-DD of the device's run")
    g.add_argument("--time", default=None)
    g.add_argument("--prefix", default="", help="a second call's file prefix in OUT_DIR (e.g. scan_)")
    g.add_argument("--machine", default=None, help="default: the GPU gpu_check.json names")
    g.add_argument("--note", default=None)
    args = p.parse_args()
    if args.what == "render":
        sys.exit(render(args.check))
    from benchmarks.results import gpu_records, stamp, write

    recs = gpu_records.records(args.out_dir, command=args.command, machine_name=args.machine, note=args.note,
                               prefix=args.prefix)
    write(stamp(recs, date=args.date, time=args.time, commit=args.commit))


def render(check: bool) -> int:
    from benchmarks.results.page import PAGE, render as page

    text, path = page(), REPO / PAGE
    if check:
        same = path.exists() and path.read_text(encoding="utf-8") == text
        print(f"{PAGE}: {'as the records make it' if same else 'differs from the records: python -m benchmarks.results render'}")
        return 0 if same else 1
    path.write_text(text, encoding="utf-8")
    print(f"wrote {PAGE} ({len(text.splitlines())} lines)")
    return 0


if __name__ == "__main__":
    main()
