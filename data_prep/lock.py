"""A directory held by one process at a time: an exclusive flock on a lock file in it, the file naming its holder.

    hold(root, name)        the lock, or `Busy` naming the live process that holds it; the holder a killed
                            process left named there (the kernel drops a lock when its holder ends, however it ends)
    release(f)              at the holder's own end: the file emptied (so nobody takes it for a killed holder's)
    held_by(path)           who holds a lock file now, without taking it (works where the reader cannot write)

Used for run.dir (one trainer: RUN_DIR/train.lock, trainer.artifacts.run_files) and a data directory (one
prepare: DATA_DIR/.prepare.lock; the trainer refuses a data.dir a prepare is writing). The file stays when
released (a holder that removes it, as a prepare that made its --out and failed does, removes it while it still
holds it; a process that opened it before sees, once it holds it, that it is no longer there, and tries again).

A holder names itself just after it takes the lock and empties the file just before it drops it, so a file that
names nobody while it is held is, nearly always, a holder between the two: it is looked at again for up to
NAMING_GRACE_S, until it names its holder or the lock is free (a busy machine can stretch that window to tens of
milliseconds; a second prepare started with the first was refused as 'a process that did not say who it is').
"""
from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import time
from typing import BinaryIO, Optional

from . import files
from .userfiles import parse_json

NAMING_GRACE_S = 2.0  # how long a held lock file that names nobody is looked at again (see above)
UNNAMED = "a process that did not say who it is"


class Busy(files.FileError):
    """Another live process holds the lock (`holder`: 'pid N on HOST since TIME', as its file says, or None)."""

    def __init__(self, path: str, holder: Optional[str]):
        super().__init__(errno.EWOULDBLOCK, f"held by {holder or UNNAMED}", path)
        self.holder = holder


def holder(path: str) -> Optional[str]:
    """Who the lock file `path` says holds it ('pid N on HOST since TIME'), None if it names nobody."""
    try:
        data = parse_json(files.read_bytes(path, 4096, "a lock file", remember=False).decode("utf-8"), path)
        return f"pid {int(data['pid'])} on {str(data['host'])[:100]} since {str(data['since'])[:40]}"
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def hold(root: str, name: str, *, where: str, owner: str) -> tuple[BinaryIO, Optional[str]]:
    """An exclusive flock on root/name (a regular file of its own, opened as `open_in` opens, never emptied before
    it is held), whose content then names this process. Raises `Busy` while another live process holds it. The
    kernel drops a lock when its holder ends, however it ends, so the file of a killed holder is no obstacle.
    Returns the open file (closing it, or `release`, drops the lock) and the holder a killed process left named
    there (None if there was none)."""
    path = os.path.join(root, name)
    for _ in range(3):
        f = files.open_in(root, name, append=True, binary=True, where=where, owner=owner)
        try:
            busy = _take(f, path, fcntl.LOCK_EX)
            if busy:
                raise Busy(path, None if busy is UNNAMED else busy)
            if not _still_there(f, path):  # removed by its holder (a prepare that made its --out) before we held it
                f.close()
                continue
            former = holder(path)
            f.truncate(0)
            f.write((json.dumps({"host": socket.gethostname(), "pid": os.getpid(),
                                 "since": time.strftime("%Y-%m-%d %H:%M:%S")}) + "\n").encode())
            f.flush()
        except BaseException:
            f.close()
            raise
        return f, former
    raise Busy(path, holder(path))


def _take(f: BinaryIO, path: str, kind: int) -> Optional[str]:
    """Takes the flock `kind` on f: None once taken, else who holds it (its name, or UNNAMED if, NAMING_GRACE_S
    after the first try, the file still names nobody and the lock is still held)."""
    deadline = time.monotonic() + NAMING_GRACE_S
    while True:
        try:
            fcntl.flock(f.fileno(), kind | fcntl.LOCK_NB)
            return None
        except BlockingIOError:
            name = holder(path)
            if name or time.monotonic() >= deadline:
                return name or UNNAMED
            time.sleep(0.01)


def _still_there(f: BinaryIO, path: str) -> bool:
    """The file held is still the one named `path` (a lock on a file removed meanwhile keeps nobody out)."""
    try:
        return os.path.samestat(os.fstat(f.fileno()), os.stat(path, follow_symlinks=False))
    except OSError:
        return False


def release(f: BinaryIO) -> None:
    """At a holder's own end (not a kill): empty the lock file, so that the next holder does not take it for the
    lock of a killed process, and drop the lock."""
    try:
        f.truncate(0)
        f.close()
    except OSError:
        pass


def held_by(path: str) -> Optional[str]:
    """Whether a live process holds the lock file `path` now: its holder ('pid N ...', or 'a process that did not
    say who it is'), None if nobody does or there is no such file. Looks without taking it for long (a shared lock,
    at once released), and works in a directory this process cannot write."""
    try:
        with files.open_read(path, "a lock file", remember=False) as f:
            return _take(f, path, fcntl.LOCK_SH)  # closing f drops a shared lock taken
    except OSError:  # none there, or not a regular file: nobody holds it
        return None
