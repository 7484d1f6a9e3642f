"""train.pin_cores: each local rank's threads on cores of its own (trainer.parallel.runtime.pin_cores)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO
from trainer.config import ConfigError, load_config
from trainer.parallel.runtime import rank_cores


def test_each_local_rank_gets_its_own_slice_of_the_allowed_cores():
    assert [rank_cores([0, 1], r, 2, 1) for r in (0, 1)] == [[0], [1]]
    assert [rank_cores([4, 5, 6, 7], r, 2, 2) for r in (0, 1)] == [[4, 5], [6, 7]]
    assert rank_cores([0, 1, 2], 0, 1, 2) == [0, 1]
    assert rank_cores([0, 1], 0, 2, 2) is None and rank_cores([0, 1], 1, 4, 1) is None  # they would share
    assert rank_cores([0, 1], 2, 2, 1) is None


PIN = """
import json, os, threading, sys
from trainer.parallel.runtime import keep_threads_on, pin_cores
allowed = os.sched_getaffinity(0)
out = []
for mode, device, rank, size in json.loads(sys.argv[1]):
    os.environ.update(LOCAL_RANK=str(rank), LOCAL_SIZE=str(size))
    said = pin_cores(mode, 1, device == "cpu")
    seen = {}
    t = threading.Thread(target=lambda: seen.update(later=sorted(os.sched_getaffinity(0))))
    t.start(); t.join()
    out.append({"said": said, "main": sorted(os.sched_getaffinity(0)), **seen})
    keep_threads_on(allowed)  # as it was, for the next case
print(json.dumps(out))
"""


def pinned(*cases) -> list[dict]:
    """What pin_cores(mode, 1 thread, device) did in a process of local rank `rank` of `size`, per case."""
    proc = subprocess.run([sys.executable, "-c", PIN, json.dumps(cases)], env=dict(os.environ, PYTHONPATH=str(REPO)),
                          capture_output=True, text=True, timeout=120, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores this process may use")
def test_auto_pins_a_cpu_rank_among_several_and_later_threads_follow():
    allowed = sorted(os.sched_getaffinity(0))
    last, first, alone, gpu, off, on, crowded = pinned(
        ("auto", "cpu", 1, 2), ("auto", "cpu", 0, 2), ("auto", "cpu", 0, 1), ("auto", "cuda", 0, 2),
        ("off", "cpu", 0, 2), ("on", "cuda", 0, 1), ("auto", "cpu", 0, len(allowed) + 1))
    assert last["main"] == last["later"] == [allowed[1]] and f"on {allowed[1]} " in last["said"]
    assert first["main"] == [allowed[0]]
    for case in (alone, gpu, off):  # one process alone, an accelerator's rank, off: left to the OS
        assert case["main"] == allowed and case["said"].startswith("cores: not pinned")
    assert on["main"] == [allowed[0]]  # on: pinned wherever it runs
    assert crowded["main"] == allowed and "do not fit" in crowded["said"]  # more ranks than cores would share


def test_pin_cores_takes_only_its_choices():
    with pytest.raises(ConfigError, match="train.pin_cores"):
        load_config(None, ["train.pin_cores=yes"])


def test_auto_threads_follow_omp_num_threads_where_the_environment_sets_it():
    """train.threads=0: OMP_NUM_THREADS as DeepSpeed's --bind_cores_to_rank or a job script sets it; anything else
    (unset, not a whole number, 0, more than the host's cores) leaves cores / local ranks."""
    from trainer.parallel.runtime import auto_threads, omp_threads

    cores = os.cpu_count() or 1
    assert auto_threads({"OMP_NUM_THREADS": "1", "LOCAL_SIZE": "1"}) == 1 and omp_threads({"OMP_NUM_THREADS": "1"}) == 1
    assert auto_threads({"OMP_NUM_THREADS": str(cores)}) == cores
    for bad in ("", "0", "-2", "two", "1.5", str(cores + 1)):
        assert omp_threads({"OMP_NUM_THREADS": bad}) is None
        assert auto_threads({"OMP_NUM_THREADS": bad, "LOCAL_SIZE": "1"}) == cores
    assert auto_threads({"LOCAL_SIZE": str(cores * 2)}) == 1
