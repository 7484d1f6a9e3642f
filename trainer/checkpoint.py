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
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
from typing import Optional

import torch

CKPT_DIR = "checkpoints"
HEAD = "head"
MANIFEST = "manifest.json"
TRAIN_STATE = "train_state.json"
META = "meta.json"
FORMAT_VERSION = 2


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
def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_bytes(path: str, data: bytes) -> dict:
    """Write `data` to `path` and fsync it; returns its manifest entry."""
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}


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
    os.makedirs(tmp)
    return tmp


def finalize(run_dir: str, step: int, files: dict) -> str:
    """Rank 0, after every rank wrote its files (`files`: name -> manifest entry, including
    train_state.json and meta.json): write the manifest, rename into place, update `latest`."""
    ckpts = root(run_dir)
    final = os.path.join(ckpts, step_name(step))
    tmp = final + ".tmp"
    write_json(os.path.join(tmp, MANIFEST), {"version": FORMAT_VERSION, "step": step, "files": dict(sorted(files.items()))})
    _fsync_dir(tmp)
    if os.path.exists(final):  # a re-save of the same step (e.g. after a resume)
        shutil.rmtree(final)
    os.replace(tmp, final)
    _fsync_dir(ckpts)
    write_pointer(run_dir, "latest", step_name(step))
    return final


def abandon(run_dir: str, step: int) -> None:
    """Rank 0, after a failed save: remove the partial directory (best effort; it is never complete)."""
    shutil.rmtree(os.path.join(root(run_dir), step_name(step) + ".tmp"), ignore_errors=True)


def write_pointer(run_dir: str, name: str, target: str) -> None:
    ckpts = root(run_dir)
    tmp = os.path.join(ckpts, name + ".tmp")
    with open(tmp, "w") as f:
        f.write(target + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(ckpts, name))


def mark_best(run_dir: str, step: int) -> None:
    write_pointer(run_dir, "best", step_name(step))


def read_pointer(run_dir: str, name: str) -> Optional[str]:
    path = os.path.join(root(run_dir), name)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return f.read().strip() or None


def complete_checkpoints(run_dir: str) -> list[str]:
    """Names of the renamed (complete when written) checkpoints, oldest first."""
    ckpts = root(run_dir)
    if not os.path.isdir(ckpts):
        return []
    names = [n for n in os.listdir(ckpts) if n.startswith("step_") and not n.endswith(".tmp")
             and os.path.isdir(os.path.join(ckpts, n))]
    return sorted(names, key=step_of)


def prune(run_dir: str, keep_last: int) -> None:
    """Keep the newest `keep_last` checkpoints and the best one."""
    names = complete_checkpoints(run_dir)
    keep = {read_pointer(run_dir, "best"), *names[-keep_last:]}
    for n in names:
        if n not in keep:
            shutil.rmtree(os.path.join(root(run_dir), n), ignore_errors=True)


# ---- reading and trusting ----
def verify(ckpt: str) -> list[str]:
    """Problems that make `ckpt` untrustworthy (missing, truncated or altered files); [] if none."""
    path = os.path.join(ckpt, MANIFEST)
    if not os.path.exists(path):
        return [f"{path}: missing (the checkpoint is incomplete, or from a version without checksums)"]
    try:
        with open(path) as f:
            files = json.load(f)["files"]
    except (ValueError, KeyError) as e:
        return [f"{path}: unreadable ({e})"]
    problems = []
    for name, entry in files.items():
        file = os.path.join(ckpt, name)
        if not os.path.exists(file):
            problems.append(f"{file}: missing")
            continue
        size = os.path.getsize(file)
        if size != entry["bytes"]:
            problems.append(f"{file}: {size} bytes, the manifest says {entry['bytes']} (truncated?)")
            continue
        h = hashlib.sha256()
        with open(file, "rb") as f:
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
    """'best' | 'last' | a path -> a complete checkpoint directory (best falls back to last)."""
    if which not in ("best", "last", "latest"):
        if not os.path.isdir(which):
            raise FileNotFoundError(f"--checkpoint {which}: not a checkpoint directory")
        return which
    name = read_pointer(run_dir, "best") if which == "best" else None
    name = name or read_pointer(run_dir, "latest")
    if name is None:
        raise FileNotFoundError(f"{root(run_dir)}: no complete checkpoint (was the run trained?)")
    return os.path.join(root(run_dir), name)


def load(path: str):
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise
    except Exception as e:  # truncated zip, bad pickle, ...
        raise CheckpointError(f"{path}: cannot be read ({type(e).__name__}: {e})") from None


def read_json(path: str) -> dict:
    with open(path) as f:
        return json.load(f)


def load_model_weights(model, ckpt: str) -> dict:
    """Fill a whole-model `Seq2Seq` from a checkpoint directory (verified when it has a manifest);
    returns its meta.json (empty while the checkpoint is still being written)."""
    if os.path.exists(os.path.join(ckpt, MANIFEST)):
        problems = verify(ckpt)
        if problems:
            raise CheckpointError(f"{ckpt}: {'; '.join(problems)}")
    for index, layer in enumerate(model.layers()):
        path = model_file(ckpt, layer_name(index))
        if not os.path.exists(path):
            raise FileNotFoundError(f"{path}: missing layer {index} (checkpoint incomplete or model.layers differs)")
        layer.load_state_dict(load(path))
    model.head.load_state_dict(load(model_file(ckpt, HEAD)))
    meta = os.path.join(ckpt, META)
    return read_json(meta) if os.path.exists(meta) else {}
