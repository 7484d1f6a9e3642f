"""benchmarks/gpu_check.sh on its CPU path (`--cpu`: the same steps at tiny sizes): it must run to the
end and write a report and a device profile a planner can read, with every number it promises."""
from __future__ import annotations

import json
import math

import pytest

from tests.conftest import run_cli


@pytest.mark.slow
def test_gpu_check_cpu_path_writes_report_and_profile(tmp_path):
    out = tmp_path / "out"
    proc = run_cli(["bash", "benchmarks/gpu_check.sh", "--cpu", "--work", str(tmp_path / "work")], timeout=900,
                   env_extra={"OUT": str(out)})
    assert "all checks passed" in proc.stdout, proc.stdout[-3000:]
    assert (out / "gpu_check.log").read_text().count("gpu_check:") > 10  # the log holds what was printed

    report = json.loads((out / "gpu_check.json").read_text())
    placement = report["placement"]
    assert placement["deepspeed_accelerator"] == "cpu" and placement["trainer_device"] == "cpu" and placement["ok"]
    runs = {r["name"]: r for r in report["runs"]}
    assert set(runs) == {"enja-small_bf16", "enja-small_fp32", "paper-size_bf16", "paper-size_fp32"}
    for name, r in runs.items():
        assert r["exit"] == 0 and "error" not in r and r["finite"], name
        assert r["pairs_per_s"] > 0 and r["tokens_per_s"] > r["pairs_per_s"] and r["peak_memory_mib"] > 50
        assert r["model_tflops"] > 0 and 0 < r["mfu_measured_gemm_peak"] and "mfu_datasheet" not in r  # no CPU sheet
        assert r["dev_bleu"] is not None and math.isfinite(r["first_loss"])
    # the paper-size stand-in is bigger than enja-small's: more FLOPs per pair
    assert runs["paper-size_fp32"]["model_tflop_per_pair"] > runs["enja-small_fp32"]["model_tflop_per_pair"]
    assert report["resume"]["ok"] and report["resume"]["logged_steps"] == list(range(1, report["steps"] + 6))
    assert report["portability"]["ok"] and report["portability"]["lines_out"] == 16
    for diff in report["bf16_vs_fp32_first_loss_rel_diff"].values():
        assert diff < 0.02  # same weights, same first batch; bf16 rounding only

    profile = json.loads((out / "device_profile.json").read_text())
    assert profile["device"]["type"] == "cpu" and profile["datasheet"] is None
    for precision in ("bf16", "fp32"):
        gemm, lstm = profile["compute"][precision]["gemm"], profile["compute"][precision]["lstm"]
        assert len(gemm) == 4 and all(g["tflops"] > 0 and g["ms"] > 0 for g in gemm)
        assert len(lstm) == 2 and all(x["tflops"] > 0 for x in lstm)
    assert profile["memory"]["copy_tb_s"] > 0
    assert profile["links"]["allreduce"] is None and "one device" in profile["links"]["allreduce_note"]
    assert profile["sources"]["compute"].startswith("measured:")
