"""A minimal interactive shell for tests: `python tests/pty_shell.py CMD ...` with stdin/stdout/stderr on a
pseudo-terminal runs CMD as a foreground job, as bash does in a terminal: this process is the session
leader and controlling process of the terminal, CMD gets a process group of its own, which is made the
terminal's foreground (so ^C typed into the terminal is a SIGINT to that group, ^Z a SIGTSTP).

It prints `[shell] job stopped` when the job stops (^Z) and continues it in the foreground after
FG_AFTER_S seconds, as `fg` does; when the job ends it takes the terminal back, prints `[shell] exit N`
(N: the job's exit status, -SIG if a signal ended it) and stays alive -- a shell does not hang up on what
the job left behind -- until it is terminated."""
import fcntl
import os
import signal
import subprocess
import sys
import termios
import time

FG_AFTER_S = 2.0


def foreground(group: int) -> None:
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTTOU})
    try:
        os.tcsetpgrp(0, group)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def main() -> None:
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)
    job = subprocess.Popen(sys.argv[1:], process_group=0)
    foreground(job.pid)
    print(f"[shell] job {job.pid}", flush=True)
    while True:
        _, status = os.waitpid(job.pid, os.WUNTRACED)
        if os.WIFSTOPPED(status):
            foreground(os.getpgrp())
            print("[shell] job stopped", flush=True)
            time.sleep(FG_AFTER_S)
            foreground(job.pid)
            os.killpg(job.pid, signal.SIGCONT)
            print("[shell] fg", flush=True)
            continue
        code = os.waitstatus_to_exitcode(status)
        break
    foreground(os.getpgrp())
    print(f"[shell] exit {code}", flush=True)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
