"""The GPU check's figures and tables (benchmarks/gpu/gpu_check.py): model FLOP/s and MFU against the peak of the
precision the run's matrix work actually ran in, the summary table, and the goals of the device-paced step, each
with what was measured against what it asks.

Precision of a run, and the peak its MFU is taken against: bf16 and fp16 -> the bf16 peak (the same tensor-core
rate on Ampere and Hopper); fp32 with train.tf32=false -> the fp32 peak (cuBLAS and cuDNN in full fp32);
`tf32` (fp32 with train.tf32=true) -> the TF32 peak. The first check (2026-12-04) ran fp32 with cuDNN in TF32
without saying so and quoted its MFU against the fp32 sheet (62%); that cannot happen here.
"""
from __future__ import annotations

import json

from benchmarks.gpu import gpu_patent, gpu_profile

FIRST_CHECK_PATENT_TOKENS_PER_S = 373_080  # patent_bf16, batch 128, ../shared/gpu/2026-12-04 (commit b5466e3)
PEAK_OF = {"bf16": "bf16", "fp16": "bf16", "fp32": "fp32", "tf32": "tf32"}


def add_mfu(result: dict, model: dict, shape: dict, precision: str, profile: dict) -> None:
    flops = gpu_profile.train_flops_per_pair(model, shape["tgt_vocab"], shape["src_len"], shape["tgt_len"])
    achieved = result["pairs_per_s"] * flops / 1e12
    result.update(model_tflop_per_pair=flops / 1e12, model_tflops=round(achieved, 4), mfu_precision=PEAK_OF[precision])
    sheet = profile["datasheet"]
    if sheet:
        result["mfu_datasheet"] = round(achieved / sheet["peak_tflops"][PEAK_OF[precision]], 5)
    compute = profile["compute"].get(PEAK_OF[precision]) or profile["compute"]["fp32"]
    result["mfu_measured_gemm_peak"] = round(achieved / max(g["tflops"] for g in compute["gemm"]), 5)


def host_ms(run: dict) -> float | None:
    """The run's main + autograd threads' CPU ms per step (timing/rank0.json), None if not recorded."""
    cpu = run.get("cpu_ms_per_step") or {}
    parts = [v for k, v in cpu.items() if k == "main" or k.startswith("pt_autograd")]
    return round(sum(parts), 2) if parts else None


def _cell(r: dict, key: str, fmt: str) -> str:
    return format(r[key], fmt) if isinstance(r.get(key), (int, float)) else "-"


def print_runs(report: dict) -> None:
    print("| run | batch | pairs/s | tokens/s | step ms (steady / timed median) | steady steps | host CPU ms/step | "
          "device busy | peak MiB | MFU (peak of) | gates | first / last loss | dev BLEU |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|")
    extra = [report[k] for k in ("profiled", "profiled_patent", "wandb") if (report.get(k) or {}).get("name")]
    for r in report["runs"] + extra:
        if "first_loss" not in r:
            print(f"| {r['name']} | FAILED ({str(r.get('error', ''))[:60]!r}) |")
            continue
        mfu = "n/a" if r.get("mfu_datasheet") is None else f"{100 * r['mfu_datasheet']:.2f}% ({r['mfu_precision']})"
        busy = (r.get("profile") or {}).get("device_busy_fraction")
        gates = r.get("gates") or {}
        gate = "ok" if gates.get("ok") else ("norm ok, loss n/a" if gates.get("grad_norm_ok") and not gates.get(
            "loss_judged") else ("FAILED" if gates else "-"))
        print(f"| {r['name']} | {r.get('micro_batch', '-')} | {_cell(r, 'pairs_per_s', '.0f')} | "
              f"{_cell(r, 'tokens_per_s', '.0f')} | {_cell(r, 'step_ms_mean', '.1f')} / "
              f"{_cell(r, 'timed_step_ms_median', '.1f')} | {r.get('untimed_steps', '-')} | {host_ms(r) or '-'} | "
              f"{'-' if busy is None else format(busy, '.0%')} | {_cell(r, 'peak_memory_mib', '.0f')} | {mfu} | "
              f"{gate} | {_cell(gates, 'loss_first', '.3f')} / {_cell(gates, 'loss_last', '.3f')} | "
              f"{_cell(r, 'dev_bleu', '.2f')} |")


def print_anchors(report: dict) -> None:
    anchors = report.get("anchors") or []
    if not anchors:
        return
    print("\n| anchor (the minimal PyTorch program) | batch | pairs/s | tokens/s | step ms | ours (same data, batch, "
          "precision) tokens/s | ours / anchor |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for a in anchors:
        if "tokens_per_s" not in a:
            print(f"| {a['name']} | FAILED ({str(a.get('error', ''))[:60]!r}) |")
            continue
        ours = a.get("ours_tokens_per_s")
        print(f"| {a['name']} | {a['batch']} | {a['pairs_per_s']:.0f} | {a['tokens_per_s']:.0f} | "
              f"{a['step_ms_mean']:.1f} | {'-' if ours is None else format(ours, '.0f')} | "
              f"{'-' if ours is None else format(ours / a['tokens_per_s'], '.2f')} |")


def goals(report: dict) -> list[dict]:
    """The device-paced goals, each {'goal', 'measured', 'met'} (met None: not measured in this check)."""
    runs = {r["name"]: r for r in report["runs"] if "tokens_per_s" in r}
    patent = runs.get("patent_bf16", {})
    busy = ((report.get("profiled_patent") or {}).get("profile") or {}).get("device_busy_fraction")
    out = [{"goal": f"patent bf16 (batch 128) >= 2x {FIRST_CHECK_PATENT_TOKENS_PER_S:,} tokens/s",
            "measured": patent.get("tokens_per_s"),
            "met": None if not patent else patent["tokens_per_s"] >= 2 * FIRST_CHECK_PATENT_TOKENS_PER_S},
           {"goal": "device busy >= 80% of a patent bf16 step (profiled, steady state)", "measured": busy,
            "met": None if busy is None else busy >= 0.8}]
    others = [runs.get(n, {}).get("tokens_per_s") for n in ("patent_fp32", "patent_tf32")]
    if patent and any(others):
        out.append({"goal": "patent bf16 faster than fp32 and TF32", "measured": [patent["tokens_per_s"], *others],
                    "met": all(o is None or patent["tokens_per_s"] > o for o in others)})
    anchored = [a for a in report.get("anchors") or [] if a.get("ours_tokens_per_s") and a.get("tokens_per_s")]
    if anchored:
        out.append({"goal": "every row at least the minimal PyTorch program's tokens/s",
                    "measured": {a["name"]: round(a["ours_tokens_per_s"] / a["tokens_per_s"], 3) for a in anchored},
                    "met": all(a["ours_tokens_per_s"] >= a["tokens_per_s"] for a in anchored)})
    gate = report.get("compile_gate")
    out.append({"goal": "the compiled head equals eager on the device, or is refused",
                "measured": None if not gate else {k: gate.get(k) for k in ("max_rel_diff", "graphs", "ok")},
                "met": None if not gate else bool(gate.get("ok"))})
    return out


def print_table(report: dict) -> None:
    """What the check measured, as far as it got."""
    for name, st in report["stages"].items():
        print(f"stage {name}: {st['status']}" + (f" ({st['seconds']}s)" if "seconds" in st else f" ({st.get('why')})"))
    p = report.get("placement")
    if p:
        print(f"\nplacement: {p['trainer_device']} (DeepSpeed accelerator {p['deepspeed_accelerator']}); loss vs CPU "
              f"fp32 rel diff {p['loss_rel_diff']:.2e}, grad norm {p['grad_norm_rel_diff']:.2e}")
    print(f"steady state: each run's steps after step {report.get('warmup')} that no metrics row timed "
          f"(warm-up excluded); gates: every logged grad norm finite and non-zero, the loss falling")
    print_runs(report)
    print_anchors(report)
    if report.get("graphs_stack"):
        print(f"\nthe decoder stack as CUDA graphs: {json.dumps(report['graphs_stack'])}")
    if report.get("graphs"):
        print(f"\npatent bf16, train.cuda_graphs on against off: {json.dumps(report['graphs'])}")
    if report.get("shared_gpu"):
        print(f"\n2 ranks on one GPU: {json.dumps(report['shared_gpu'])}")
    print("\ngoals:")
    for g in goals(report):
        met = {True: "met", False: "NOT met", None: "not measured"}[g["met"]]
        print(f"- {g['goal']}: {met} ({json.dumps(g['measured'])})")
    profile = report.get("profile")
    if profile:
        for precision, c in profile["compute"].items():
            print(f"{precision}: GEMM TFLOP/s " + ", ".join(f"{g['m']}x{g['n']}x{g['k']}={g['tflops']}"
                                                          for g in c["gemm"])
                  + "; LSTM fwd+bwd TFLOP/s " + ", ".join(f"b{x['batch']}t{x['time']}h{x['hidden']}={x['tflops']}"
                                                         for x in c["lstm"]))
        print(f"memory/links: {profile['memory']} {json.dumps(profile['links'])}")
    if report.get("latency"):
        lat = report["latency"]
        print(f"latencies at patent length: {lat['op_overhead_us']} us per launch, {lat['sync_us']} us per sync, "
              f"LSTM step {lat['lstm_step_us']} us forward / {lat['lstm_step_bwd_us']} us backward "
              f"(estimates: 5, 15, 6 us)")
    if report.get("planner"):
        patent = next((r for r in report["runs"] if r["name"] == "patent_bf16"), {})
        gpu_patent.print_predictions(report["planner"], patent.get("step_ms_mean"))
