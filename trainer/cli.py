"""What the thin entry points in launch/ call."""
from __future__ import annotations

import json
import os
import sys


def fail(err: Exception, code: int = 2, exit=sys.exit) -> None:
    """A user error (exit code 2) or a stop with a reason (1): one line on stderr, no traceback."""
    print(f"error: {err}", file=sys.stderr, flush=True)
    exit(code)


def leave(code: int) -> None:
    """End a training process once its work is done and its files are closed, skipping interpreter
    teardown: there, gloo/DeepSpeed background threads have now and then aborted a finished process
    ("terminate called without an active exception", exit -6), turning a clean run into a failure."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _lost_peer_exit(err: Exception, trainer) -> None:
    """A peer died or stopped answering: say who and what was kept, then leave at once (exit 3)
    without the collective teardown, which would wait on the lost peer."""
    from trainer import checkpoint
    from trainer.distributed import peer_status

    import torch.distributed as dist

    rank = dist.get_rank() if dist.is_initialized() else "?"
    lines = [f"error: rank {rank}: lost contact with a peer rank: {str(err).splitlines()[0][:400]}"]
    if trainer is not None:
        lines.append(f"  ranks on this host: {peer_status(trainer.peers)}")
        lines.append(f"  timeout for an unresponsive peer: train.comm_timeout_s={trainer.cfg.train.comm_timeout_s}")
        latest = checkpoint.read_pointer(trainer.run_dir, "latest")
        lines.append(f"  newest complete checkpoint: {latest or 'none'} (continue with train.resume=auto)")
    print("\n".join(lines), file=sys.stderr, flush=True)
    os._exit(3)


def run_dry(ds_config_path: str) -> int:
    from trainer.layout import SECTION, LayoutSpec
    from trainer.schedule import format_schedule, global_programs

    with open(ds_config_path) as f:
        ds = json.load(f)
    section = ds.get(SECTION, {})
    world = section.get("num_pp", 1) * section.get("num_dp", 1)
    spec = LayoutSpec.from_ds_config(ds, world)
    print(f"mode={spec.mode} num_pp={spec.num_pp} num_dp={spec.num_dp} micro_batches={spec.micro_batches} "
          f"time_chunks={spec.time_chunks} head_parallel={spec.head_parallel}")
    print(format_schedule(global_programs(spec.num_pp, spec.num_dp, spec.micro_batches, spec.time_chunks,
                                          spec.head_parallel)))
    return 0


def train_main(config_path, overrides, ds_config_path) -> int:
    from trainer.config import load_config
    from trainer.trainer import Trainer

    import torch.distributed as dist

    from trainer.distributed import is_comm_failure

    cfg = load_config(config_path, overrides)
    trainer = None
    try:
        trainer = Trainer(cfg, ds_config_path)
        trainer.fit()
    except Exception as e:
        if is_comm_failure(e):
            _lost_peer_exit(e, trainer)
        if dist.is_initialized():  # an error every rank raised together (a failed save, bad steps, ...):
            if trainer is not None:  # leave no collective in flight, or gloo aborts the process at exit
                trainer.runner.sync_head()
            dist.destroy_process_group()
        raise
    if dist.is_initialized():  # leave together: no rank tears gloo down under a peer still talking
        dist.barrier()
        dist.destroy_process_group()
    return 0


def _translator(args):
    import torch

    from trainer.translator import Translator

    torch.set_num_threads(max(1, torch.get_num_threads()))
    if getattr(args, "model", None):
        return Translator.from_export(args.model)
    return Translator.from_run(args.run, args.checkpoint, allow_unverified=getattr(args, "allow_unverified", False))


def export_main(args) -> int:
    from trainer.translator import Translator

    translator = Translator.from_run(args.run, args.checkpoint,
                                     allow_unverified=getattr(args, "allow_unverified", False))
    translator.export(args.out)
    o = translator.origin
    print(f"exported {o['run_dir']}/checkpoints/{o['checkpoint']} (step {o['step']}) -> {args.out}")
    return 0


def _write_lines(path: str, lines: list[str]) -> None:
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.writelines(line + "\n" for line in lines)


def translate_main(args) -> int:
    from trainer.translator import read_lines

    if not os.path.exists(args.input):
        raise FileNotFoundError(f"--input {args.input}: no such file")
    lines = read_lines(args.input)
    hyps = _translator(args).translate(lines, beam=args.beam, max_len_ratio=args.max_len_ratio,
                                       length_penalty=args.length_penalty, batch_size=args.batch_size)
    _write_lines(args.output, hyps)
    return 0


def evaluate_main(args) -> int:
    import sacrebleu

    from trainer.translator import read_lines

    for flag, path in (("--src", args.src), ("--ref", args.ref)):
        if not os.path.exists(path):
            raise FileNotFoundError(f"{flag} {path}: no such file")
    src, ref = read_lines(args.src), read_lines(args.ref)
    if len(src) != len(ref):
        raise ValueError(f"--src {args.src} has {len(src)} lines but --ref {args.ref} has {len(ref)}")
    translator = _translator(args)
    hyps = translator.translate(src, beam=args.beam)
    if args.output:
        _write_lines(args.output, hyps)
    bleu = sacrebleu.BLEU(tokenize=translator.decode_cfg.bleu_tokenize)
    chrf = sacrebleu.CHRF()
    b, c = bleu.corpus_score(hyps, [ref]), chrf.corpus_score(hyps, [ref])
    result = {"bleu": round(b.score, 2), "chrf": round(c.score, 2), "signature": str(bleu.get_signature()),
              "chrf_signature": str(chrf.get_signature()), "sentences": len(src)}
    if args.json:
        print(json.dumps(result))
    else:
        print(f"BLEU {result['bleu']:.2f}  ({result['signature']})")
        print(f"chrF {result['chrf']:.2f}  ({result['chrf_signature']})")
    return 0
