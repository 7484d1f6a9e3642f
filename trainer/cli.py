"""What the thin entry points in launch/ call."""
from __future__ import annotations

import json
import os
import sys


def fail(err: Exception) -> None:
    """A user error: one line on stderr, exit code 2, no traceback."""
    print(f"error: {err}", file=sys.stderr, flush=True)
    sys.exit(2)


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

    cfg = load_config(config_path, overrides)
    Trainer(cfg, ds_config_path).fit()
    if dist.is_initialized():  # leave together: no rank tears gloo down under a peer still talking
        dist.barrier()
        dist.destroy_process_group()
    return 0


def _translator(args):
    import torch

    from trainer.translator import Translator

    torch.set_num_threads(max(1, torch.get_num_threads()))
    return Translator.from_run(args.run, args.checkpoint)


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
