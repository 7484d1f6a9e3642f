"""benchmarks/gpu/gpu_check.sh on its CPU path (`--cpu`: the same stages at tiny sizes): it must run to the end
where MeCab cannot be imported (as on the device) and write a report and a device profile a planner can
read, with every number it promises; a run killed by its timeout, a stage that fails or overruns, and the
deadline must leave the report and the runs' files of everything before them."""
from __future__ import annotations

import json
import math
import subprocess
import sys
import tarfile
import time

import pytest

from tests import background
from tests.conftest import REPO, run_cli



@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """The check's data prepared before the device, where MeCab is installed (gpu_wheels.sh does this)."""
    work = tmp_path_factory.mktemp("gpudata")
    run_cli([sys.executable, "-m", "benchmarks.gpu.gpu_check", "--prepare-only", "--device", "cpu", "--work",
             str(work)], timeout=600)
    return work


@pytest.mark.slow
@pytest.mark.timeout(3900)
def test_gpu_check_cpu_path_without_mecab_writes_report_and_profile(tmp_path):
    """The check's data prepared, then `gpu_check.sh --cpu` with MeCab hidden: started in the background when the
    suite collected this test (tests/background.py; here it is waited for), with its output in check.root."""
    check = background.check(background.CPU_PATH_TEST, tmp_path)
    probe = run_cli([sys.executable, "-c", "import MeCab"], check=False,
                    env_extra={"PYTHONPATH": background.no_mecab_path(check.root)})
    assert probe.returncode != 0 and "hidden by the test" in probe.stderr
    proc = check.result(timeout=3800)
    assert proc.returncode == 0 and "all checks passed" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "backstop of the deadline: 3700s" in proc.stdout  # the --deadline-s given, not the CPU's default
    out = check.root / "out"
    assert (out / "gpu_check.log").read_text().count("gpu_check:") > 10  # the log holds what was printed

    report = json.loads((out / "gpu_check.json").read_text())
    assert report["environment"]["mecab"] is False and "char" in report["environment"]["bleu_tokenize"]
    assert all(st["status"] == "ok" for st in report["stages"].values()), report["stages"]
    placement = report["placement"]
    assert placement["deepspeed_accelerator"] == "cpu" and placement["trainer_device"] == "cpu" and placement["ok"]
    runs = {r["name"]: r for r in report["runs"]}
    assert set(runs) == {"enja-small_bf16", "enja-small_fp32", "paper-size_bf16", "paper-size_fp32",
                         "enja-small_bf16_units", "patent_bf16", "patent_bf16_stacked", "patent_fp32", "patent_tf32",
                         "patent_fp16", "patent_bf16_b24", "patent_bf16_padded"}
    for name, r in runs.items():
        assert r["exit"] == 0 and "error" not in r and r["finite"] and r["device"] == "cpu", name
        assert r["pairs_per_s"] > 0 and r["tokens_per_s"] > r["pairs_per_s"] and r["peak_memory_mib"] > 50
        assert r["untimed_steps"] == 2 and r["step_ms_mean"] > 0 and "profile" not in r  # steps 3 and 5, unlogged
        gates = r["gates"]  # every logged grad norm finite and non-zero; 6 steps are too few to judge the loss
        assert gates["grad_norm_ok"] and gates["grad_norms"] >= 3 and gates["ok"] and not gates["loss_judged"]
        assert r["model_tflops"] > 0 and 0 < r["mfu_measured_gemm_peak"] and "mfu_datasheet" not in r  # no CPU sheet
        assert r["dev_bleu"] is not None and math.isfinite(r["first_loss"])
    assert runs["patent_bf16_b24"]["micro_batch"] == 24 and runs["patent_tf32"]["mfu_precision"] == "tf32"
    anchors = {a["name"]: a for a in report["anchors"]}  # the minimal PyTorch program beside ours
    assert set(anchors) == {"anchor_patent_b16", "anchor_patent_b24", "anchor_enja-small_b8"}
    for a in anchors.values():
        assert "error" not in a and a["tokens_per_s"] > 0 and a["ours_tokens_per_s"] > 0 and len(a["losses"]) >= 2
        assert a["threads"] == 1  # as our runs (train.threads=1): two threads beside other work took 57x as long
    assert report["profiled_patent"]["profile"]["steps"] == [4, 6]
    shared = report["shared_gpu"]  # 2 ranks (on the GPU: sharing it) against one process, step by step
    assert shared["ok"] and shared["steps"] == list(range(1, 9)) and shared["max_rel_diff"]["loss"] < 1e-5
    assert [g["met"] for g in report["goals"]][-1] is None  # the compile gate runs on cuda only
    profiled = report["profiled"]  # the profile window in a run of its own
    assert "error" not in profiled and profiled["profile"]["steps"][1] - profiled["profile"]["steps"][0] == 2
    assert report["wandb"]["ok"] and list(report["stages"])[-2:] == ["wandb", "planner"]  # the last run: wandb
    assert report["wandb"]["gates"]["grad_norm_ok"]
    # the paper-size stand-in is bigger than enja-small's: more FLOPs per pair; the patent run's pairs are longer
    assert runs["paper-size_fp32"]["model_tflop_per_pair"] > runs["enja-small_fp32"]["model_tflop_per_pair"]
    assert runs["patent_bf16"]["model_tflop_per_pair"] > runs["paper-size_bf16"]["model_tflop_per_pair"]
    assert report["data"]["patent"]["src_len"] == pytest.approx(2 * report["data"]["tiny_joint"]["src_len"] - 1)
    resume = report["resume"]  # every step after the first run's rows logged once
    assert resume["ok"] and resume["logged_steps"] == resume["expected_steps"]
    assert resume["logged_steps"][-5:] == list(range(report["steps"] + 1, report["steps"] + 6))
    assert report["portability"]["ok"] and report["portability"]["lines_out"] == 16
    latency = report["latency"]
    assert latency["op_overhead_us"] > 0 and latency["sync_us"] >= 0 and latency["lstm_step_us"] >= 0
    planner = report["planner"]["predictions"]
    for label in ("estimates", "measured"):
        assert [r["devices"] for r in planner[label]] == [2, 4, 8]
        assert all(r["one_gpu_ms"] > 0 and r["pick_speedup"] > 0 for r in planner[label])
    assert planner["estimates"] != planner["measured"]  # the measured latencies change the prediction
    roof = json.loads((out / "planner_profile.json").read_text())["roofline"]
    for key in ("op_overhead_us", "sync_us", "lstm_step_us"):
        assert roof[key]["value"] == latency[key] and roof[key]["source"].startswith("measured:")
    assert roof["instruction_us"]["source"].startswith("estimate:")
    for diff in report["bf16_vs_fp32_first_loss_rel_diff"].values():
        assert diff < 0.02  # same weights, same first batch; bf16 rounding only
    with tarfile.open(out / "runs.tar.gz") as tar:
        names = set(tar.getnames())
    for name in [*runs, "enja-small_bf16_profiled", "patent_bf16_profiled", "enja-small_bf16_wandb"]:
        assert f"logs/{name}.log" in names and f"runs/{name}/metrics.jsonl" in names
    assert all(f"logs/{name}.log" in names for name in anchors)
    assert "runs/enja-small_bf16_profiled/profile/rank0.trace.json.gz" in names
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
                    str(tmp_path / "work"), "--data-root", str(prepared), "--stages", "environment,data,short",
                    "--runs", "enja-small_bf16", "--run-timeout-s", "3",
                    # a run that outlasts 3 s on any CPU: a million steps, not the CPU size's 6
                    "--steps", "1000000"], timeout=300, check=False)
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


# ---- issue 31: throughput from untimed steps ----
def _row(step, wall, seen, tokens_seen, step_s=0.5, pairs=10, tokens=100, **kw):
    return {"step": step, "wall_s": wall, "sentences_seen": seen, "tokens_seen": tokens_seen, "step_time_s": step_s,
            "sentences_per_s": pairs / step_s, "tokens_per_s": tokens / step_s, **kw}


def test_throughput_comes_from_the_steps_between_logged_rows():
    from benchmarks.gpu.gpu_runs import untimed_rates

    # logged steps 10, 20, 30 are timed (0.5 s each, synchronised); the 9 steps between two rows take 0.1 s each
    rows = [_row(1, 0.5, 10, 100), _row(10, 1.8, 100, 1000), _row(20, 1.8 + 0.9 + 0.5, 200, 2000),
            _row(30, 3.2 + 0.9 + 0.5, 300, 3000)]
    rates = untimed_rates(rows, warmup=10)
    assert rates["untimed_steps"] == 18  # steps 11-19 and 21-29; not 2-9 (before the warm-up ends)
    assert rates["step_ms_mean"] == pytest.approx(100.0)
    assert rates["pairs_per_s"] == pytest.approx(100.0) and rates["tokens_per_s"] == pytest.approx(1000.0)
    # a validation after step 20 (its row has dev_loss) lengthens the next window: that window is left out
    rows[2]["dev_loss"] = 3.0
    rows[3] = _row(30, 3.2 + 0.9 + 0.5 + 7.0, 300, 3000)
    assert untimed_rates(rows, warmup=10)["untimed_steps"] == 9
    # a resumed process starts its clock again: no window across it; none at all -> None
    assert untimed_rates([_row(20, 9.0, 200, 2000), _row(25, 1.0, 50, 500)], warmup=1) is None


@pytest.mark.slow
def test_metrics_rows_carry_running_totals_and_the_device(tmp_path, tiny_data):
    """A real CPU run: every row has wall_s (rising), sentences_seen and tokens_seen over every step
    (logged or not); the trainer says where it computes, which is what the check's fallback detector reads."""
    from benchmarks.gpu.gpu_runs import device_seen, untimed_rates, wrong_device
    from tests.conftest import read_metrics

    run = tmp_path / "run"
    proc = run_cli([sys.executable, "launch/train.py", "--deepspeed_config", "ds_configs/single.json", "--config",
                    "trainer/configs/demo.yaml", f"data.dir={tiny_data}", f"run.dir={run}", "train.max_steps=5",
                    "train.eval_every=100", "train.log_every=2", "train.threads=1", "logging.wandb_mode=disabled",
                    "model.emb_dim=16", "model.hidden=16"], timeout=300)
    rows = read_metrics(run)
    assert [r["step"] for r in rows] == [1, 2, 4, 5]
    walls = [r["wall_s"] for r in rows]
    assert walls == sorted(walls) and walls[0] >= rows[0]["step_time_s"] > 0
    assert [r["sentences_seen"] for r in rows] == [64, 128, 256, 320]  # batches of 64, logged or not
    for a, b in zip(rows, rows[1:]):
        assert b["tokens_seen"] - a["tokens_seen"] > b["sentences_seen"] - a["sentences_seen"]
    assert rows[0]["sentences_seen"] == round(rows[0]["sentences_per_s"] * rows[0]["step_time_s"])
    assert untimed_rates(rows, warmup=2)["untimed_steps"] == 1  # step 3
    assert device_seen(proc.stdout) == "cpu" and wrong_device(proc.stdout, "cpu") is None


def test_the_cpu_fallback_detector_reads_the_trainers_device_line():
    from benchmarks.gpu.gpu_runs import wrong_device

    fell_back = "device: cpu; DeepSpeed accelerator cpu, backend gloo\nlayout: mode=single ...\n"
    on_gpu = "device: cuda:0 (NVIDIA H200); DeepSpeed accelerator cuda, backend cpu:gloo,cuda:nccl\n"
    assert "computed on cpu, not cuda" in wrong_device(fell_back, "cuda")
    assert wrong_device(on_gpu, "cuda") is None
    assert "no 'device: ...' line" in wrong_device("step 1/5 loss 9.1\n", "cuda")


# ---- issue 31: nothing left on the device, no call without a timeout ----
def _alive(pid: int) -> bool:
    import os

    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return open(f"/proc/{pid}/stat").read().split()[2] != "Z"


def _all_gone(pids, seconds=10) -> bool:
    """Whether every pid is gone within `seconds` (a SIGKILLed grandchild dies a moment after killpg returns)."""
    end = time.time() + seconds
    while any(_alive(p) for p in pids) and time.time() < end:
        time.sleep(0.05)
    return not any(_alive(p) for p in pids)


def _spawner(tmp_path):
    """A command whose child starts a grandchild (as the deepspeed launcher does) and writes both pids."""
    pids = tmp_path / "pids"
    return ["bash", "-c", f"sleep 300 & echo $$ $! > {pids}; wait"], pids


def _wait_for(path, seconds=10):
    end = time.time() + seconds
    while time.time() < end and not (path.exists() and len(path.read_text().split()) == 2):
        time.sleep(0.05)
    return [int(x) for x in path.read_text().split()]


def test_a_stage_alarm_during_a_run_kills_its_whole_process_group(tmp_path):
    import os

    from benchmarks.gpu import gpu_check
    from benchmarks.gpu.gpu_runs import run_group

    check = gpu_check.Check(tmp_path, deadline_s=60, report={})
    check.started = time.time()
    cmd, pids = _spawner(tmp_path)
    start = time.time()
    assert check.stage("run", lambda: run_group(cmd, tmp_path / "x.log", 120, "cpu", dict(os.environ)), timeout=2) is None
    assert check.report["stages"]["run"]["status"] == "timeout" and time.time() - start < 30
    assert _all_gone(_wait_for(pids))


def test_sigterm_to_the_check_kills_the_running_training_group(tmp_path):
    import os
    import signal
    import threading

    from benchmarks.gpu import gpu_check
    from benchmarks.gpu.gpu_runs import run_group

    cmd, pids = _spawner(tmp_path)
    previous = signal.signal(signal.SIGTERM, gpu_check._sigterm)
    try:
        threading.Timer(1.5, os.kill, (os.getpid(), signal.SIGTERM)).start()
        with pytest.raises(SystemExit):
            run_group(cmd, tmp_path / "x.log", 120, "cpu", dict(os.environ))
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert _all_gone(_wait_for(pids))


def test_a_hanging_nvidia_smi_costs_its_timeout_and_the_watch_stops(tmp_path, monkeypatch):
    from benchmarks.gpu import gpu_runs

    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "nvidia-smi").write_text("#!/bin/sh\nsleep 60\n")
    (fake / "nvidia-smi").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}:/usr/bin:/bin")
    monkeypatch.setattr(gpu_runs, "NVIDIA_SMI_TIMEOUT_S", 1)
    start = time.time()
    assert gpu_runs.nvidia_smi("--query-gpu=memory.used") == ""
    watch = gpu_runs.MemoryWatch(12345, "cuda")
    time.sleep(0.2)
    assert watch.stop() == 0.0 and time.time() - start < 15


# ---- issue 31: the stages' order ----
def test_speed_runs_are_neither_profiled_nor_logged_to_wandb_which_runs_last():
    from benchmarks.gpu import gpu_check

    sizes = gpu_check.SIZES["cuda"]
    plan = gpu_check.run_plan(sizes)
    runs = [s["name"] for s in plan["runs"]]
    assert runs[:2] == ["patent_bf16", "patent_bf16_stacked"]  # the goal and the stack's A/B first
    assert {"patent_fp32", "patent_tf32", "patent_fp16"} <= set(runs)
    for spec in plan["runs"] + plan["short"] + plan["scan"]:
        assert not any("profile" in e for e in spec.get("extra", ())) and not spec.get("wandb")
    assert all(any("profile_steps" in e for e in s["extra"]) for s in plan["profiled"])
    assert [s["micro"] for s in plan["scan"]] == [512, 1024]
    assert "enja-small_bf16" in [s["name"] for s in plan["short"]]
    assert [a["ours"] for a in plan["anchor"]] == ["patent_bf16", "patent_bf16_b1024", "enja-small_bf16"]
    order = [gpu_check.STAGES.index(s) for s in ("runs", "anchor", "profiled", "scan", "short", "resume", "compile")]
    assert gpu_check.STAGES.index("wandb") > max(order) and gpu_check.STAGES.index("profiled") > order[0]
    assert gpu_check.STAGES[-1] == "planner"  # host CPU only: what the deadline may cut, done here from OUT
    assert gpu_check.STAGES.index("graphs_stack") < gpu_check.STAGES.index("runs")  # seconds, and the next question
    assert "graphs_stack" not in gpu_check.parse_args(["--device", "cpu"]).stages  # cuda only, as compile
    assert "graphs_stack" in gpu_check.parse_args(["--device", "cuda"]).stages
    # train.cuda_graphs on against off: after the runs it is compared with, rehearsed on the CPU too
    assert gpu_check.STAGES.index("runs") < gpu_check.STAGES.index("graphs") < gpu_check.STAGES.index("profiled")
    assert "graphs" in gpu_check.parse_args(["--device", "cpu"]).stages
    pair = plan["graphs"]
    assert [s["extra"] for s in pair] == [("train.cuda_graphs=off",), ("train.cuda_graphs=on",)]
    assert all(s["model"] == "patent" and s["precision"] == "bf16" for s in pair)
    g = sizes["graphs"]
    assert (g["steps"] - g["warmup"]) * (1 - 1 / g["log_every"]) >= 100  # steady steps in both runs
    # steady state: at least 100 unlogged steps after the warm-up, in the runs and in the scan
    assert (sizes["steps"] - sizes["warmup"]) * (1 - 1 / sizes["log_every"]) >= 100 <= sizes["gate_min_steps"]
    assert (sizes["scan_steps"] - sizes["scan_warmup"]) * (1 - 1 / sizes["scan_log_every"]) >= 100
    assert sizes["steps"] >= sizes["gate_min_steps"]  # the loss gate is judged on every run of the check


# ---- issue 31: the patent-length data ----
def test_the_patent_length_data_repeats_every_sentence_and_verifies(tmp_path, tiny_data):
    from benchmarks.gpu.gpu_patent import stretch_data_dir
    from trainer.data import ParallelData, read_manifest, verify

    out = stretch_data_dir(tiny_data, tmp_path / "patent", 4)
    verify(str(out), read_manifest(str(out)), "checksums")  # the trainer's own check of every file
    for split in ("train", "dev"):
        short, long = ParallelData(str(tiny_data), split), ParallelData(str(out), split)
        assert len(long) == len(short)
        assert (long.src_len == 4 * short.src_len).all() and (long.tgt_len == 4 * short.tgt_len).all()
    first = (tiny_data / "dev.src.txt").read_text(encoding="utf-8").splitlines()[0]
    assert (out / "dev.src.txt").read_text(encoding="utf-8").splitlines()[0] == " ".join([first] * 4)
    assert read_manifest(str(out))["derived"]["repeat"] == 4


# ---- issue 31: the device's image and the carried wheels ----
def _wheel(folder, name, version, *requires):
    import zipfile

    dist = f"{name.replace('-', '_')}-{version}"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(f"Requires-Dist: {r}\n" for r in requires)
    with zipfile.ZipFile(folder / f"{dist}-py3-none-any.whl", "w") as z:
        z.writestr(f"{dist}.dist-info/METADATA", meta + "\nthe description\n")


def test_the_image_file_lists_what_the_rehearsal_installs():
    from benchmarks.gpu.gpu_rehearsal import read_image

    pins, names = read_image()
    assert pins["torch"] == "2.11.0" and pins["numpy"] == "2.5.2"  # KINDS.md's readings
    assert {"deepspeed", "omegaconf", "wandb", "pydantic"}.isdisjoint(names)  # carried: not on the image
    assert set(pins) <= names and "typing-extensions" in pins


def test_a_carried_wheel_the_image_cannot_serve_is_found_before_the_device(tmp_path):
    from benchmarks.gpu.gpu_rehearsal import apply_pins, check_wheels, read_image

    pins, names = read_image()
    _wheel(tmp_path, "pydantic-core", "2.46.4", "typing-extensions>=4.14.1")
    _wheel(tmp_path, "omegaconf", "2.4.0", "PyYAML>=5.1.0", "antlr4-python3-runtime==4.9.*; python_version < '3.0'")
    problems, bounds = check_wheels(tmp_path, pins, names)
    assert problems == [] and any(b.startswith("pydantic-core 2.46.4 needs typing-extensions>=4.14.1") for b in bounds)
    problems, _ = check_wheels(tmp_path, apply_pins(pins, ["typing_extensions==4.12.2"]), names)
    assert problems == ["pydantic-core 2.46.4 needs typing-extensions>=4.14.1: the image's is 4.12.2"]
    _wheel(tmp_path, "typing-extensions", "4.15.0")  # carried: it comes first on PYTHONPATH
    assert check_wheels(tmp_path, apply_pins(pins, ["typing-extensions==4.12.2"]), names)[0] == []
    _wheel(tmp_path, "wandb", "0.31.0", "gitpython>=1.0", "pandas")
    problems, _ = check_wheels(tmp_path, pins, names)
    assert "wandb 0.31.0 needs gitpython>=1.0: neither carried nor on the image: carry it" in problems
    assert "wandb 0.31.0 needs pandas: on the image, but gpu_image.txt gives no version: add it there" in problems
    _wheel(tmp_path, "wandb", "0.30.0")
    assert any("two wheels" in p for p in check_wheels(tmp_path, pins, names)[0])


@pytest.mark.slow
def test_gpu_wheels_runs_from_a_fresh_shell_and_shows_pips_errors(tmp_path):
    """The system's python3 (no torch) is passed over for the project's; a pip that fails says why."""
    import shutil

    (tmp_path / "benchmarks" / "gpu").mkdir(parents=True)
    for name in ("gpu_wheels.sh", "gpu_rehearsal.py", "gpu_image.txt"):
        shutil.copy(REPO / "benchmarks" / "gpu" / name, tmp_path / "benchmarks" / "gpu" / name)
    env = {"HOME": str(tmp_path), "PATH": f"/usr/local/bin:/usr/bin:/bin", "PYTHON": sys.executable,
           "PIP_CONFIG_FILE": "/dev/null", "PIP_INDEX_URL": "http://127.0.0.1:9/simple", "PIP_RETRIES": "0",
           "PIP_TIMEOUT": "2", "PIP_NO_CACHE_DIR": "1"}
    proc = subprocess.run(["bash", str(tmp_path / "benchmarks" / "gpu" / "gpu_wheels.sh"), "--wheels-only"], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and f"at {sys.executable}" in proc.stdout, proc.stdout + proc.stderr
    assert "FAILED: downloading omegaconf==2.4.0" in proc.stderr and "ERROR:" in proc.stderr  # pip's own words
    # a fresh shell's PATH, whose python3 is the system's (no torch), and no pyenv in HOME: said so, by name
    bare = subprocess.run(["/bin/bash", str(tmp_path / "benchmarks" / "gpu" / "gpu_wheels.sh")], capture_output=True, text=True,
                          env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}, timeout=120)
    assert bare.returncode == 2 and "no Python here imports torch" in bare.stderr


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_rehearsal_in_the_devices_python_passes_and_catches_an_old_typing_extensions(tmp_path):
    """benchmarks/gpu/gpu_rehearsal.sh (PyPI: 2.6 GB of wheels, a 4.8 GB environment in .rehearsal/, reused while
    gpu_image.txt stays; ~6 minutes from nothing on a quiet machine): the check's CPU path in a copy of the
    device's Python with the carried wheels (the environment's build and that run started in the background when
    the suite collected this test, tests/background.py; here it is waited for), then the same with
    typing_extensions 4.12.2 on the image, which the carried pydantic_core cannot import
    (typing_extensions.Sentinel): the try it would have spent."""
    good = background.check(background.REHEARSAL_TEST, tmp_path).result(timeout=3000)
    if good.returncode == 3 and "gpu_rehearsal: not built:" in good.stderr:  # no room on this machine, said
        pytest.skip(good.stderr.strip().splitlines()[-1])
    assert good.returncode == 0 and "all checks passed" in good.stdout, good.stdout[-4000:] + good.stderr[-2000:]
    bad = run_cli(["bash", "benchmarks/gpu/gpu_rehearsal.sh", "--image-pin", "typing-extensions==4.12.2"], timeout=1200,
                  check=False)
    assert bad.returncode != 0
    assert "pydantic-core 2.46.4 needs typing-extensions>=4.14.1: the image's is 4.12.2" in bad.stdout
    assert "cannot import name 'Sentinel' from 'typing_extensions'" in bad.stdout + bad.stderr


def test_the_rehearsal_refuses_to_build_where_the_disk_has_no_room_for_it(tmp_path):
    """A build needs ~7.5 GB (the environment and its wheels): on a file system with less free than that and a
    margin it would fill the disk under everything running beside it (the suite, whose every later test then
    failed on ENOSPC in a CI): refused in one line, exit 3, nothing written but the cache's empty folders."""
    cache = tmp_path / "cache"
    (cache / "venv-stale").mkdir(parents=True)  # an incomplete environment of an earlier try: its room is freed
    proc = run_cli(["bash", "benchmarks/gpu/gpu_rehearsal.sh", "--build-only"], timeout=120, check=False,
                   env_extra={"GPU_REHEARSAL_CACHE": str(cache), "GPU_REHEARSAL_NEED_MB": str(1 << 40)})
    if proc.returncode == 2 and "no CPython 3.12 found" in proc.stderr:
        pytest.skip("no CPython 3.12 here: the rehearsal stops before its build")
    assert proc.returncode == 3, proc.stdout + proc.stderr
    line = proc.stderr.strip()
    assert line.startswith("gpu_rehearsal: not built: ") and f"{1 << 40} MB" in line and "\n" not in line, line
    assert sorted(p.name for p in cache.iterdir()) == ["build.lock", "wheels"]
    assert not any((cache / "wheels").iterdir())


def test_every_module_the_check_imports_exists():
    """The check's first stage imports the trainer's modules by name; a module renamed by a refactor must fail
    here, in the fast tier, and not on the device (trainer.training.session went with the one-home issue)."""
    import importlib.util
    import re

    text = (REPO / "benchmarks" / "gpu" / "gpu_check.sh").read_text()
    names = re.findall(r'"(trainer\.[\w.]+)"', text.split("need = [", 1)[1].split("]", 1)[0])
    assert names, "the check's import list was not found"
    for name in names:
        assert importlib.util.find_spec(name) is not None, f"gpu_check.sh imports {name}, which does not exist"


def test_the_graphs_gate_compares_every_logged_step_and_wants_graphs_on_cuda():
    from benchmarks.gpu.gpu_gates import graphs_gate

    off = [{"step": s, "loss": 5.0 - s / 10, "grad_norm": 1.0} for s in (1, 10, 20)]
    on = [{**r, "cuda_graphs": 6, "cuda_graphs_mib": 40.0} for r in off]
    assert graphs_gate(off, on, "bf16")["ok"] and graphs_gate(off, on, "bf16")["captured"] == 6
    assert not graphs_gate(off, [{**r, "cuda_graphs": 0} for r in on], "bf16")["ok"]  # nothing captured
    assert graphs_gate(off, [{**r, "cuda_graphs": 0} for r in on], "bf16", need_graphs=False)["ok"]  # a CPU
    drifted = [{**r, "grad_norm": 1.05} if r["step"] == 20 else r for r in on]
    gate = graphs_gate(off, drifted, "bf16")
    assert not gate["ok"] and gate["max_rel_diff"]["grad_norm"] == pytest.approx(0.05)
    assert not graphs_gate(off[:1], on[:1], "bf16")["ok"]  # one step compares nothing over the run


@pytest.mark.slow
def test_the_graphs_stage_rehearses_on_the_cpu(tmp_path, prepared):
    """The stage's two runs (off, and auto: eager on a CPU), its gate and its steady ms per step, through the CLI."""
    out = tmp_path / "out"
    proc = run_cli([sys.executable, "-m", "benchmarks.gpu.gpu_check", "--device", "cpu", "--stages", "data,graphs",
                    "--work", str(tmp_path / "work"), "--data-root", str(prepared), "--out", str(out)], timeout=900)
    assert "all checks passed" in proc.stdout, proc.stdout[-3000:]
    graphs = json.loads((out / "gpu_check.json").read_text())["graphs"]
    assert graphs["ok"] and graphs["steps"] == [1, 2, 4, 6] and graphs["setting"] == "auto"
    assert graphs["max_rel_diff"]["loss"] == 0 and graphs["step_ms_off"] > 0 and graphs["step_ms_on"] > 0


@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="CUDA graphs need CUDA")
def test_the_decoder_stack_replayed_as_graphs_computes_the_eager_step():
    from benchmarks.gpu.gpu_graphs import run

    out = run(batch=8, time_steps=6, hidden=32, layers=2, reps=2)
    for precision in ("bf16", "fp32"):
        assert "error" not in out[precision], out[precision]
        assert out[precision]["max_rel_diff"] < (2e-2 if precision == "bf16" else 1e-4)
