"""Writing into run.dir, and reading the files a run is made from, without trusting what is there: the run
directory's side of the file layer (data_prep.files).

A run directory may be on a shared filesystem or be someone else's: any name in it may be a symbolic
link to a file elsewhere, a FIFO or a device. The trainer writes only regular files it creates or
rewrites itself, inside run.dir: every file is opened through `open_write` (files.open_in), which walks from
run.dir to the file one directory at a time without following links (O_NOFOLLOW at every step; run.dir itself
may be a link, the user's choice), refuses anything but a regular file of one name (a FIFO is opened
non-blocking, so it cannot hang the open), and truncates only after that check. `check_run_dir` refuses such
entries before anything is written, naming the first one. A run.dir that cannot be made (read-only, below a
regular file) or a full disk is one line naming the path (files.FileError).

Reading: the file layer's `files.read_bytes` takes regular files only (links to regular files are fine: a data
dir may link its files), up to a size cap (MAX_SPM_BYTES for a SentencePiece model), so a model that is a link
to /dev/zero or a FIFO is a one-line error instead of a copy until the disk is full or a read until memory runs
out.
"""
from __future__ import annotations

import os
import stat

from data_prep.dataformat import MAX_SPM_BYTES, files, lock
from trainer.artifacts.run_dir import LOCK_FILE



def _refuse(path: str) -> files.FileError:
    return files.refused_in(path, "run.dir", "the trainer")


def open_write(run_dir: str, relpath: str, *, append: bool = False, binary: bool = False, where: str = "run.dir"):
    """run_dir/relpath for writing (truncated, or appended to), as a file object; its directories are
    created as needed. Raises files.FileError for a link, FIFO, device or directory anywhere on the way
    (`where`: what the user would change, for the message), or when it cannot be written."""
    return files.open_in(run_dir, relpath, append=append, binary=binary, where=where, owner="the trainer")


def make_dirs(run_dir: str, relpath: str) -> None:
    """run_dir/relpath as real directories (created as needed; a link on the way is refused)."""
    files.make_dirs(run_dir, "run.dir")
    os.close(files.open_dir(run_dir, [p for p in relpath.split("/") if p], True, "run.dir", "the trainer"))


def write_bytes(run_dir: str, relpath: str, data: bytes, *, fsync: bool = False) -> None:
    with open_write(run_dir, relpath, binary=True) as f:
        f.write(data)
        if fsync:
            files.sync(f)


def write_text(run_dir: str, relpath: str, text: str) -> None:
    write_bytes(run_dir, relpath, text.encode("utf-8"))


def check_run_dir(run_dir: str, files: tuple[str, ...], dirs: dict[str, tuple[str, ...]]) -> None:
    """Before a run writes anything: none of the names it writes (`files` at the top; `dirs`: directory
    -> fnmatch patterns of what it writes inside) may be a link or a special file, and each directory
    must be a real directory. Raises files.FileError naming the first offender."""
    import fnmatch

    if not os.path.isdir(run_dir):
        return
    for name in files:
        path = os.path.join(run_dir, name)
        if os.path.lexists(path) and not stat.S_ISREG(os.lstat(path).st_mode):
            raise _refuse(path)
    for name, patterns in dirs.items():
        path = os.path.join(run_dir, name)
        if not os.path.lexists(path):
            continue
        if not stat.S_ISDIR(os.lstat(path).st_mode):
            raise _refuse(path)
        for entry in sorted(os.listdir(path)):
            inner = os.path.join(path, entry)
            if any(fnmatch.fnmatchcase(entry, p) for p in patterns) and not stat.S_ISREG(os.lstat(inner).st_mode):
                if not (entry.endswith(".tmp") and stat.S_ISDIR(os.lstat(inner).st_mode)):
                    raise _refuse(inner)


# ---- one trainer per run.dir ----
_held: list = []  # the lock files this process holds, open for its whole life (closing one drops its lock)


class RunDirBusy(ValueError):
    """run.dir is held by another live trainer; the message names it (host, pid, since when)."""


def lock_run_dir(run_dir: str) -> str | None:
    """Hold run.dir for the life of this process (rank 0 of a run): an exclusive flock on
    RUN_DIR/train.lock, whose content names the holder (lock.hold). Raises RunDirBusy while another live trainer
    holds it. The kernel drops the lock when its holder ends, however it ends, so the file a killed run
    left behind is no obstacle: returns a note naming that former holder (None if there was none)."""
    make_dirs(run_dir, "")
    try:
        f, former = lock.hold(run_dir, LOCK_FILE, where="run.dir", owner="the trainer")
    except lock.Busy as e:
        holder = e.holder or "its holder did not say who it is"
        raise RunDirBusy(f"run.dir={run_dir} is in use by another trainer ({holder}); wait for it to end, or "
                         f"choose another run.dir") from None
    _held.append(f)
    return (f"run.dir: the lock of an earlier trainer ({former}) was stale: that trainer was killed; taken over"
            if former else None)


def release_run_dir() -> None:
    """At a trainer's own end (not a kill): empty the lock file, so that the next run does not take it for
    the lock of a killed run, and drop the lock."""
    while _held:
        lock.release(_held.pop())
