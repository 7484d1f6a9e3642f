"""How a training process meets stop requests, its terminal and its launcher (docs/RELIABILITY.md,
"Signals, the terminal and the launcher").

Above the ranks of a launched job are DeepSpeed's runner (the `deepspeed` command) and, on each node, its
launcher (`deepspeed.launcher.launch`). Left to them, a Ctrl-C in a terminal reaches every process of the
job: the runner dies at once with a KeyboardInterrupt traceback (exit 130), the launcher SIGTERMs every rank
*and every process below the ranks* (wandb's service among them), waits 30 s and exits 1. A launcher that
is killed leaves its ranks training, orphaned, to the end. So:

* `install`: SIGTERM, SIGINT and SIGHUP only record a stop request (`STOP`); the training loop agrees on it
  across ranks after each step, saves that step and exits 0 (after SIGHUP, the streams that were the closed
  terminal go to /dev/null; under `nohup`, SIGHUP stays ignored). Before the loop has begun there is nothing to save:
  they raise `Interrupted`, and the process leaves at once.
* `take_terminal`: in a terminal, the node's first rank moves into a process group of its own and makes it
  the terminal's foreground, so a Ctrl-C reaches that rank alone: the ranks stop together and exit 0, and
  DeepSpeed's launcher and runner then end with 0 of their own accord, without a traceback. A Ctrl-Z
  still suspends the whole job (the rank gives the terminal back and stops with it; `fg` continues it).
* `keep_console`: the console is commentary (metrics.jsonl and the checkpoints keep the record), so a terminal
  that has gone (EIO: closed before its SIGHUP is handled, or with none sent) or a reader that left (EPIPE)
  does not end the run: the first write that fails so sends that stream to /dev/null.
* `watch_launcher`: a thread notices when a launcher process above this rank is gone (SIGKILL, the OOM
  killer, a SIGINT to the runner alone) and makes that a stop request, so no rank trains on as an orphan.

wandb's service is started outside the rank's process tree (`trainer.observe.wandb_run`), so that no launcher's
kill reaches it before the last rows and the finish of the run.
"""
from __future__ import annotations

import atexit
import errno
import os
import signal
import sys
import termios
import threading
import time

LAUNCHER_MODULES = ("deepspeed.launcher.launch", "deepspeed.launcher.runner")
WATCH_INTERVAL_S = 1.0


class Interrupted(BaseException):
    """A stop signal before training started: nothing is trained yet, so the process leaves at once
    (a BaseException, as KeyboardInterrupt, so that no `except Exception` on the way holds it up)."""

    def __init__(self, signal_name: str):
        super().__init__(signal_name)
        self.signal_name = signal_name


class StopRequests:
    """Why this process was asked to stop; the first request counts, except that a signal replaces the
    launcher watch's request: a signal to the whole job (Ctrl-C, `kill -- -PGID`) also ends the launcher, and
    the watch thread may record that exit while the signal's handler still waits for the main thread (which
    runs it at its next bytecode, before the training loop reads `reason`). The signal is the cause. Until the
    training loop begins (`begin_training`), a stop signal raises `Interrupted` instead."""

    def __init__(self):
        self.reason: str | None = None
        self.by_signal = False
        self.training = False
        self.announce = lambda reason: None

    def begin_training(self, announce) -> str | None:
        """From now on requests are recorded and `announce`d (the loop names the step it finishes);
        returns a request that came before (the launcher watch records, it never raises)."""
        self.announce, self.training = announce, True
        return self.reason

    def request(self, reason: str, *, by_signal: bool = False) -> None:
        # no lock: a signal handler may interrupt another one in the same thread
        if self.reason is None:
            self.reason, self.by_signal = reason, by_signal
            self.announce(reason)
        elif by_signal and not self.by_signal:  # announced once; the stop line names the signal
            self.reason, self.by_signal = reason, True


STOP = StopRequests()  # process-wide, as the signal dispositions that feed it


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def install() -> None:
    """SIGTERM, SIGINT and SIGHUP (a closed terminal, a dropped ssh) become stop requests (from here on: before
    this, during the first imports, Python's own handling applies). A signal that is ignored stays ignored:
    under `nohup`, a closed terminal does not stop the run."""
    for sig in STOP_SIGNALS:
        if signal.getsignal(sig) is not signal.SIG_IGN:
            signal.signal(sig, _on_stop_signal)


def _on_stop_signal(signum, frame) -> None:
    name = signal.Signals(signum).name
    if signum == signal.SIGHUP:
        _leave_hung_up_terminal()
    if not STOP.training:
        raise Interrupted(name)
    STOP.request(name, by_signal=True)


def _leave_hung_up_terminal() -> None:
    """After SIGHUP the terminal is gone: a write to it fails (EIO), which would break the save that follows. The
    standard streams that are a terminal, or were one that has hung up, go to /dev/null from here on (as nohup
    sends them to a file); metrics.jsonl and the checkpoint keep the record."""
    for fd in (1, 2):
        if _is_terminal(fd):
            _to_null(fd)


def _is_terminal(fd: int) -> bool:
    """A terminal, or one that has hung up: there every terminal request fails with EIO (`os.isatty` is then
    False, and the streams would stay on it)."""
    try:
        termios.tcgetattr(fd)
        return True
    except termios.error as e:
        return bool(e.args) and e.args[0] == errno.EIO
    except (OSError, ValueError):
        return False


def _to_null(fd: int) -> None:
    null = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.dup2(null, fd)
    except OSError:
        pass
    finally:
        os.close(null)


GONE = (errno.EIO, errno.EPIPE)  # a write to a terminal that has hung up; a pipe whose reader left


class Console:
    """sys.stdout or sys.stderr of a training process: a write or flush that fails because the terminal has gone
    or the reader left (`GONE`) sends the stream's descriptor to /dev/null and is dropped, where it would have
    raised in whatever code wrote (a progress line, the stop announcement inside a signal handler) and ended the
    run without a save. Any other error is raised as before."""

    def __init__(self, stream):
        self._stream = stream

    def __getattr__(self, name):
        return getattr(self._stream, name)

    def _gone(self, err: OSError) -> None:
        if err.errno not in GONE:
            raise err
        try:
            _to_null(self._stream.fileno())
        except (OSError, ValueError):
            pass

    def write(self, text):
        try:
            return self._stream.write(text)
        except OSError as e:
            self._gone(e)
            return len(text)

    def flush(self):
        try:
            self._stream.flush()
        except OSError as e:
            self._gone(e)
            try:  # what the buffer held goes to /dev/null now
                self._stream.flush()
            except OSError:
                pass


def keep_console() -> None:
    """Training's stdout and stderr become `Console`s (once)."""
    if not isinstance(sys.stdout, Console) and sys.stdout is not None:
        sys.stdout = Console(sys.stdout)
    if not isinstance(sys.stderr, Console) and sys.stderr is not None:
        sys.stderr = Console(sys.stderr)


def start(environ=os.environ) -> None:
    """Everything above, for a training process: the console, stop requests, the terminal, the launcher watch."""
    keep_console()
    install()
    take_terminal(environ)
    watch_launcher()


# ---- the launcher ----
def _cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read(1 << 16).decode(errors="replace").split("\0")
    except OSError:
        return []


def _is_deepspeed_launcher(cmdline: list[str]) -> bool:
    return any(arg in LAUNCHER_MODULES or os.path.basename(arg) == "deepspeed" for arg in cmdline[:4])


def launcher_chain() -> list[tuple]:
    """DeepSpeed's processes above this one, nearest first, as (psutil.Process, what it is): the node's
    launcher and, where `deepspeed` was started on this node, its runner ([] for a process not started by
    DeepSpeed's launcher)."""
    import psutil

    chain = []
    try:
        parent = psutil.Process().parent()
        while parent is not None:
            line = _cmdline(parent.pid)
            if not _is_deepspeed_launcher(line):
                break
            name = next((m for m in LAUNCHER_MODULES if m in line), "deepspeed")
            chain.append((parent, f"{name}, pid {parent.pid}"))
            parent = parent.parent()
    except psutil.Error:
        pass
    return chain


def _gone(process) -> bool:
    import psutil

    try:
        return not process.is_running() or process.status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True


def watch_launcher(interval: float = WATCH_INTERVAL_S) -> list:
    """Watch DeepSpeed's processes above this rank from a daemon thread; the first one gone becomes a
    stop request. Returns the watched processes."""
    chain = launcher_chain()
    if chain:
        threading.Thread(target=_watch, args=(chain, interval), name="launcher-watch", daemon=True).start()
    return chain


def _watch(chain: list, interval: float) -> None:
    while True:
        for process, label in chain:
            if _gone(process):
                STOP.request(f"the exit of its launcher ({label})")
                return
        time.sleep(interval)


# ---- the terminal ----
_terminal: tuple[int, int] | None = None  # (fd of the terminal, the job's process group) while we hold it


def _set_foreground(fd: int, group: int) -> None:
    """tcsetpgrp from a process that may be in a background group (SIGTTOU blocked meanwhile)."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTTOU})
    try:
        os.tcsetpgrp(fd, group)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def take_terminal(environ=os.environ) -> bool:
    """If this is the node's first rank of a job DeepSpeed's launcher started in a terminal's foreground,
    make a process group of this rank alone the terminal's foreground (see the module docstring).
    Anything unusual (no terminal, a background job, `stty tostop`, which would stop the launchers'
    output) leaves the terminal alone."""
    global _terminal
    if _terminal is not None or environ.get("LOCAL_RANK") != "0" or not launcher_chain():
        return False
    try:
        fd = os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError:
        return False
    job = os.getpgrp()
    try:
        if os.tcgetpgrp(fd) != job or termios.tcgetattr(fd)[3] & termios.TOSTOP:
            raise OSError("not the foreground job")
        os.setpgid(0, 0)
        _set_foreground(fd, os.getpgrp())
    except (OSError, termios.error):
        if os.getpgrp() != job:
            try:
                os.setpgid(0, job)
            except OSError:
                pass
        os.close(fd)
        return False
    _terminal = (fd, job)
    signal.signal(signal.SIGTSTP, _on_suspend)
    signal.signal(signal.SIGCONT, _on_continue)
    atexit.register(release_terminal)
    return True


def release_terminal() -> None:
    """Hand the terminal's foreground back to the job (before this process exits)."""
    global _terminal
    if _terminal is None:
        return
    fd, job = _terminal
    _terminal = None
    try:
        if os.tcgetpgrp(fd) == os.getpgrp():
            _set_foreground(fd, job)
    except OSError:  # the job's group is gone (its runner and launcher died): the shell takes it back
        pass


def _on_suspend(signum, frame) -> None:
    """Ctrl-Z reached this rank alone: rejoin the job, give it the terminal and stop the job as a whole,
    this rank with it, so that the shell sees it stopped (and `fg` / `bg` continue all of it)."""
    if _terminal is None:  # (the terminal was handed back on the way out): stop as SIGTSTP would
        os.kill(os.getpid(), signal.SIGSTOP)
        return
    fd, job = _terminal
    try:
        _set_foreground(fd, job)
        os.setpgid(0, job)
    except OSError:
        return
    signal.signal(signal.SIGTSTP, signal.SIG_DFL)
    try:
        os.killpg(job, signal.SIGTSTP)
    finally:
        signal.signal(signal.SIGTSTP, _on_suspend)


def _on_continue(signum, frame) -> None:
    """Continued in the foreground (`fg`): take the terminal again; in the background (`bg`): stay with
    the job, which does not own the terminal."""
    if _terminal is None:
        return
    fd, job = _terminal
    try:
        if os.getpgrp() == job and os.tcgetpgrp(fd) == job:
            os.setpgid(0, 0)
            _set_foreground(fd, os.getpgrp())
    except OSError:
        pass


def flush_and_release() -> None:
    """Before os._exit: the streams, and the terminal back to the job."""
    sys.stdout.flush()
    sys.stderr.flush()
    release_terminal()
