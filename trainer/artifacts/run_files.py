"""Writing into run.dir, and reading the files a run is made from, without trusting what is there.

A run directory may be on a shared filesystem or be someone else's: any name in it may be a symbolic
link to a file elsewhere, a FIFO or a device. The trainer writes only regular files it creates or
rewrites itself, inside run.dir: every file is opened through `open_write`, which walks from run.dir to
the file one directory at a time without following links (O_NOFOLLOW at every step; run.dir itself may
be a link, the user's choice), refuses anything but a regular file (a FIFO is opened non-blocking, so
it cannot hang the open), and truncates only after that check. `check_run_dir` refuses such entries
before anything is written, naming the first one.

Reading: `read_capped` takes regular files only (links to regular files are fine: a data dir may link
its files), up to a size cap, so a SentencePiece model that is a link to /dev/zero or a FIFO is a
one-line error instead of a copy until the disk is full or a read until memory runs out.
"""
from __future__ import annotations

import errno
import fcntl
import os
import stat

from trainer.artifacts.run_dir import LOCK_FILE

MAX_SPM_BYTES = 64 << 20  # a SentencePiece model: ~1 MB for 32k pieces, a few MB for the largest vocabularies
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class RunFileError(OSError):
    """A name in run.dir where the trainer writes its own file is a link, a FIFO, a device or a
    directory; or a file read for the run is not a regular file or too large. One line, naming it."""

    def __str__(self) -> str:
        return f"{self.filename}: {self.strerror}"


def _refuse(path: str, what: str, code: int = errno.EPERM) -> RunFileError:
    return RunFileError(code, what, path)


def _describe(path: str) -> str:
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return "not a regular file"
    if stat.S_ISLNK(mode):
        return f"a symbolic link (to {os.readlink(path)})"
    kind = {stat.S_ISFIFO: "a FIFO", stat.S_ISCHR: "a character device", stat.S_ISBLK: "a block device",
            stat.S_ISSOCK: "a socket", stat.S_ISDIR: "a directory"}
    return next((name for test, name in kind.items() if test(mode)), "not a regular file")


def _writes_here(path: str, where: str = "run.dir") -> str:
    return (f"{_describe(path)} where the trainer writes its own file; refused (it writes only regular files "
            f"it creates: remove it, or choose another {where})")


def _open_dir(run_dir: str, parts: list[str], create: bool) -> int:
    """An fd of run_dir/parts..., each part a real directory (created if missing, never a link)."""
    fd = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    path = run_dir
    try:
        for name in parts:
            path = os.path.join(path, name)
            try:
                sub = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                try:
                    os.mkdir(name, dir_fd=fd)
                except FileExistsError:
                    pass
                sub = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except OSError as e:
                if e.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise _refuse(path, _writes_here(path)) from None
                raise
            os.close(fd)
            fd = sub
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_write(run_dir: str, relpath: str, *, append: bool = False, binary: bool = False, where: str = "run.dir"):
    """run_dir/relpath for writing (truncated, or appended to), as a file object; its directories are
    created as needed. Raises RunFileError for a link, FIFO, device or directory anywhere on the way
    (`where`: what the user would change, for the message)."""
    parts = [p for p in relpath.split("/") if p]
    if not parts or any(p in (".", "..") for p in parts):
        raise ValueError(f"{relpath!r}: not a path inside run.dir")
    path = os.path.join(run_dir, *parts)
    dir_fd = _open_dir(run_dir, parts[:-1], create=True)
    try:
        flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | (os.O_APPEND if append else 0)
        try:
            fd = os.open(parts[-1], flags, 0o666, dir_fd=dir_fd)
        except OSError as e:  # ELOOP: a link; ENXIO: a FIFO nobody reads; EISDIR: a directory
            if e.errno in (errno.ELOOP, errno.ENXIO, errno.EISDIR, errno.ENOTDIR):
                raise _refuse(path, _writes_here(path, where)) from None
            raise
    finally:
        os.close(dir_fd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _refuse(path, _writes_here(path, where))
        if st.st_nlink > 1:  # a hard link: writing would change the file under its other names too
            raise _refuse(path, f"a file with {st.st_nlink} names (hard links); writing it would change the others "
                                f"too; refused (remove it, or choose another {where})")
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
        if not append:
            os.ftruncate(fd, 0)
    except BaseException:
        os.close(fd)
        raise
    if binary:
        return os.fdopen(fd, "ab" if append else "wb")
    return os.fdopen(fd, "a" if append else "w", encoding="utf-8")


def make_dirs(run_dir: str, relpath: str) -> None:
    """run_dir/relpath as real directories (created as needed; a link on the way is refused)."""
    if os.path.exists(run_dir) and not os.path.isdir(run_dir):
        raise _refuse(run_dir, "exists and is not a directory (run.dir)", errno.ENOTDIR)
    os.makedirs(run_dir, exist_ok=True)
    os.close(_open_dir(run_dir, [p for p in relpath.split("/") if p], create=True))


def write_bytes(run_dir: str, relpath: str, data: bytes, *, fsync: bool = False) -> None:
    with open_write(run_dir, relpath, binary=True) as f:
        f.write(data)
        if fsync:
            f.flush()
            os.fsync(f.fileno())


def write_text(run_dir: str, relpath: str, text: str) -> None:
    write_bytes(run_dir, relpath, text.encode("utf-8"))


def read_capped(path: str, max_bytes: int, what: str) -> bytes:
    """The bytes of the regular file at `path` (links to one are followed), at most `max_bytes`;
    RunFileError (naming `what`) for a FIFO, a device, a directory or a larger file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise
    except OSError as e:
        raise _refuse(path, f"{what}: cannot be read ({e.strerror})", e.errno) from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = _describe(os.path.realpath(path))
            raise _refuse(path, f"{what}: {kind}, not a regular file; refused")
        if st.st_size > max_bytes:
            raise _refuse(path, f"{what}: {st.st_size} bytes, more than the {max_bytes} a file of this kind may have",
                          errno.EFBIG)
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:  # grew while read
        raise _refuse(path, f"{what}: more than the {max_bytes} bytes a file of this kind may have", errno.EFBIG)
    return data


def check_run_dir(run_dir: str, files: tuple[str, ...], dirs: dict[str, tuple[str, ...]]) -> None:
    """Before a run writes anything: none of the names it writes (`files` at the top; `dirs`: directory
    -> fnmatch patterns of what it writes inside) may be a link or a special file, and each directory
    must be a real directory. Raises RunFileError naming the first offender."""
    import fnmatch

    if not os.path.isdir(run_dir):
        return
    for name in files:
        path = os.path.join(run_dir, name)
        if os.path.lexists(path) and not stat.S_ISREG(os.lstat(path).st_mode):
            raise _refuse(path, _writes_here(path))
    for name, patterns in dirs.items():
        path = os.path.join(run_dir, name)
        if not os.path.lexists(path):
            continue
        if not stat.S_ISDIR(os.lstat(path).st_mode):
            raise _refuse(path, _writes_here(path))
        for entry in sorted(os.listdir(path)):
            inner = os.path.join(path, entry)
            if any(fnmatch.fnmatchcase(entry, p) for p in patterns) and not stat.S_ISREG(os.lstat(inner).st_mode):
                if not (entry.endswith(".tmp") and stat.S_ISDIR(os.lstat(inner).st_mode)):
                    raise _refuse(inner, _writes_here(inner))


# ---- one trainer per run.dir ----
_held: list = []  # the lock files this process holds, open for its whole life (closing one drops its lock)


class RunDirBusy(ValueError):
    """run.dir is held by another live trainer; the message names it (host, pid, since when)."""


def _holder(path: str) -> str | None:
    """Who the lock file says holds it ('pid N on HOST since TIME'), None if it names nobody."""
    from data_prep.dataformat import userfiles

    try:
        data = userfiles.parse_json(read_capped(path, 4096, what="the run.dir lock").decode("utf-8"), path)
        return f"pid {int(data['pid'])} on {str(data['host'])[:100]} since {str(data['since'])[:40]}"
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def lock_run_dir(run_dir: str) -> str | None:
    """Hold run.dir for the life of this process (rank 0 of a run): an exclusive flock on
    RUN_DIR/train.lock, whose content names the holder. Raises RunDirBusy while another live trainer
    holds it. The kernel drops the lock when its holder ends, however it ends, so the file a killed run
    left behind is no obstacle: returns a note naming that former holder (None if there was none)."""
    import json
    import socket
    import time

    make_dirs(run_dir, "")
    f = open_write(run_dir, LOCK_FILE, append=True)  # not emptied before we hold it
    path = os.path.join(run_dir, LOCK_FILE)
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.close()
        holder = _holder(path) or "its holder did not say who it is"
        raise RunDirBusy(f"run.dir={run_dir} is in use by another trainer ({holder}); wait for it to end, or "
                         f"choose another run.dir") from None
    except BaseException:
        f.close()
        raise
    former = _holder(path)
    f.truncate(0)
    f.write(json.dumps({"host": socket.gethostname(), "pid": os.getpid(),
                        "since": time.strftime("%Y-%m-%d %H:%M:%S")}) + "\n")
    f.flush()
    _held.append(f)
    return (f"run.dir: the lock of an earlier trainer ({former}) was stale: that trainer was killed; taken over"
            if former else None)


def release_run_dir() -> None:
    """At a trainer's own end (not a kill): empty the lock file, so that the next run does not take it for
    the lock of a killed run, and drop the lock."""
    while _held:
        f = _held.pop()
        try:
            f.truncate(0)
            f.close()
        except OSError:
            pass
