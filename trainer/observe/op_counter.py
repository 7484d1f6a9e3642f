"""Count, on any device, the operator launches of a piece of code and the operations in it that would
force the host to wait for an accelerator (a device sync).

On a GPU the host queues kernels and runs ahead; anything that needs a value computed on the device
back on the host (`.item()`, `int(t)`, `bool(t)`, `nonzero`, boolean-mask indexing, a copy to the
host) stops the queue until the device catches up, and the step then costs host time plus device
time instead of the larger of the two. These operations are the same on the CPU, so counting them
there, in tests, keeps them out of the hot loop before any GPU is lent:

    with OpCounter() as c:
        trainer.train_step()
    c.syncs      # [(op name, where in our code)]: each would be a device sync on a GPU
    c.launches   # operators that run a kernel (views, allocations and detach excluded)

A `TorchDispatchMode` sees every aten operator, the autograd engine's backward ones included, plus
what the Python methods `.cpu()`, `.tolist()` and `.numpy()` do (patched for the duration: on a CPU
tensor they dispatch nothing). Host-side values (lengths, token counts) must therefore live in numpy
or Python numbers, not in tensors, for the count to mean "device": the trainer keeps them so
(`trainer.data.Batch` carries them from the batcher).
"""
from __future__ import annotations

import traceback
import weakref
from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten

# operators that read a device value on the host, whatever their arguments
SYNC_OPS = {aten._local_scalar_dense, aten.nonzero, aten.masked_select, aten.nonzero_static, aten.unique_consecutive,
            aten._unique2, aten.unique_dim, aten.repeat_interleave}
# operators that queue no kernel: allocation, aliasing, metadata
NO_KERNEL = {aten.detach, aten.empty, aten.empty_strided, aten.empty_like, aten.lift_fresh, aten.alias,
             aten.is_same_size, aten.resize_, aten.set_, aten.sym_size, aten.sym_stride, aten.sym_numel}


_HOST: dict[int, weakref.ref] = {}  # id -> the marked tensor (tensors compare elementwise: no set)


def host(t: torch.Tensor) -> torch.Tensor:
    """Mark `t` as a host tensor on every device (a CPU collective's buffer, say): reading it is no
    device sync, and the counter does not count it. Returns `t`."""
    key = id(t)
    _HOST[key] = weakref.ref(t, lambda _: _HOST.pop(key, None))
    return t


def _is_host(t) -> bool:
    ref = _HOST.get(id(t))
    return ref is not None and ref() is t


def _on_host(args) -> bool:
    return bool(args) and _is_host(args[0])


def _bool_index(func, args) -> bool:
    """aten.index / index_put with a boolean mask among the indices (its nonzero runs on the host)."""
    if func.overloadpacket not in (aten.index, aten.index_put, aten.index_put_, aten._index_put_impl_):
        return False
    indices = args[1] if len(args) > 1 else ()
    return any(isinstance(t, torch.Tensor) and t.dtype == torch.bool for t in indices or ())


def _where() -> str:
    """The innermost frame of our own code (trainer/, data_prep/) that led here."""
    for frame in reversed(traceback.extract_stack()[:-3]):
        f = frame.filename
        if ("/trainer/" in f or "/data_prep/" in f) and not f.endswith("op_counter.py"):
            return f"{f.split('/trainer/')[-1] if '/trainer/' in f else f.split('/data_prep/')[-1]}:{frame.lineno} " \
                   f"{frame.name}"
    return "(outside the project)"


class OpCounter(TorchDispatchMode):
    """Counts launches and would-be device syncs while active (see the module docstring).

    `syncs`: one (op, where) per sync; `launches`: kernel-running operators; `by_op`: launches by
    operator name. `where=False` skips the stack walk (cheaper, for counting launches in benchmarks)."""

    def __init__(self, where: bool = True):
        super().__init__()
        self.where = where
        self.syncs: list[tuple[str, str]] = []
        self.launches = 0
        self.by_op: Counter = Counter()
        self._patched: dict = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        packet = func.overloadpacket
        if (packet in SYNC_OPS or _bool_index(func, args)) and not _on_host(args):
            self._sync(packet.__name__)
        if packet not in NO_KERNEL and not func.is_view:
            self.launches += 1
            self.by_op[packet.__name__] += 1
        return func(*args, **kwargs)

    def _sync(self, name: str) -> None:
        self.syncs.append((name, _where() if self.where else ""))

    # .cpu() / .tolist() / .numpy() dispatch nothing on a CPU tensor: count them at the Python level
    def __enter__(self):
        counter = self
        for name in ("cpu", "tolist", "numpy"):
            original = getattr(torch.Tensor, name)
            self._patched[name] = original

            def patched(t, *a, _name=name, _original=original, **kw):
                if not _is_host(t) and not torch._C._dispatch_tls_is_dispatch_key_excluded(
                        torch._C.DispatchKey.Python):
                    counter._sync(f"Tensor.{_name}")
                return _original(t, *a, **kw)

            setattr(torch.Tensor, name, patched)
        return super().__enter__()

    def __exit__(self, *exc):
        for name, original in self._patched.items():
            setattr(torch.Tensor, name, original)
        self._patched.clear()
        return super().__exit__(*exc)

    def sync_sites(self) -> Counter:
        """How many syncs each (op, place) made."""
        return Counter(self.syncs)
