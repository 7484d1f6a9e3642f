"""Output directories: never overwrite or delete what this program did not write.

A program that writes into a directory (prepare's --out DATA_DIR, the trainer's run.dir) first calls
`check_output_dir` with the names it writes and a marker file that proves an earlier run of its own.
The directory is accepted when it does not exist, is empty, or holds only names the program writes
*and* its marker (checked by content) -- so replacing our own earlier output needs no flag. Anything
else is refused with the first offending name, unless the user passed the explicit overwrite flag;
even then, files of other names are left alone (only the program's own names are replaced).

    check_output_dir(out, owned=OUTPUT_NAMES, marker="manifest.json", is_marker_ours=json_marker(["checksum"]),
                     overwrite=args.overwrite, flag="--overwrite", program="prepare", leftovers=[".prepare-tmp"])
"""
from __future__ import annotations

import fnmatch
import os
from typing import Callable, Iterable, Optional

from .userfiles import open_regular, parse_json


class OutputDirError(ValueError):
    """The output directory holds files this program did not write; the message names one and the flag."""


def foreign_names(directory: str, owned: Iterable[str]) -> list[str]:
    """Entries of `directory` that match none of the `owned` patterns (fnmatch, on the entry's name)."""
    patterns = list(owned)
    return sorted(n for n in os.listdir(directory) if not any(fnmatch.fnmatchcase(n, p) for p in patterns))


def check_output_dir(directory: str, *, owned: Iterable[str], marker: Optional[str],
                     is_marker_ours: Callable[[str], bool], overwrite: bool, flag: str, program: str,
                     leftovers: Iterable[str] = ()) -> None:
    """Raise `OutputDirError` unless `program` may write into `directory` (see the module docstring).

    owned           name patterns the program writes (fnmatch), e.g. "spm.*.model"
    marker          the file an earlier run of the program always leaves (e.g. "manifest.json"); None: none
    is_marker_ours  whether the marker's path holds the program's own content
    leftovers       names the program leaves only when interrupted (e.g. ".prepare-tmp"): alone, they do
                    not need the marker
    """
    if not os.path.isdir(directory) or overwrite:
        return
    names = sorted(os.listdir(directory))
    if not names:
        return
    advice = (f"choose a new or empty directory, or pass {flag} to write into it anyway (files of other names "
              f"are left alone)")
    foreign = foreign_names(directory, owned)
    if foreign:
        more = f" (and {len(foreign) - 1} more)" if len(foreign) > 1 else ""
        raise OutputDirError(f"{directory}: holds {foreign[0]}{more}, which {program} did not write; {advice}")
    if set(names) <= set(leftovers) or marker is None:
        return
    marker_path = os.path.join(directory, marker)
    if not os.path.isfile(marker_path) or os.path.islink(marker_path) or not is_marker_ours(marker_path):
        raise OutputDirError(f"{directory}: holds {names[0]} but no {marker} written by {program}, so it may not "
                             f"be {program}'s own output; {advice}")


def json_marker(required_keys: Iterable[str], max_bytes: int = 64 << 20) -> Callable[[str], bool]:
    """An `is_marker_ours` for a JSON marker: a JSON object (of at most `max_bytes`) holding every key."""
    keys = tuple(required_keys)

    def is_ours(path: str) -> bool:
        if os.path.getsize(path) > max_bytes:
            return False
        try:
            with open_regular(path, "a marker") as f:
                data = parse_json(f.read(max_bytes).decode("utf-8"), path)
        except (ValueError, OSError):  # UserFileError and UnicodeDecodeError are ValueErrors
            return False
        return isinstance(data, dict) and all(k in data for k in keys)

    return is_ours
