"""Checkpoints keyed by global layer index, so a run trained in one layout loads into any other.

RUN_DIR/checkpoints/step_00000500/
    layer_00-model_states.pt   Embeddings          (written by the stage that holds the layer,
    layer_01-model_states.pt   pair layer 0         replica 0 only; DeepSpeed's PipelineModule
    ...                                             file naming)
    head-model_states.pt       AttentionSoftmaxHead
    meta.json                  step, dev metrics, the data manifest checksum; written last
RUN_DIR/checkpoints/latest     name of the newest complete checkpoint
RUN_DIR/checkpoints/best       name of the checkpoint with the best dev BLEU

A checkpoint is written into `step_N.tmp` and renamed once every rank has finished, so a directory
without the `.tmp` suffix is always complete.
"""
from __future__ import annotations

import json
import os
import shutil

import torch

CKPT_DIR = "checkpoints"
HEAD_FILE = "head-model_states.pt"


def layer_file(ckpt: str, index: int) -> str:
    return os.path.join(ckpt, f"layer_{index:02d}-model_states.pt")


def step_name(step: int) -> str:
    return f"step_{step:08d}"


def save_rank_weights(tmp_dir: str, module, layout) -> None:
    """This rank's share: its layers (replica 0 of each stage) and the head (last stage, replica 0)."""
    if layout.replica != 0:
        return
    os.makedirs(tmp_dir, exist_ok=True)
    for offset, layer in enumerate(module.layers):
        torch.save(layer.state_dict(), layer_file(tmp_dir, module.first_layer + offset))
    if layout.is_last:
        torch.save(module.head.state_dict(), os.path.join(tmp_dir, HEAD_FILE))


def finalize(run_dir: str, step: int, meta: dict) -> str:
    """Rank 0, after every rank saved: write meta.json, rename into place, update `latest`."""
    root = os.path.join(run_dir, CKPT_DIR)
    final = os.path.join(root, step_name(step))
    tmp = final + ".tmp"
    with open(os.path.join(tmp, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1)
    if os.path.exists(final):
        shutil.rmtree(final)
    os.replace(tmp, final)
    _write_pointer(root, "latest", step_name(step))
    return final


def _write_pointer(root: str, name: str, target: str) -> None:
    tmp = os.path.join(root, name + ".tmp")
    with open(tmp, "w") as f:
        f.write(target + "\n")
    os.replace(tmp, os.path.join(root, name))


def mark_best(run_dir: str, step: int) -> None:
    _write_pointer(os.path.join(run_dir, CKPT_DIR), "best", step_name(step))


def prune(run_dir: str, keep_last: int) -> None:
    """Keep the newest `keep_last` checkpoints and the best one."""
    root = os.path.join(run_dir, CKPT_DIR)
    keep = {_read_pointer(root, "best")}
    names = sorted(n for n in os.listdir(root) if n.startswith("step_") and not n.endswith(".tmp"))
    keep.update(names[-keep_last:])
    for n in names:
        if n not in keep:
            shutil.rmtree(os.path.join(root, n), ignore_errors=True)


def _read_pointer(root: str, name: str) -> str | None:
    path = os.path.join(root, name)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return f.read().strip()


def resolve(run_dir: str, which: str = "best") -> str:
    """'best' | 'last' | a path -> a complete checkpoint directory (best falls back to last)."""
    if which not in ("best", "last", "latest"):
        if not os.path.isdir(which):
            raise FileNotFoundError(f"--checkpoint {which}: not a checkpoint directory")
        return which
    root = os.path.join(run_dir, CKPT_DIR)
    name = _read_pointer(root, "best") if which == "best" else None
    name = name or _read_pointer(root, "latest")
    if name is None:
        raise FileNotFoundError(f"{root}: no complete checkpoint (was the run trained?)")
    return os.path.join(root, name)


def load_model_weights(model, ckpt: str) -> dict:
    """Fill a whole-model `Seq2Seq` from a checkpoint directory; returns its meta.json."""
    for index, layer in enumerate(model.layers()):
        path = layer_file(ckpt, index)
        if not os.path.exists(path):
            raise FileNotFoundError(f"{path}: missing layer {index} (checkpoint incomplete or model.layers differs)")
        layer.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
    model.head.load_state_dict(torch.load(os.path.join(ckpt, HEAD_FILE), map_location="cpu", weights_only=True))
    with open(os.path.join(ckpt, "meta.json")) as f:
        return json.load(f)
