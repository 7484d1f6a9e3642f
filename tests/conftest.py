"""Shared fixtures: a tiny prepared demo corpus and a runner for the real CLIs with a timeout."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# One torch/OpenMP thread per process, in this process (set before torch is imported) and in every process the suite
# starts (the CLIs' train.threads=0 follows OMP_NUM_THREADS): the suite's models are tiny, and a process of two
# threads beside any other work on a 2-core machine waits for its second thread at every parallel region (a 10-step
# CLI run of the console tests took 12.7 s beside the GPU check's background run, 5.3 s with one thread; docs/testing.md).
# A test that needs another count sets it itself (train.threads=T, torch.set_num_threads).
os.environ["OMP_NUM_THREADS"] = "1"

from tests import background  # noqa: E402
from tests.harness import free_port  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"


def cli_env(extra: dict | None = None) -> dict:
    """The environment the suite starts a CLI with: this one, unbuffered, wandb disabled, the checkout importable."""
    return {**os.environ, "PYTHONUNBUFFERED": "1", "WANDB_MODE": "disabled", "PYTHONPATH": str(REPO), **(extra or {})}


def run_cli(args: list[str], timeout: int = 300, cwd=REPO, check: bool = True,
            env_extra: dict | None = None) -> subprocess.CompletedProcess:
    """Run a command from the repo root; a hang fails the test instead of the CI (timeout)."""
    env = cli_env(env_extra)
    try:
        proc = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"")[-4000:] if isinstance(e.stdout, bytes) else (e.stdout or "")[-4000:]
        pytest.fail(f"timed out after {timeout}s: {' '.join(map(str, args))}\n{out}")
    if check and proc.returncode != 0:
        pytest.fail(f"exit {proc.returncode}: {' '.join(map(str, args))}\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
    return proc


def launch_module(script: str):
    """launch/SCRIPT.py imported without running it (its __main__ block may re-execute the process)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"launch_{script}", REPO / "launch" / f"{script}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def launch_main(script: str, argv: list, capsys) -> tuple[int, str, str]:
    """launch/SCRIPT.py's main(argv) in this process: (exit code, stdout, stderr). What the process would do,
    without the start of a new interpreter and torch (seconds each): for the fast tier's refusals, beside one
    test per entry point that runs the real process. Not for what takes the process's signals or terminal
    (a training start: job_control); a training process's `leave` (os._exit) raises SystemExit here."""
    module = launch_module(script)
    if hasattr(module, "leave"):
        module.leave = sys.exit
    try:
        code = module.main([str(a) for a in argv]) or 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    out = capsys.readouterr()
    return code, out.out, out.err


def run_ranks(num_ranks: int, args: list, timeout: int = 300, check: bool = True,
              env_extra: dict | None = None) -> subprocess.CompletedProcess:
    """`launch/train.py ARGS` on N local ranks, each started as DeepSpeed's launcher starts it (its environment
    variables and `--local_rank`; the first rank to fail has the others sent SIGTERM, then SIGKILL 30 s later, and
    its exit code is the job's), without the runner and launcher processes around them (about 6.5 s of a 2-rank
    launch: their imports, their teardown, the launcher's 1 s polling). For tests of what the ranks do (resume,
    faults); what the runner and launcher do (signals, the terminal, a stopped rank, the launcher's exit line) is
    tested through `deepspeed_cmd`. stdout and stderr are the ranks', rank 0's first."""
    import signal
    import tempfile
    import time

    env = {**cli_env(),
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": str(num_ranks),
           "CROSS_RANK": "0", "CROSS_SIZE": "1", "LOCAL_SIZE": str(num_ranks), **(env_extra or {})}
    args = [str(a) for a in args]
    with tempfile.TemporaryDirectory(prefix="ranks-") as logs:
        files = [(open(f"{logs}/out{r}", "w+"), open(f"{logs}/err{r}", "w+")) for r in range(num_ranks)]
        procs = [subprocess.Popen([sys.executable, "-u", args[0], f"--local_rank={r}", *args[1:]], cwd=REPO,
                                  env={**env, "RANK": str(r), "LOCAL_RANK": str(r)}, stdout=out, stderr=err)
                 for r, (out, err) in enumerate(files)]
        deadline, failed, killed_at = time.monotonic() + timeout, None, None
        while any(p.poll() is None for p in procs):
            if time.monotonic() > deadline:
                for p in procs:
                    p.kill()
                    p.wait()
                break
            if failed is None and (bad := next((p for p in procs if p.returncode not in (None, 0)), None)):
                failed, killed_at = bad.returncode, time.monotonic() + 30
                for p in procs:
                    if p.poll() is None:
                        p.send_signal(signal.SIGTERM)
            if killed_at is not None and time.monotonic() > killed_at:
                for p in procs:
                    if p.poll() is None:
                        p.kill()
            time.sleep(0.1)
        timed_out = time.monotonic() > deadline
        texts = []
        for out, err in files:
            out.seek(0), err.seek(0)
            texts.append((out.read(), err.read()))
            out.close(), err.close()
    stdout, stderr = "".join(t[0] for t in texts), "".join(t[1] for t in texts)
    command = " ".join(args)
    if timed_out:
        pytest.fail(f"timed out after {timeout}s: {num_ranks} ranks of {command}\n{stdout[-2000:]}\n{stderr[-4000:]}")
    code = failed if failed is not None else next((p.returncode for p in procs if p.returncode != 0), 0)
    if check and code != 0:
        pytest.fail(f"exit {code}: {num_ranks} ranks of {command}\n{stdout[-3000:]}\n{stderr[-5000:]}")
    return subprocess.CompletedProcess(args, code, stdout, stderr)


def deepspeed_cmd(num_ranks: int, *args) -> list[str]:
    """The deepspeed launcher with N local CPU ranks (gloo), on a port of its own."""
    return [sys.executable, "-m", "deepspeed.launcher.runner", "--num_gpus", str(num_ranks),
            "--master_port", str(free_port()), *map(str, args)]


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory) -> Path:
    """A 600-pair demo corpus, prepared (SentencePiece + binarized) into a DATA_DIR the way the quickstart
    prepares its corpus (Japanese pieces within MeCab's words, number placeholders)."""
    root = tmp_path_factory.mktemp("tiny")
    run_cli([sys.executable, "-m", "data_prep.demo_corpus", "--out", root / "text", "--pairs", "600",
             "--dev", "40", "--test", "40", "--seed", "3"])
    t = root / "text"
    run_cli([sys.executable, "-m", "data_prep.prepare", "--format", "moses", "--train-src", t / "train.en",
             "--train-tgt", t / "train.ja", "--dev-src", t / "dev.en", "--dev-tgt", t / "dev.ja",
             "--test-src", t / "test.en", "--test-tgt", t / "test.ja", "--out", root / "data",
             "--vocab-size", "600", "--number-placeholders", "8"])  # byte fallback takes 256 pieces of it
    # (number placeholders as in the quickstart: every CLI test also runs the masking and the restoring)
    return root / "data"


def read_metrics(run_dir: Path) -> list[dict]:
    with open(run_dir / "metrics.jsonl") as f:
        return [json.loads(line) for line in f]


_POOL: list = []  # the session's worker pool, spawned once the tests are collected (pytest_collection_finish)


@pytest.fixture(scope="session")
def workers():
    """Four spawned gloo workers, reused by every in-process multi-rank test (tests/harness.py). They are
    spawned as soon as the tests are collected (their imports overlap the tests before the first job) and
    meet at the first job, so a start that fails (after its retries) fails that test alone, not the fixture
    of every later one."""
    from tests.harness import Workers

    if not _POOL:
        _POOL.append(Workers(4))
    yield _POOL[0]
    _POOL[0].close()


def pytest_collection_finish(session):
    if any("workers" in getattr(item, "fixturenames", ()) for item in session.items):
        from tests.harness import Workers

        _POOL.append(Workers(4))
        _POOL[0].spawn_early()
    # the GPU check's whole-script runs, on the cores the tests leave idle (tests/background.py)
    background.start(session.config, {item.nodeid for item in session.items})


def pytest_unconfigure(config):
    for pool in _POOL:  # a session that ends before the fixture's own teardown (an interrupt)
        pool.close()
    background.stop_all()  # a session that ended before a background check: its group stopped


DEFAULT_TIMEOUT_S = 600  # per test; a multi-process test that hangs fails instead of the CI


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: starts the real CLIs as processes (end-to-end, faults), or costs "
                                       "seconds (tests/tiers.py); `pytest -m 'not slow' tests` is the fast tier")
    default_stop_signals()
    compile_the_checkout()


def compile_the_checkout() -> None:
    """The checkout's bytecode written once, for the hundreds of processes the suite starts: where
    PYTHONDONTWRITEBYTECODE is set (as on this workplace's machines) each of them would compile every module it
    imports from source again (0.21 s of CPU per training process: compiling the ~13 k lines it imports)."""
    import compileall

    for part in ("trainer", "data_prep", "launch", "benchmarks", "tests"):
        compileall.compile_dir(str(REPO / part), quiet=1)


def default_stop_signals() -> None:
    """SIGINT, SIGQUIT and SIGHUP as an interactive shell leaves them, however the suite was started: `nohup` ignores
    SIGHUP, and a background job of a non-interactive shell (`bash .ci/run &`) ignores SIGINT and SIGQUIT, for this
    process and every process it starts, where the signal tests would then test the launcher instead of the code."""
    import signal

    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


@pytest.hookimpl(tryfirst=True)  # before -m "not slow" deselects
def pytest_collection_modifyitems(config, items):
    from tests.tiers import HEAVY

    for item in items:
        if item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(DEFAULT_TIMEOUT_S))
        if item.nodeid in HEAVY:
            item.add_marker(pytest.mark.slow)
    stale = stale_heavy(HEAVY, {item.nodeid for item in items}, config.args, config.rootpath)
    if stale:
        raise pytest.UsageError(f"tests/tiers.py names a test that was not collected: {stale[0]}")
    # the tests that wait for a background check last: the check then has the whole suite's idle cores (in their
    # place, the middle of the suite, they waited 242 s for checks that had had 13 minutes at nice 19)
    waiting = [i for i in items if i.nodeid in background.CHECKS]
    items[:] = [i for i in items if i.nodeid not in background.CHECKS] + waiting


def stale_heavy(heavy, collected: set[str], args: list[str], root: Path) -> list[str]:
    """The names in tests/tiers.py whose file was collected whole (a directory or file argument, not one test)
    but which name no collected test."""
    whole = [(root / a).resolve() for a in args if "::" not in a]
    return [nid for nid in heavy if nid not in collected
            and any(w == (f := (root / nid.split("::")[0]).resolve()) or w in f.parents for w in whole)]
