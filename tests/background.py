"""Whole-script checks started in the background when the suite collects their tests, on the CPU the other tests
leave idle (nice 19, idle I/O), and waited for by the tests, which then assert on what they wrote.

The suite runs one test at a time, and its tests use 1.3 of a 2-core machine's cores on average (a CLI run's
start and imports, two-rank jobs waiting on each other): the two GPU-check runs (the check's CPU path, and the
rehearsal in a copy of the device's Python) are single-threaded chains of processes, minutes each, with files
for output, so they need nothing of the tests before them. At nice 19 they take a core only where no test wants
it; their tests run last (conftest.pytest_collection_modifyitems), and one that reaches its check before the
check has ended waits for it, the check then having the machine.

Each check gets what its test would have given it (its own directories under the session's base temp); the
deadline and the per-run timeout of a check are raised where it runs in the background (it may wait behind the
tests): those limits are tested on their own (tests/test_gpu_check.py). If the background run could not be
started (a test run by node id in a process that did not collect it: never, in pytest), the test runs it in
the foreground, the same command."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from benchmarks.common import own_process_group

REPO = Path(__file__).resolve().parents[1]
REHEARSAL_TEST = ("tests/test_gpu_check.py::"
                  "test_rehearsal_in_the_devices_python_passes_and_catches_an_old_typing_extensions")
CPU_PATH_TEST = "tests/test_gpu_check.py::test_gpu_check_cpu_path_without_mecab_writes_report_and_profile"
# limits for a check that may wait behind the tests at nice 19: its own defaults (1200 s, 240 s per run) assume
# a machine of its own
PATIENT = ["--deadline-s", "3600", "--run-timeout-s", "900"]


@dataclass
class Check:
    """A check's command (run in REPO with `env`), where its output goes, and its process once started."""
    name: str
    cmd: list
    env: dict
    root: Path  # its directories and output files
    proc: subprocess.Popen | None = None

    @property
    def log(self) -> tuple[Path, Path]:
        return self.root / "stdout.txt", self.root / "stderr.txt"

    def start(self, nice: bool = True) -> "Check":
        """In a process group of its own (in the tests' session: `own_process_group` says why), under a supervisor
        that ends it if the test process goes without ending it (SIGTERM or SIGKILL to pytest: no unconfigure hook
        runs then)."""
        out, err = self.log
        prefix = ["nice", "-n", "19", "ionice", "-c", "3"] if nice else []
        supervised = [sys.executable, "-m", "tests.background", "--supervise", str(os.getpid()), "--", *self.cmd]
        with open(out, "w") as o, open(err, "w") as e:
            self.proc = subprocess.Popen(prefix + supervised, cwd=REPO, env=self.env, stdout=o, stderr=e,
                                         **own_process_group())
        return self

    def result(self, timeout: float) -> subprocess.CompletedProcess:
        """Wait for the check (started now in the foreground if it was not started); a check still running after
        `timeout` seconds is stopped, with its process group, and the test fails on its output."""
        if self.proc is None:
            self.start(nice=False)
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            code = -15
        out, err = self.log
        return subprocess.CompletedProcess(self.cmd, code, out.read_text(errors="replace"),
                                           err.read_text(errors="replace"))

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, 15)
            except ProcessLookupError:
                pass
            self.proc.wait()


def _env(**extra) -> dict:
    return {**os.environ, "PYTHONUNBUFFERED": "1", "WANDB_MODE": "disabled", "PYTHONPATH": str(REPO), **extra}


def rehearsal(root: Path) -> Check:
    """benchmarks/gpu/gpu_rehearsal.sh: its environment built (or reused) and the check's CPU path run in it.
    The script drops the caller's PYTHONPATH itself; its files are its cache's (.rehearsal/out)."""
    env = {k: v for k, v in _env().items() if k != "PYTHONPATH"}
    return Check("rehearsal", ["bash", "benchmarks/gpu/gpu_rehearsal.sh", "--", *PATIENT], env, root)


def no_mecab_path(root: Path) -> str:
    """A PYTHONPATH on which `import MeCab` and `import ipadic` fail, as on the device (then the checkout)."""
    shadow = root / "no_mecab"
    for name in ("MeCab", "ipadic"):
        (shadow / name).mkdir(parents=True, exist_ok=True)
        (shadow / name / "__init__.py").write_text(f"raise ImportError('No module named {name!r} (hidden by the test)')\n")
    return f"{shadow}:{REPO}"


def cpu_path(root: Path) -> Check:
    """The check's data prepared (as gpu_wheels.sh prepares it, MeCab importable), then gpu_check.sh --cpu with
    MeCab hidden: report and profile in ROOT/out."""
    data, path = root / "gpudata", no_mecab_path(root)
    script = (f'"{sys.executable}" -m benchmarks.gpu.gpu_check --prepare-only --device cpu --work "{data}" '
              f'&& PYTHONPATH="{path}" bash benchmarks/gpu/gpu_check.sh --cpu --work "{root / "work"}" '
              f'--data-root "{data}" {" ".join(PATIENT)}')
    return Check("cpu_path", ["bash", "-c", script], _env(OUT=str(root / "out")), root)


CHECKS = {REHEARSAL_TEST: rehearsal, CPU_PATH_TEST: cpu_path}
_STARTED: dict = {}


def start(config, nodeids: set) -> None:
    """Start the checks of the collected tests (pytest_collection_finish); none for `--collect-only`."""
    if getattr(getattr(config, "option", None), "collectonly", False):
        return
    factory = getattr(config, "_tmp_path_factory", None)
    for nodeid, make in CHECKS.items():
        if nodeid in nodeids and nodeid not in _STARTED:
            root = factory.mktemp(f"bg_{make.__name__}") if factory else Path(tempfile.mkdtemp(prefix="hnmt-bg-"))
            _STARTED[nodeid] = make(root).start()


def check(nodeid: str, root: Path) -> Check:
    """The check of the test `nodeid`: the one started in the background, or a new one in `root`."""
    return _STARTED.get(nodeid) or CHECKS[nodeid](root)


def stop_all() -> None:
    """A session that ends before a check (an interrupt): its process group stopped."""
    for c in _STARTED.values():
        c.stop()


def supervise(parent: int, cmd: list, poll_s: float = 1.0) -> int:
    """Run `cmd` (in this process's group) to its end, or, once this process is no longer `parent`'s child (the test
    process is gone: it is reparented), send the group SIGTERM (this process with it): a check outlives no test
    process. A SIGTERM or SIGHUP to this process goes to the whole group too. (`nice` and `ionice` exec what they
    run, so the test process is this one's parent.)"""
    def end_group(signum, frame):  # the supervisor stopped (SIGTERM, SIGHUP): the check with it
        signal.signal(signum, signal.SIG_DFL)
        os.killpg(0, signum)

    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, end_group)
    child = subprocess.Popen(cmd)
    while True:
        try:
            return child.wait(timeout=poll_s)
        except subprocess.TimeoutExpired:
            if os.getppid() != parent:
                os.killpg(0, signal.SIGTERM)


if __name__ == "__main__":
    if len(sys.argv) > 4 and sys.argv[1] == "--supervise" and sys.argv[3] == "--":
        sys.exit(supervise(int(sys.argv[2]), sys.argv[4:]))
    sys.exit("usage: python -m tests.background --supervise PARENT_PID -- CMD ...")
