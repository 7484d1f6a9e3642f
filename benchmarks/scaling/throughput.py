"""One process alone (`python -m benchmarks.scaling --throughput`; its --help says what is measured): the
reference model in fp32 and bf16, pairs/s, tokens/s and the per-part split, with OpenNMT-py's figures
beside them when WORK/opennmt_peer.json holds some.
"""
from __future__ import annotations

import json
from pathlib import Path

from benchmarks import results as records
from benchmarks.common import breakdown, ds_variant, train

PEER_RUNS = ("OpenNMT-py, no input feeding fp32", "OpenNMT-py, input feeding fp32")


def run(work: Path, data: Path, steps: int, threads: int) -> None:
    results = {}
    for precision in ("fp32", "bf16"):
        name = f"throughput_{precision}"
        cfg = ds_variant(work, "single", name, bf16={"enabled": precision == "bf16"})
        results[precision] = train(work, name, cfg, 1, threads, steps, data)
    print("| precision | pairs/s | tokens/s | median step (ms) | fwd | head | bwd | opt |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for precision, r in results.items():
        b = breakdown(r["timing"][0])
        print(f"| {precision} | {r['pairs_per_s']:.0f} | {r['tokens_per_s']:.0f} | {r['step_ms_median']:.0f} | "
              f"{b['forward']:.0f} | {b['head']:.0f} | {b['backward']:.0f} | {b['optimizer_step']:.0f} |")
    peer_file = work / "opennmt_peer.json"
    if peer_file.exists():
        peer = json.loads(peer_file.read_text())
        for name in PEER_RUNS:
            if name in peer.get("runs", {}):
                print(f"{name}: {peer['runs'][name]['pairs_per_s']:.0f} pairs/s ({peer_file}, its own run; "
                      f"python -m benchmarks.peers.opennmt_peer measures both side by side)")
    else:
        print("the peer: python -m benchmarks.peers.opennmt_peer (OpenNMT-py 3.5.1 beside ours, same model and "
              "batches)")
    (work / "throughput.json").write_text(json.dumps(results, indent=1))
    records.write([records.record("scaling", "runs", command=records.command("benchmarks.scaling"), settings={
        "model": "enja-small", "precision": precision, "layout": f"single {threads} thread{'s' if threads > 1 else ''}",
        "threads": threads, "pairs_per_step": 64}, figures={
        "pairs_per_s": r["pairs_per_s"], "tokens_per_s": r["tokens_per_s"], "step_ms_median": r["step_ms_median"]})
        for precision, r in results.items()])
