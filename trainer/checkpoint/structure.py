"""What a checkpoint's files must hold, checked before anything is copied out of them.

Checksums prove that the files are the ones the manifest lists, not that they fit: a tool that rewrites a file
and its manifest entry (or a careless hand) gives files that verify and hold the wrong thing, and a checkpoint of
another model verifies too. So every checkpoint a command loads is checked for structure first, by every entry
point (resume, and translate, evaluate, score, export, average through trainer.inference.loading, which also
checks an exported model's weights here): its layer files against the model (each layer's there, none beyond:
`layer_files`), every tensor's shape and dtype against the model and optimizer it is loaded into, every key
present with the right type (train_state.json, optimizer state, RNG states). A problem is one CheckpointError
naming the file and the tensor or key; nothing has been copied by then.
"""
from __future__ import annotations

import dataclasses
import os
import re

import torch

from trainer.checkpoint.files import HEAD, CheckpointError, layer_name, model_file
from trainer.checkpoint.optimizer import MASTER
from trainer.checkpoint.state import TrainState

_TYPES = {"int": (int,), "float": (int, float), "str": (str,), "dict": (dict,)}  # TrainState's annotations
ADDED_LATER = {"lr_schedule_steps"}  # TrainState fields a checkpoint written before them lacks: their defaults apply
_TYPE_NAMES = {"int": "an integer", "float": "a number", "str": "a string", "dict": "an object"}


def _is(value, kind: str) -> bool:
    return isinstance(value, _TYPES[kind]) and not isinstance(value, bool)


def train_state(data, path: str) -> TrainState:
    """train_state.json's content as a TrainState: every field present, of its type."""
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a JSON object of the training state, found {type(data).__name__}")
    fields = [f for f in dataclasses.fields(TrainState) if f.name in data or f.name not in ADDED_LATER]
    for f in fields:
        if f.name not in data:
            raise CheckpointError(f"{path}: no {f.name!r} (written by another program, or damaged)")
        if not _is(data[f.name], f.type):
            raise CheckpointError(f"{path}: {f.name!r} is {data[f.name]!r:.60}, expected {_TYPE_NAMES[f.type]}")
    if data["step"] < 0:
        raise CheckpointError(f"{path}: 'step' is {data['step']}, expected >= 0")
    for key in ("epoch", "index"):
        if not _is(data["stream"].get(key), "int"):
            raise CheckpointError(f"{path}: stream.{key} is {data['stream'].get(key)!r:.60}, expected an integer")
    for key, value in data["engine"].items():
        if not _is(value, "int"):
            raise CheckpointError(f"{path}: engine.{key} is {value!r:.60}, expected an integer")
    if not isinstance(data["config"].get("model", {}), dict):
        raise CheckpointError(f"{path}: config.model is not an object")
    _optimizer_summary(data["optimizer"], path)
    return TrainState(**{f.name: data[f.name] for f in fields})


def _optimizer_summary(summary: dict, path: str) -> None:
    keys = summary.get("state_keys", [])
    if not (isinstance(keys, list) and all(isinstance(k, str) and k != MASTER for k in keys)):
        raise CheckpointError(f"{path}: optimizer.state_keys is {keys!r:.60}, expected a list of names")
    if keys and not _is(summary.get("step"), "float"):
        raise CheckpointError(f"{path}: optimizer.step is {summary.get('step')!r:.60}, expected a number")
    for key in ("param_group", "loss_scaler"):
        if not isinstance(summary.get(key, {}), dict):
            raise CheckpointError(f"{path}: optimizer.{key} is not an object")
    for key, value in summary.get("loss_scaler", {}).items():
        if not _is(value, "float"):
            raise CheckpointError(f"{path}: optimizer.loss_scaler.{key} is {value!r:.60}, expected a number")


def lr_scheduler(saved: dict, current: dict, path: str) -> None:
    """The saved LR scheduler state against this run's scheduler (`current`: its state now): each of its keys
    there, of the same kind of value."""
    for key, value in current.items():
        if key not in saved:
            raise CheckpointError(f"{path}: lr_scheduler has no {key!r} (another scheduler.type than the "
                                  f"checkpoint's?)")
        kinds = [k for k in _TYPES if _is(value, k)]
        if kinds and not _is(saved[key], kinds[0]):
            raise CheckpointError(f"{path}: lr_scheduler.{key} is {saved[key]!r:.60}, expected "
                                  f"{_TYPE_NAMES[kinds[0]]}")


def _tensor(value, path: str, name: str) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise CheckpointError(f"{path}: {name} is a {type(value).__name__}, expected a tensor")
    return value


_LAYER_FILE = re.compile(r"^layer_([0-9]+)-")


def layer_files(ckpt: str, pair_layers: int, needs: str = "this run's model") -> None:
    """The layer files of `ckpt` against the model it is loaded into (`pair_layers`: its model.layers; layer_00 is
    the embeddings, layer_01 .. the pair layers, then the head): each one's weights there, and no file of a layer
    beyond them. Each layer is read by its own name, so a checkpoint of a deeper model loaded into this one would
    lose its top layers without a word. `needs`: the model, in the error."""
    names = sorted(os.listdir(ckpt))
    beyond = [n for n in names if (m := _LAYER_FILE.match(n)) and int(m.group(1)) > pair_layers]
    if beyond:
        raise CheckpointError(f"{os.path.join(ckpt, beyond[0])}: a layer {needs} does not have (it has model.layers="
                              f"{pair_layers}: layer_00 .. {layer_name(pair_layers)} and the head): the checkpoint "
                              f"is of a deeper model")
    for part in [*(layer_name(i) for i in range(pair_layers + 1)), HEAD]:
        if not os.path.lexists(model_file(ckpt, part)):
            raise CheckpointError(f"{model_file(ckpt, part)}: missing ({needs} has model.layers={pair_layers}: the "
                                  f"checkpoint is incomplete, or of a shallower model)")


def weights(state, module, path: str, needs: str = "this run's model") -> None:
    """A weights file against the module it is loaded into (a meta-device one will do: only names, shapes and
    dtypes are read): the same names, each a tensor of the module's shape and a floating-point dtype (bf16 and
    fp32 load into each other: a run may change its precision). `needs`: the model, in the error."""
    if not isinstance(state, dict):
        raise CheckpointError(f"{path}: the weights are a {type(state).__name__}, not a state dict")
    want = module.state_dict()
    for name, tensor in want.items():
        if name not in state:
            raise CheckpointError(f"{path}: no {name}, which {needs} has (model.* differs from the checkpoint's?)")
        got = _tensor(state[name], path, name)
        if tuple(got.shape) != tuple(tensor.shape):
            raise CheckpointError(f"{path}: {name} has shape {tuple(got.shape)}, {needs} needs "
                                  f"{tuple(tensor.shape)} (another vocabulary or model.* size)")
        if got.is_floating_point() != tensor.is_floating_point():
            raise CheckpointError(f"{path}: {name} has dtype {got.dtype}, {needs} needs {tensor.dtype}")
    extra = sorted(set(state) - set(want))
    if extra:
        raise CheckpointError(f"{path}: holds {extra[0]}, which {needs} does not have (model.* differs)")


def optimizer(parts: dict, paths: dict, expected: dict, summary: dict) -> None:
    """Optimizer files ({part: content}, read from `paths`) against what this rank's optimizer needs
    (`expected`: {part: {param name: shape}}): every parameter's master and state keys, each a float32 tensor of
    the parameter's shape."""
    keys = [MASTER, *summary.get("state_keys", [])]
    for part, shapes in expected.items():
        path, content = paths[part], parts[part]
        if not isinstance(content, dict):
            raise CheckpointError(f"{path}: expected {{parameter name: optimizer state}}, found "
                                  f"{type(content).__name__}")
        for name, shape in shapes.items():
            entry = content.get(name)
            if entry is None:
                raise CheckpointError(f"{path}: no optimizer state for {part}.{name} (model.* differs from the "
                                      f"checkpoint's?)")
            if not isinstance(entry, dict):
                raise CheckpointError(f"{path}: {name} is a {type(entry).__name__}, expected {{state key: tensor}}")
            for key in keys:
                if key not in entry:
                    raise CheckpointError(f"{path}: {name} has no {key!r} (the optimizer state lists {keys})")
                got = _tensor(entry[key], path, f"{name}.{key}")
                if tuple(got.shape) != tuple(shape):
                    raise CheckpointError(f"{path}: {name}.{key} has shape {tuple(got.shape)}, the parameter has "
                                          f"{tuple(shape)}")
                if got.dtype != torch.float32:
                    raise CheckpointError(f"{path}: {name}.{key} has dtype {got.dtype}, expected torch.float32")


def rng(state, path: str) -> None:
    """An RNG file as `capture_rng` writes it: python's state, numpy's (keys, pos, has_gauss, gauss), torch's
    (and CUDA's) byte tensors."""
    if not isinstance(state, dict):
        raise CheckpointError(f"{path}: expected {{generator: state}}, found {type(state).__name__}")
    for key in ("python", "numpy", "torch"):
        if key not in state:
            raise CheckpointError(f"{path}: no {key!r} RNG state")
    py = state["python"]
    if not (isinstance(py, (tuple, list)) and len(py) == 3 and isinstance(py[1], (tuple, list))
            and all(isinstance(x, int) for x in py[1])):
        raise CheckpointError(f"{path}: python: not a state of python's random module")
    n = state["numpy"]
    if not isinstance(n, dict):
        raise CheckpointError(f"{path}: numpy: expected {{keys, pos, has_gauss, gauss}}")
    keys = _tensor(n.get("keys"), path, "numpy.keys")
    if keys.dtype != torch.int64 or tuple(keys.shape) != (624,):
        raise CheckpointError(f"{path}: numpy.keys has dtype {keys.dtype} and shape {tuple(keys.shape)}, expected "
                              f"torch.int64 (624,)")
    for key, kind in (("pos", "int"), ("has_gauss", "int"), ("gauss", "float")):
        if not _is(n.get(key), kind):
            raise CheckpointError(f"{path}: numpy.{key} is {n.get(key)!r:.60}, expected {_TYPE_NAMES[kind]}")
    for key in ("torch", "cuda"):
        if key in state and (_tensor(state[key], path, key).dtype != torch.uint8 or state[key].dim() != 1):
            raise CheckpointError(f"{path}: {key} has dtype {state[key].dtype}, expected a 1-D torch.uint8 tensor")
