"""Process-wide memory settings of a training or decoding process, made by launch/train.py (and translate.py,
evaluate.py) before torch is loaded.

What held the memory of a long run (docs/BENCHMARKS.md, "Resident memory over a long run"): oneDNN keeps a
primitive (JIT-compiled kernels, ~0.3 MB) for every GEMM and LSTM shape it has met, up to 1024 of them, and
glibc's malloc keeps the freed memory of tensors whose sizes change from batch to batch, more of it the
longer a run goes. The model bounds the first by rounding the head's row count (`trainer.model.seq2seq`); here:

- ONEDNN_PRIMITIVE_CACHE_CAPACITY (unless already set) = PRIMITIVE_CACHE: the shapes one step meets
  stay cached, rare ones are made again. oneDNN reads it once, when it makes its first primitive.
- the allocator: mimalloc (the pip package cmeel-mimalloc, in requirements.txt) gives freed memory back
  to the system on its own. An allocator replaces malloc only if it is loaded before anything else
  (LD_PRELOAD), so `prepare` runs the same command again, once, in the same process (exec), with it
  preloaded. This covers every way of starting a rank (python, the deepspeed launcher, several nodes)
  because every rank runs launch/train.py. HYBRID_NMT_ALLOCATOR picks another: `glibc` (no preload)
  or the path of a shared library (e.g. /usr/lib/x86_64-linux-gnu/libjemalloc.so.2).
- mimalloc's purge delay (MIMALLOC_PURGE_DELAY, unless already set) = PURGE_DELAY_MS: how long freed memory
  stays mapped before it goes back to the system. mimalloc's own 1 s is shorter than a CPU step of a
  paper-size model, or of any model on a loaded machine: the memory a step freed went back before the next
  step asked for it again, and came back as fresh zeroed (huge) pages: 22-32% of a single-process run's CPU
  time in the kernel's page clearing (AVX2-only AMD EPYC, `perf`, 2026-12-06). Memory left unused for longer
  (after a validation, a resize of the batches) still goes back.
"""
from __future__ import annotations

import os
import sys

PRIMITIVE_CACHE = 512
PURGE_DELAY_MS = 10_000
ALLOCATOR_ENV = "HYBRID_NMT_ALLOCATOR"


def allocator_library(environ=os.environ) -> str | None:
    """The shared library to preload, or None for the C library's malloc."""
    choice = environ.get(ALLOCATOR_ENV, "mimalloc")
    if choice == "glibc" or not sys.platform.startswith("linux"):
        return None
    if choice != "mimalloc":
        if not os.path.isfile(choice):
            raise FileNotFoundError(f"{ALLOCATOR_ENV}={choice}: no such file (use glibc, mimalloc or a .so path)")
        return os.path.abspath(choice)
    return mimalloc_library()


def allocator_in_use() -> str:
    """What this process allocates with: the file name of a preloaded library it has mapped, or "glibc"
    (also where /proc cannot say). A planner profile records it: the same head ran 20-30% slower in bf16
    under glibc than under mimalloc (AMD EPYC with AVX-512, 2026-12-07)."""
    preloaded = [os.path.basename(p) for p in os.environ.get("LD_PRELOAD", "").split(":") if p]
    try:
        with open("/proc/self/maps") as f:
            maps = f.read()
    except OSError:
        return "glibc"
    return next((name for name in preloaded if name in maps), "glibc")


def training_allocator(environ=os.environ) -> str:
    """The file name of the allocator a training process started now would run with, or "glibc"."""
    library = allocator_library(environ)
    return os.path.basename(library) if library else "glibc"


def mimalloc_library() -> str | None:
    """libmimalloc.so.N of the installed cmeel-mimalloc package, or None when it is not installed."""
    from importlib import metadata

    try:
        files = metadata.files("cmeel-mimalloc") or []
    except metadata.PackageNotFoundError:
        return None
    for f in files:
        if f.parent.name == "lib" and f.name.startswith("libmimalloc.so."):
            path = str(f.locate())
            if os.path.isfile(path):
                return path
    return None


def training_environ(environ=os.environ) -> dict:
    """The variables a training process runs with: `environ` and the oneDNN cache size, mimalloc's purge delay
    and the allocator in LD_PRELOAD, each unless already set there. For a process about to be started (the
    test suite's spawned ranks) as for this one (`prepare`)."""
    env = dict(environ)
    env.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", str(PRIMITIVE_CACHE))
    env.setdefault("MIMALLOC_PURGE_DELAY", str(PURGE_DELAY_MS))  # read by mimalloc only
    library = allocator_library(environ)
    preloaded = [p for p in env.get("LD_PRELOAD", "").split(":") if p]
    if library is not None and library not in preloaded:
        env["LD_PRELOAD"] = ":".join([library, *preloaded])
    return env


def prepare() -> None:
    """Set the oneDNN cache size and mimalloc's purge delay, and re-execute this process with the allocator
    preloaded unless it is."""
    env = training_environ()
    preload = env.get("LD_PRELOAD") != os.environ.get("LD_PRELOAD")
    os.environ.update(env)
    if preload:
        os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)
