"""launch/plan.py: rank the layouts for N devices (and write the winner's DeepSpeed JSON), or calibrate
this machine's profile."""
from __future__ import annotations

import argparse
import os

from trainer.config import REPO_ROOT

DEFAULT_BASE = os.path.join(REPO_ROOT, "ds_configs", "single.json")
USAGE = """\
  python launch/plan.py --config MODEL.yaml --devices N --profile PROFILE [--deepspeed_config BASE.json]
                        [--scale-batch] [--link nvlink|pcie] [--steps 16] [--top 20] [--write-config OUT.json]
                        [key=value ...]
  python launch/plan.py --calibrate --config MODEL.yaml --out PROFILE [--quick] [key=value ...]"""


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="launch/plan.py", usage=USAGE, description=(
        "Predict each parallel layout's step time on N devices by simulating its schedule with a device "
        "profile's costs over real batches of the configured data, rank them, and optionally write the "
        "winner's DeepSpeed JSON; or measure this machine's profile (--calibrate)."))
    p.add_argument("--config", default=None, help="model/data YAML (default trainer/configs/demo.yaml)")
    p.add_argument("--devices", type=int, help="devices to plan for: GPUs, or on a CPU profile cores")
    p.add_argument("--profile", help="device profile: a JSON file (one written by --calibrate), or a shipped "
                                      "profile's name (h200: trainer/planner/profiles/h200.json)")
    p.add_argument("--deepspeed_config", default=DEFAULT_BASE,
                   help="base DeepSpeed JSON: optimizer, precision, batch (global micro-batch = its "
                        "train_micro_batch_size_per_gpu x its num_dp), accumulation (default ds_configs/single.json); "
                        "bf16.enabled \"auto\" is planned in the precision a launch on the profile's device would "
                        "choose (the first line says which)")
    p.add_argument("--scale-batch", dest="scale_batch", action="store_true",
                   help="grow the global micro-batch with the device count: the base's global micro-batch per rank "
                        "of its layout, times --devices, for every layout (default: the base's global micro-batch, "
                        "kept whatever the device count); speed-ups are then tokens/s over one device at the base's "
                        "batch per rank")
    p.add_argument("--link", default=None, help="a GPU profile's link between devices (its roofline.links)")
    p.add_argument("--steps", type=int, default=16, help="training steps whose real batches are simulated")
    p.add_argument("--top", type=int, default=20, help="layouts printed")
    p.add_argument("--write-config", dest="write_config", default=None, help="write the winner's DeepSpeed JSON here")
    p.add_argument("--calibrate", action="store_true", help="measure this machine's profile instead")
    p.add_argument("--out", default=None, help="--calibrate: the profile file to write")
    p.add_argument("--quick", action="store_true", help="--calibrate: fewer shapes and repeats (tests)")
    p.add_argument("overrides", nargs="*", help="key=value config overrides, e.g. data.dir=...")
    return p


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    from trainer.config import load_config

    cfg = load_config(args.config, args.overrides)
    if args.calibrate:
        from trainer.planner.calibrate import calibrate
        from trainer.planner.plan import require_prepared

        if not args.out:
            raise ValueError("--calibrate needs --out PROFILE (the file to write)")
        require_prepared(cfg.data.dir, args.config)  # it times the model on real batches
        from trainer.ds_config import global_micro_batch
        from trainer.parallel.deepspeed_json import load_ds_config
        from trainer.parallel.layout import LayoutSpec, layout_world

        ds = load_ds_config(args.deepspeed_config, None)
        spec = LayoutSpec.from_ds_config(ds, layout_world(ds))
        calibrate(cfg, args.out, quick=args.quick, global_batch=global_micro_batch(ds, spec.num_dp))
        return 0
    if args.devices is None or args.devices < 1:
        raise ValueError(f"--devices {args.devices}: give the number of devices to plan for (>= 1)")
    if not args.profile:
        from trainer.planner.profile import shipped

        raise ValueError(f"--profile PROFILE is required (a shipped one: {', '.join(shipped())}; or a file written "
                         f"by --calibrate)")
    if args.steps < 1 or args.top < 1:
        raise ValueError("--steps and --top must be >= 1")
    return _plan(args, cfg)


def _plan(args, cfg) -> int:
    """Rank the layouts for --devices, print them, write the winner's JSON if asked."""
    from trainer.parallel.deepspeed_json import load_ds_config
    from trainer.planner import plan
    from trainer.planner.profile import load, resolve

    profile = load(resolve(args.profile))
    plan.require_prepared(cfg.data.dir, args.config)
    ds = load_ds_config(args.deepspeed_config, None)  # the schedule is not planned; written without a length
    per_rank = plan.batch_per_rank(ds) if args.scale_batch else None
    planned, precision_line, done = plan.auto_precision(cfg, ds, profile, args.devices, args.link, args.steps,
                                                        per_rank and per_rank * args.devices, per_rank)
    # both precisions ranked to choose: the chosen one's ranking is this plan's
    work, (ranked, one, invalid) = done or plan.ranked_plan(cfg, planned, profile, args.devices, args.link, args.steps,
                                                            per_rank and per_rank * args.devices, per_rank)
    # the winner's JSON keeps "auto" (its launch decides on its own device); the precision line follows a busy
    # profile's warning, which comes first
    print(report(work, profile, args, ranked, one, invalid, precision_line))
    if args.write_config:
        best = ranked[0].candidate
        plan.write_config(args.write_config, plan.winner_config(ds, best, work.global_batch), best.ranks)
        launch = (f"deepspeed --num_gpus {best.ranks} launch/train.py" if best.ranks > 1 else "python launch/train.py")
        threads = f" train.threads={best.threads}" if "layers" in profile else ""
        print(f"wrote {args.write_config}: {best.label()}\n  {launch} --deepspeed_config {args.write_config} "
              f"--config {args.config or 'trainer/configs/demo.yaml'}{threads} ...")
    return 0


def report(work, profile, args, ranked, one, invalid: int, precision_line: str | None = None) -> str:
    from trainer.planner.profile import provenance

    dev = profile.get("device", {})
    where = dev.get("name", "?")
    if "roofline" in profile and "layers" not in profile:
        links = profile["roofline"].get("links", {})
        where += f", link {args.link or profile['roofline'].get('default_link') or sorted(links)[0]}"
    d = work.dims
    warning = (profile.get("conditions") or {}).get("warning") if isinstance(profile.get("conditions"), dict) else None
    lines = [f"WARNING: {args.profile}: {warning}; measure again on a quiet machine (--calibrate)"] if warning else []
    lines += [precision_line] if precision_line else []
    if work.cfg.model.lstm_kernel != "fused":
        lines.append(f"NOTE: model.lstm_kernel={work.cfg.model.lstm_kernel}: the profiles price torch's fused LSTM, so "
                     f"these are the fused kernel's predictions (docs/BENCHMARKS.md 13 measures both)")
    lines += [f"plan: {args.devices} device(s) of {where} ({os.path.basename(args.profile)}); model emb {d.emb} hidden "
              f"{d.hidden} {d.layers}+{d.layers} layers, vocab {d.src_vocab}/{d.tgt_vocab}; {work.precision}; "
              f"{batch_words(work, one, args)}; {len(work.windows)} real steps of {work.cfg.data.dir}",
              provenance(profile),
              f"one device ({one.candidate.label()}{_at(one, work)}): predicted {1000 * one.step_s:.1f} ms/step, "
              f"{one.tokens_per_s:.0f} tokens/s; {len(ranked)} layouts simulated, {invalid} left out (the trainer "
              f"would refuse them); '(screened)': simulated on the first {min(4, len(work.windows))} steps only",
              "",
              "| # | layout | ranks x threads | predicted step ms | predicted tokens/s | predicted speed-up | "
              "predicted busy / waiting / communicating % per rank |",
              "|---:|---|---|---:|---:|---:|---|"]
    for i, p in enumerate(ranked[:args.top], 1):
        fr = " ; ".join(f"{round(100 * f['busy'])}/{round(100 * f['waiting'])}/{round(100 * f['communicating'])}"
                        for _, f in sorted(p.fractions.items()))
        mark = " (screened)" if p.screened_only else ""
        lines.append(f"| {i} | {p.candidate.label()}{mark} | {p.candidate.ranks} x {p.candidate.threads or '-'} | "
                     f"{1000 * p.step_s:.1f} | {p.tokens_per_s:.0f} | {p.speedup:.2f}x | {fr} |")
    best = {}
    for p in ranked:
        if not p.screened_only and p.candidate.ranks in (1, args.devices):
            best.setdefault(p.candidate.spec.mode if p.candidate.spec.mode != "grid" else "hybrid", p)
    lines.append("")
    lines.append(f"predicted best of each mode on all {args.devices} device(s): "
                 + ", ".join(f"{m} {p.speedup:.2f}x ({p.candidate.label()})" for m, p in best.items()))
    if warning:  # again under the table, where the eye lands
        lines.append(f"WARNING: planned with a profile measured on a busy machine ({warning.split(':')[0]}): "
                     f"these predictions are not worth acting on")
    return "\n".join(lines)


def batch_words(work, one, args) -> str:
    """The batch planned with, and what the speed-up compares: kept or grown with the device count."""
    per_step = f"{work.global_batch} pairs per global micro-batch x {len(work.windows[0])}"
    if not args.scale_batch:
        return f"{per_step} (the base's, kept for every layout; --scale-batch grows it with the devices)"
    per_rank = work.global_batch // args.devices
    return (f"{per_step} ({per_rank} per device x {args.devices}: --scale-batch); speed-up: predicted tokens/s "
            f"over one device's at {per_rank} pairs")


def _at(one, work) -> str:
    return "" if one.global_batch == work.global_batch else f" at {one.global_batch} pairs"
