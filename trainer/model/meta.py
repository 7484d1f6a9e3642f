"""A model built for its shapes only: on the meta device (nothing allocated), its random initialization skipped."""
from __future__ import annotations

import contextlib

import torch
from torch.overrides import TorchFunctionMode

# The initializers that fill a tensor at random (torch.nn.init's reaches the mode as itself, not as the tensor's).
# On the meta device there is nothing to fill, and `normal_`'s meta kernel is torch._refs' Python decomposition,
# whose wrapper imports torch._dynamo at its first call (1.1 s of a process's start, AMD EPYC; `uniform_` and the
# rest have kernels of their own).
_FILLS = frozenset({torch.Tensor.normal_, torch.nn.init.normal_})


class _SkipFills(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        filled = args[0] if args else kwargs.get("tensor")  # torch.nn.init passes it by name
        if func in _FILLS and isinstance(filled, torch.Tensor) and filled.is_meta:
            return filled
        return func(*args, **kwargs)


@contextlib.contextmanager
def shapes_only():
    """Modules built inside have their parameters' shapes and dtypes and no values (the meta device)."""
    with torch.device("meta"), _SkipFills():
        yield
