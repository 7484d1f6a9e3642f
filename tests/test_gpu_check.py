"""benchmarks/gpu/gpu_check.sh on its CPU path (`--cpu`: the same stages at tiny sizes): it must run to the end
where MeCab cannot be imported (as on the device) and write a report and a device profile a planner can
read, with every number it promises; a run killed by its timeout, a stage that fails or overruns, and the
deadline must leave the report and the runs' files of everything before them."""
from __future__ import annotations

import json
import math
import sys
import tarfile
import time

import pytest

from tests.conftest import REPO, run_cli



@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """The check's data prepared before the device, where MeCab is installed (gpu_wheels.sh does this)."""
    work = tmp_path_factory.mktemp("gpudata")
    run_cli([sys.executable, "-m", "benchmarks.gpu.gpu_check", "--prepare-only", "--device", "cpu", "--work",
             str(work)], timeout=600)
    return work


@pytest.fixture(scope="module")
def no_mecab(tmp_path_factory):
    """A PYTHONPATH entry on which `import MeCab` and `import ipadic` fail, as on the device."""
    shadow = tmp_path_factory.mktemp("no_mecab")
    for name in ("MeCab", "ipadic"):
        (shadow / name).mkdir()
        (shadow / name / "__init__.py").write_text(f"raise ImportError('No module named {name!r} (hidden by the test)')\n")
    return f"{shadow}:{REPO}"


@pytest.mark.slow
def test_gpu_check_cpu_path_without_mecab_writes_report_and_profile(tmp_path, prepared, no_mecab):
    probe = run_cli([sys.executable, "-c", "import MeCab"], check=False, env_extra={"PYTHONPATH": no_mecab})
    assert probe.returncode != 0 and "hidden by the test" in probe.stderr
    out = tmp_path / "out"
    proc = run_cli(["bash", "benchmarks/gpu/gpu_check.sh", "--cpu", "--work", str(tmp_path / "work"),
                    "--data-root", str(prepared)], timeout=1200, env_extra={"OUT": str(out), "PYTHONPATH": no_mecab})
    assert "all checks passed" in proc.stdout, proc.stdout[-3000:]
    assert (out / "gpu_check.log").read_text().count("gpu_check:") > 10  # the log holds what was printed

    report = json.loads((out / "gpu_check.json").read_text())
    assert report["environment"]["mecab"] is False and "char" in report["environment"]["bleu_tokenize"]
    assert all(st["status"] == "ok" for st in report["stages"].values()), report["stages"]
    placement = report["placement"]
    assert placement["deepspeed_accelerator"] == "cpu" and placement["trainer_device"] == "cpu" and placement["ok"]
    runs = {r["name"]: r for r in report["runs"]}
    assert set(runs) == {"enja-small_bf16", "enja-small_fp32", "paper-size_bf16", "paper-size_fp32",
                         "enja-small_bf16_units"}
    for name, r in runs.items():
        assert r["exit"] == 0 and "error" not in r and r["finite"], name
        assert r["pairs_per_s"] > 0 and r["tokens_per_s"] > r["pairs_per_s"] and r["peak_memory_mib"] > 50
        assert r["model_tflops"] > 0 and 0 < r["mfu_measured_gemm_peak"] and "mfu_datasheet" not in r  # no CPU sheet
        assert r["dev_bleu"] is not None and math.isfinite(r["first_loss"])
    assert runs["enja-small_bf16"]["profile"]["steps"][1] - runs["enja-small_bf16"]["profile"]["steps"][0] == 2
    # the paper-size stand-in is bigger than enja-small's: more FLOPs per pair
    assert runs["paper-size_fp32"]["model_tflop_per_pair"] > runs["enja-small_fp32"]["model_tflop_per_pair"]
    assert report["resume"]["ok"] and report["resume"]["logged_steps"] == list(range(1, report["steps"] + 6))
    assert report["portability"]["ok"] and report["portability"]["lines_out"] == 16
    for diff in report["bf16_vs_fp32_first_loss_rel_diff"].values():
        assert diff < 0.02  # same weights, same first batch; bf16 rounding only
    with tarfile.open(out / "runs.tar.gz") as tar:
        names = set(tar.getnames())
    for name in runs:
        assert f"logs/{name}.log" in names and f"runs/{name}/metrics.jsonl" in names
    assert "runs/enja-small_bf16/profile/rank0.trace.json.gz" in names
    assert not any("checkpoints" in n for n in names)
    assert len(list(out.iterdir())) <= 8  # what the device tool brings back

    profile = json.loads((out / "device_profile.json").read_text())
    assert profile["device"]["type"] == "cpu" and profile["datasheet"] is None
    for precision in ("bf16", "fp32"):
        gemm, lstm = profile["compute"][precision]["gemm"], profile["compute"][precision]["lstm"]
        assert len(gemm) == 4 and all(g["tflops"] > 0 and g["ms"] > 0 for g in gemm)
        assert len(lstm) == 2 and all(x["tflops"] > 0 for x in lstm)
    assert profile["memory"]["copy_tb_s"] > 0
    assert profile["links"]["allreduce"] is None and "one device" in profile["links"]["allreduce_note"]
    assert profile["sources"]["compute"].startswith("measured:")


@pytest.mark.slow
def test_a_run_killed_by_its_timeout_leaves_the_report_and_its_files(tmp_path, prepared):
    out = tmp_path / "out"
    proc = run_cli([sys.executable, "-m", "benchmarks.gpu.gpu_check", "--device", "cpu", "--out", str(out), "--work",
                    str(tmp_path / "work"), "--data-root", str(prepared), "--stages", "environment,data,runs",
                    "--runs", "enja-small_bf16", "--run-timeout-s", "3"], timeout=300, check=False)
    assert proc.returncode == 1 and "KILLED after its 3s timeout" in proc.stdout, proc.stdout[-3000:]
    report = json.loads((out / "gpu_check.json").read_text())
    assert report["environment"]["torch"] and report["data"]
    (run,) = report["runs"]
    assert run["timeout"] and run["error"] == "timeout after 3s" and run["wall_s"] < 30
    with tarfile.open(out / "runs.tar.gz") as tar:
        assert "logs/enja-small_bf16.log" in tar.getnames()


def test_stages_overrunning_failing_or_past_the_deadline_are_recorded_as_they_happen(tmp_path):
    from benchmarks.gpu import gpu_check

    check = gpu_check.Check(tmp_path, deadline_s=30, report={})
    check.started = time.time()
    assert check.stage("fine", lambda: {"x": 1}, timeout=10) == {"x": 1}
    assert json.loads((tmp_path / "gpu_check.json").read_text())["stages"]["fine"]["status"] == "ok"
    assert check.stage("slow", lambda: time.sleep(5), timeout=1) is None
    assert json.loads((tmp_path / "gpu_check.json").read_text())["stages"]["slow"]["status"] == "timeout"
    assert check.stage("broken", lambda: 1 / 0, timeout=10) is None
    stages = json.loads((tmp_path / "gpu_check.json").read_text())["stages"]
    assert stages["broken"]["status"] == "failed" and "ZeroDivisionError" in stages["broken"]["error"]
    check.deadline = time.time() + 5
    assert check.stage("late", lambda: 1, timeout=10, need=20) is None
    stages = json.loads((tmp_path / "gpu_check.json").read_text())["stages"]
    assert stages["late"]["status"] == "skipped" and "deadline" in stages["late"]["why"]
