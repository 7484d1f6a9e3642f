"""The file layer: how every file a user hands us, or names for us to write, is opened, read and written.

Reading
    open_read(path, what)            a regular file only, whatever the link: a FIFO, a device, a socket or a
                                     directory is refused on the open descriptor before a byte is read (opened
                                     without blocking, so a FIFO cannot hang even the open). Inside a `command()`
                                     (every CLI's main), remembered by device and inode as read by it.
    read_bytes(path, max_bytes, what) the same, the whole file, bounded

Writing
    replace(path, what)              a context manager yielding a file: written to a new temporary file in the
                                     target's directory, fsynced and renamed over the target at the end (a reader
                                     never sees half a file; a failure or a stop signal leaves the old file and no
                                     temporary). The target may be missing or a regular file: never a link (nothing
                                     is written through one), a FIFO, a device or a directory; never a file this
                                     command read; never inside what the command `protect`s; and, where the caller
                                     can tell its own files (`ours`), never over a file it did not write. `own=True`:
                                     the program's own file, rewritten (a pointer, a cache), which it may have read.
    open_in(root, relpath)           a file written where it is (an appended log, the lock), reached from `root`
                                     without following a link at any step, a regular file of one name only
    create(path, what)               a new file in a directory the program made for itself (prepare's staging
                                     directory), its failures named like the others
    make_dirs(path, what), fsync_dir(path), protect(path, why), command(), same_file(a, b)

Identity, not spelling: "the same file" and "inside what is protected" are decided by what a path resolves to, as
the kernel resolves it: the device and inode of an existing file; for a name about to be created, the directory it
would be created in (opened as the kernel walks the path, so `D/lnk/../x` is beside lnk's target, not in D) and the
directories above it (walked up through `..`). `replace` checks and writes through that one open directory, so the
file checked is the file written. A command's own stdout and stderr are files too: redirected onto a file it reads
(`>> IN`, `< IN >> IN`) or protects, the command is refused when it reads or protects that file.

Signals: inside a `command()`, SIGTERM, SIGINT and SIGHUP raise `Stopped`; every `replace` under way removes its
temporary file, and the command ends with one line (`stopped by SIGTERM: --output F not written ...`) and status
128 + the signal's number, never a traceback (an ignored signal, e.g. under nohup, stays ignored).

Every failure is a `FileError` (an OSError and a ValueError): one line naming the path and what was being done, e.g.
"out.txt: cannot write: No space left on device"; a missing file is a `MissingFile` (a FileNotFoundError too).
Parsing what was read stays in data_prep.userfiles. tests/test_files.py fails on a file opened, read or written
anywhere else in trainer/, data_prep/ or launch/ (a short list of exceptions, each with its reason).
"""
from __future__ import annotations

import errno
import io
import os
import secrets
import signal
import stat
import sys
import threading
from contextlib import contextmanager, nullcontext
from typing import BinaryIO, Callable, Iterator, Optional

TEMP_PATTERN = ".*.tmp"  # the temporary name of `replace` (fnmatch): ".NAME.XXXXXXXX.tmp" beside its target
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory"), (stat.S_ISLNK, "a symbolic link"),
          (stat.S_ISREG, "a regular file"))


class FileError(OSError, ValueError):
    """A file that could not be opened, read or written, or that is refused; one line naming it (`flag`: the
    option that named it, e.g. --output) and what was being done. An OSError, and a ValueError as every user error
    of the project is (what the entry points print as one line: trainer.entry.fail)."""

    def __init__(self, code: Optional[int], reason: str, path: str, flag: Optional[str] = None):
        super().__init__(code, reason, path)
        self.flag = flag

    def __str__(self) -> str:
        return f"{self.flag + ' ' if self.flag else ''}{self.filename}: {self.strerror}"


class MissingFile(FileError, FileNotFoundError):
    """The file (or a directory on its way) does not exist."""


def failed(path: str, doing: str, e: OSError, flag: Optional[str] = None) -> FileError:
    """`e` as one line: 'PATH: cannot DOING: REASON' (a FileError passes through)."""
    if isinstance(e, FileError):
        return e
    cls = MissingFile if isinstance(e, FileNotFoundError) else FileError
    reason = e.strerror or str(e)
    named = str(e.filename) if e.filename else None
    if named and named != os.path.basename(path) and os.path.abspath(named) != os.path.abspath(path):
        reason += f" ({named})"  # a directory on the way (not the file itself, by a name relative to its directory)
    return cls(e.errno, f"cannot {doing}: {reason}", path, flag)


@contextmanager
def errors(path: str, doing: str, flag: Optional[str] = None) -> Iterator[None]:
    """Any OSError inside becomes `failed(path, doing)`."""
    try:
        yield
    except OSError as e:
        raise failed(path, doing, e, flag) from None


def kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "a special file")


def describe(path: str) -> str:
    """What `path` is, for a refusal: 'a symbolic link (to X)', 'a FIFO', ... (links not followed)."""
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return "not a regular file"
    return f"a symbolic link (to {os.readlink(path)})" if stat.S_ISLNK(mode) else kind(mode)


# ---- what this command read and what it protects: no write lands on either ----
def _identity(st: os.stat_result) -> tuple[int, int]:
    return st.st_dev, st.st_ino


_STREAMS = ((1, "stdout"), (2, "stderr"))  # where a command's own lines go: never onto what it reads or protects
_MAX_DEPTH = 4096  # directories walked up from a target (a loop of bind mounts cannot hold the walk)


class _Command:
    """What one command read (by device and inode) and what it protects."""

    def __init__(self, remembers_reads: bool):
        self.remembers_reads = remembers_reads
        self.read: dict[tuple[int, int], str] = {}  # (device, inode) -> the path it was read as
        self.protected: dict[tuple[int, int], tuple[str, str]] = {}  # of a file or directory -> (path, why)
        self.protected_entries: dict[tuple[int, int, str], tuple[str, str]] = {}  # (its directory's identity,
        # its name) -> (path, why): a name protected whether or not something is there yet
        self.discarded: list[str] = []  # outputs whose temporary file a stop signal removed


_commands = [_Command(remembers_reads=False)]  # the process outside any command (the trainer), then nested ones


class Stopped(BaseException):
    """A stop signal (SIGTERM, SIGINT, SIGHUP) inside a `command()`: raised where the program is, so that every
    `replace` under way removes its temporary file on the way out. A BaseException, as KeyboardInterrupt, so that
    no `except Exception` holds it up."""

    def __init__(self, signum: int):
        self.signum, self.name = signum, signal.Signals(signum).name
        super().__init__(self.name)


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def _on_stop(signum, frame) -> None:
    for sig in STOP_SIGNALS:  # one stop is enough: a second signal must not cut the cleanup short
        if signal.getsignal(sig) is _on_stop:
            signal.signal(sig, signal.SIG_IGN)
    raise Stopped(signum)


@contextmanager
def stop_signals() -> Iterator[None]:
    """SIGTERM, SIGINT and SIGHUP raise `Stopped` in the main thread for the length of the block (a signal that
    is ignored, as `nohup` ignores SIGHUP, stays ignored); the dispositions before are restored after it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    try:
        for sig, handler in before.items():
            if handler is not signal.SIG_IGN:
                signal.signal(sig, _on_stop)
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)


@contextmanager
def command(*, signals: bool = True) -> Iterator[None]:
    """One command (a CLI's main): the files it reads are remembered, and what it read or protected is forgotten at
    its end, so commands run one after another in one process (tests) do not see each other's. Outside a command
    (the trainer, a long process that rewrites its own files) no read is remembered. `signals`: a stop signal ends
    the command with one line on stderr and exit status 128 + the signal's number (130 for Ctrl-C, 143 for
    SIGTERM, 129 for SIGHUP), its outputs under way discarded (a caller with its own handling says False)."""
    now = _Command(remembers_reads=True)
    _commands.append(now)
    try:
        with stop_signals() if signals else nullcontext():
            yield
    except Stopped as e:
        _say_stopped(e, now.discarded)
        raise SystemExit(128 + e.signum) from None
    finally:
        _commands.remove(now)


def _say_stopped(e: Stopped, discarded: list[str]) -> None:
    left = (f"{', '.join(discarded)} not written (its temporary file removed; a file there before is unchanged)"
            if discarded else "no output file was written")
    try:
        print(f"stopped by {e.name}: {left}", file=sys.stderr, flush=True)
    except OSError:  # a terminal that hung up (SIGHUP): nobody to tell
        pass


def protect(path: str, why: str) -> None:
    """No `replace` of this command writes `path` or, for a directory, anything below it (`why`: whose it is).
    Held by identity: the file or directory `path` resolves to (device and inode) and, whether or not anything is
    there yet, the name in the directory its parent resolves to."""
    now = _commands[-1]
    path = path.rstrip(os.sep) or path
    directory, name = os.path.split(path)
    try:
        now.protected[_identity(os.stat(path))] = (path, why)
    except OSError:
        pass
    try:
        now.protected_entries[(*_identity(os.stat(directory or ".")), name)] = (path, why)
    except OSError:
        pass
    _check_streams()


def _protection_at(dir_fd: int, name: str, st: Optional[os.stat_result]) -> Optional[tuple[str, str, bool]]:
    """(protected path, why, whether the target is that path itself) if the entry `name` of the directory `dir_fd`
    (`st`: what is there, None if nothing) is protected or below a protected directory: by identity, walking up
    through `..` as the kernel does."""
    now = _commands[-1]
    if not (now.protected or now.protected_entries):
        return None
    here = os.fstat(dir_fd)
    hit = now.protected_entries.get((*_identity(here), name)) or (now.protected.get(_identity(st)) if st else None)
    if hit is not None:
        return (*hit, True)
    fd = os.dup(dir_fd)
    try:
        for _ in range(_MAX_DEPTH):
            hit = now.protected.get(_identity(here))
            if hit is not None:
                return (*hit, False)
            try:
                parent = os.open("..", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=fd)
            except OSError:  # a directory above that cannot be searched: nothing protected found so far
                return None
            os.close(fd)
            fd = parent
            above = os.fstat(fd)
            hit = _entry_of(now, fd, above, here)
            if hit is not None:
                return (*hit, False)
            if _identity(above) == _identity(here):  # the root
                return None
            here = above
        return None
    finally:
        os.close(fd)


def _entry_of(now: _Command, parent_fd: int, parent: os.stat_result, child: os.stat_result):
    """A protected name of the directory `parent` that is now the directory `child` (made after it was protected)."""
    for (dev, ino, name), hit in now.protected_entries.items():
        if (dev, ino) == _identity(parent):
            try:
                if _identity(os.stat(name, dir_fd=parent_fd, follow_symlinks=False)) == _identity(child):
                    return hit
            except OSError:
                pass
    return None


def was_read(path: str) -> Optional[str]:
    """The path under which this command read the file `path` is (by device and inode), or None."""
    try:
        return _commands[-1].read.get(_identity(os.stat(path)))
    except OSError:
        return None


def same_file(a: str, b: str) -> bool:
    """`a` and `b` resolve to the same file or directory (device and inode, links followed as the kernel does);
    False if either cannot be reached."""
    try:
        return _identity(os.stat(a)) == _identity(os.stat(b))
    except OSError:
        return False


def reading_stdin() -> None:
    """The command reads standard input: a regular file there (`< IN`) is remembered as read, as `open_read`
    remembers a named input, so that no output (stdout among them: `>> IN`) lands on it."""
    now = _commands[-1]
    try:
        st = os.fstat(0)
    except OSError:
        return
    if now.remembers_reads and stat.S_ISREG(st.st_mode):
        now.read.setdefault(_identity(st), "stdin")
        _check_streams()


def _check_streams() -> None:
    """Refuse (FileError) when this command's stdout or stderr is a file it reads or protects (`>> IN` of the input:
    a translation of its own output, without end; `>> RUN/config.yaml`), compared by identity (fstat of the
    descriptor). A refused stream is first pointed elsewhere (`_keep_off`), so that not even the refusal's own
    line lands in that file."""
    if not _commands[-1].remembers_reads:
        return
    refused = [(fd, stream, why) for fd, stream in _STREAMS if (why := _stream_refusal(fd, stream))]
    if refused:
        _keep_off([fd for fd, _, _ in refused])
        _, stream, why = refused[0]
        raise FileError(errno.EPERM, why, stream)


def _stream_refusal(fd: int, stream: str) -> Optional[str]:
    """Why the descriptor `fd` may not be written (a file this command reads or protects), or None."""
    try:
        st = os.fstat(fd)
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode):
        return None
    read_as = _commands[-1].read.get(_identity(st))
    if read_as is not None:
        return (f"refused: redirected onto {read_as}, a file this command reads; what it writes would change its own "
                f"input: redirect {stream} elsewhere")
    hit = _stream_protection(fd, st)
    if hit is not None:
        return f"refused: redirected {'onto' if hit[2] else 'inside'} {hit[0]}, {hit[1]}: redirect {stream} elsewhere"
    return None


def _keep_off(fds: list[int]) -> None:
    """Point the refused descriptors elsewhere: stderr at stdout when stdout is not refused (the refusal is still
    seen), otherwise at /dev/null."""
    null = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
    try:
        for fd in fds:
            os.dup2(1 if fd == 2 and 1 not in fds else null, fd)
    finally:
        os.close(null)


def _stream_protection(fd: int, st: os.stat_result) -> Optional[tuple[str, str, bool]]:
    """_protection_at for the file open as `fd`: its directory from /proc/self/fd (Linux), if that still names it."""
    now = _commands[-1]
    if not (now.protected or now.protected_entries):
        return None
    hit = now.protected.get(_identity(st))
    if hit is not None:
        return (*hit, True)
    try:
        path = os.readlink(f"/proc/self/fd/{fd}")
        if not (os.path.isabs(path) and same_file(path, f"/proc/self/fd/{fd}")):
            return None
        dir_fd = os.open(os.path.dirname(path), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return _protection_at(dir_fd, os.path.basename(path), st)
    finally:
        os.close(dir_fd)


# ---- reading ----
class _Raw(io.FileIO):
    """A descriptor whose read and write failures name the file; the first failure is kept (`failure`), for a
    writer (torch.save) that wraps it in an error of its own."""

    def __init__(self, fd: int, mode: str, path: str, flag: Optional[str]):
        super().__init__(fd, mode, closefd=True)
        self.path, self.flag, self.failure = path, flag, None

    def _failed(self, doing: str, e: OSError) -> FileError:
        self.failure = self.failure or failed(self.path, doing, e, self.flag)
        return self.failure

    def write(self, b) -> int:
        try:
            return super().write(b)
        except OSError as e:
            raise self._failed("write", e) from None

    def readinto(self, b) -> int:
        try:
            return super().readinto(b)
        except OSError as e:
            raise self._failed("read", e) from None

    def sync(self) -> None:
        try:
            os.fsync(self.fileno())
        except OSError as e:
            raise self._failed("write (fsync)", e) from None


def _reader(fd: int, path: str, flag: Optional[str]) -> BinaryIO:
    return io.BufferedReader(_Raw(fd, "r", path, flag), 1 << 16)


def open_read(path: str, what: str = "a file", flag: Optional[str] = None, *, remember: bool = True) -> BinaryIO:
    """`path` opened for binary reading if it is a regular file (after following links); refused (FileError)
    otherwise, before any byte is read. `remember=False`: a look at a file about to be written (is it ours?),
    not an input of the command."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        if e.errno == errno.ENXIO and os.path.exists(path):  # a socket cannot even be opened
            raise _not_regular(path, what, os.stat(path).st_mode, flag) from None
        raise failed(path, f"open {what}", e, flag) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _not_regular(path, what, st.st_mode, flag)
        os.set_blocking(fd, True)
        if remember and _commands[-1].remembers_reads:
            _commands[-1].read[_identity(st)] = path
            _check_streams()
        return _reader(fd, path, flag)
    except BaseException:
        os.close(fd)
        raise


def _not_regular(path: str, what: str, mode: int, flag: Optional[str]) -> FileError:
    link = f" (a link to {os.path.realpath(path)})" if os.path.islink(path) else ""
    return FileError(errno.EPERM, f"{what} must be a regular file, not {kind(mode)}{link}; refused", path, flag)


def read_bytes(path: str, max_bytes: int, what: str = "a file", flag: Optional[str] = None, *,
               remember: bool = True) -> bytes:
    """The bytes of the regular file at `path`, at most `max_bytes` (a larger one, or one that grows past it while
    read, is refused)."""
    with open_read(path, what, flag, remember=remember) as f:
        size = os.fstat(f.fileno()).st_size
        data = f.read(max_bytes + 1) if size <= max_bytes else b""
    if max(size, len(data)) > max_bytes:
        raise FileError(errno.EFBIG, f"{what}: {max(size, len(data))} bytes, more than the {max_bytes} a file of "
                                     f"this kind may have", path, flag)
    return data


def text_reader(f: BinaryIO) -> io.TextIOWrapper:
    """UTF-8 lines of an opened file, '\\n'-terminated only."""
    return io.TextIOWrapper(f, encoding="utf-8", newline="\n")


# ---- writing ----
def _writer(fd: int, path: str, flag: Optional[str], binary: bool, append: bool = False):
    raw = _Raw(fd, "a" if append else "w", path, flag)
    buffered = io.BufferedWriter(raw, 1 << 16)
    return buffered if binary else io.TextIOWrapper(buffered, encoding="utf-8", newline="\n")


def _raw_of(f) -> _Raw:
    return (f.buffer if isinstance(f, io.TextIOWrapper) else f).raw


def _open_dir_of(path: str, what: str, flag: Optional[str]) -> tuple[int, str]:
    """An fd of the directory `path` is in, as the kernel resolves it (`D/lnk/../x` is in the directory above lnk's
    target, not in D), and the name in it; what `replace` checks and writes through, so the file checked is the file
    written."""
    directory, name = os.path.split(path)
    if name in ("", ".", ".."):
        raise FileError(errno.EISDIR, f"refused: not a file name; {what} must name a file", path, flag)
    try:
        return os.open(directory or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC), name
    except FileNotFoundError as e:
        _refuse_protected_missing(directory, path, what, flag)
        raise failed(directory or ".", f"open the directory of {what}", e, flag) from None
    except OSError as e:
        raise failed(directory or ".", f"open the directory of {what}", e, flag) from None


def _refuse_protected_missing(directory: str, path: str, what: str, flag: Optional[str]) -> None:
    """A directory of `path` that does not exist yet may still be a protected name (the run's timing/ before its
    first run): refused as such rather than as missing, from the nearest directory on the way that exists."""
    for _ in range(_MAX_DEPTH):
        above, name = os.path.split(directory)
        if not name or name in (".", ".."):
            return
        try:
            fd = os.open(above or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            directory = above
            continue
        try:
            protected = _protection_at(fd, name, None)
        finally:
            os.close(fd)
        if protected is not None:
            where, why, itself = protected
            raise FileError(errno.EPERM, f"refused: inside {where}, {why}; write {what} elsewhere", path, flag)
        return


def check_target(path: str, what: str = "the output", *, flag: Optional[str] = None, own: bool = False,
                 ours: Optional[Callable[[str], bool]] = None) -> None:
    """Refuse (FileError) to write `path` unless it is missing or a regular file that this command neither read
    (unless `own`) nor protects, and that `ours` (when given) says the program wrote."""
    dir_fd, name = _open_dir_of(path, what, flag)
    try:
        _check_at(dir_fd, name, path, what, flag=flag, own=own, ours=ours)
    finally:
        os.close(dir_fd)


def _check_at(dir_fd: int, name: str, path: str, what: str, *, flag: Optional[str], own: bool,
              ours: Optional[Callable[[str], bool]]) -> None:
    """check_target for the entry `name` of the directory `dir_fd` (`path`: how the user named it)."""
    def refuse(reason: str) -> FileError:
        return FileError(errno.EPERM, f"refused: {reason}", path, flag)

    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        st = None
    except OSError as e:
        raise failed(path, f"write {what}", e, flag) from None
    if st is not None and stat.S_ISLNK(st.st_mode):
        raise refuse(f"{describe(path)}; {what} may not be written through a link (name the file itself, or remove "
                     f"the link)")
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise refuse(f"{describe(path)}; {what} may replace only a regular file")
    read_as = _commands[-1].read.get(_identity(st)) if st is not None and not own else None
    if read_as is not None:
        same = "" if read_as == path else f" (the same file as {read_as})"
        raise refuse(f"a file this command reads{same}; writing {what} there would destroy it, choose another name")
    protected = None if own else _protection_at(dir_fd, name, st)
    if protected is not None:
        where, why, itself = protected
        raise refuse(f"{'' if itself else f'inside {where}, '}{why}; write {what} elsewhere")
    if st is not None and ours is not None and not ours(path):
        raise refuse(f"exists and is not {what} written by this program; remove it, or choose another name")


_STOP_MASK = set(STOP_SIGNALS)


@contextmanager
def replace(path: str, what: str = "the output", *, flag: Optional[str] = None, binary: bool = False,
            own: bool = False, ours: Optional[Callable[[str], bool]] = None):
    """A file to write that replaces `path` when the block ends without an error (see the module docstring)."""
    dir_fd, name = _open_dir_of(path, what, flag)
    try:
        _check_at(dir_fd, name, path, what, flag=flag, own=own, ours=ours)
        tmp = f".{name[:200]}.{secrets.token_hex(4)}.tmp"
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_MASK)  # no stop between its creation and `try`
        try:
            with errors(os.path.join(os.path.dirname(path), tmp), f"create a temporary file for {what}", flag):
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666,
                             dir_fd=dir_fd)
            f = _writer(fd, path, flag, binary)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        try:
            yield f
            f.flush()
            _raw_of(f).sync()
            f.close()
            _check_at(dir_fd, name, path, what, flag=flag, own=own, ours=ours)  # not swapped for a link meanwhile
            with errors(path, f"rename {what} into place", flag):
                os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            _sync_dir(dir_fd)
        except BaseException as e:
            failure = _raw_of(f).failure
            _discard(f, tmp, dir_fd)
            if isinstance(e, Stopped):
                _commands[-1].discarded.append(f"{flag + ' ' if flag else ''}{path}")
            if failure is not None and not isinstance(e, (FileError, Stopped)):  # torch.save's RuntimeError (a full
                raise failure from None                                         # disk)
            raise
    finally:
        os.close(dir_fd)


def _discard(f, tmp: str, dir_fd: int) -> None:
    try:
        f.close()
    except OSError:
        pass
    try:
        os.unlink(tmp, dir_fd=dir_fd)
    except OSError:
        pass


def _sync_dir(dir_fd: int) -> None:
    try:
        os.fsync(dir_fd)
    except OSError:  # some filesystems cannot; the rename itself is done
        pass


def fsync_dir(path: str) -> None:
    with errors(path, "sync the directory"):
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        _sync_dir(fd)
    finally:
        os.close(fd)


def create(path: str, what: str = "a file", *, binary: bool = False):
    """A new file (or one the program wrote before) in a directory the program made for itself, for writing;
    never through a link; its failures name it."""
    with errors(path, f"create {what}"):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
    return _writer(fd, path, None, binary)


def make_dirs(path: str, what: str = "a directory", flag: Optional[str] = None) -> None:
    """`path` and its parents as directories; one line naming `path` when one cannot be made."""
    if os.path.lexists(path) and not os.path.isdir(path):
        raise FileError(errno.ENOTDIR, f"{what}: exists and is {describe(path)}, not a directory", path, flag)
    try:
        os.makedirs(path, exist_ok=True)
    except NotADirectoryError as e:
        above = next((p for p in _parents(path) if os.path.lexists(p) and not os.path.isdir(p)), None)
        if above is None:
            raise failed(path, f"create {what}", e, flag) from None
        raise FileError(e.errno, f"cannot create {what}: {above} is {describe(above)}, not a directory", path,
                        flag) from None
    except OSError as e:
        raise failed(path, f"create {what}", e, flag) from None


def _parents(path: str) -> list[str]:
    """The directories above `path`, nearest last."""
    out, probe = [], os.path.dirname(os.path.abspath(path))
    while os.path.dirname(probe) != probe:
        out.append(probe)
        probe = os.path.dirname(probe)
    return out[::-1]


# ---- a directory's own files, written where they are ----
def refused_in(path: str, where: str, owner: str) -> FileError:
    return FileError(errno.EPERM, f"{describe(path)} where {owner} writes its own file; refused (it writes only "
                                  f"regular files it creates: remove it, or choose another {where})", path)


def open_dir(root: str, parts: list[str], create_missing: bool, where: str, owner: str = "the program") -> int:
    """An fd of root/parts..., each part a real directory (created if missing, never a link)."""
    with errors(root, f"open {where}"):
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    path = root
    try:
        for name in parts:
            path = os.path.join(path, name)
            try:
                sub = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create_missing:
                    raise failed(path, "open the directory", FileNotFoundError(errno.ENOENT, "no such directory"))
                with errors(path, "create the directory"):
                    try:
                        os.mkdir(name, dir_fd=fd)
                    except FileExistsError:
                        pass
                    sub = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except OSError as e:
                if e.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise refused_in(path, where, owner) from None
                raise failed(path, "open the directory", e) from None
            os.close(fd)
            fd = sub
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_in(root: str, relpath: str, *, append: bool = False, binary: bool = False, where: str = "directory",
            owner: str = "the program"):
    """root/relpath for writing where it is (truncated, or appended to), its directories created as needed. A link,
    FIFO, device, directory or hard-linked file anywhere on the way is refused (`where`: what the user would
    change, for the message)."""
    parts = [p for p in relpath.split("/") if p]
    if not parts or any(p in (".", "..") for p in parts):
        raise ValueError(f"{relpath!r}: not a path inside {where}")
    path = os.path.join(root, *parts)
    dir_fd = open_dir(root, parts[:-1], True, where, owner)
    try:
        flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | (os.O_APPEND if append else 0)
        try:
            fd = os.open(parts[-1], flags, 0o666, dir_fd=dir_fd)
        except OSError as e:  # ELOOP: a link; ENXIO: a FIFO nobody reads; EISDIR: a directory
            if e.errno in (errno.ELOOP, errno.ENXIO, errno.EISDIR, errno.ENOTDIR):
                raise refused_in(path, where, owner) from None
            raise failed(path, "open for writing", e) from None
    finally:
        os.close(dir_fd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise refused_in(path, where, owner)
        if st.st_nlink > 1:  # a hard link: writing would change the file under its other names too
            raise FileError(errno.EPERM, f"a file with {st.st_nlink} names (hard links); writing it would change the "
                                         f"others too; refused (remove it, or choose another {where})", path)
        os.set_blocking(fd, True)
        if not append:
            with errors(path, "truncate"):
                os.ftruncate(fd, 0)
    except BaseException:
        os.close(fd)
        raise
    return _writer(fd, path, None, binary, append)


def sync(f) -> None:
    """Flush a file of this layer and fsync it (its failure names the file)."""
    f.flush()
    _raw_of(f).sync()

