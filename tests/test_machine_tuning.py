"""What the trainer measures of the machine it runs on: CPU time per thread (trainer.observe.cpu_threads) and the
head's loss chunk, timed once and cached (trainer.training.tuning)."""
from __future__ import annotations

import json
import os
import threading
import time

import pytest
import torch

from tests.conftest import REPO
from trainer.observe import cpu_threads
from trainer.observe.cpu_threads import OthersClock, ThreadClock, thread_cpu
from trainer.training import tuning


def _spin(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_a_threads_cpu_time_is_its_own_and_named():
    clock = ThreadClock()
    clock.start()
    spun, stop = threading.Event(), threading.Event()
    worker = threading.Thread(target=lambda: (_spin(0.3), spun.set(), stop.wait()), name="spinner")
    worker.start()
    _spin(0.1)
    spun.wait(60)  # the main thread waits (no CPU) while the spinner burns 0.3 s, however busy the machine
    per_step = clock.per_step(2)
    stop.set()
    worker.join()
    assert per_step["spinner"] == pytest.approx(150, abs=40)  # 0.3 s over 2 steps, at the kernel's 10 ms ticks
    assert per_step["main"] == pytest.approx(50, abs=40)
    assert "main" in {name for name, _ in thread_cpu().values()}


def test_threads_that_ended_are_counted_apart():
    clock = ThreadClock()
    clock.start()
    worker = threading.Thread(target=_spin, args=(0.3,), name="short-lived")
    worker.start()
    tid = worker.native_id
    worker.join()
    # join() returns when Python is done with the thread; the kernel may list the task a moment longer (a loaded
    # machine made that visible), and a task still listed is a live thread here, named by the kernel
    deadline = time.monotonic() + 10
    while os.path.exists(f"/proc/self/task/{tid}") and time.monotonic() < deadline:
        time.sleep(0.01)
    per_step = clock.per_step(1)
    # at least its 0.3 s (other threads of the test process that end meanwhile would add theirs)
    assert "short-lived" not in per_step and 240 <= per_step["(threads that ended)"] < 2000


LINUX = pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="reads /proc/stat (Linux)")


def test_the_others_clock_takes_this_process_and_its_waited_children_out_of_the_machines_cpu(monkeypatch):
    """A calibration is quiet when the rest of the machine did nothing meanwhile: the machine's busy seconds less
    this process's own and its reaped children's (a load average counts the measurement itself)."""
    machine = iter([(100.0, 5.0), (103.5, 5.5)])  # 3.5 s busy and 0.5 s stolen over the 2 s between
    own = iter([10.0, 12.5])  # of which 2.5 s this process and its children
    wall = iter([50.0, 52.0])
    monkeypatch.setattr(cpu_threads, "machine_cpu", lambda: next(machine))
    monkeypatch.setattr(OthersClock, "_own_cpu", staticmethod(lambda: next(own)))
    monkeypatch.setattr(cpu_threads.os, "times", lambda: type("T", (), {"elapsed": next(wall)})())
    assert OthersClock().cores() == {"others": 0.5, "steal": 0.25}


@LINUX
def test_the_others_clock_counts_a_process_beside_it_and_not_a_child_it_waited_for():
    import subprocess
    import sys

    spin = "import time\nend = time.process_time() + {}\nwhile time.process_time() < end: pass"
    clock = OthersClock()
    subprocess.run([sys.executable, "-c", spin.format(0.5)], check=True, timeout=120)  # a child, waited for
    _spin(0.3)
    mine = cpu_threads.machine_cpu()
    beside = subprocess.Popen([sys.executable, "-c", spin.format(30)])  # still running (unreaped) when the clock reads
    deadline = time.monotonic() + 60
    while cpu_threads.machine_cpu()[0] - mine[0] < 1.2 and time.monotonic() < deadline:
        time.sleep(0.05)  # (no poll(): it would reap the process, and its CPU would count as this one's)
    got = clock.cores()
    elapsed = os.times().elapsed
    beside.kill()
    beside.wait()
    assert got is not None and got["others"] > 0 and got["steal"] >= 0
    # at least most of the second of CPU the unreaped process took is another's (whatever else the machine ran)
    assert got["others"] * (elapsed - clock._wall) >= 0.7


def test_the_loss_chunk_is_measured_once_then_read_from_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    calls = []
    timed = {(128, "chunked"): 3.0, (256, "chunked"): 1.0, (512, "chunked"): 2.0}
    monkeypatch.setattr(tuning, "time_loss_chunks", lambda *a, **k: calls.append(a) or timed)
    rows, origin = tuning.loss_chunk_rows(0, torch.device("cpu"), 16, 100, torch.float32)
    assert rows == 256 and origin.startswith("measured now") and len(calls) == 1
    assert rows == tuning.loss_chunk_rows(0, torch.device("cpu"), 16, 100, torch.float32)[0] and len(calls) == 1
    assert "earlier" in tuning.loss_chunk_rows(0, torch.device("cpu"), 16, 100, torch.float32)[1]
    cached = json.loads((tmp_path / "hybrid-nmt" / "tuning.json").read_text())
    assert list(cached.values()) == [256] and "width 16|vocab 100" in next(iter(cached))
    tuning.loss_chunk_rows(0, torch.device("cpu"), 16, 100, torch.bfloat16)  # another key: measured again
    assert len(calls) == 2


def test_a_stated_chunk_or_an_accelerator_measures_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(tuning, "time_loss_chunks", lambda *a, **k: pytest.fail("measured"))
    assert tuning.loss_chunk_rows(384, torch.device("cpu"), 16, 100, torch.float32) == (384, "train.loss_chunk_rows")
    assert tuning.loss_chunk_rows(0, torch.device("cuda"), 16, 100, torch.float32)[0] == 8192


def test_the_loss_projection_is_measured_at_the_chunk_once_then_cached(tmp_path, monkeypatch):
    """train.loss_projection=auto: chunked against whole at the chunk chosen, timed once per machine and chunk."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    calls = []

    def timed(width, vocab, dtype, candidates, projections):
        calls.append(candidates)
        return {(candidates[0], "chunked"): 2.0, (candidates[0], "whole"): 1.0}

    monkeypatch.setattr(tuning, "time_loss_chunks", timed)
    proj, origin = tuning.loss_projection("auto", torch.device("cpu"), 16, 100, torch.float32, 256)
    assert proj == "whole" and origin.startswith("measured now") and "chunked: 2000.0 ms" in origin
    assert tuning.loss_projection("auto", torch.device("cpu"), 16, 100, torch.float32, 256)[0] == "whole"
    assert calls == [(256,)]
    tuning.loss_projection("auto", torch.device("cpu"), 16, 100, torch.float32, 512)  # another chunk: measured
    assert calls == [(256,), (512,)]
    monkeypatch.setattr(tuning, "time_loss_chunks", lambda *a, **k: pytest.fail("measured"))
    assert tuning.loss_projection("chunked", torch.device("cpu"), 16, 100, torch.float32, 256) == \
        ("chunked", "train.loss_projection")
    assert tuning.loss_projection("auto", torch.device("cuda"), 16, 100, torch.float32, 8192)[0] == "whole"


def test_the_timed_loss_runs_both_projections():
    times = tuning.time_loss_chunks(16, 50, torch.float32, candidates=(32,), tokens=64,
                                    projections=tuning.PROJECTIONS)
    assert set(times) == {(32, "chunked"), (32, "whole")} and all(0 < t < 5 for t in times.values())


def test_a_damaged_cache_is_measured_again(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    (tmp_path / "hybrid-nmt").mkdir()
    (tmp_path / "hybrid-nmt" / "tuning.json").write_text("[not an object")
    monkeypatch.setattr(tuning, "time_loss_chunks", lambda *a, **k: {(128, "chunked"): 1.0, (256, "chunked"): 2.0})
    assert tuning.loss_chunk_rows(0, torch.device("cpu"), 16, 100, torch.float32)[0] == 128


def test_the_timed_loss_runs_every_candidate():
    times = tuning.time_loss_chunks(16, 50, torch.float32, candidates=(8, 32), tokens=64)
    assert set(times) == {(8, "chunked"), (32, "chunked")} and all(0 < t < 5 for t in times.values())


def test_a_bf16_run_is_told_once_measured_when_bf16_is_the_slower_on_this_cpu(tmp_path, monkeypatch):
    """bf16 on a CPU without fast bf16 units (no AMX) is dearer than fp32: a bf16 run says so, from one GEMM at
    the model's width timed in both precisions and cached; fp32, fp16 and accelerators measure nothing."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    calls = []
    speed = {torch.bfloat16: 2.0, torch.float32: 1.25}
    monkeypatch.setattr(tuning, "gemm_seconds", lambda width, dtypes: calls.extend(dtypes) or dict(speed))
    notes = tuning.precision_notes(torch.device("cpu"), "bf16", 256)
    assert len(notes) == 1 and "1.6x slower than fp32" in notes[0] and "measured now" in notes[0]
    assert '"bf16": {"enabled": false}' in notes[0] and len(calls) == 2
    assert "earlier" in tuning.precision_notes(torch.device("cpu"), "bf16", 256)[0] and len(calls) == 2
    for device, precision in (("cpu", "fp32"), ("cpu", "fp16"), ("cuda", "bf16")):
        assert tuning.precision_notes(torch.device(device), precision, 256) == []
    assert len(calls) == 2
    speed[torch.bfloat16] = 0.5  # a CPU with AMX: bf16 the faster, nothing to say (another width: measured)
    assert tuning.precision_notes(torch.device("cpu"), "bf16", 512) == [] and len(calls) == 4


def test_the_gemm_timing_is_positive_in_both_precisions():
    t = tuning.gemm_seconds(32, (torch.float32, torch.bfloat16), rows=8, rounds=2)
    assert set(t) == {torch.float32, torch.bfloat16} and all(0 < v < 1 for v in t.values())


def test_the_bf16_ratio_is_measured_on_one_thread_whatever_the_process_runs(tmp_path, monkeypatch):
    """On several threads a small product waits for each thread at every call: beside other work the ratio measured
    the load (0.66x chose bf16 on a CPU that emulates it at 27x). One core's ratio, the thread count given back."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    seen = []
    monkeypatch.setattr(tuning, "gemm_seconds", lambda width, dtypes: seen.append(torch.get_num_threads())
                        or {torch.bfloat16: 2.7, torch.float32: 0.1})
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert tuning.bf16_over_fp32(64) == (27.0, "measured now") and seen == [1]
        assert torch.get_num_threads() == 2
        torch.set_num_threads(1)
        assert tuning.bf16_over_fp32(64) == (27.0, "measured on this machine earlier") and seen == [1]
    finally:
        torch.set_num_threads(threads)


def test_stalls_do_not_decide_the_gemm_ratio(monkeypatch):
    """The precision `auto` chose bf16 on a CPU that emulates it (27x fp32's time) because the fp32 GEMM's three
    timed calls each met a stall (a thread pool's wake-up, another process on the core: milliseconds against
    microseconds). Here the first 8 fp32 calls stall 5 ms each, so does every fp32 call that follows a bf16 call
    (its threads asleep), and every third fp32 call 40 ms (a test suite beside it); everything else costs its
    nominal time: the ratio is still bf16's 27x."""
    clock = {"now": 0.0}
    cost = {torch.float32: 10e-6, torch.bfloat16: 270e-6}
    seen = {"fp32": 0, "last": None}

    def mm(a, b):
        if a.dtype == torch.float32:
            seen["fp32"] += 1
            n = seen["fp32"]
            clock["now"] += 5e-3 if n <= 8 or seen["last"] == torch.bfloat16 else 40e-3 if n % 3 == 0 else 0.0
        seen["last"] = a.dtype
        clock["now"] += cost[a.dtype]

    monkeypatch.setattr(tuning.time, "perf_counter", lambda: clock["now"])
    monkeypatch.setattr(tuning.torch, "mm", mm)
    t = tuning.gemm_seconds(256, (torch.bfloat16, torch.float32))
    assert t[torch.bfloat16] / t[torch.float32] == pytest.approx(27.0, rel=0.01)


# ---- "bf16": {"enabled": "auto"}: the precision the device runs faster ------------------------------------------

def test_bf16_auto_chooses_what_this_device_runs_faster(monkeypatch):
    """A CPU: bf16 where a GEMM of the model's width takes at most BF16_SLOWER times fp32's (AMX), fp32 where it
    takes more (an AVX2-only AMD EPYC: 47x); CUDA: what the GPU has; the line says which and why."""
    ratio = {"now": 47.0}
    monkeypatch.setattr(tuning, "bf16_over_fp32", lambda width: (ratio["now"], "measured now"))
    on, line = tuning.bf16_choice("cpu", 256)
    assert not on and line == ("precision: bf16.enabled=auto -> fp32: a bf16 GEMM at width 256 takes 47.00x fp32's "
                               "time on this CPU (measured now)")
    ratio["now"] = 0.4
    assert tuning.bf16_choice("cpu", 256)[0] and "-> bf16" in tuning.bf16_choice("cpu", 256)[1]
    ratio["now"] = tuning.BF16_SLOWER
    assert tuning.bf16_choice("cpu", 256)[0]
    for has in (True, False):
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda has=has: has)
        on, line = tuning.bf16_choice("cuda", 1024)
        assert on is has and ("-> bf16: the GPU runs bf16" if has else "-> fp32: the GPU has no bf16") in line
    assert tuning.bf16_choice("hpu", 1024)[0]


def test_bf16_auto_is_a_value_of_bf16_enabled_only_and_goes_to_deepspeed_as_true_or_false(tmp_path):
    from trainer.ds_config import DSConfigError, bf16_auto, validate, with_bf16
    from trainer.parallel.deepspeed_json import load_ds_config

    ds = json.loads((REPO / "ds_configs" / "demo_hybrid_2.json").read_text())
    assert ds["bf16"] == {"enabled": "auto"} and bf16_auto(ds)  # the quickstart's
    loaded = load_ds_config(str(REPO / "ds_configs" / "demo_hybrid_2.json"), 100)  # DeepSpeed's own reader passes it
    assert bf16_auto(loaded) and with_bf16(loaded, False)["bf16"] == {"enabled": False} and bf16_auto(loaded)
    for section, value, message in (("bf16", "yes", 'bf16.enabled="yes": must be true, false or "auto"'),
                                     ("fp16", "auto", 'fp16.enabled="auto": must be true or false')):
        with pytest.raises(DSConfigError, match=message):
            validate({**ds, section: {"enabled": value}}, "x.json")
    with pytest.raises(DSConfigError, match="fp16.enabled and bf16.enabled are both set"):
        validate({**ds, "fp16": {"enabled": True}}, "x.json")
    with pytest.raises(DSConfigError, match="grad_accum_dtype.*chosen at launch"):
        validate({**ds, "data_types": {"grad_accum_dtype": "bf16"}}, "x.json")
