"""The GPU side of the profile format (trainer/planner/profile.py): datasheet peaks of the GPUs we may be
lent, this workplace's measurements, stated estimates for what no GPU run has measured yet, and
`roofline(profile)`, which turns a device profile measured by the GPU check (python -m
benchmarks.gpu.gpu_check -> device_profile.json) into the planner's "roofline" section (read by
trainer/planner/roofline.py): measured numbers where the profile has them, the datasheet's or an estimate
(each with its source) elsewhere. `python -m benchmarks.gpu.gpu_profile --planner-profile OUT.json [--from
device_profile.json]` writes it.
"""
from __future__ import annotations

import os

from data_prep.dataformat import userfiles

# Dense (no sparsity) peaks. The datasheets print tensor-core rates "with sparsity"; dense is half.
DATASHEETS = {
    "NVIDIA H200 NVL": dict(peak_tflops={"bf16": 835.5, "tf32": 417.5, "fp32": 60.0}, memory_tb_s=4.8,
                            links_gb_s={"nvlink": 900.0, "pcie": 128.0},
                            source="NVIDIA H200 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/h200), "
                                   "H200 NVL column: BF16 1,671 TFLOPS and TF32 835 TFLOPS with sparsity, FP32 60 "
                                   "TFLOPS, 4.8 TB/s, NVLink 900 GB/s, PCIe Gen5 128 GB/s"),
    "NVIDIA H200": dict(peak_tflops={"bf16": 989.5, "tf32": 494.7, "fp32": 67.0}, memory_tb_s=4.8,
                        links_gb_s={"nvlink": 900.0, "pcie": 128.0},
                        source="NVIDIA H200 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/h200), "
                               "H200 SXM column: BF16 1,979 TFLOPS and TF32 989 TFLOPS with sparsity, FP32 67 "
                               "TFLOPS, 4.8 TB/s, NVLink 900 GB/s, PCIe Gen5 128 GB/s"),
    "NVIDIA H100 80GB HBM3": dict(peak_tflops={"bf16": 989.5, "tf32": 494.7, "fp32": 67.0}, memory_tb_s=3.35,
                                  links_gb_s={"nvlink": 900.0, "pcie": 128.0},
                                  source="NVIDIA H100 Tensor Core GPU datasheet, H100 SXM column"),
    "NVIDIA A100-SXM4-80GB": dict(peak_tflops={"bf16": 312.0, "tf32": 156.0, "fp32": 19.5}, memory_tb_s=2.039,
                                  links_gb_s={"nvlink": 600.0, "pcie": 64.0},
                                  source="NVIDIA A100 Tensor Core GPU datasheet, A100 80GB SXM column"),
}


def datasheet(name: str) -> dict | None:
    """The entry whose name is the longest prefix of the device's name (H200 NVL before H200)."""
    for key in sorted(DATASHEETS, key=len, reverse=True):
        if name.startswith(key):
            return {"name": key, **DATASHEETS[key]}
    return None


# ---- the planner's roofline section ----
LAUNCH_BOUND = 4  # a product timed at under this many bare launches measured the host, not the device
KINDS_MEASUREMENT = ("measured: this workplace's H200 (device tool, KINDS.md, 2026-10-28 and 2026-11-04): bf16 "
                     "8192^3 torch matmul on random data 769-798 TFLOP/s; device-to-device copy 4.3 TB/s (read + write)")
# the planner's stated estimates, for a GPU where nothing measured them: {key: {"value", "source"}} (package data)
ESTIMATES = {key: (node["value"], node["source"]) for key, node in userfiles.read_json(
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "estimates.json"), 1 << 20,
    "the planner's estimates").items()}
LINK_ESTIMATES = {"efficiency": (0.8, "estimate: NCCL reaches about 80% of a link's rate on large messages"),
                  "latency_us": {"nvlink": (10.0, "estimate: NCCL small-message latency between GPUs over NVLink"),
                                 "pcie": (20.0, "estimate: NCCL small-message latency between GPUs over PCIe")}}


def _num(value, source: str) -> dict:
    return {"value": value, "source": source}


def gemm_rates(compute: dict, launch_us: float) -> dict:
    """{precision: {"value": [[rows, tflops], ...], "source"}} from the measured products of each precision: the best
    rate at each row count, leaving out products so short that the host's launch, not the device, set their time."""
    out = {}
    for precision, table in compute.items():
        best: dict = {}
        for g in table.get("gemm") or []:
            if g["ms"] * 1000 >= LAUNCH_BOUND * launch_us:
                best[g["m"]] = max(best.get(g["m"], 0.0), g["tflops"])
        if best:
            out[precision] = _num([[m, t] for m, t in sorted(best.items())],
                                  f"measured: compute.{precision}.gemm, the best rate at each row count (products timed "
                                  f"under {LAUNCH_BOUND} launches of {launch_us} us left out: the host set their time)")
    return out


def roofline(profile: dict) -> dict:
    """The planner's rates (trainer/planner/roofline.py) from a device profile: measured numbers where
    the profile has them, the datasheet's and this workplace's measurements, stated estimates else."""
    sheet = profile.get("datasheet") or {}
    compute = profile.get("compute") or {}
    out = {"gemm_tflops": {}, "lstm_gemm_tflops": {}}
    for precision in ("bf16", "fp32"):
        gemms = compute.get(precision, {}).get("gemm") or []
        if gemms:
            best = max(gemms, key=lambda g: g["tflops"])
            out["gemm_tflops"][precision] = _num(best["tflops"], f"measured: largest torch matmul of compute.{precision}.gemm "
                                                                 f"({best['m']}x{best['n']}x{best['k']})")
        elif precision == "bf16" and sheet.get("name", "").startswith("NVIDIA H200"):
            out["gemm_tflops"]["bf16"] = _num(788.0, KINDS_MEASUREMENT)
        else:
            ratio = 788.0 / 989.5  # achieved / datasheet, bf16 on this workplace's H200
            out["gemm_tflops"][precision] = _num(round(sheet["peak_tflops"][precision] * ratio, 1),
                                                 f"estimate: datasheet {sheet['peak_tflops'][precision]} TFLOP/s x "
                                                 f"{ratio:.3f} (measured / datasheet bf16 ratio)")
        out["lstm_gemm_tflops"][precision] = out["gemm_tflops"][precision]
    if "tf32" in (sheet.get("peak_tflops") or {}):
        tf32 = compute.get("tf32", {}).get("gemm") or []
        value = max(g["tflops"] for g in tf32) if tf32 else round(sheet["peak_tflops"]["tf32"] * 788.0 / 989.5, 1)
        out["lstm_gemm_tflops"]["fp32"] = _num(value, "cuDNN runs fp32 LSTMs on TF32 by default (torch.backends.cudnn."
                                                      "allow_tf32): " + ("measured compute.tf32.gemm" if tf32 else
                                                                         "estimate: datasheet TF32 x 0.796"))
    copy = (profile.get("memory") or {}).get("copy_tb_s")
    out["memory_tb_s"] = (_num(copy, "measured: memory.copy_tb_s") if copy and (profile.get("device") or {}).get("type") == "cuda"
                          else _num(4.3, KINDS_MEASUREMENT))
    for key, (value, source) in ESTIMATES.items():
        out[key] = _num(value, source)
    overhead = (profile.get("host") or {}).get("op_overhead_us")
    if overhead:
        out["op_overhead_us"] = _num(overhead, "measured: host.op_overhead_us")
    rates = gemm_rates(compute, overhead or ESTIMATES["op_overhead_us"][0])
    if rates:
        out["gemm_rates"] = rates
        if "tf32" in rates:
            out["gemm_tflops"]["tf32"] = _num(max(t for _, t in rates["tf32"]["value"]), "measured: largest torch matmul "
                                                                                         "of compute.tf32.gemm")
    links = sheet.get("links_gb_s") or {}
    out["links"] = {}
    for name, total in links.items():
        out["links"][name] = {
            "gb_s": _num(total / 2, f"datasheet: {total} GB/s in both directions together, half each way ({sheet.get('source')})"),
            "efficiency": _num(*LINK_ESTIMATES["efficiency"]),
            "latency_us": _num(*LINK_ESTIMATES["latency_us"].get(name, (15.0, "estimate")))}
    out["default_link"] = "nvlink" if "nvlink" in out["links"] else next(iter(out["links"]), None)
    return out
