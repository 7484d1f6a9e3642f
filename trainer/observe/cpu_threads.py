"""Where a rank's CPU time goes, thread by thread: the main thread, gloo's workers, the batch prefetcher,
anything DeepSpeed, torch or wandb starts. A thread that burns a core while its rank waits shows up here
and nowhere else (the timeline only sees the main thread's instructions).

`ThreadClock.start()` reads every thread's CPU seconds (user + system, /proc/self/task/*/stat); `per_step(steps)`
gives the CPU ms per step of each thread since then, grouped by name: a Python thread by its `threading`
name, any other by the name the kernel has for it (`/proc/self/task/TID/comm`); threads of one name are summed
and counted ("gloo x4"). Linux only; elsewhere it reports nothing.
"""
from __future__ import annotations

import os
import threading

_TASKS = "/proc/self/task"
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def thread_cpu() -> dict[int, tuple[str, float]]:
    """tid -> (name, CPU seconds so far) of every thread of this process; {} where /proc is not there."""
    names = {t.native_id: t.name for t in threading.enumerate() if t.native_id is not None}
    main = threading.main_thread().native_id
    out = {}
    try:
        tids = os.listdir(_TASKS)
    except OSError:
        return {}
    for tid in tids:
        try:
            with open(f"{_TASKS}/{tid}/stat", "rb") as f:
                stat = f.read().decode("ascii", "replace")
            with open(f"{_TASKS}/{tid}/comm", "rb") as f:
                comm = f.read().decode("utf-8", "replace").strip()
        except OSError:  # the thread ended in between
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) ": state is field 3 of stat
        seconds = (int(fields[11]) + int(fields[12])) / _TICK  # utime, stime
        n = int(tid)
        out[n] = ("main" if n == main else names.get(n, comm), seconds)
    return out


def process_cpu() -> float:
    """CPU seconds of the whole process so far, threads that have ended included."""
    times = os.times()
    return times.user + times.system


class ThreadClock:
    """CPU seconds per thread between `start()` and `per_step()`."""

    def __init__(self):
        self._base: dict[int, tuple[str, float]] = {}
        self._process = 0.0

    def start(self) -> None:
        self._base, self._process = thread_cpu(), process_cpu()

    def per_step(self, steps: int) -> dict[str, float]:
        """name -> CPU ms per step since `start()` (threads started since count from zero), largest first."""
        if steps <= 0:
            return {}
        now = thread_cpu()
        used: dict[str, float] = {}
        count: dict[str, int] = {}
        for tid, (name, seconds) in now.items():
            base = self._base.get(tid)
            spent = seconds - (base[1] if base is not None and base[0] == name else 0.0)
            used[name] = used.get(name, 0.0) + spent
            count[name] = count.get(name, 0) + 1
        labelled = {(f"{name} x{count[name]}" if count[name] > 1 else name): 1000 * s / steps for name, s in used.items()}
        ended = process_cpu() - self._process - sum(used.values())  # threads that ran and ended since start()
        if now and ended * 1000 / steps >= 0.1:
            labelled["(threads that ended)"] = 1000 * ended / steps
        return dict(sorted(labelled.items(), key=lambda kv: -kv[1]))


def machine_cpu() -> tuple[float, float] | None:
    """(CPU seconds every core has been busy, seconds the hypervisor took from them: steal) since boot, from
    /proc/stat; None where it is not there."""
    try:
        with open("/proc/stat", "rb") as f:
            fields = f.readline().decode("ascii", "replace").split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu" or len(fields) < 9:
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[1:9])
    return (user + nice + system + irq + softirq) / _TICK, steal / _TICK


class OthersClock:
    """What the rest of the machine did while this process (and the children it has waited for) ran: other
    processes' CPU and the hypervisor's steal, in cores, between `__init__` and `cores()`. A measurement is only
    worth keeping if both are near zero; a load average cannot say it, since it counts the measurement itself."""

    def __init__(self):
        self._machine, self._own, self._wall = machine_cpu(), self._own_cpu(), os.times().elapsed

    @staticmethod
    def _own_cpu() -> float:
        t = os.times()
        return process_cpu() + t.children_user + t.children_system

    def cores(self) -> dict[str, float] | None:
        """{"others": cores other processes used on average, "steal": cores the hypervisor took}, or None."""
        now = machine_cpu()
        wall = os.times().elapsed - self._wall
        if now is None or self._machine is None or wall <= 0:
            return None
        others = (now[0] - self._machine[0]) - (self._own_cpu() - self._own)
        return {"others": round(max(0.0, others) / wall, 3), "steal": round((now[1] - self._machine[1]) / wall, 3)}
