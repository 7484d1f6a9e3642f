"""Checkpoint files, keyed by global layer index, so a run trained in one layout loads into any other.

RUN_DIR/checkpoints/step_00000500/
    layer_00-model_states.pt   Embeddings weights        written by the stage that holds the layer
    layer_00-optim_states.pt   its optimizer state       (replica 0; DeepSpeed's PipelineModule naming):
    layer_01-model_states.pt   pair layer 0               {param name: {"fp32": master weight,
    layer_01-optim_states.pt                               "exp_avg": ..., "exp_avg_sq": ...}}
    ...
    head-model_states.pt       AttentionSoftmaxHead      (the last stage, which owns the head)
    head-optim_states.pt
    rng-rank_00.pt             python / numpy / torch RNG states of each global rank
    train_state.json           TrainState: step, data position, LR scheduler, engine counters, config, ...
    meta.json                  step, epoch, dev metrics, data checksum, layout (a summary for people)
    manifest.json              sha256 and size of every file above; written last
RUN_DIR/checkpoints/latest     name of the newest complete checkpoint
RUN_DIR/checkpoints/best       name of the checkpoint with the best dev BLEU

Atomicity: every file is written into `step_N.tmp` and fsynced; once every rank has written its
files, rank 0 writes the manifest, renames the directory to `step_N` and fsyncs the parent, then
updates `latest` (temporary name + rename). A directory without the `.tmp` suffix therefore always
holds a complete checkpoint, and `verify` detects any later truncation or corruption by checksum.

Trust: a checkpoint directory may come from anywhere (a copy, a download, a tampered run). `verify`
accepts it only if its manifest is well-formed, names plain files of that directory (no "..", no
absolute paths, no links that leave it, nothing but regular files: no /dev/zero, no FIFO), lists
every file the directory holds, and every size and sha256 matches. A checkpoint without a manifest is
refused unless the caller says so explicitly (`allow_unverified`; the CLIs' --allow-unverified), and
`best` / `latest` must name a checkpoint directory of the same run. Every file is read and written through the
file layer (data_prep.files; JSON with a size cap, the pointers renamed into place).
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import stat
from typing import Optional

import torch

from data_prep.dataformat import files, userfiles
from trainer.artifacts import run_files, torch_files
from trainer.artifacts.run_dir import BEST, CKPT_DIR, LATEST

HEAD = "head"
MANIFEST = "manifest.json"
TRAIN_STATE = "train_state.json"
META = "meta.json"
FORMAT_VERSION = 2
MAX_JSON_BYTES = 64 << 20  # manifest / meta / train_state: real ones are kilobytes
_STEP_DIR = re.compile(r"^step_[0-9]{1,12}$")
_PLAIN_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,200}$")  # no separator, no "..", no leading dot
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be written, found, or trusted; the message names the file."""


def layer_name(index: int) -> str:
    return f"layer_{index:02d}"


def model_file(ckpt: str, part: str) -> str:
    """`part`: 'layer_XX' or 'head'."""
    return os.path.join(ckpt, f"{part}-model_states.pt")


def optim_file(ckpt: str, part: str) -> str:
    return os.path.join(ckpt, f"{part}-optim_states.pt")


def rng_file(ckpt: str, rank: int) -> str:
    return os.path.join(ckpt, f"rng-rank_{rank:02d}.pt")


def step_name(step: int) -> str:
    return f"step_{step:08d}"


def step_of(name: str) -> int:
    return int(name[len("step_"):])


def root(run_dir: str) -> str:
    return os.path.join(run_dir, CKPT_DIR)


# ---- writing ----
def write_bytes(path: str, data: bytes) -> dict:
    """Write `data` to `path` (a regular file: never through a link, trainer.artifacts.run_files) and fsync it;
    returns its manifest entry."""
    with run_files.open_write(os.path.dirname(path), os.path.basename(path), binary=True) as f:
        f.write(data)
        files.sync(f)
    return {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}


def compact(state: dict) -> dict:
    """A state dict whose tensors own their storage: torch.save writes a view's whole storage, and the weights can be
    views of a larger buffer (ZeRO-1's flat group, a cuDNN stack's flat weights), which would put that buffer into
    every layer's file."""
    return {k: v.detach().clone() if isinstance(v, torch.Tensor) and v.untyped_storage().nbytes() > v.nbytes else v
            for k, v in state.items()}


def write_torch(path: str, obj) -> dict:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return write_bytes(path, buf.getvalue())


def write_json(path: str, obj) -> dict:
    return write_bytes(path, (json.dumps(obj, indent=1) + "\n").encode())


def begin(run_dir: str, step: int) -> str:
    """Rank 0: an empty `step_N.tmp` (a stale one from a crashed save is removed)."""
    tmp = os.path.join(root(run_dir), step_name(step) + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    with files.errors(tmp, "create the checkpoint directory"):
        os.makedirs(tmp)
    return tmp


def finalize(run_dir: str, step: int, written: dict) -> str:
    """Rank 0, after every rank wrote its files (`written`: name -> manifest entry, including
    train_state.json and meta.json): write the manifest, rename into place, update `latest`."""
    ckpts = root(run_dir)
    final = os.path.join(ckpts, step_name(step))
    tmp = final + ".tmp"
    write_json(os.path.join(tmp, MANIFEST),
               {"version": FORMAT_VERSION, "step": step, "files": dict(sorted(written.items()))})
    files.fsync_dir(tmp)
    if os.path.exists(final):  # a re-save of the same step (e.g. after a resume)
        shutil.rmtree(final)
    with files.errors(final, "rename the checkpoint into place"):
        os.replace(tmp, final)
    files.fsync_dir(ckpts)
    write_pointer(run_dir, LATEST, step_name(step))
    return final


def abandon(run_dir: str, step: int) -> None:
    """Rank 0, after a failed save: remove the partial directory (best effort; it is never complete)."""
    shutil.rmtree(os.path.join(root(run_dir), step_name(step) + ".tmp"), ignore_errors=True)


def write_pointer(run_dir: str, name: str, target: str) -> None:
    """checkpoints/latest or best: the run's own file, replaced (never written through a link)."""
    with files.replace(os.path.join(root(run_dir), name), f"the {name} pointer", own=True) as f:
        f.write(target + "\n")


def mark_best(run_dir: str, step: int) -> None:
    write_pointer(run_dir, BEST, step_name(step))


def read_pointer(run_dir: str, name: str) -> Optional[str]:
    """The checkpoint `latest` / `best` names (None if there is no pointer). A pointer that names anything
    but a checkpoint directory of this run (`step_N`, inside RUN_DIR/checkpoints) is a CheckpointError."""
    path = os.path.join(root(run_dir), name)
    if not os.path.lexists(path):
        return None
    problem = _not_a_regular_file(path, root(run_dir))
    if problem:
        raise CheckpointError(f"{path}: {problem}")
    with files.open_read(path, "a checkpoint pointer") as f:
        raw = f.read(257)
    target = raw.decode("utf-8", errors="replace").strip()
    if not target:
        return None
    if len(raw) > 256 or not _STEP_DIR.match(target) or not _inside(os.path.join(root(run_dir), target), root(run_dir)):
        raise CheckpointError(f"{path}: names {target[:80]!r}, which is not a checkpoint directory of this run "
                              f"(expected step_N in {root(run_dir)})")
    return target


def _inside(path: str, directory: str) -> bool:
    """`path`, with every link resolved, is `directory` or below it."""
    real, base = os.path.realpath(path), os.path.realpath(directory)
    return real == base or real.startswith(base.rstrip(os.sep) + os.sep)


def _not_a_regular_file(path: str, directory: str) -> Optional[str]:
    """Why `path` may not be read as a file of `directory` (None if it may): it must exist, stay inside
    `directory` after resolving links, and be a regular file (a device or FIFO would hang a reader)."""
    if not os.path.lexists(path):
        return "missing"
    if not _inside(path, directory):
        return f"a link to {os.path.realpath(path)}, outside {directory}"
    try:
        mode = os.stat(path).st_mode
    except OSError as e:
        return f"cannot be read ({e.strerror})"
    return None if stat.S_ISREG(mode) else "not a regular file"


def complete_checkpoints(run_dir: str) -> list[str]:
    """Names of the renamed (complete when written) checkpoints, oldest first. A `step_N` entry that is not
    a directory inside the run (e.g. a link to elsewhere) is not one of them."""
    ckpts = root(run_dir)
    if not os.path.isdir(ckpts):
        return []
    names = [n for n in os.listdir(ckpts) if _STEP_DIR.match(n)
             and os.path.isdir(os.path.join(ckpts, n)) and _inside(os.path.join(ckpts, n), ckpts)]
    return sorted(names, key=step_of)


def prune(run_dir: str, keep_last: int) -> None:
    """Keep the newest `keep_last` checkpoints and the best one."""
    names = complete_checkpoints(run_dir)
    keep = {read_pointer(run_dir, BEST), *names[-keep_last:]}
    for n in names:
        if n not in keep:
            shutil.rmtree(os.path.join(root(run_dir), n), ignore_errors=True)


# ---- reading and trusting ----
def read_manifest(ckpt: str) -> tuple[dict, list[str]]:
    """(name -> {"sha256", "bytes"}, problems) of `ckpt`'s manifest; the entries are only returned when
    the manifest is well-formed and names only plain files of the directory."""
    path = os.path.join(ckpt, MANIFEST)
    if not os.path.lexists(path):
        return {}, [f"{path}: missing (the checkpoint is incomplete, or from a version without checksums)"]
    try:
        data = read_json(path)
    except CheckpointError as e:
        return {}, [str(e)]
    listed = data.get("files") if isinstance(data, dict) else None
    if not isinstance(listed, dict):
        return {}, [f"{path}: malformed: expected an object whose \"files\" maps file names to sha256 and bytes"]
    problems = []
    for name, entry in listed.items():
        if not _PLAIN_NAME.match(name) or name == MANIFEST:
            problems.append(f"{path}: lists {name[:80]!r}, which is not a file name of this checkpoint directory")
        elif not (isinstance(entry, dict) and type(entry.get("bytes")) is int and entry["bytes"] >= 0
                  and isinstance(entry.get("sha256"), str) and _SHA256.match(entry["sha256"])):
            problems.append(f"{path}: malformed entry for {name!r} (expected sha256 and bytes)")
    return ({} if problems else listed), problems


def verify(ckpt: str) -> list[str]:
    """Problems that make `ckpt` untrustworthy (no or a malformed manifest; missing, truncated, altered,
    unlisted or not-regular files); [] if none."""
    listed, problems = read_manifest(ckpt)
    if problems:
        return problems
    for name in sorted(set(os.listdir(ckpt)) - set(listed) - {MANIFEST}):
        problems.append(f"{os.path.join(ckpt, name)}: not in the manifest (added after the checkpoint was saved?)")
    for name, entry in listed.items():
        file = os.path.join(ckpt, name)
        problem = _not_a_regular_file(file, ckpt)
        if problem:
            problems.append(f"{file}: {problem}")
            continue
        size = os.path.getsize(file)
        if size != entry["bytes"]:
            problems.append(f"{file}: {size} bytes, the manifest says {entry['bytes']} (truncated?)")
            continue
        h = hashlib.sha256()
        with files.open_read(file, "a checkpoint file") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        if h.hexdigest() != entry["sha256"]:
            problems.append(f"{file}: sha256 mismatch (corrupted)")
    return problems


def find_resume(run_dir: str, which: str, log=print) -> Optional[str]:
    """`train.resume`: 'auto' -> the newest checkpoint that verifies (falling back past corrupt ones,
    saying so), None if the run has none; a path -> that checkpoint, which must verify."""
    if which != "auto":
        if not os.path.isdir(which):
            raise CheckpointError(f"train.resume={which}: not a checkpoint directory")
        problems = verify(which)
        if problems:
            raise CheckpointError(f"train.resume={which}: checkpoint is not usable: {'; '.join(problems)}")
        return which
    for name in reversed(complete_checkpoints(run_dir)):
        ckpt = os.path.join(root(run_dir), name)
        problems = verify(ckpt)
        if not problems:
            return ckpt
        log(f"resume: skipping {ckpt}: {'; '.join(problems)}; falling back to the previous checkpoint")
    return None


def resolve(run_dir: str, which: str = "best") -> str:
    """'best' | 'last' | a path -> a complete checkpoint directory (best falls back to last). The pointers
    must name a checkpoint directory of this run; a path is the user's own choice."""
    if which not in ("best", "last", "latest"):
        if not os.path.isdir(which):
            raise FileNotFoundError(f"--checkpoint {which}: not a checkpoint directory")
        return which
    name = read_pointer(run_dir, BEST) if which == "best" else None
    name = name or read_pointer(run_dir, LATEST)
    if name is None:
        raise FileNotFoundError(f"{root(run_dir)}: no complete checkpoint (was the run trained?)")
    path = os.path.join(root(run_dir), name)
    if not os.path.isdir(path):
        raise CheckpointError(f"{root(run_dir)}: the pointer names {name}, which does not exist (pruned or moved?)")
    return path


def is_unfinished_save(run_dir: str, ckpt: str) -> bool:
    """`ckpt` is this run's own save in progress (checkpoints/step_N.tmp): its manifest is written only
    after the trainer's dev decode has read the weights, so it cannot be verified yet."""
    ckpt = ckpt.rstrip(os.sep) or ckpt
    name = os.path.basename(ckpt)  # its directory by identity, as the kernel resolves it (`lnk/..` is not undone)
    return (name.endswith(".tmp") and bool(_STEP_DIR.match(name[:-4]))
            and files.same_file(os.path.dirname(ckpt) or ".", root(run_dir)))


def check_trusted(ckpt: str, *, allow_unverified: bool = False) -> None:
    """Raise CheckpointError unless `ckpt` verifies. With `allow_unverified` (the user said so), a missing or
    malformed manifest is accepted, but every file read must still be a regular file of `ckpt`."""
    if not allow_unverified:
        problems = verify(ckpt)
        if problems:
            hint = (" (to load it anyway, without checksums, pass --allow-unverified)"
                    if any(p.startswith(os.path.join(ckpt, MANIFEST)) for p in problems) else "")
            raise CheckpointError(f"{ckpt}: {'; '.join(problems)}{hint}")


def load(path: str):
    problem = _not_a_regular_file(path, os.path.dirname(path) or ".")
    if problem == "missing":
        raise FileNotFoundError(f"{path}: missing")
    if problem:
        raise CheckpointError(f"{path}: {problem}")
    try:
        with files.open_read(path, "a checkpoint file") as f:
            return torch_files.load_weights(f)
    except files.FileError as e:
        raise CheckpointError(str(e)) from None
    except torch_files.UnreadableTorchFile as e:  # truncated zip, bad pickle, code it would run, ...
        raise CheckpointError(f"{path}: cannot be read ({e})") from None


def read_json(path: str, max_bytes: int = MAX_JSON_BYTES):
    """A JSON file of a checkpoint or run, refused (CheckpointError naming it) when it is not a regular file,
    larger than `max_bytes`, or not JSON."""
    problem = _not_a_regular_file(path, os.path.dirname(path) or ".")
    if problem:
        raise CheckpointError(f"{path}: {problem}")
    try:  # the project's one strict reader: every key once, bounded depth, UTF-8, capped
        return userfiles.read_json(path, max_bytes, "a JSON file of a checkpoint or run")
    except (userfiles.UserFileError, files.FileError) as e:
        raise CheckpointError(str(e)) from None
