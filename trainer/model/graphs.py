"""Graphs of a step's fixed-shape work, replayed per shape (train.cuda_graphs).

A CUDA graph replays a captured forward's or backward's kernels with one launch, where eager code pays the host's
cost of every kernel (on the H200, 0.6-0.8 ms per cuDNN LSTM call: docs/gpu.md). A graph reads and writes fixed
addresses, so every captured call here has *static* inputs (copied in before a replay), static outputs (what a
replay writes) and static gradients (what the backward's replay writes, copied out to the caller).

`GraphCache.call(name, fn, inputs, ...)` runs `fn(*inputs)` (a flat tuple of tensors in and out, no generator made,
no host read) as an autograd function whose forward and backward are replays of graphs captured for the inputs'
shapes, dtypes and `bucket`:

* **slots**: a replay's outputs are the slot's static buffers, and its backward reads the slot's saved activations,
  so a slot is busy from its forward to its backward; a second call of the same shape in flight (several pipeline
  units, time chunks of one width) takes another slot (another capture). `end_step()` frees every slot.
* **gradients** are copied out of the static buffers (the next replay overwrites them); parameters get theirs
  through autograd, as eager ones do (DeepSpeed's hooks see nothing else).
* **recapture** when a parameter's storage changed (a checkpoint loaded, a reshard): a graph reads the old one.
* **a cap** (`cap` slots in all, 256 by default): beyond it calls run eagerly, said once.
* **proof** (`prove`, train.cuda_graphs=auto): the first call of each shape runs eagerly and replayed, with the
  same inputs and output gradients, and their outputs and every gradient are compared (TOLERANCE by dtype); a
  mismatch turns the cache off for good (eager from then on), said once.
* **backend**: `CudaBackend` (torch.cuda.CUDAGraph), or `RecordingBackend`, a CPU stand-in that "captures" by
  keeping the function and "replays" by calling it on the static inputs and copying the results into the static
  outputs, so everything but the kernels' replay (slots, copies, keys, caps, proof, recapture) runs on a CPU.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

GRAPH_CAP = 256
TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 3e-2, torch.float16: 1e-2}  # max |a - b| / max |b|, by dtype
CUDA_WARMUP = 3  # eager iterations on a side stream before a capture (torch.cuda.make_graphed_callables does 3)


class RecordingBackend:
    """The CPU stand-in: capture runs the thunk once and keeps it; a replay runs it again and copies its results
    into the first run's tensors (the static outputs)."""

    name = "cpu stand-in"

    def pool(self):
        return None

    def warm(self, run: Callable[[], None]) -> None:
        pass

    def capture(self, thunk: Callable[[], tuple], pool) -> tuple[Callable[[], None], tuple]:
        static = thunk()

        def replay() -> None:
            with torch.no_grad():
                for s, f in zip(static, thunk()):
                    if s is not None and f is not None:
                        s.detach().copy_(f.detach())
        return replay, static

    def reserved_bytes(self) -> int:
        return 0


class CudaBackend:
    """torch.cuda graphs: each slot's forward and backward captured into one private memory pool, after a few eager
    iterations on a side stream (cuDNN and cuBLAS choose their kernels and workspaces there, not in the graph)."""

    name = "cuda"

    def pool(self):
        return torch.cuda.graph_pool_handle()

    def warm(self, run: Callable[[], None]) -> None:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(CUDA_WARMUP):
                run()
        torch.cuda.current_stream().wait_stream(side)

    def capture(self, thunk: Callable[[], tuple], pool) -> tuple[Callable[[], None], tuple]:
        graph = torch.cuda.CUDAGraph()
        # thread_local: the batch prefetcher's thread may copy to the device meanwhile
        with torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
            static = thunk()
        return graph.replay, static

    def reserved_bytes(self) -> int:
        return torch.cuda.memory_reserved()


def default_backend():
    """CudaBackend where CUDA is, else the CPU stand-in (which only tests force: train.cuda_graphs needs CUDA)."""
    return CudaBackend() if torch.cuda.is_available() else RecordingBackend()


@dataclass
class GraphStats:
    captured: int = 0  # slots captured over the run (each a forward graph and a backward graph)
    held: int = 0  # slots held now (what the cap counts; dropped ones and a fallback's are let go)
    held_bytes: int = 0  # device memory reserved while capturing the held slots (0 on the CPU stand-in)
    replays: int = 0  # calls replayed
    eager: int = 0  # calls run eagerly because of the cap or a fallback
    fallbacks: int = 0  # proofs that failed (the cache is off after the first)
    proved: int = 0  # shapes proved equal to eager
    recaptures: int = 0  # shapes dropped because a parameter's storage changed


class _Slot:
    """One capture of a call: static inputs, outputs and gradients, and the replays of its forward and backward."""

    def __init__(self, backend, fn: Callable, inputs: tuple, differentiable: tuple, params: list):
        self.fn, self.params = fn, params
        self.differentiable = differentiable
        self.inputs = tuple(x.detach().clone().requires_grad_(d) for x, d in zip(inputs, differentiable))
        self.busy = False
        self.bytes = 0  # device memory reserved while capturing it (GraphCache sets it)
        self.live: tuple = ()  # the outputs the backward differentiates: the capture's (CUDA), the last replay's (CPU)
        self.grad_outputs: tuple = ()  # the static output gradients (none yet: zeros at the warm-up)
        pool = backend.pool()
        backend.warm(lambda: self._backward_thunk(self._forward_thunk()))
        self.forward, outs = backend.capture(self._forward_thunk, pool)
        self.out_diff = tuple(o.requires_grad for o in outs)
        self.outputs = tuple(o.detach() for o in outs)
        self.grad_outputs = tuple(torch.zeros_like(o) if d else None for o, d in zip(self.outputs, self.out_diff))
        self.backward, self.grads = backend.capture(lambda: self._backward_thunk(self.live), pool)

    def _forward_thunk(self) -> tuple:
        with torch.enable_grad():
            self.live = tuple(self.fn(*self.inputs))
        return self.live

    def _backward_thunk(self, outs: tuple) -> tuple:
        """Gradients of the differentiable inputs and of the parameters (None where unused), given
        `grad_outputs`."""
        given = self.grad_outputs or (None,) * len(outs)
        pairs = [(o, g if g is not None else torch.zeros_like(o)) for o, g in zip(outs, given) if o.requires_grad]
        wrt = [x for x in self.inputs if x.requires_grad] + list(self.params)
        if not pairs:
            return (None,) * len(wrt)
        return torch.autograd.grad([o for o, _ in pairs], wrt, [g for _, g in pairs], allow_unused=True)

    def run_forward(self, inputs: tuple) -> tuple:
        with torch.no_grad():
            for s, x in zip(self.inputs, inputs):
                s.copy_(x)
        self.forward()
        return tuple(o.detach() for o in self.outputs)

    def run_backward(self, grads: tuple) -> tuple:
        """Gradients copied out: of every input (None where not differentiable) and of every parameter."""
        with torch.no_grad():
            for s, g in zip(self.grad_outputs, grads):
                if s is None:
                    continue
                if g is None:  # (autograd materialises them; a direct caller may not)
                    s.zero_()
                else:
                    s.copy_(g)
        self.backward()
        out = [g.clone() if g is not None else None for g in self.grads]
        n = sum(self.differentiable)
        it = iter(out[:n])
        return tuple(next(it) if d else None for d in self.differentiable) + tuple(out[n:])


class _Replay(torch.autograd.Function):
    """A slot's forward and backward as one autograd node: inputs, then the parameters."""

    @staticmethod
    def forward(ctx, slot: _Slot, count: int, *tensors):
        ctx.slot = slot
        slot.busy = True
        outs = slot.run_forward(tensors[:count])
        ctx.mark_non_differentiable(*[o for o, d in zip(outs, slot.out_diff) if not d])
        return outs

    @staticmethod
    def backward(ctx, *grads):
        slot = ctx.slot
        result = slot.run_backward(grads)
        slot.busy = False
        return (None, None, *result)


@dataclass
class _Entry:
    storage: tuple  # the parameters' (data_ptr, shape, dtype) when captured
    slots: list = field(default_factory=list)


def _storage(params: list) -> tuple:
    return tuple((p.data_ptr(), tuple(p.shape), p.dtype) for p in params)


def _key(name: str, inputs: tuple, differentiable: tuple, bucket) -> tuple:
    return (name, bucket, tuple((tuple(x.shape), x.dtype, str(x.device), d) for x, d in zip(inputs, differentiable)))


def rel_diff(got: torch.Tensor | None, ref: torch.Tensor | None) -> float:
    """max |got - ref| / max |ref| (the reference's largest element; absolute where it is all zeros), in fp32 (None:
    no gradient, the same as zeros)."""
    if got is None and ref is None:
        return 0.0
    if got is None or ref is None:
        present = (got if ref is None else ref).detach()
        return float(present.float().abs().max()) if present.numel() else 0.0
    got, ref = got.detach().float(), ref.detach().float()
    if got.shape != ref.shape:
        return float("inf")
    if not ref.numel():
        return 0.0
    return float((got - ref).abs().max()) / (float(ref.abs().max()) or 1.0)


class GraphCache:
    """Captured calls by shape, for one rank. `prove`: check each new shape against eager first (auto); `cap`:
    slots in all; `say`: where the one line of a fallback or of the cap goes."""

    def __init__(self, backend=None, *, prove: bool = False, cap: int = GRAPH_CAP, say: Callable[[str], None] = print):
        self.backend = backend or default_backend()
        self.prove, self.cap, self.say = prove, cap, say
        self.entries: dict[tuple, _Entry] = {}
        self.stats = GraphStats()
        self.off: str | None = None  # why calls run eagerly for good (a failed proof)
        self._capped = False

    def call(self, name: str, fn: Callable, inputs: tuple, differentiable: tuple, params: list, bucket=()) -> tuple:
        """fn(*inputs) -> tuple of tensors, as a replay of this shape's graphs (eagerly where the cache cannot).
        `differentiable[i]`: inputs[i] gets a gradient; `params`: the parameters fn reads (their gradients too)."""
        if self.off is not None or not torch.is_grad_enabled():
            return self._eager(fn, inputs)
        key = _key(name, inputs, differentiable, bucket)
        entry = self.entries.get(key)
        if entry is not None and entry.storage != _storage(params):
            self._drop(key)
            self.stats.recaptures += 1
            entry = None
        if entry is None:
            entry = self.entries[key] = _Entry(_storage(params))
            if self.prove and not self._proved(entry, fn, inputs, differentiable, params, name):
                return self._eager(fn, inputs)
        slot = next((s for s in entry.slots if not s.busy), None)
        if slot is None:
            if self.stats.held >= self.cap:
                return self._at_cap(fn, inputs)
            slot = self._capture(fn, inputs, differentiable, params)
            entry.slots.append(slot)
        self.stats.replays += 1
        return _Replay.apply(slot, len(inputs), *inputs, *params)

    def _eager(self, fn: Callable, inputs: tuple) -> tuple:
        if self.off is not None or self._capped:
            self.stats.eager += 1
        return tuple(fn(*inputs))

    def _at_cap(self, fn: Callable, inputs: tuple) -> tuple:
        if not self._capped:
            self._capped = True
            self.say(f"cuda_graphs: {self.cap} graphs captured, the cap; calls of new shapes run eagerly")
        return self._eager(fn, inputs)

    def _capture(self, fn: Callable, inputs: tuple, differentiable: tuple, params: list) -> _Slot:
        before = self.backend.reserved_bytes()
        slot = _Slot(self.backend, fn, inputs, differentiable, params)
        slot.bytes = max(self.backend.reserved_bytes() - before, 0)
        self.stats.captured += 1
        self.stats.held += 1
        self.stats.held_bytes += slot.bytes
        return slot

    def _drop(self, key: tuple) -> None:
        """Forget a shape's graphs (their memory goes with them): they read a parameter's old storage."""
        entry = self.entries.pop(key)
        self.stats.held -= len(entry.slots)
        self.stats.held_bytes -= sum(s.bytes for s in entry.slots)

    def _proved(self, entry: _Entry, fn: Callable, inputs: tuple, differentiable: tuple, params: list,
                name: str) -> bool:
        """The call once eagerly and once captured and replayed, on these inputs and the same output gradients:
        outputs and every gradient within TOLERANCE. On a mismatch the cache is off for good, said once."""
        slot = self._capture(fn, inputs, differentiable, params)
        entry.slots.append(slot)  # free again once proved: the call replays it
        leaves = tuple(x.detach().clone().requires_grad_(d) for x, d in zip(inputs, differentiable))
        with torch.enable_grad():
            ref_out = tuple(fn(*leaves))
        probe = _probe_grads(ref_out)
        wrt = [x for x in leaves if x.requires_grad] + list(params)
        used = [(o, g) for o, g in zip(ref_out, probe) if g is not None]
        ref_grads = torch.autograd.grad([o for o, _ in used], wrt, [g for _, g in used], allow_unused=True)
        got_out = slot.run_forward(inputs)
        got_grads = [g for g, d in zip(slot.run_backward(probe), (*differentiable, *[True] * len(params))) if d]
        worst, where = 0.0, ""
        for label, got, ref in [*(("output", g, r) for g, r in zip(got_out, ref_out)),
                                *(("gradient", g, r) for g, r in zip(got_grads, ref_grads))]:
            diff = rel_diff(got, ref)
            tol = TOLERANCE.get(ref.dtype if ref is not None else got.dtype, 1e-4)
            if not diff <= tol and diff / tol >= worst:
                worst, where = diff / tol, f"{label} of {name} differs by {diff:.3g} (tolerance {tol:g})"
        if where:
            self.stats.fallbacks += 1
            self.off = where
            for key in list(self.entries):  # eager from now on: no graph is needed any more
                self._drop(key)
            self.say(f"cuda_graphs=auto: a replayed {where} from eager; eager from now on")
            return False
        self.stats.proved += 1
        return True

    def end_step(self) -> None:
        """Every slot free again: nothing of this step's replays is needed any more."""
        for entry in self.entries.values():
            for slot in entry.slots:
                slot.busy = False

    def summary(self) -> str:
        st = self.stats
        state = f"off ({self.off})" if self.off else "on"
        return (f"cuda_graphs ({self.backend.name}): {st.held} held ({st.held_bytes / 2 ** 20:.1f} MiB), "
                f"{st.captured} captured in all, {st.replays} replays, {st.proved} shapes proved, {st.fallbacks} fallbacks, {st.eager} eager calls, "
                f"{st.recaptures} recaptures; {state}")


def _probe_grads(outs: tuple) -> tuple:
    """Output gradients for a proof: fixed pseudo-random values (a generator of their own, drawn on the host),
    None for outputs that take none."""
    g = torch.Generator().manual_seed(0)
    return tuple(torch.randn(o.shape, generator=g).to(o.device, o.dtype) if o.requires_grad else None for o in outs)
