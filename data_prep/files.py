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
                                     never sees half a file; a failure leaves the old file and no temporary). The
                                     target may be missing or a regular file: never a link (nothing is written
                                     through one), a FIFO, a device or a directory; never a file this command read
                                     (by device and inode: another name, a hard link or `..` does not hide it);
                                     never inside what the command `protect`s; and, where the caller can tell its
                                     own files (`ours`), never over a file it did not write. `own=True`: the
                                     program's own file, rewritten (a pointer, a cache), which it may have read.
    open_in(root, relpath)           a file written where it is (an appended log, the lock), reached from `root`
                                     without following a link at any step, a regular file of one name only
    create(path, what)               a new file in a directory the program made for itself (prepare's staging
                                     directory), its failures named like the others
    make_dirs(path, what), fsync_dir(path), protect(path, why), command()

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
import stat
from contextlib import contextmanager
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


class _Command:
    """What one command read (by device and inode) and what it protects."""

    def __init__(self, remembers_reads: bool):
        self.remembers_reads = remembers_reads
        self.read: dict[tuple[int, int], str] = {}  # (device, inode) -> the path it was read as
        self.protected: dict[tuple[int, int], tuple[str, str]] = {}  # of a file or directory -> (path, why)
        self.protected_names: dict[str, tuple[str, str]] = {}  # the same by real path, for names not (yet) there


_commands = [_Command(remembers_reads=False)]  # the process outside any command (the trainer), then nested ones


@contextmanager
def command() -> Iterator[None]:
    """One command (a CLI's main): the files it reads are remembered, and what it read or protected is forgotten at
    its end, so commands run one after another in one process (tests) do not see each other's. Outside a command
    (the trainer, a long process that rewrites its own files) no read is remembered."""
    _commands.append(_Command(remembers_reads=True))
    try:
        yield
    finally:
        _commands.pop()


def protect(path: str, why: str) -> None:
    """No `replace` of this command writes `path` or, for a directory, anything below it (`why`: whose it is)."""
    now = _commands[-1]
    now.protected_names[os.path.realpath(path)] = (path, why)
    try:
        now.protected[_identity(os.stat(path))] = (path, why)
    except OSError:
        pass


def _protection(path: str) -> Optional[tuple[str, str]]:
    """(protected path, why) if `path` is protected or below a protected directory."""
    now = _commands[-1]
    probe = os.path.realpath(path)
    while True:
        hit = now.protected_names.get(probe)
        if hit is None:
            try:
                hit = now.protected.get(_identity(os.stat(probe)))
            except OSError:
                pass
        if hit is not None:
            return hit
        parent = os.path.dirname(probe)
        if parent == probe:
            return None
        probe = parent


def was_read(path: str) -> Optional[str]:
    """The path under which this command read the file `path` is (by device and inode), or None."""
    try:
        return _commands[-1].read.get(_identity(os.stat(path)))
    except OSError:
        return None


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


def check_target(path: str, what: str = "the output", *, flag: Optional[str] = None, own: bool = False,
                 ours: Optional[Callable[[str], bool]] = None) -> None:
    """Refuse (FileError) to write `path` unless it is missing or a regular file that this command neither read
    (unless `own`) nor protects, and that `ours` (when given) says the program wrote."""
    def refuse(reason: str) -> FileError:
        return FileError(errno.EPERM, f"refused: {reason}", path, flag)

    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    except OSError as e:
        raise failed(path, f"write {what}", e, flag) from None
    if st is not None and stat.S_ISLNK(st.st_mode):
        raise refuse(f"{describe(path)}; {what} may not be written through a link (name the file itself, or remove "
                     f"the link)")
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise refuse(f"{describe(path)}; {what} may replace only a regular file")
    read_as = was_read(path) if st is not None and not own else None
    if read_as is not None:
        same = "" if os.path.abspath(read_as) == os.path.abspath(path) else f" (the same file as {read_as})"
        raise refuse(f"a file this command reads{same}; writing {what} there would destroy it, choose another name")
    protected = None if own else _protection(path)
    if protected is not None:
        where, why = protected
        inside = "" if os.path.realpath(where) == os.path.realpath(path) else f"inside {where}, "
        raise refuse(f"{inside}{why}; write {what} elsewhere")
    if st is not None and ours is not None and not ours(path):
        raise refuse(f"exists and is not {what} written by this program; remove it, or choose another name")


@contextmanager
def replace(path: str, what: str = "the output", *, flag: Optional[str] = None, binary: bool = False,
            own: bool = False, ours: Optional[Callable[[str], bool]] = None):
    """A file to write that replaces `path` when the block ends without an error (see the module docstring)."""
    check_target(path, what, flag=flag, own=own, ours=ours)
    directory, name = os.path.split(os.path.abspath(path))
    with errors(directory, f"open the directory of {what}", flag):
        dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    tmp = f".{name[:200]}.{secrets.token_hex(4)}.tmp"
    try:
        with errors(os.path.join(directory, tmp), f"create a temporary file for {what}", flag):
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666,
                         dir_fd=dir_fd)
        f = _writer(fd, path, flag, binary)
        try:
            yield f
            f.flush()
            _raw_of(f).sync()
            f.close()
            check_target(path, what, flag=flag, own=own, ours=ours)  # not swapped for a link meanwhile
            with errors(path, f"rename {what} into place", flag):
                os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            _sync_dir(dir_fd)
        except BaseException as e:
            failure = _raw_of(f).failure
            _discard(f, tmp, dir_fd)
            if failure is not None and not isinstance(e, FileError):  # torch.save's RuntimeError for a full disk
                raise failure from None
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
