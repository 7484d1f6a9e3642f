"""Device profiles: JSON files that say how long the model's pieces take on a device. The format is
defined here, and the shipped profiles are in trainer/planner/profiles/ (`--profile h200` names
trainer/planner/profiles/h200.json).

A device profile (`device_profile`; written by the GPU check, python -m benchmarks.gpu.gpu_check, as
device_profile.json) has:
    device        {"name", "type": "cuda"|"cpu", "capability", "memory_gib", "multiprocessors", "threads"}
    datasheet     {"name", "source", "peak_tflops": {"bf16", "tf32", "fp32"}, "memory_tb_s",
                   "links_gb_s": {"nvlink", "pcie"}} (dense rates, no sparsity), or null (no entry)
    compute       {precision: {"gemm": [{"m", "n", "k", "ms", "tflops"}], "lstm": [{"batch", "time",
                   "input", "hidden", "ms_fwd_bwd", "tflops"}]}} for bf16, fp32 (TF32 off) and, on
                   CUDA, tf32; the largest GEMM is the achievable matrix peak
    memory        {"copy_tb_s": device-to-device copy, bytes read + written}
    links         {"host_to_device_gb_s", "device_to_host_gb_s" (pinned), "nvlink_gb_s", "pcie_gb_s",
                   "allreduce": null + why (one GPU: no peer to measure against), "sources"}
    host          {"op_overhead_us"}: host time per tiny eager op (dispatch + launch), what small
                   kernels cost when the host, not the GPU, sets the pace
    sources       what each number is: "measured: <how>" or "datasheet: <document>"
    measured_on   {"device", "date"}: where and when it was measured (profiles from before it have none)

The planner reads two more sections, whichever the file has:

    layers      measured by `python launch/plan.py --calibrate` (trainer/planner/calibrate.py): the real
                layers of one model timed at a few shapes, per precision and thread count:
                  model         the sizes they were measured at (emb_dim, hidden, layers, attention, vocab)
                  PREC.THREADS  lstm {"IxH": {fused_fwd, fused_bwd, packed_fwd, packed_bwd: [[rows, steps, ms]]}}
                                (one layer with its dropout; fused = oneDNN over all-real steps, packed =
                                the per-step path of ragged tails), embedding {src_fwd, src_bwd, tgt_fwd,
                                tgt_bwd: [[tokens, ms]]}, mask [[elements, ms]] (a dropout mask drawn),
                                copy [[bytes, ms]], head [[rows, src_len, tgt_len, tokens, ms]] (forward +
                                backward of one piece), optimizer [[params, tensors, ms]] (DeepSpeed's
                                step), overhead {instruction_ms: {op: ms}, micro_step_ms,
                                backward_ms} (the interpreter's own work per instruction type, read
                                off real one-rank micro-steps; DeepSpeed's backward call)
                contention   {PREC: {component: factor}}: how much slower a component runs while a
                             second rank computes on the other core (shared caches, memory bandwidth);
                             "step": a whole training step, which the planner applies to every component
                transfers    {"gloo": {p2p [[bytes, one_way_ms, post_ms]], all_reduce / reduce /
                             broadcast [[bytes, ms, cpu_ms]] between two ranks (cpu_ms: the process's CPU
                             time of the call, all its threads; optional: a profile without it prices an
                             async verb at nothing to its caller); all_reduce_bf16 the same sum of bf16
                             tensors (optional: without it bf16 sums take fp32's line)}}
    roofline    a GPU's rates, each with its source (datasheet figure, a measurement, or an estimate):
                see trainer/planner/roofline.py; `planner_profile` adds it to a device profile
                (trainer/planner/gpu_profile.py: the datasheets, estimates and `roofline`), and
                `python -m benchmarks.gpu.gpu_profile --planner-profile OUT [--from device_profile.json]`
                writes the file (trainer/planner/profiles/h200.json was written so).

Every number the planner uses is read from the file: nothing device-specific lives in code.

What a profile rests on (`provenance`, printed above every plan): `measured_on` {"device", "date"} says where
and when a calibration or a GPU check measured it (files written before it was kept have none: their dates come
from the sources' text, or are "not recorded"); a roofline's numbers are counted by their sources (measured,
datasheet, estimate).
"""
from __future__ import annotations

import math
import os
import re
import time

from trainer.ds_config import read_json_file
from trainer.planner.fit import Curve, linear
from trainer.planner.gpu_profile import DATASHEETS, datasheet, roofline

MAX_BYTES = 4 << 20
PROFILES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "profiles")  # the shipped ones (package data)


class ProfileError(ValueError):
    """A profile that cannot be used; the message names the file and the key."""


def shipped() -> list[str]:
    """The names of the shipped profiles (trainer/planner/profiles/NAME.json)."""
    return sorted(f[:-len(".json")] for f in os.listdir(PROFILES) if f.endswith(".json"))


def resolve(profile: str) -> str:
    """--profile's value as a file: a shipped profile's name (`h200`) is its file in PROFILES; anything
    else is a path, as given."""
    named = os.path.join(PROFILES, f"{profile}.json")
    return named if profile in shipped() and not os.path.exists(profile) else profile


def load(path: str) -> dict:
    data = read_json_file(path, flag="--profile", kind="a device profile", max_bytes=MAX_BYTES, error=ProfileError)
    if not isinstance(data, dict) or not isinstance(data.get("device"), dict):
        raise ProfileError(f"{path}: not a device profile (a JSON object with a 'device' section)")
    if "layers" not in data and "roofline" not in data:
        raise ProfileError(f"{path}: has neither 'layers' (a calibrated machine: python launch/plan.py --calibrate) "
                           f"nor 'roofline' (a GPU's rates); the planner needs one")
    data = tame(data)
    data["_path"] = path
    return data


MAX_TEXT = 400  # characters of one string of a profile (the shipped one's longest is 273)


def tame(node):
    """A loaded profile with every string (keys too) fit to be printed: a character that is not printable (a
    terminal escape, a newline) written as its escape, and a string past MAX_TEXT cut, saying so. The device
    name, `measured_on`, the allocator, the sources and the link names reach the plan's lines as the file gives
    them, and a profile is a file a user hands over (up to MAX_BYTES)."""
    if isinstance(node, dict):
        return {tame(k): tame(v) for k, v in node.items()}
    if isinstance(node, list):
        return [tame(v) for v in node]
    if not isinstance(node, str):
        return node
    text = node if node.isprintable() else "".join(c if c.isprintable() else repr(c)[1:-1] for c in node)
    return text if len(text) <= MAX_TEXT else f"{text[:MAX_TEXT]}... ({len(text) - MAX_TEXT} more characters)"


def allocator_said(profile: dict) -> str:
    """A calibrated profile's allocator, and whether training runs under another (its prices are then off: the
    same bf16 head took 20-30% longer under glibc than under mimalloc, AMD EPYC with AVX-512, 2026-12-07)."""
    from trainer.training.memory import training_allocator

    conditions = profile.get("conditions") if isinstance(profile.get("conditions"), dict) else {}
    measured, training = conditions.get("allocator"), training_allocator()
    if measured == training:
        return f", under {measured}"
    said = f"under {measured}" if isinstance(measured, str) else "allocator not recorded (before 2026-12-07: glibc)"
    return f", {said} where training runs under {training}: prices may be off, calibrate again"


def provenance(profile: dict) -> str:
    """One line: what the profile's prices rest on (measured where and when, or estimates) and that what is
    printed from them are predictions."""
    name = os.path.basename(profile.get("_path", "profile"))
    device = (profile.get("device") or {}).get("name", "?")
    stamp = profile.get("measured_on") if isinstance(profile.get("measured_on"), dict) else {}
    if "layers" in profile:
        cores = (profile.get("device") or {}).get("cores")
        where = stamp.get("device") or device + (f" ({cores} cores)" if cores else "")
        when = stamp.get("date") or "date not recorded (a profile from before dates were kept)"
        quick = " --quick (fewer shapes and repeats)" if (profile.get("conditions") or {}).get("quick") else ""
        return (f"prices: {name}, measured by python launch/plan.py --calibrate{quick} on {where}, {when}"
                f"{allocator_said(profile)}; every figure below is a prediction from them, not a measurement")
    counts, measured = {"measured": 0, "datasheet": 0, "estimate": 0}, {}
    for source in _sources(profile.get("roofline") or {}):
        kind = "estimate" if "estimate" in source or "scenario" in source else (
            "datasheet" if source.startswith("datasheet") else "measured" if "measured" in source else "estimate")
        counts[kind] += 1
        if kind == "measured":  # on this file's device (measured_on), or this workplace's GPU the source names
            other = re.search(r"this workplace's [^ (]+", source)
            where = other.group(0) if other else stamp.get("device") or device
            dates = set(re.findall(r"\b20\d\d-\d\d-\d\d\b", source)) if other else {stamp.get("date")}
            measured.setdefault(where, [0, set()])
            measured[where][0] += 1
            measured[where][1].update(dates)
    said = "; ".join(f"{n} measured on {where} ({' and '.join(sorted(d for d in dates if d)) or 'date not recorded'})"
                     for where, (n, dates) in measured.items()) or "none measured"
    return (f"prices: {name}, {device}: of its {sum(counts.values())} numbers {said}, {counts['datasheet']} from "
            f"the datasheet, {counts['estimate']} estimates never checked on a GPU; every figure below is a "
            f"prediction from them, not a measurement")


def _sources(node) -> list[str]:
    """The `source` of every number of a roofline section."""
    if isinstance(node, dict) and "value" in node:
        return [str(node.get("source", ""))]
    return [s for v in node.values() for s in _sources(v)] if isinstance(node, dict) else []


def stamp(device: str) -> dict:
    """A measurement's `measured_on`: the device and today's date (UTC)."""
    return {"device": device, "date": time.strftime("%Y-%m-%d", time.gmtime())}


# ---- writing the format ----
def device_profile(device: dict, measured: dict) -> dict:
    """A device profile from what was measured on `device` (its "device" section): `measured` holds
    "compute", "rates" (copy_tb_s, and on CUDA host_to_device_gb_s / device_to_host_gb_s) and, when
    measured, "op_overhead_us"; the datasheet's figures stand beside them, each number with its source."""
    cuda = device.get("type") == "cuda"
    sheet = datasheet(device["name"]) if cuda else None
    rates = measured["rates"]
    links = {"host_to_device_gb_s": rates.get("host_to_device_gb_s"),
             "device_to_host_gb_s": rates.get("device_to_host_gb_s"),
             "nvlink_gb_s": sheet["links_gb_s"]["nvlink"] if sheet else None,
             "pcie_gb_s": sheet["links_gb_s"]["pcie"] if sheet else None,
             "allreduce": None,
             "allreduce_note": "not measured: one device, no peer (NCCL all-reduce needs a second GPU)"}
    sources = {
        "compute": "measured: torch matmul / nn.LSTM forward+backward on random data, median of repeats after "
                   "warm-up (CUDA events on GPU, perf_counter on CPU); tf32 = fp32 tensors with TF32 allowed",
        "memory.copy_tb_s": "measured: device-to-device copy, bytes read + written",
        "links.host_to_device_gb_s": "measured: pinned host memory copy" if cuda else None,
        "links.nvlink_gb_s": f"datasheet: {sheet['source']}" if sheet else None,
        "links.pcie_gb_s": f"datasheet: {sheet['source']}" if sheet else None,
        "datasheet": sheet["source"] if sheet else "no datasheet entry for this device",
    }
    if "op_overhead_us" in measured:
        sources["host.op_overhead_us"] = "measured: host time of 200 eager adds of 8 numbers, synchronised at the end"
    return {"device": device, "measured_on": stamp(device["name"]), "datasheet": sheet, "compute": measured["compute"],
            "memory": {"copy_tb_s": rates["copy_tb_s"]}, "links": links,
            "host": {"op_overhead_us": measured.get("op_overhead_us")}, "sources": sources}


def datasheet_profile(name: str) -> dict:
    """A device profile of nothing measured: the datasheet entry of the GPU `name`."""
    sheet = datasheet(name)
    if sheet is None:
        raise ProfileError(f"--device-name {name!r}: no datasheet entry ({', '.join(DATASHEETS)})")
    return {"device": {"name": name, "type": "cuda"}, "datasheet": sheet, "sources": {"datasheet": sheet["source"]}}


def planner_profile(device: dict) -> dict:
    """A device profile with the planner's "roofline" section added: measured numbers where it has them,
    datasheet figures or stated estimates elsewhere."""
    return {**device, "roofline": roofline(device),
            "measured_by": device.get("measured_by") or "datasheet + this workplace's measurements + stated estimates"}


# ---- reading it ----
def _get(profile: dict, *keys):
    node = profile
    for i, k in enumerate(keys):
        if not isinstance(node, dict) or k not in node:
            have = sorted(x for x in node if not str(x).startswith("_")) if isinstance(node, dict) else []
            raise ProfileError(f"{profile.get('_path', 'profile')}: {'.'.join(keys[:i + 1])}: missing "
                               f"(has: {', '.join(map(str, have)) or 'nothing'})")
        node = node[k]
    return node


def _points(profile: dict, *keys) -> list:
    pts = _get(profile, *keys)
    if not isinstance(pts, list) or not pts or not all(
            isinstance(p, list) and all(isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v < math.inf
                                        for v in p)
            for p in pts):
        raise ProfileError(f"{profile['_path']}: {'.'.join(keys)}: must be a non-empty list of lists of finite numbers >= 0")
    return pts


class _Line:
    """y = c . features(x) fitted to measured points (ms), returning seconds."""

    def __init__(self, profile, keys, features):
        try:
            self.coef = linear(_points(profile, *keys), features)
        except (ValueError, IndexError, TypeError) as e:
            raise ProfileError(f"{profile['_path']}: {'.'.join(keys)}: cannot fit ({e})") from None
        self.features = features

    def __call__(self, *x) -> float:
        return float(self.coef @ self.features(list(x))) / 1000.0


class _Lstm:
    """One LSTM layer's table: ms = c0(rows) + steps * step(rows), per measured row count, fitted
    over the measured step counts and interpolated between row counts."""

    def __init__(self, profile, keys):
        by_rows: dict = {}
        for rows, steps, ms in _points(profile, *keys):
            by_rows.setdefault(rows, []).append((steps, ms))
        xs, c0, step = [], [], []
        for rows, pts in sorted(by_rows.items()):
            c = linear([[s, ms] for s, ms in pts], lambda r: [1.0, r[0]]) if len(pts) > 1 else [0.0, pts[0][1] / pts[0][0]]
            xs.append(rows)
            c0.append(c[0])
            step.append(c[1])
        self.c0, self.step = Curve(xs, c0), Curve(xs, step)

    def fused(self, rows: int, steps: int) -> float:
        return (self.c0(rows) + steps * self.step(rows)) / 1000.0 if steps > 0 and rows > 0 else 0.0

    def per_step(self, counts) -> float:
        """Steps of different active row counts (the packed path)."""
        counts = [n for n in counts if n > 0]
        if not counts:
            return 0.0
        return (self.c0(max(counts)) + sum(self.step(n) for n in counts)) / 1000.0


COMPONENTS = ("lstm", "embedding", "mask", "copy", "head", "optimizer")


class MeasuredDevice:
    """A calibrated machine: every cost from the layer tables of one precision and thread count."""

    kind = "measured"
    masks_by_rows = True  # the host draws a rank's rows of a dropout mask only (trainer.model.dropout.BLOCK_ROWS)

    def __init__(self, profile: dict, precision: str, threads: int, dims=None):
        self.profile, self.precision, self.threads = profile, precision, threads
        tables = _get(profile, "layers", precision)
        key = str(threads)
        if key not in tables:
            raise ProfileError(f"{profile['_path']}: layers.{precision}.{key}: not calibrated for {threads} thread(s) "
                               f"(has: {', '.join(sorted(tables))})")
        if dims is not None:
            self._check_model(dims)
        base = ("layers", precision, key)
        self.lstm = {name: {part: _Lstm(profile, (*base, "lstm", name, part))
                            for part in ("fused_fwd", "fused_bwd", "packed_fwd", "packed_bwd")}
                     for name in _get(profile, *base, "lstm")}
        one = lambda r: [1.0, r[0]]  # noqa: E731
        self.embedding = {part: _Line(profile, (*base, "embedding", part), one)
                          for part in ("src_fwd", "src_bwd", "tgt_fwd", "tgt_bwd")}
        self.mask = _Line(profile, (*base, "mask"), one)
        self.copy = _Line(profile, (*base, "copy"), one)
        self.head = _Line(profile, (*base, "head"), lambda r: [1.0, r[3], r[0] * r[2], r[0] * r[2] * r[1]])
        self.optimizer_line = _Line(profile, (*base, "optimizer"), lambda r: [1.0, r[0], r[1]])
        over = _get(profile, *base, "overhead")
        per_op = over.get("instruction_ms", {})
        self.per_instruction = ({op: float(ms) / 1000.0 for op, ms in per_op.items()} if isinstance(per_op, dict)
                                else {"reduce_metrics": float(per_op) / 1000.0})
        self.micro_step = float(over.get("micro_step_ms", 0.0)) / 1000.0
        self.backward_call = float(over.get("backward_ms", 0.0)) / 1000.0  # engine.backward's own work
        self.contention = profile.get("contention", {}).get(precision, {})
        self._transfers = None

    def instruction(self, op: str) -> float:
        """The interpreter's own seconds for one instruction of type `op` (measured on one rank;
        instruction types only several ranks run take those of the loss all-reduce, a bare verb)."""
        return self.per_instruction.get(op, self.per_instruction.get("reduce_metrics", 0.0))

    @property
    def transfers(self) -> dict:
        if self._transfers is None:
            profile, gloo = self.profile, ("transfers", "gloo")

            def column(name: str, index: int):
                """The line through (bytes, the points' `index`-th value), or None where no point has one. Each
                line takes its own column: the p2p line fitted the points' last value, the sender's posting, for
                the one-way time from 2026-12-01 to 2026-12-07 (a message of 8 MB priced at 0.1 ms for 3.5)."""
                pts = [[r[0], r[index]] for r in _points(profile, *gloo, name) if len(r) > index]
                if not pts:
                    return None
                return _Line({"_path": profile["_path"], name: pts}, (name,), lambda r: [1.0, r[0]])

            self._transfers = {"p2p": column("p2p", 1), "post": column("p2p", 2),
                               **{name: column(name, 1) for name in ("all_reduce", "reduce", "broadcast")},
                               # the CPU time of the verb, where the profile has it
                               **{f"{name}_cpu": column(name, 2) for name in ("reduce", "broadcast")}}
            if _get(profile, *gloo).get("all_reduce_bf16") is not None:  # profiles from before it: fp32's line
                self._transfers["all_reduce_bf16"] = column("all_reduce_bf16", 1)
            missing = [k for k in ("p2p", "post", "all_reduce", "reduce", "broadcast") if self._transfers[k] is None]
            if missing:
                raise ProfileError(f"{profile['_path']}: transfers.gloo: {', '.join(missing)}: no measured column")
        return self._transfers

    def _check_model(self, dims) -> None:
        measured = _get(self.profile, "layers", "model")
        want = dims.describe()
        differ = {k: (measured.get(k), v) for k, v in want.items() if k != "layers" and measured.get(k) != v}
        if differ:
            raise ProfileError(f"{self.profile['_path']}: calibrated for another model ("
                               + ", ".join(f"{k}: {a} there, {b} here" for k, (a, b) in differ.items())
                               + "); calibrate this one: python launch/plan.py --calibrate --config MODEL.yaml --out FILE")

    # ---- compute ----
    def _lstm(self, in_dim: int, hidden: int) -> dict:
        key = f"{in_dim}x{hidden}"
        if key not in self.lstm:
            raise ProfileError(f"{self.profile['_path']}: layers.{self.precision}.{self.threads}.lstm.{key}: no table "
                               f"(has: {', '.join(sorted(self.lstm))})")
        return self.lstm[key]

    def lstm_fused(self, direction: str, in_dim: int, hidden: int, rows: int, steps: int, above: int = 0) -> float:
        """A layer's call, and `above` more stacked on it (on a CPU a stack costs what its layers cost)."""
        return sum(self._lstm(i, hidden)[f"fused_{direction}"].fused(rows, steps) for i in [in_dim] + [hidden] * above)

    def lstm_packed(self, direction: str, in_dim: int, hidden: int, counts, above: int = 0) -> float:
        return sum(self._lstm(i, hidden)[f"packed_{direction}"].per_step(counts) for i in [in_dim] + [hidden] * above)

    def embed(self, side: str, direction: str, tokens: int) -> float:
        return self.embedding[f"{side}_{direction}"](tokens) if tokens else 0.0

    def dropout_mask(self, elements: int) -> float:
        return self.mask(elements) if elements else 0.0

    def copy_bytes(self, nbytes: int) -> float:
        return self.copy(nbytes) if nbytes else 0.0

    def head_step(self, rows: int, src: int, tgt: int, tokens: int) -> float:
        return self.head(rows, src, tgt, tokens) if rows else 0.0

    def optimizer(self, params: int, tensors: int) -> float:
        return self.optimizer_line(params, tensors)

    def slowdown(self, component: str) -> float:
        """How much slower `component` runs while another rank computes on the host's other core: the whole
        step's factor where the calibration measured one (two training steps at once against one alone, the
        ceiling's measurement: python -m benchmarks.scaling --goals), else the component's own."""
        factor = self.contention.get("step", self.contention.get(component, 1.0))
        return max(1.0, float(factor))

    # ---- transfers between ranks ----
    def p2p(self, nbytes: int) -> tuple[float, float]:
        """(the sender's cost of posting it, when it arrives after that)."""
        return self.transfers["post"](nbytes), self.transfers["p2p"](nbytes)

    def collective_cpu(self, name: str, nbytes: int, ranks: int) -> float:
        """The CPU time of an async `name` (reduce, broadcast) of `nbytes` over `ranks` ranks that gloo's
        thread takes from the caller's core (a rank of one thread); 0 where the profile did not measure it.
        Grows with the ring's steps as `collective` does."""
        line = self.transfers.get(f"{name}_cpu")
        if ranks <= 1 or line is None:
            return 0.0
        return max(0.0, (ranks - 1) * line(nbytes))

    def collective(self, name: str, nbytes: int, ranks: int, itemsize: int = 4) -> float:
        """gloo between `ranks` ranks, from the two-rank measurement: latency terms grow with the
        ring's steps (ranks - 1), the bandwidth term by 2 (ranks - 1) / ranks for an all-reduce. An all-reduce
        of 2-byte elements (bf16 gradients) takes the bf16 sum's line where the profile has one."""
        if ranks <= 1:
            return 0.0
        line = self.transfers[name]
        if name == "all_reduce" and itemsize == 2:
            line = self.transfers.get("all_reduce_bf16", line)
        latency, per_byte = line.coef[0] / 1000.0, line.coef[1] / 1000.0
        volume = 2 * (ranks - 1) / ranks if name == "all_reduce" else 1.0
        return (ranks - 1) * latency + per_byte * nbytes * volume
