"""`parallel_layout: {"mode": "auto"}`: the layout chosen at launch by the planner (trainer/planner), for the ranks
launched and the run's data.

    {"mode": "auto", "profile": FILE or a shipped name (optional), "steps": 4 (optional), "margin": 0.1 (optional)}

Before any process talks (`check`): the planner's profile for this device, and the data it reads, must be there, or
the run is refused in one line naming what is missing. The profile: `profile` if given; on a GPU the shipped one of
its name (trainer/planner/profiles/, e.g. h200); on a CPU the one `python launch/plan.py --calibrate` wrote to
CPU_PROFILE in the cache directory. Once the process group is up (`choose`, on rank 0; every rank takes its answer:
trainer.parallel.runtime.ParallelRuntime.start_agreed): every layout the trainer accepts for that many ranks is
predicted on the first `steps` real batches of data.dir and ranked (trainer.planner.plan.rank_layouts; cached in the
cache directory, keyed by everything the ranking depends on); the log names the top rows and the choice, and the
run trains with it as with a JSON that had named it. `train_micro_batch_size_per_gpu` is the global micro-batch of an
auto layout (a chosen layout with num_dp replicas gives each 1/num_dp of it), as one process would take it.

The choice (`pick`): the fastest prediction, unless other layouts are predicted within `margin` of it (default 0.10,
the planner's error per row it is validated to: `python -m benchmarks.planner validate`). Rows closer than the
planner's error are not ordered by it (measured on the AMD EPYC, 2026-12-06: the hybrid predicted 2% ahead of data 2
ran 11-22% behind it); among them auto takes the layout with the fewest pipeline hand-offs per step (num_pp x units
x time chunks; 1 without a pipeline), even head shares before uneven ones, then the faster prediction: every hand-off
carries the fixed host costs the planner prices least well (issue 39), and uneven head shares rest on its prices
alone. `"margin": 0` takes the fastest prediction.
"""
from __future__ import annotations

import copy
import hashlib
import json
import os
from dataclasses import dataclass

from omegaconf import OmegaConf

from data_prep.dataformat import files, userfiles
from trainer.parallel.layout import SECTION, LayoutError, LayoutSpec

MAX_PROFILE_BYTES = 1 << 20  # a planner profile (a few kB; trainer.planner.profile caps what it loads likewise)

AUTO = "auto"
KEYS = ("mode", "profile", "steps", "margin")
DEFAULT_STEPS = 4
DEFAULT_MARGIN = 0.10  # the planner's validation goal per row (issue 40): predictions closer than this are a tie
TOP = 5  # ranking rows the log names
CPU_PROFILE = "cpu_profile.json"  # in the cache directory: where an auto run on a CPU looks for its profile
CACHE = "layouts.json"
MAX_CACHE_BYTES = 1 << 20
VERSION = 3  # of what a cached ranking means: raise it when the planner's model changes


def requested(ds: dict) -> bool:
    section = ds.get(SECTION)
    return isinstance(section, dict) and section.get("mode") == AUTO


def cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "hybrid-nmt")


@dataclass(frozen=True)
class AutoRequest:
    """What an auto layout is planned from, checked before any process talks."""

    profile: str  # the profile file
    steps: int
    world: int
    device: str  # cpu | cuda
    margin: float = DEFAULT_MARGIN  # predictions within this fraction of the fastest are a tie (module docstring)


def check(cfg, ds: dict, world: int, device: str, device_name: str = "") -> AutoRequest:
    """The request, or a LayoutError / FileNotFoundError of one line naming what is missing."""
    from trainer.planner import plan
    from trainer.planner.profile import ProfileError, load

    section = ds[SECTION]
    unknown = sorted(set(section) - set(KEYS))
    if unknown:
        raise LayoutError(f"{SECTION}.{unknown[0]}: not a key of mode=auto (its keys: {', '.join(KEYS)}); the "
                          f"planner chooses the rest")
    steps = section.get("steps", DEFAULT_STEPS)
    if not isinstance(steps, int) or isinstance(steps, bool) or not 1 <= steps <= 64:
        raise LayoutError(f"{SECTION}.steps={steps!r}: must be an integer in 1 .. 64 (real batches the planner "
                          f"simulates)")
    margin = section.get("margin", DEFAULT_MARGIN)
    if not isinstance(margin, (int, float)) or isinstance(margin, bool) or not 0 <= margin <= 0.5:
        raise LayoutError(f"{SECTION}.margin={margin!r}: must be a number in 0 .. 0.5 (predictions within this "
                          f"fraction of the fastest count as a tie; 0 takes the fastest prediction)")
    path = profile_path(section.get("profile"), device, device_name)
    plan.require_prepared(cfg.data.dir)
    try:
        work = _workload(cfg, ds, 1)
        plan.device_for(load(path), work.precision, 1, None, work.dims)  # a profile of another model: refused here
    except ProfileError as e:
        raise LayoutError(f"{SECTION}.mode=auto: {e}") from None
    return AutoRequest(path, steps, world, device, float(margin))


def profile_path(given, device: str, device_name: str) -> str:
    """The profile an auto layout plans with (module docstring), or one line saying there is none."""
    from trainer.planner.profile import PROFILES, resolve, shipped

    if given is not None:
        path = resolve(str(given))
        if not os.path.isfile(path):
            raise LayoutError(f"{SECTION}.profile={given!r}: no such file, and not a shipped profile "
                              f"({', '.join(shipped())})")
        return path
    if device == "cpu":
        path = os.path.join(cache_dir(), CPU_PROFILE)
        if not os.path.isfile(path):
            raise LayoutError(f"{SECTION}.mode=auto: no planner profile for this CPU ({path} does not exist): measure "
                              f"one with python launch/plan.py --calibrate --config YOUR.yaml --out {path} (minutes), "
                              f"or name one in {SECTION}.profile")
        return path
    for name in shipped():
        path = os.path.join(PROFILES, f"{name}.json")
        profile = userfiles.read_json(path, MAX_PROFILE_BYTES, "a shipped planner profile")
        if device_name.startswith(profile.get("device", {}).get("name", "\0")):
            return path
    raise LayoutError(f"{SECTION}.mode=auto: no shipped planner profile for {device_name or device} (shipped: "
                      f"{', '.join(shipped())}); name one in {SECTION}.profile (python -m benchmarks.planner "
                      f"gpu-prices writes one from a GPU check)")


def _workload(cfg, ds: dict, steps: int):
    from trainer.planner import plan

    base = {**ds, SECTION: {"mode": "single", "num_pp": 1, "num_dp": 1}}  # the global micro-batch as one process's
    return plan.workload(cfg, base, steps)


@dataclass(frozen=True)
class Choice:
    layout: dict  # the chosen parallel_layout
    micro_batch: int  # train_micro_batch_size_per_gpu that keeps the global micro-batch
    lines: tuple  # what the log says


def choose(cfg, ds: dict, req: AutoRequest) -> tuple[LayoutSpec, Choice]:
    """The fastest predicted layout of `req.world` ranks (rank 0 runs this; the others take its answer)."""
    key = _key(cfg, ds, req)
    cached = _read_cache().get(key)
    if cached is None:
        cached = _rank(cfg, ds, req)
        _write_cache(key, cached)
        how = f"ranked in {cached['seconds']:.1f} s"
    else:
        how = f"from the cache ({os.path.join(cache_dir(), CACHE)})"
    spec = LayoutSpec.from_ds_config({SECTION: cached["layout"]}, req.world)
    lines = (f"parallel_layout auto: {cached['ranked']} layouts of {req.world} rank(s) on {req.device}, "
             f"{req.steps} real steps of {cfg.data.dir}, {how}; {cached['prices']}",
             *(f"  {i}. {row}" for i, row in enumerate(cached["top"], 1)),
             *([f"parallel_layout auto: {cached['why']}"] if cached.get("why") else []),
             f"parallel_layout auto: chose {cached['label']}: {json.dumps(cached['layout'])}")
    return spec, Choice(cached["layout"], cached["micro_batch"], lines)


def _rank(cfg, ds: dict, req: AutoRequest) -> dict:
    import time

    from trainer.planner import plan
    from trainer.planner.profile import load, provenance

    start = time.perf_counter()
    profile = load(req.profile)
    work = _workload(cfg, ds, req.steps)
    ranked, _, _ = plan.rank_layouts(work, profile, req.world, screen_steps=min(2, req.steps))
    fits = [p for p in ranked if p.candidate.ranks == req.world]  # every rank launched takes part
    if not fits:
        raise LayoutError(f"{SECTION}.mode=auto: no layout of {req.world} ranks fits model.layers="
                          f"{cfg.model.layers}, a global micro-batch of {work.global_batch} and "
                          f"data.min_batch_sentences={cfg.data.min_batch_sentences}")
    chosen, why = pick(fits, req.margin)
    best = chosen.candidate
    top = [f"{p.candidate.label()}: predicted {1000 * p.step_s:.1f} ms/step, {p.tokens_per_s:.0f} tokens/s"
           + (" (screened)" if p.screened_only else "") for p in fits[:TOP]]
    return {"layout": best.layout_json(), "label": best.label(), "micro_batch": work.global_batch // best.spec.num_dp,
            "top": top, "ranked": len(fits), "prices": provenance(profile), "seconds": time.perf_counter() - start,
            "why": why}


def handoffs(spec: LayoutSpec) -> int:
    """Pipeline hand-offs per step: each stage boundary is crossed by every unit's every time chunk."""
    return spec.num_pp * spec.micro_batches * spec.time_chunks if spec.num_pp > 1 else 1


def pick(ranked: list, margin: float) -> tuple:
    """(the prediction auto takes, why in words or ""), from predictions fastest first (module docstring): among
    those within `margin` of the fastest, the fewest hand-offs, even head shares, then the fastest."""
    fastest = ranked[0]
    tied = [p for p in ranked if p is fastest or (not p.screened_only and p.step_s <= fastest.step_s * (1 + margin))]
    chosen = min(tied, key=lambda p: (handoffs(p.candidate.spec), bool(p.candidate.spec.head_shares), p.step_s))
    if chosen is fastest:
        return chosen, ""
    return chosen, (f"{chosen.candidate.label()} is predicted {100 * (chosen.step_s / fastest.step_s - 1):.1f}% "
                    f"slower than {fastest.candidate.label()}, within the planner's error (margin {margin:g}): "
                    f"taken for its {handoffs(chosen.candidate.spec)} pipeline hand-off(s) per step against "
                    f"{handoffs(fastest.candidate.spec)}" + (", even head shares" if fastest.candidate.spec.head_shares
                                                             and not chosen.candidate.spec.head_shares else ""))


def apply(ds: dict, choice: Choice) -> dict:
    """The run's DeepSpeed JSON: the chosen layout and the micro-batch per replica that keeps the global one."""
    out = copy.deepcopy(ds)
    out[SECTION] = dict(choice.layout)
    out["train_micro_batch_size_per_gpu"] = choice.micro_batch
    return out


# ---- the cache ----
def _key(cfg, ds: dict, req: AutoRequest) -> str:
    from trainer.data import read_manifest

    profile = hashlib.sha256(files.read_bytes(req.profile, MAX_PROFILE_BYTES, "a planner profile")).hexdigest()
    what = {"version": VERSION, "profile": profile, "data": read_manifest(cfg.data.dir).get("checksum"),
            "data_dir": os.path.abspath(cfg.data.dir), "model": OmegaConf.to_container(cfg.model),
            "batching": OmegaConf.to_container(cfg.data), "seed": cfg.train.seed,
            "train": {k: cfg.train[k] for k in ("stack_layers", "tf32")},
            "ds": {k: ds.get(k) for k in ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "bf16",
                                          "fp16")},
            "world": req.world, "device": req.device, "steps": req.steps, "margin": req.margin}
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:32]


def _read_cache() -> dict:
    try:
        data = userfiles.read_json(os.path.join(cache_dir(), CACHE), MAX_CACHE_BYTES, "the layout cache")
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}  # none yet, or damaged: rank again


def _write_cache(key: str, value: dict) -> None:
    """Add the ranking (the newest 32 kept); a cache that cannot be written costs a ranking next time."""
    path = os.path.join(cache_dir(), CACHE)
    data = _read_cache()
    data.pop(key, None)
    data[key] = value
    data = dict(list(data.items())[-32:])
    try:
        files.make_dirs(os.path.dirname(path), "the cache directory")
        with files.replace(path, "the layout cache", own=True) as f:
            f.write(json.dumps(data, indent=1))
    except OSError:
        pass
