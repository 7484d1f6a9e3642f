"""tests/background.py: the whole-script checks the suite starts when it collects their tests."""
from __future__ import annotations

import os
import subprocess
import sys
import time
import types

import pytest

from tests import background
from tests.harness import running


def _check(tmp_path, script: str) -> background.Check:
    return background.Check("probe", ["bash", "-c", script], dict(os.environ), tmp_path)


def test_a_check_not_started_in_the_background_runs_when_its_test_asks(tmp_path):
    result = _check(tmp_path, "echo out; echo err >&2; exit 3").result(timeout=60)
    assert (result.returncode, result.stdout, result.stderr) == (3, "out\n", "err\n")


def test_a_check_that_outlasts_its_wait_is_stopped_with_its_process_group(tmp_path):
    check = _check(tmp_path, f"sleep 300 & echo $! > {tmp_path / 'child'}; wait").start()
    child = int(_wait_for(lambda: (tmp_path / "child").is_file() and (tmp_path / "child").read_text().strip()))
    result = check.result(timeout=1)
    assert result.returncode == -15
    assert _wait_for(lambda: not running(child), tries=100), "the group's other process is gone too"


def test_only_the_collected_tests_checks_start_each_once_at_nice_19(tmp_path, monkeypatch):
    started = []

    def maker(root):
        check = _check(root, "cat /proc/self/stat | cut -d' ' -f19")
        started.append(check)
        return check

    monkeypatch.setattr(background, "CHECKS", {"t.py::a": maker, "t.py::b": maker})
    monkeypatch.setattr(background, "_STARTED", {})
    roots = iter([tmp_path / "1", tmp_path / "2"])
    config = types.SimpleNamespace(_tmp_path_factory=types.SimpleNamespace(mktemp=lambda name: _mkdir(next(roots))))
    listing = types.SimpleNamespace(option=types.SimpleNamespace(collectonly=True))
    background.start(listing, {"t.py::a"})  # pytest --collect-only: nothing runs
    assert started == []
    background.start(config, {"t.py::a", "t.py::other"})
    background.start(config, {"t.py::a"})  # a second collection: not again
    assert len(started) == 1 and background.check("t.py::a", tmp_path) is started[0]
    assert started[0].result(timeout=60).stdout.strip() == "19"  # its niceness
    assert background.check("t.py::b", tmp_path / "2") is not started[0]  # not collected: a new one, not started
    background.stop_all()


def _mkdir(path):
    path.mkdir()
    return path


FAKE_PYTEST = """
import os, sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from tests import background
from tests.harness import running
root = Path(sys.argv[2])
check = background.Check("probe", ["bash", "-c", f"sleep 300 & echo $! > {root / 'child'}; wait"], dict(os.environ),
                         root).start()
print(check.proc.pid, flush=True)
time.sleep(300)
"""


def test_a_check_ends_when_the_test_process_goes_without_ending_it(tmp_path):
    """pytest killed (SIGTERM, SIGKILL: no unconfigure hook runs): its background checks end within seconds, the
    whole process group of each, instead of running on for up to an hour."""
    fake_pytest = subprocess.Popen([sys.executable, "-c", FAKE_PYTEST, str(background.REPO), str(tmp_path)],
                                   stdout=subprocess.PIPE, text=True)
    supervisor = int(fake_pytest.stdout.readline())
    child = int(_wait_for(lambda: (tmp_path / "child").is_file() and (tmp_path / "child").read_text().strip()))
    fake_pytest.kill()
    fake_pytest.wait()
    for pid in (supervisor, child):
        if not _wait_for(lambda: not running(pid), tries=100, pause=0.1):
            os.kill(pid, 9)
            pytest.fail(f"pid {pid} outlived the killed test process by 10 s")


def _wait_for(probe, tries: int = 200, pause: float = 0.05):
    for _ in range(tries):
        value = probe()
        if value:
            return value
        time.sleep(pause)
    return None


def test_a_check_whose_supervisor_is_stopped_ends_whole(tmp_path):
    """`pkill -f` matching the supervisor's command line (it names the check's paths) once left the check's chain
    running without it: a SIGTERM to the supervisor now ends its process group."""
    check = _check(tmp_path, f"sleep 300 & echo $! > {tmp_path / 'child'}; wait").start()
    child = int(_wait_for(lambda: (tmp_path / "child").is_file() and (tmp_path / "child").read_text().strip()))
    os.kill(check.proc.pid, 15)
    check.proc.wait(timeout=30)
    if not _wait_for(lambda: not running(child), tries=100, pause=0.1):
        os.kill(child, 9)
        pytest.fail("the check's process outlived its stopped supervisor")
