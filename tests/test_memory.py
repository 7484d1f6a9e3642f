"""trainer.training.memory: a training process sets oneDNN's cache size and runs again with mimalloc preloaded
(before torch is loaded), unless told otherwise."""
from __future__ import annotations

import json
import os
import sys

import pytest

from tests.conftest import REPO, run_cli
from trainer.training import memory

PROBE = """
import json, os, sys
from trainer.training import memory
memory.prepare()
maps = open("/proc/self/maps").read()
print(json.dumps({"torch": "torch" in sys.modules, "preload": os.environ.get("LD_PRELOAD", ""),
                  "cache": os.environ.get("ONEDNN_PRIMITIVE_CACHE_CAPACITY"), "argv": sys.argv[1:],
                  "mimalloc": "libmimalloc" in maps, "jemalloc": "libjemalloc" in maps,
                  "in_use": memory.allocator_in_use(), "training": memory.training_allocator()}))
"""
# A step's pattern: tensors of many sizes made, written and freed, again and again; the page faults of the
# rounds after the first (fresh pages the kernel must clear: a fault on a huge page clears 2 MB).
REUSE = """
import json, resource, sys
from trainer.training import memory
memory.prepare()
import torch

def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt

counts = []
for _ in range(4):
    before = faults()
    xs = [torch.empty(500_000 + i * 37_000) for i in range(40)]
    for x in xs:
        x.fill_(1.0)
    del xs
    counts.append(faults() - before)
print(json.dumps({"faults": counts[1:], "delay": __import__("os").environ.get("MIMALLOC_PURGE_DELAY")}))
"""
LINUX = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="LD_PRELOAD and /proc are Linux's")


def probe(tmp_path, script_text: str = PROBE, **env) -> dict:
    script = tmp_path / "probe.py"
    script.write_text(script_text)
    env = {"LD_PRELOAD": "", "ONEDNN_PRIMITIVE_CACHE_CAPACITY": "", **env}
    env = {k: v for k, v in env.items() if v is not None}
    proc = run_cli([sys.executable, "-u", str(script), "x", "k=v"], timeout=60, env_extra=env)
    return json.loads(proc.stdout.strip().splitlines()[-1])


@LINUX
def test_prepare_runs_the_same_command_again_with_mimalloc_preloaded(tmp_path):
    library = memory.mimalloc_library()
    assert library is not None, "cmeel-mimalloc (requirements.txt) is not installed"
    got = probe(tmp_path, ONEDNN_PRIMITIVE_CACHE_CAPACITY=None)
    assert got["mimalloc"] and got["preload"].split(":")[0] == library
    assert got["in_use"] == got["training"] == os.path.basename(library)  # what a planner profile records
    assert got["argv"] == ["x", "k=v"] and not got["torch"]
    assert got["cache"] == str(memory.PRIMITIVE_CACHE)


@LINUX
def test_memory_a_step_freed_is_there_for_the_next_unless_the_user_set_mimallocs_purge(tmp_path):
    """mimalloc's own purge delay (1 s) is shorter than a CPU step can be: freed memory went back to the system
    between steps and came back as fresh pages to clear, up to a third of a run's CPU time. Ours keeps it
    (PURGE_DELAY_MS); a user's MIMALLOC_PURGE_DELAY is kept (0: at once, the pattern every round)."""
    ours = probe(tmp_path, REUSE, MIMALLOC_PURGE_DELAY=None)
    at_once = probe(tmp_path, REUSE, MIMALLOC_PURGE_DELAY="0")
    assert ours["delay"] == str(memory.PURGE_DELAY_MS) and at_once["delay"] == "0"
    assert min(at_once["faults"]) > 200, at_once  # 40 tensors of 2-8 MB given back each round
    assert sum(ours["faults"]) < min(at_once["faults"]) / 4, (ours, at_once)


@LINUX
def test_glibc_choice_and_a_users_cache_size_are_kept(tmp_path):
    got = probe(tmp_path, HYBRID_NMT_ALLOCATOR="glibc", ONEDNN_PRIMITIVE_CACHE_CAPACITY="64")
    assert not got["mimalloc"] and got["preload"] == "" and got["cache"] == "64"
    assert got["in_use"] == got["training"] == "glibc"


@LINUX
def test_an_allocator_given_by_path_is_preloaded_once(tmp_path):
    library = memory.mimalloc_library()
    got = probe(tmp_path, HYBRID_NMT_ALLOCATOR=library)
    assert got["mimalloc"] and got["preload"] == library
    got = probe(tmp_path, HYBRID_NMT_ALLOCATOR=library, LD_PRELOAD=library)
    assert got["mimalloc"] and got["preload"] == library  # already there: no second copy, no exec loop


@pytest.mark.parametrize("command", [["launch/train.py", "--deepspeed_config", "ds_configs/single.json", "--dry-run"],
                                     ["launch/translate.py", "--help"], ["launch/evaluate.py", "--help"],
                                     ["launch/plan.py", "--help"]],
                         ids=["train", "translate", "evaluate", "plan"])
def test_a_missing_allocator_library_is_one_line_error(command):
    """Training, the decoding CLIs and the planner (its calibration) run with the allocator (a translate process
    under glibc's malloc: 1.5 M page faults and 4.3 s of kernel time for 40 sentences at beam 5, 1.2 s with
    mimalloc; the planner's bf16 head 20-30% slower): each refuses a missing one."""
    proc = run_cli([sys.executable, *command], timeout=60, check=False,
                   env_extra={"HYBRID_NMT_ALLOCATOR": str(REPO / "no-such.so")})
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"error: HYBRID_NMT_ALLOCATOR={REPO / 'no-such.so'}: no such file " \
                                  "(use glibc, mimalloc or a .so path)"
