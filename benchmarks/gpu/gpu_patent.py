"""The GPU check at patent length (benchmarks/gpu/gpu_check.py): the planner's `patent_len` scenario
(python -m benchmarks.planner predict: the paper-size model without dropout, every sentence pair repeated 4 times,
~33 source and ~49 target pieces, about a patent sentence) as data the trainer reads, the latencies the
planner only estimates, measured at that length, and the planner's predictions from both.

    stretch_data_dir  DATA_DIR -> one whose every sentence is the original's pieces repeated N times
                      (binarized ids, no EOS in between, as the planner's `stretch`; texts joined by spaces)
    latencies         host time per launched op, one device sync (a tiny op and reading it back, beyond
                      the launch), the LSTM's time per time step forward and backward (cuDNN's nn.LSTM
                      at the paper-size width and batch, timed at the patent source length and twice it:
                      the slope), in bf16
    planner_profile   the device profile's roofline (trainer/planner/gpu_profile.py) with those three
                      measured numbers in place of its estimates -> OUT/planner_profile.json
    predictions       the planner's 2/4/8-GPU ranking (launch/plan.py's) on the stretched data, from the
                      shipped estimates (trainer/planner/profiles/h200.json) and from the measured profile

The planner's other estimates (instruction_us, backward_call_us, host_collective_us, the links) stay
estimates: one GPU has no peer, and the interpreter's own costs need a multi-rank run.
"""
from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import numpy as np

from benchmarks.gpu import gpu_profile
from benchmarks.common import REPO, ds_variant
from data_prep.dataformat import MANIFEST, SPM_MODELS

ESTIMATES_PROFILE = REPO / "trainer" / "planner" / "profiles" / "h200.json"
PLANNER_CONFIG = "trainer/configs/paper_size.yaml"


# ---- the data ----
def stretch_data_dir(src: Path, out: Path, times: int) -> Path:
    """OUT: SRC with every sentence (each split, both sides) repeated `times` times; made once."""
    from data_prep.binary import SIDES, TokenArray, TokenArrayWriter, file_sha256, files_checksum, side_paths

    if (out / MANIFEST).exists():
        return out
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    manifest = json.loads((src / MANIFEST).read_text())
    binarized = []
    for split in manifest["splits"]:
        for side in SIDES:
            arr = TokenArray.load(str(src), split, side)
            writer = TokenArrayWriter(str(tmp), split, side)
            for i in range(len(arr)):
                writer.append(np.tile(arr[i], times))
            writer.close()
            binarized += [Path(p).name for p in side_paths(str(tmp), split, side)]
            text = src / f"{split}.{side}.txt"
            if text.exists():
                lines = text.read_text(encoding="utf-8").splitlines()
                (tmp / text.name).write_text("".join(" ".join([line] * times) + "\n" for line in lines), encoding="utf-8")
            manifest["splits"][split]["tokens"][side] *= times
    for name in [n for model in SPM_MODELS.values() for n in (model, model.replace(".model", ".vocab"))]:
        if (src / name).exists():
            shutil.copy2(src / name, tmp / name)
    manifest.update(checksum_files=sorted(binarized), checksum=files_checksum(str(tmp), binarized),
                    file_sha256={n: file_sha256(str(tmp / n)) for n in sorted(binarized)},
                    derived={"from": str(src), "repeat": times, "how": "every sentence's pieces repeated (the "
                             "planner's patent_len scenario, python -m benchmarks.planner predict)"})
    (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1))
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


# ---- the latencies ----
def sync_us(dev, op_us: float, reps: int = 200) -> float:
    """Host microseconds of one device sync beyond the launch: a tiny op, then reading its 4 bytes
    back (the host waits for the queue, then copies), minus the launch alone (`op_us`)."""
    import torch

    x = torch.zeros(1, device=dev)
    for _ in range(20):
        x.add_(1).item()
    t = time.perf_counter()
    for _ in range(reps):
        x.add_(1)
        x.item()
    return max(0.0, 1e6 * (time.perf_counter() - t) / reps - op_us)


def lstm_ms(dev, hidden: int, batch: int, steps: int, reps: int, backward: bool) -> float:
    """Milliseconds of one bf16 nn.LSTM layer (hidden -> hidden, batch-first) over `steps` time steps:
    forward (as in training: the input needs its gradient), with `backward` forward + backward."""
    import torch

    layer = torch.nn.LSTM(hidden, hidden, batch_first=True).to(device=dev, dtype=torch.bfloat16)
    x = torch.randn(batch, steps, hidden, device=dev, dtype=torch.bfloat16, requires_grad=True)

    def run():
        y, _ = layer(x)
        if backward:
            y.sum().backward()

    for _ in range(2):
        run()
    return gpu_profile._timer(dev)(run, reps)


def latencies(dev, hidden: int, batch: int, src_len: float, reps: int) -> dict:
    """The planner's estimated latencies, measured at patent length (module docstring)."""
    op_us = gpu_profile.op_overhead(dev)
    t0 = max(2, round(src_len))
    t1 = 2 * t0
    fwd = {t: lstm_ms(dev, hidden, batch, t, reps, backward=False) for t in (t0, t1)}
    both = {t: lstm_ms(dev, hidden, batch, t, reps, backward=True) for t in (t0, t1)}
    step_fwd = (fwd[t1] - fwd[t0]) / (t1 - t0) * 1000
    step_bwd = ((both[t1] - both[t0]) - (fwd[t1] - fwd[t0])) / (t1 - t0) * 1000
    out = {"op_overhead_us": op_us, "sync_us": gpu_profile._sig(sync_us(dev, op_us)),
           "lstm_step_us": gpu_profile._sig(max(step_fwd, 0.0)), "lstm_step_bwd_us": gpu_profile._sig(max(step_bwd, 0.0)),
           "batch": batch, "hidden": hidden, "time_steps": [t0, t1],
           "lstm_ms": {"fwd": {str(t): gpu_profile._sig(v) for t, v in fwd.items()},
                       "fwd_bwd": {str(t): gpu_profile._sig(v) for t, v in both.items()}}}
    print(f"gpu_check: latencies at patent length: {json.dumps(out)}", flush=True)
    return out


def planner_profile(device_profile: dict, lat: dict, path: Path) -> dict:
    """The planner's profile from the measured device profile (its roofline: measured rates, datasheet
    links, estimates elsewhere) with the patent-length latencies in place of their estimates; written
    to `path`. A profile without a datasheet (a CPU) borrows the H200's links: the code path only."""
    from trainer.planner.gpu_profile import datasheet, roofline

    base = json.loads(json.dumps(device_profile))
    if not base.get("datasheet"):
        base["datasheet"] = datasheet("NVIDIA H200")
        base.setdefault("sources", {})["datasheet"] = ("no datasheet for this device: the NVIDIA H200's links, so "
                                                       "that the planner runs (a rehearsal, no prediction)")
    roof = roofline(base)
    where = (f"at patent length (bf16 nn.LSTM, batch {lat['batch']}, hidden {lat['hidden']}, "
             f"{lat['time_steps'][0]} and {lat['time_steps'][1]} time steps)")
    roof["op_overhead_us"] = {"value": lat["op_overhead_us"], "source": "measured: host time per tiny eager op "
                                                                        "(gpu_profile.op_overhead)"}
    roof["sync_us"] = {"value": lat["sync_us"], "source": "measured: a tiny op then .item(), minus the launch"}
    roof["lstm_step_us"] = {"value": lat["lstm_step_us"], "source": f"measured: forward time per time step {where}"}
    roof["lstm_step_bwd_us"] = {"value": lat["lstm_step_bwd_us"], "source": f"measured: backward time per time step {where}"}
    base.update(roofline=roof, latencies=lat, measured_by="python3 -m benchmarks.gpu.gpu_check (latency stage)")
    path.write_text(json.dumps(base, indent=1) + "\n")
    return base


# ---- the planner ----
def predictions(data: Path, overrides: list[str], micro: int, profiles: dict, work: Path, devices=(2, 4, 8),
                link: str = "nvlink", steps: int = 4) -> dict:
    """{label: [row per device count]}: the planner's one-GPU step and the best layout of each mode
    (speed-up over one GPU) on the stretched data, for each profile of `profiles` (label -> path)."""
    from trainer.config import load_config, merge_overrides
    from trainer.parallel.deepspeed_json import load_ds_config
    from trainer.planner import plan
    from trainer.planner.profile import load

    cfg = load_config(str(REPO / PLANNER_CONFIG), merge_overrides([f"data.dir={data}", "model.dropout=0.0"], overrides))
    ds = load_ds_config(str(ds_variant(work, "single", "patent_plan", train_micro_batch_size_per_gpu=micro)), 1000)
    workload = plan.workload(cfg, ds, steps)
    out = {}
    for label, path in profiles.items():
        profile, rows = load(str(path)), []
        for n in devices:
            t = time.time()
            ranked, one, _ = plan.rank_layouts(workload, profile, n, link)
            best = plan.best_by_mode(ranked, n)
            rows.append({"devices": n, "link": link, "one_gpu_ms": round(1000 * one.step_s, 3),
                         "pick": ranked[0].candidate.label(), "pick_ranks": ranked[0].candidate.ranks,
                         "pick_speedup": round(ranked[0].speedup, 3),
                         **{f"{m}_speedup": round(p.speedup, 3) for m, p in best.items()},
                         **{f"{m}_layout": p.candidate.label() for m, p in best.items()},
                         "seconds": round(time.time() - t, 1)})
            print(f"gpu_check: planner ({label}): {json.dumps(rows[-1])}", flush=True)
        out[label] = rows
    return out


def print_predictions(planner: dict, measured_ms: float | None) -> None:
    """The planner's 2/4/8-GPU predictions from estimates beside those from measured latencies."""
    rows = {label: {r["devices"]: r for r in rs} for label, rs in planner["predictions"].items()}
    est, mea = rows.get("estimates", {}), rows.get("measured", {})
    cell = lambda r, m: f"{r[m + '_speedup']:.2f}x" if r and m + "_speedup" in r else "-"  # noqa: E731
    print(f"\nplanner, patent length ({planner['data']}): predicted speed-up over one GPU by layout; "
          f"estimates = {ESTIMATES_PROFILE.relative_to(REPO)}, measured = planner_profile.json")
    for label, path in planner.get("profiles", {}).items():
        print(f"{label}: {profile_provenance(path)}")
    print("| GPUs | predicted: hybrid (est / measured) | data | pipeline | pick (est) | pick (measured) |")
    print("|---:|---|---|---|---|---|")
    for n in sorted(set(est) | set(mea)):
        e, m = est.get(n), mea.get(n)
        print(f"| {n} | {cell(e, 'hybrid')} / {cell(m, 'hybrid')} | {cell(e, 'data')} / {cell(m, 'data')} | "
              f"{cell(e, 'pipeline')} / {cell(m, 'pipeline')} | {e['pick'] if e else '-'} | {m['pick'] if m else '-'} |")
    one = [f"{label} {next(iter(r.values()))['one_gpu_ms']:.1f}" for label, r in rows.items() if r]
    if measured_ms is not None:
        one.append(f"trained (untimed steps, measured) {measured_ms:.1f}")
    print("one-GPU ms/step, predicted: " + ", ".join(one))


def profile_provenance(path) -> str:
    """What a profile's prices rest on (trainer.planner.profile.provenance), or why it cannot say."""
    from trainer.planner.profile import load, provenance

    try:
        return provenance(load(str(path)))
    except (OSError, ValueError) as e:
        return f"{path}: not readable here ({e})"
