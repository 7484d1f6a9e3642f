"""Files users hand us, read strictly: one home for opening them and for parsing their JSON and YAML.

    open_regular(path, what)       a regular file only (links followed): a FIFO, device, socket or directory is
                                   refused before any byte is read, so a reader never blocks on one
    parse_json(text, where)        JSON with every key stated once and nesting bounded (MAX_DEPTH)
    read_json(path, max_bytes)     a regular file of at most `max_bytes`, UTF-8, parsed by parse_json
    check_yaml(text, where)        the same rules for YAML (omegaconf parses it afterwards)

Python's parsers accept a key stated twice (the last value wins, silently) and recurse once per level of
nesting (a file nested 100,000 deep is a RecursionError, or a crash in a C extension). Every refusal is a
`UserFileError`: one line naming the file, the line, and the key where there is one. The trainer reads these
through data_prep.dataformat; tests/test_userfiles.py fails on a json/yaml parse anywhere else.
"""
from __future__ import annotations

import json
import os
import re
import stat
from typing import BinaryIO

MAX_DEPTH = 64  # levels of objects/lists; the project's files nest at most 8 (a device profile)
MAX_TEXT_BYTES = 64 << 20  # what any JSON or YAML text may be; each kind of file has its own, smaller cap


class UserFileError(ValueError):
    """A user's file refused; the message is one line naming the file (and line and key where known)."""


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory")):
        if test(mode):
            return name
    return "a special file"


def open_regular(path: str, what: str = "a file") -> BinaryIO:
    """`path` opened for binary reading if it is a regular file (after following links). Opened without
    blocking and checked on the open descriptor, so a FIFO swapped in after a check cannot block either."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            link = f" (a link to {os.path.realpath(path)})" if os.path.islink(path) else ""
            raise UserFileError(f"{path}: {what} must be a regular file, not {_kind(mode)}{link}; refused")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_json(path: str, max_bytes: int, what: str = "a JSON file"):
    """The JSON value of the regular file at `path`, of at most `max_bytes`, strictly parsed."""
    with open_regular(path, what) as f:
        size = os.fstat(f.fileno()).st_size
        raw = f.read(max_bytes + 1)
    if max(size, len(raw)) > max_bytes:
        raise UserFileError(f"{path}: {max(size, len(raw))} bytes, more than the {max_bytes} {what} may have")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UserFileError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    return parse_json(text, path)


_JSON_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[{}\[\],]')


def parse_json(text: str, where: str, *, line: int = 1, max_depth: int = MAX_DEPTH, max_bytes: int = MAX_TEXT_BYTES):
    """`text` (from `where`, starting at `line`) as JSON: invalid JSON, a key stated twice in one object, nesting
    deeper than `max_depth` or a text over `max_bytes` is a UserFileError naming `where` and the line."""
    if len(text) > max_bytes:
        raise UserFileError(f"{where}: {len(text)} characters, more than the {max_bytes} a JSON text may have")
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise UserFileError(f"{where}:{line + e.lineno - 1}: invalid JSON: {e.msg}") from None
    except RecursionError:  # the scan names the line where it goes too deep
        _scan_json(text, where, line, max_depth)
        raise UserFileError(f"{where}: nested too deeply for Python's parser; refused") from None
    _scan_json(text, where, line, max_depth)  # linear: json.loads proved every string here closed
    return value


def _scan_json(text: str, where: str, line: int, max_depth: int) -> None:
    """Walk the brackets, commas and strings of (valid) JSON without recursion: depth and repeated keys."""
    def at(pos: int) -> int:
        return line + text.count("\n", 0, pos)

    stack: list[list] = []  # per open container: [{key: position}, last key] (object) or [None, index] (list)
    expect_key = False
    for m in _JSON_TOKEN.finditer(text):
        tok = m.group()
        if tok in ("{", "["):
            if len(stack) >= max_depth:
                raise UserFileError(f"{where}:{at(m.start())}: nested deeper than {max_depth} levels of objects and "
                                    f"lists; refused")
            stack.append([{}, None] if tok == "{" else [None, 0])
            expect_key = tok == "{"
        elif tok in ("}", "]"):
            if stack:
                stack.pop()
            expect_key = False
        elif tok == ",":
            expect_key = bool(stack) and stack[-1][0] is not None
            if stack and not expect_key:
                stack[-1][1] += 1
        elif expect_key:
            keys, key = stack[-1][0], json.loads(tok)
            if key in keys:
                raise UserFileError(f"{where}:{at(m.start())}: invalid JSON: found duplicate key "
                                    f"{_key_path(stack, key)!r} (first on line {at(keys[key])}); state each key once")
            keys[key] = m.start()
            stack[-1][1] = key
            expect_key = False


def _key_path(stack: list, key: str) -> str:
    """`key` with the keys and list indices that lead to it: section.name, layers[2].ms, ..."""
    path = ""
    for frame in [*stack[:-1], [{}, key]]:
        keys, at = frame[0], frame[-1]
        path += f"[{at}]" if keys is None else (f".{at}" if path else str(at))
    return path


def check_yaml(text: str, where: str, *, max_depth: int = MAX_DEPTH, max_bytes: int = MAX_TEXT_BYTES) -> None:
    """Refuse YAML `text` (from `where`) whose mappings state a key twice or that nests deeper than `max_depth`,
    before a recursive loader sees it, walking the parser's events (no recursion). Syntax errors are left to
    the loader, which names their line."""
    import yaml

    if len(text) > max_bytes:
        raise UserFileError(f"{where}: {len(text)} characters, more than the {max_bytes} a YAML text may have")
    stack: list[list] = []  # per open collection: [{key: line}, next node is a key, last key] or [None, _, index]
    try:
        for event in yaml.parse(text, Loader=yaml.SafeLoader):
            scalar = isinstance(event, yaml.ScalarEvent)
            if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
                _yaml_node(stack, event, where, scalar)
                if len(stack) >= max_depth:
                    raise UserFileError(f"{where}:{event.start_mark.line + 1}: nested deeper than {max_depth} "
                                        f"levels of mappings and lists; refused")
                stack.append([{}, True, None] if isinstance(event, yaml.MappingStartEvent) else [None, False, -1])
            elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
                stack.pop()
            elif scalar or isinstance(event, yaml.AliasEvent):
                _yaml_node(stack, event, where, scalar)
    except yaml.YAMLError:
        return


def _yaml_node(stack: list, event, where: str, scalar: bool) -> None:
    """A node starts in the innermost collection: in a mapping, every other node is a key (checked once)."""
    if not stack:
        return
    frame = stack[-1]
    if frame[0] is None:  # a list: count its items
        frame[2] += 1
        return
    is_key, frame[1] = frame[1], not frame[1]
    if not is_key:
        return
    key, line = (event.value if scalar else "?"), event.start_mark.line + 1
    if scalar and key in frame[0]:
        raise UserFileError(f"{where}:{line}:{event.start_mark.column + 1}: YAML syntax error: found duplicate key "
                            f"{_key_path(stack, key)!r} (first on line {frame[0][key]}); state each key once")
    frame[0][key] = line
    frame[2] = key
