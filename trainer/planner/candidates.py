"""The layouts worth trying on N devices: single, data, pipeline and hybrid over every grid num_pp x
num_dp = N, with pipeline units, time chunks, head schedules and head shares; each checked as the
trainer checks it (trainer.parallel.layout), so the planner never proposes a layout the trainer refuses."""
from __future__ import annotations

from dataclasses import dataclass

from trainer.parallel.layout import LayoutError, LayoutSpec

UNITS = (1, 2, 4, 8)
CHUNKS = (1, 2, 4)
LIGHTER_LAST = (8, 6)  # head_shares: the last stage (which also assembles the top outputs) gets 0.8 / 0.6 of a share


@dataclass(frozen=True)
class Candidate:
    spec: LayoutSpec
    ranks: int
    threads: int  # torch threads per rank on a CPU; 0 on GPUs (one rank per device)

    def label(self) -> str:
        s = self.spec
        if s.mode == "single":
            return f"single {self.threads} thread{'s' if self.threads > 1 else ''}" if self.threads else "single"
        if s.mode == "data":
            return f"data {s.num_dp}"
        name = {"hybrid": "hybrid", "grid": "hybrid", "pipeline": "pipeline"}[s.mode]
        grid = f"{s.num_pp}" if s.num_dp == 1 else f"{s.num_pp}x{s.num_dp}"
        extra = f" u{s.micro_batches} c{s.time_chunks}"
        if s.head_parallel and s.head_schedule == "per_unit":
            extra += " per_unit"
        if s.head_parallel and s.head_split == "time":
            extra += " head by time"
        if s.head_shares:
            extra += " shares " + ":".join(str(w) for w in s.head_shares)
        return f"{name} {grid}{extra}"

    def layout_json(self) -> dict:
        """The DeepSpeed JSON's parallel_layout for it (defaults left out)."""
        s = self.spec
        out = {"mode": s.mode, "num_pp": s.num_pp, "num_dp": s.num_dp}
        if s.mode != "single":
            out.update(micro_batches=s.micro_batches, time_chunks=s.time_chunks)
        if s.head_parallel:
            out["head_schedule"] = s.head_schedule
            if s.head_split != LayoutSpec.__dataclass_fields__["head_split"].default:
                out["head_split"] = s.head_split
            if s.head_shares:
                out["head_shares"] = list(s.head_shares)
        if s.partition_method != LayoutSpec.__dataclass_fields__["partition_method"].default:
            out["partition_method"] = s.partition_method
        return out


def _valid(spec: LayoutSpec, model_cfg, min_batch: int, global_batch: int) -> bool:
    if global_batch % spec.num_dp:
        return False  # every replica takes the same micro-batch (train_micro_batch_size_per_gpu)
    try:
        spec.check_world(spec.world_size)
        spec.check_model(model_cfg, min_batch, global_batch // spec.num_dp)
    except LayoutError:
        return False
    return True


def enumerate_layouts(devices: int, model_cfg, min_batch: int, global_batch: int, cpu_threads: tuple = (),
                      partition_method: str = "type:EncoderDecoderLayer") -> tuple[list[Candidate], int]:
    """(candidates, how many were left out as invalid). `cpu_threads`: on a CPU profile, the thread
    counts it was calibrated for (N devices = N cores, shared by the ranks); empty for GPUs (one rank
    per device, on any number of the N devices)."""
    specs: list[tuple[LayoutSpec, int]] = []
    cpu = bool(cpu_threads)
    for threads in (cpu_threads if cpu else (0,)):
        if not cpu or threads <= devices:
            specs.append((LayoutSpec("single", 1, 1, partition_method=partition_method), threads))
    threads = 1 if cpu else 0
    if cpu and devices > 1 and 1 not in cpu_threads:
        return [Candidate(s, 1, t) for s, t in specs], 0
    # GPUs: also layouts on fewer of them (more devices can be slower: links, replicated work);
    # a CPU's ranks share its cores, so there every core gets a rank
    for world in ([devices] if cpu else range(2, devices + 1)):
        specs += _layouts(world, threads, partition_method)
    valid = [Candidate(s, s.world_size, t) for s, t in specs if _valid(s, model_cfg, min_batch, global_batch)]
    return valid, len(specs) - len(valid)


def _layouts(devices: int, threads: int, partition_method: str) -> list[tuple[LayoutSpec, int]]:
    specs = [(LayoutSpec("data", 1, devices, partition_method=partition_method), threads)] if devices > 1 else []
    for num_pp in range(2, devices + 1):
        if devices % num_pp:
            continue
        num_dp = devices // num_pp
        for units in UNITS:
            for chunks in CHUNKS:
                base = dict(num_pp=num_pp, num_dp=num_dp, micro_batches=units, time_chunks=chunks,
                            partition_method=partition_method)
                specs.append((LayoutSpec("pipeline", **base), threads))
                specs.append((LayoutSpec("hybrid", **base), threads))
                for last in LIGHTER_LAST:
                    specs.append((LayoutSpec("hybrid", **base, head_shares=(10,) * (num_pp - 1) + (last,)), threads))
                if units >= num_pp:
                    specs.append((LayoutSpec("hybrid", **base, head_schedule="per_unit"), threads))
                if units == 1 and chunks >= num_pp:  # the head cut along time: each stage a block of time chunks
                    specs.append((LayoutSpec("hybrid", **base, head_split="time"), threads))
    return specs
