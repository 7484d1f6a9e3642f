"""Stopping a launched job the ways people and machines do (issue 22, items 1, 4, 13, 14, 19): Ctrl-C and
Ctrl-Z typed into a real (pseudo-)terminal, SIGINT to DeepSpeed's runner alone or to one rank, SIGKILL of
the runner or of the node's launcher, SIGTERM to the job's process group with wandb in its default
(offline) mode, and the first start in a fresh environment (no compiled DeepSpeed op, a stale build lock).

Each job is the real `deepspeed --num_gpus 2 launch/train.py` (hybrid_2, the tiny model of
tests/test_reliability.py); each wait has a timeout, so a hang fails, and whatever a job leaves running is
killed (found by a mark in its environment). docs/RELIABILITY.md ("Signals, the terminal and the launcher")
lists what each case gets."""
from __future__ import annotations

import contextlib
import errno
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import psutil
import pytest

from tests.conftest import REPO, read_metrics, run_cli
from tests.test_reliability import HYBRID, ds_config, losses, train_cmd
from trainer.config import merge_overrides
from trainer.checkpoint import files as checkpoint


MARK = "HNMT_TEST_JOB"  # set in a job's environment, so that whatever it leaves running can be found and ended


def default_env() -> dict:
    """As a user's shell has it: no WANDB_* variables (wandb offline, no API key, no network); marked."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    return dict(env, PYTHONUNBUFFERED="1", PYTHONPATH=str(REPO), **{MARK: uuid.uuid4().hex})


def kill_marked(env: dict) -> None:
    """SIGKILL every process started with `env` (a failed test must not leave orphans training). wandb's service
    is one of them (it inherits the environment); killed, it cannot remove its socket's directory
    (TMPDIR/wandb-PARENT-PID-N, which it removes when it ends by itself), so that goes here."""
    services = []
    for p in psutil.process_iter():
        try:
            if p.pid != os.getpid() and p.environ().get(MARK) == env[MARK]:
                if "wandb-core" in p.name():
                    services.append(p.pid)
                p.kill()
        except psutil.Error:
            pass
    for pid in services:
        for folder in Path(tempfile.gettempdir()).glob(f"wandb-*-{pid}-*"):
            shutil.rmtree(folder, ignore_errors=True)


@contextlib.contextmanager
def job_at_step(tiny_data, tmp_path: Path, step: int):
    """A 2-rank job started in its own session (the job's process group is its pid), yielded once it has
    reached `step`, as (job, run, log, processes); every process it started is killed on the way out."""
    cmd, run = job_cmd(tiny_data, tmp_path)
    log, env = tmp_path / "job.log", default_env()
    job = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT,
                           start_new_session=True)
    try:
        wait_for_step(run, step, lambda: job.poll() is None)
        yield job, run, log, job_processes(job.pid)
    finally:
        kill_marked(env)


def job_cmd(tiny_data, tmp_path: Path, *overrides) -> tuple[list, Path]:
    """An endless hybrid_2 job (no validation, no periodic save) with wandb in its default mode."""
    run = tmp_path / "run"
    ds = ds_config(tmp_path, HYBRID, total_steps=100000)
    return train_cmd(tiny_data, run, 2, ds, "train.max_steps=100000", "train.eval_every=100000",
                     "train.save_every=0", "logging.wandb_mode=offline", *overrides), run


def wait_for_step(run: Path, step: int, alive, timeout: float = 240) -> int:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if (run / "metrics.jsonl").exists():
            rows = read_metrics(run)
            if rows and rows[-1]["step"] >= step:
                return rows[-1]["step"]
        assert alive(), "the job ended before reaching the step"
        time.sleep(0.2)
    pytest.fail(f"no step {step} within {timeout}s")


def gone(processes: list, timeout: float) -> list:
    """The processes still running (zombies count as gone) after up to `timeout` seconds."""
    deadline = time.time() + timeout
    while True:
        alive = []
        for p in processes:
            try:
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    alive.append(p)
            except psutil.NoSuchProcess:
                pass
        if not alive or time.time() > deadline:
            return alive
        time.sleep(0.2)


def job_processes(root: int) -> dict:
    """runner / launcher / rank0 / rank1 below `root` (the runner itself, or the terminal's shell)."""
    found = {}
    for p in [psutil.Process(root), *psutil.Process(root).children(recursive=True)]:
        line = " ".join(p.cmdline())
        if "deepspeed.launcher.runner" in line:
            found["runner"] = p
        elif "deepspeed.launcher.launch" in line:
            found["launcher"] = p
        elif "launch/train.py" in line and "--local_rank=" in line:
            found[f"rank{line.split('--local_rank=')[1].split()[0]}"] = p
    return found


def assert_saved_at_the_last_step(run: Path) -> int:
    last = max(losses(run))
    assert checkpoint.read_pointer(str(run), "latest") == checkpoint.step_name(last)
    assert checkpoint.verify(str(run / "checkpoints" / checkpoint.step_name(last))) == []
    return last


def wandb_steps(run: Path) -> dict:
    """wandb run id -> the steps of its history, per offline folder (in order)."""
    from tests.wandb_records import summary

    out = {}
    for folder in sorted((run / "wandb").glob("offline-run-*")):
        [records] = folder.glob("run-*.wandb")
        out[folder.name] = [int(h["_step"]) for h in summary(str(records))["history"] if "_step" in h and "loss" in h]
    return out


class Terminal:
    """A pseudo-terminal whose session leader is a minimal shell (tests/pty_shell.py) running `cmd` as its
    foreground job: typing ^C there is a SIGINT to the job's process group, as in a terminal window."""

    def __init__(self, cmd: list, env: dict):
        self.env = env
        self.master, slave = os.openpty()
        self.shell = subprocess.Popen([sys.executable, str(REPO / "tests" / "pty_shell.py"), *map(str, cmd)],
                                      cwd=REPO, env=env, stdin=slave, stdout=slave, stderr=slave,
                                      start_new_session=True)  # the stop signals as a shell's: tests/conftest.py
        os.close(slave)
        self.output = b""
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            ready, _, _ = select.select([self.master], [], [], 0.5)
            if ready:
                try:
                    data = os.read(self.master, 65536)
                except OSError:
                    return
                if not data:
                    return
                self.output += data

    @property
    def text(self) -> str:
        return self.output.decode(errors="replace")

    def type(self, keys: bytes) -> None:
        os.write(self.master, keys)

    def wait_for(self, text: str, timeout: float) -> None:
        deadline = time.time() + timeout
        while text not in self.text:
            if time.time() > deadline:
                pytest.fail(f"{text!r} did not appear within {timeout}s; the terminal shows:\n{self.text[-4000:]}")
            time.sleep(0.1)

    def close(self) -> None:
        kill_marked(self.env)
        self.shell.kill()
        self.shell.wait()
        os.close(self.master)


@pytest.fixture
def terminal():
    opened = []

    def open_terminal(cmd, env):
        opened.append(Terminal(cmd, env))
        return opened[-1]

    yield open_terminal
    for t in opened:
        t.close()


# ---- stop requests and the launcher watch, in small processes --------------------------------------------------
@pytest.fixture
def installed(monkeypatch):
    """job_control.install() in this process, its signal dispositions and stop requests undone after the test. The
    hung-up terminal's streams are not sent to /dev/null (recorded instead: this may be a real terminal)."""
    from trainer.training import job_control

    hung = []
    monkeypatch.setattr(job_control, "_leave_hung_up_terminal", lambda: hung.append(1))
    saved = {sig: signal.getsignal(sig) for sig in job_control.STOP_SIGNALS}
    job_control.install()
    try:
        yield job_control, hung
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
        job_control.STOP = job_control.StopRequests()


def test_a_stop_signal_before_training_leaves_at_once_and_once_training_is_a_request(installed):
    job_control, _ = installed
    with pytest.raises(job_control.Interrupted, match="SIGTERM"):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(1)  # the handler runs in this thread at the next bytecode
    said = []
    assert job_control.STOP.begin_training(said.append) is None
    os.kill(os.getpid(), signal.SIGINT)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.1)
    assert job_control.STOP.reason == "SIGINT" and said == ["SIGINT"]  # the first request counts, once


def test_sighup_is_a_stop_request_like_sigterm_and_stays_ignored_under_nohup(installed):
    """The issue's: SIGHUP (a closed terminal, a dropped ssh) killed a training run without a save or a word. It is a
    stop request now (the run saves its step: tests/test_reliability.py), its terminal's streams are let go, and
    under nohup (ignored) it stays ignored."""
    job_control, hung = installed
    with pytest.raises(job_control.Interrupted, match="SIGHUP"):
        os.kill(os.getpid(), signal.SIGHUP)
        time.sleep(1)
    assert job_control.STOP.begin_training(lambda reason: None) is None
    os.kill(os.getpid(), signal.SIGHUP)
    time.sleep(0.1)
    assert job_control.STOP.reason == "SIGHUP" and hung == [1, 1]
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    job_control.install()
    assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN


def test_a_console_whose_terminal_hung_up_or_whose_reader_left_goes_to_dev_null_and_other_errors_still_raise():
    """A training process's stdout/stderr (job_control.Console): a terminal gone before its SIGHUP is handled (every
    write EIO, `isatty` False) or a pipe whose reader left (EPIPE) must not raise into the writer (a progress line, the
    stop announcement inside the signal handler): that stream goes to /dev/null. Any other error still raises."""
    from trainer.training import job_control

    master, slave = os.openpty()
    os.close(master)  # the terminal hangs up
    assert not os.isatty(slave) and job_control._is_terminal(slave)  # what the SIGHUP handler now recognises
    r, w = os.pipe()
    os.close(r)  # the reader left
    devnull = os.stat(os.devnull)
    for fd in (slave, w):
        console = job_control.Console(open(fd, "w", buffering=1, closefd=True))
        print("step 4/100000  loss 6.57", file=console, flush=True)  # raised OSError (EIO/EPIPE) before
        print("and on", file=console, flush=True)
        after = os.fstat(console.fileno())
        assert (after.st_dev, after.st_ino) == (devnull.st_dev, devnull.st_ino)
        console.close()
    assert not job_control._is_terminal(r := os.open(os.devnull, os.O_RDONLY))
    os.close(r)

    class Full:
        def write(self, text):
            raise OSError(errno.ENOSPC, "No space left on device")
    with pytest.raises(OSError, match="No space"):
        job_control.Console(Full()).write("x")


def test_a_signal_names_the_stop_even_after_the_launcher_watch_recorded_the_launchers_exit():
    """A signal to the whole job ends the launcher too; the watch thread may see that first (the signal's handler
    waits for the main thread). The stop line names the signal, deterministically; a second signal changes
    nothing, and neither does a launcher exit after a signal."""
    from trainer.training import job_control

    said = []
    stop = job_control.StopRequests()
    stop.begin_training(said.append)
    stop.request("the exit of its launcher (deepspeed.launcher.runner, pid 1)")
    stop.request("SIGTERM", by_signal=True)
    stop.request("SIGINT", by_signal=True)
    assert stop.reason == "SIGTERM" and said == ["the exit of its launcher (deepspeed.launcher.runner, pid 1)"]
    later = job_control.StopRequests()
    later.begin_training(said.append)
    later.request("SIGINT", by_signal=True)
    later.request("the exit of its launcher (deepspeed.launcher.launch, pid 2)")
    assert later.reason == "SIGINT"


WATCHED = """import sys, time
from trainer.training import job_control
job_control.STOP.begin_training(lambda reason: print(reason, flush=True))
print('watching', [label for _, label in job_control.watch_launcher(interval=0.1)], flush=True)
time.sleep(30)
"""
LAUNCHER = """import subprocess, sys, time
subprocess.Popen([sys.executable, '-c', sys.argv[2]])
time.sleep(60)
"""


def test_the_launcher_watch_turns_the_launchers_exit_into_a_stop_request(tmp_path):
    """A stand-in for DeepSpeed's launcher (its module name on the command line) above a watched process:
    SIGKILL of it becomes that process's stop request, naming it."""
    env = dict(default_env(), PYTHONPATH=str(REPO))
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER, "deepspeed.launcher.launch", WATCHED], cwd=REPO,
                                env=env, stdout=subprocess.PIPE, text=True)
    try:
        first = launcher.stdout.readline()
        assert first.startswith("watching ['deepspeed.launcher.launch, pid ") and str(launcher.pid) in first, first
        launcher.kill()
        launcher.wait()
        said = launcher.stdout.readline()  # the orphan still writes to the pipe
        assert said == f"the exit of its launcher (deepspeed.launcher.launch, pid {launcher.pid})\n", said
    finally:
        kill_marked(env)


# ---- item 1 (and 19): Ctrl-C in a terminal --------------------------------------------------------------------
@pytest.mark.slow
def test_ctrl_c_in_a_terminal_saves_once_exits_0_and_wandb_continues_the_same_run(tiny_data, tmp_path, terminal):
    """Issue 22, item 1: Ctrl-C gave ~100 lines of tracebacks, exit 130, a wandb run that stopped at the service's
    last flush and a resume that started another wandb run. Now: one line, exit 0 from `deepspeed` itself,
    the wandb history up to the saved step, and the resume continues that wandb run. Ctrl-Z on the way
    suspends the whole job and `fg` continues it (the shell sees it stopped)."""
    cmd, run = job_cmd(tiny_data, tmp_path)
    term = terminal(cmd, default_env())
    wait_for_step(run, 2, lambda: term.shell.poll() is None)
    procs = job_processes(term.shell.pid)
    assert set(procs) == {"runner", "launcher", "rank0", "rank1"}, procs
    term.type(b"\x1a")  # Ctrl-Z
    term.wait_for("[shell] job stopped", 60)
    term.wait_for("[shell] fg", 30)
    step = wait_for_step(run, max(losses(run)) + 2, lambda: term.shell.poll() is None, timeout=120)
    term.type(b"\x03")  # Ctrl-C
    pressed = time.time()
    term.wait_for("[shell] exit ", 120)
    print(f"Ctrl-C: `deepspeed` ended {time.time() - pressed:.1f}s after the key")
    text = term.text
    assert "[shell] exit 0" in text, text[-4000:]
    assert "Traceback" not in text and "ConnectionResetError" not in text, text[-4000:]
    assert text.count("finishing step") == 1 and "rank 0: SIGINT: finishing step" in text, text[-4000:]
    assert not gone(list(procs.values()), 30), "a process of the job outlived it"
    last = assert_saved_at_the_last_step(run)
    assert last > step and f"stopped by SIGINT after step {last}: saved" in text
    [(folder, steps)] = wandb_steps(run).items()
    assert steps == list(range(1, last + 1)), f"wandb history {steps[:3]}..{steps[-3:]}, saved step {last}"
    assert f"wandb sync {run}/wandb/{folder}" in text
    rid = (run / "wandb_run_id").read_text().strip()
    assert folder.endswith("-" + rid)
    # the resume continues the same wandb run; it is also the first start of a fresh environment (issue 22, items
    # 4 and 13: DeepSpeed compiled its deepspeed_shm_comm op with g++ on the first CPU start, ~70 s, into a cache
    # every environment shares, and a build killed halfway left a lock that made every later start wait forever,
    # silently): its extensions directory is fresh but for such a stale lock, and it builds and waits on nothing
    ext = tmp_path / "torch_extensions"
    (ext / "deepspeed_shm_comm").mkdir(parents=True)
    (ext / "deepspeed_shm_comm" / "lock").write_text("")
    env = default_env()
    try:
        resumed = run_cli(merge_overrides(cmd, [f"train.max_steps={last + 2}", "train.resume=auto"]), timeout=300,
                          env_extra={"TORCH_EXTENSIONS_DIR": str(ext), MARK: env[MARK]})
    finally:
        kill_marked(env)
    assert sorted(str(p.relative_to(ext)) for p in ext.rglob("*")) == ["deepspeed_shm_comm",
                                                                      "deepspeed_shm_comm/lock"]
    segments = wandb_steps(run)
    assert len(segments) == 2 and all(name.endswith("-" + rid) for name in segments), segments
    assert list(segments.values())[1] == [last + 1, last + 2]
    assert " ".join(f"{run}/wandb/{name}" for name in segments) in resumed.stdout


# ---- item 1: SIGINT to the runner alone, or to one rank; item 14: a killed launcher ---------------------------
@pytest.mark.slow
@pytest.mark.parametrize("target,signum", [("runner", signal.SIGINT), ("rank1", signal.SIGINT),
                                           ("runner", signal.SIGKILL), ("launcher", signal.SIGKILL)],
                         ids=["sigint-runner", "sigint-rank1", "sigkill-runner", "sigkill-launcher"])
def test_a_signal_to_one_process_of_the_job_stops_it_whole_with_a_save(tiny_data, tmp_path, terminal, target,
                                                                       signum):
    """Issue 22, items 1 and 14: SIGINT to the `deepspeed` runner alone (or SIGKILL of it, or of the node's
    launcher: what an OOM killer or `timeout -s KILL` does) left both ranks training, orphaned, to the end.
    Now the ranks notice that their launcher is gone, save the step and exit 0; a SIGINT to one rank stops
    every rank at the same step. The runner's own KeyboardInterrupt traceback is DeepSpeed's (it dies
    of the SIGINT sent to it alone)."""
    cmd, run = job_cmd(tiny_data, tmp_path)
    term = terminal(cmd, default_env())
    wait_for_step(run, 2, lambda: term.shell.poll() is None)
    procs = job_processes(term.shell.pid)
    os.kill(procs[target].pid, signum)
    sent = time.time()
    alive = gone([procs[r] for r in ("launcher", "rank0", "rank1") if r != target], 90)
    print(f"{signal.Signals(signum).name} to the {target}: the job's other processes were gone "
          f"{time.time() - sent:.1f}s later")
    assert not alive, f"still running 90 s after the {signal.Signals(signum).name} to the {target}: {alive}"
    last = assert_saved_at_the_last_step(run)
    if target != "rank1":  # the ranks' last lines may still be on their way through the terminal to its reader
        term.wait_for(f"after step {last}: saved", 30)
    text = term.text
    if target == "rank1":
        term.wait_for("[shell] exit ", 30)
        assert "[shell] exit 0" in term.text and "Traceback" not in text
        assert f"stopped by a stop request on another rank after step {last}" in text, text[-3000:]
    else:
        assert "the exit of its launcher (" in text and f"after step {last}: saved" in text, text[-3000:]
        assert "[rank0]" not in text and "[rank1]" not in text, text[-3000:]  # no rank's traceback
    [steps] = wandb_steps(run).values()
    assert steps == list(range(1, last + 1))


# ---- item 19: SIGTERM to the launched job, wandb offline --------------------------------------------------------
@pytest.mark.slow
def test_sigterm_to_the_job_with_wandb_offline_saves_and_keeps_the_wandb_history(tiny_data, tmp_path):
    """Issue 22, item 19: what a scheduler sends to the job's process group. DeepSpeed's launcher passed it
    on to every process below the ranks, wandb's service too: rank 0 died in wandb's ConnectionResetError,
    rank 1 in gloo's "Connection closed by peer". Now both save the step and exit 0, and the wandb run
    holds every step up to the saved one."""
    with job_at_step(tiny_data, tmp_path, 3) as (job, run, log, procs):
        os.killpg(job.pid, signal.SIGTERM)
        sent = time.time()
        assert not gone([procs["rank0"], procs["rank1"]], 60), "a rank was still running 60 s after SIGTERM"
        print(f"SIGTERM to the job's process group: both ranks gone {time.time() - sent:.1f}s later")
        job.wait(timeout=60)
    text = log.read_text()
    assert "Traceback" not in text and "ConnectionResetError" not in text, text[-3000:]
    last = assert_saved_at_the_last_step(run)
    assert f"stopped by SIGTERM after step {last}: saved" in text and "wandb sync " in text
    [steps] = wandb_steps(run).values()
    assert steps == list(range(1, last + 1))


# ---- issue 30 B5: SIGINT from a script, which has no terminal --------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("target", ["group", "rank0"])
def test_sigint_from_a_script_saves_the_step_and_only_the_runner_speaks_for_itself(tiny_data, tmp_path, target):
    """A script (no terminal) that sends SIGINT to the job's process group: every process of the job gets it, the
    `deepspeed` runner too, which dies of it with DeepSpeed's own KeyboardInterrupt traceback (exit status 130),
    or ends with 1 when its node launcher ends first (its code, not ours; no rank can change how another process
    takes a signal). The ranks finish the step,
    save it and exit 0, with no traceback of theirs. What a terminal's Ctrl-C does (exit 0, one line) a script
    gets by sending SIGINT to rank 0 alone: its pid is in RUN_DIR/train.lock."""
    import json

    with job_at_step(tiny_data, tmp_path, 3) as (job, run, log, procs):
        if target == "group":
            os.killpg(job.pid, signal.SIGINT)
        else:
            os.kill(json.loads((run / "train.lock").read_text())["pid"], signal.SIGINT)
        assert not gone([procs["rank0"], procs["rank1"]], 90), "a rank was still running 90 s after SIGINT"
        job.wait(timeout=60)
    text = log.read_text()
    last = assert_saved_at_the_last_step(run)
    assert f"stopped by SIGINT after step {last}: saved" in text, text[-3000:]
    assert "[rank0]" not in text and "[rank1]" not in text, text[-3000:]  # no rank's traceback
    if target == "group":
        # DeepSpeed's runner: 130 when the SIGINT lands in its wait, 1 when its node launcher (which got the
        # same SIGINT and ends with 1) has ended first -- a race between DeepSpeed's two processes, not ours
        assert job.returncode in (1, 130, -signal.SIGINT), job.returncode
        tracebacks = text.split("Traceback")[1:]  # the runner's own, if the SIGINT landed in its wait
        assert len(tracebacks) <= 1 and all("deepspeed/launcher/runner.py" in t for t in tracebacks), text[-3000:]
    else:
        assert job.returncode == 0 and "Traceback" not in text, text[-3000:]


