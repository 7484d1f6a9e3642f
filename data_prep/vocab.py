"""SentencePiece training for `data_prep.prepare`: a seeded sample of the kept pairs, one model per side or a joint one."""
from __future__ import annotations

import io
import os
import random
import re
import shutil
import sys
from dataclasses import dataclass
from typing import Iterator

import sentencepiece as spm

from .binary import SPECIAL_IDS
from .normalize import PLACEHOLDER
from .readers import PrepareError

CHARACTER_COVERAGE = 0.9995
MAX_SENTENCE_BYTES = 1 << 16  # SentencePiece's default (4192) would silently skip whole patent abstracts
_TOO_HIGH = re.compile(r"Vocabulary size too high \((\d+)\)\. Please set it to a value <= (\d+)")
_TOO_LOW = re.compile(r"Vocabulary size is smaller than required_chars\. (\d+) vs (\d+)")


@dataclass(frozen=True)
class VocabResult:
    src_size: int
    tgt_size: int
    requested: int


def sample_flags(n: int, k: int, seed: int | str) -> Iterator[bool]:
    """For each of `n` items in order, whether it is in a seeded uniform sample of min(n, k) of them.

    Selection sampling (Knuth's Algorithm S): one pass, constant memory whatever `n` and `k` are; item i is
    taken with probability (still wanted) / (still left), so exactly min(n, k) are, and all of them when n <= k.
    """
    rng, wanted = random.Random(seed), k
    for left in range(n, 0, -1):
        take = wanted > 0 and rng.random() * left < wanted
        wanted -= take
        yield take


def train_model(input_file: str, model_prefix: str, *, vocab_size: int, model_type: str, seed: int) -> int:
    """Train one model and return its size.

    The size SentencePiece can reach depends on the corpus: a small one cannot fill a large vocabulary, and the
    vocabulary must hold every character that `CHARACTER_COVERAGE` keeps. Instead of failing, the size is moved
    to the nearest one SentencePiece accepts (with a warning); the manifest records requested and actual sizes.
    """
    spm.set_random_generator_seed(seed)
    args = dict(model_type=model_type, character_coverage=CHARACTER_COVERAGE, num_threads=2,
                input_sentence_size=0,  # the caller already sampled (seeded) at most --spm-sample sentences
                max_sentence_length=MAX_SENTENCE_BYTES, normalization_rule_name="identity",
                pad_id=SPECIAL_IDS["pad"], unk_id=SPECIAL_IDS["unk"], bos_id=SPECIAL_IDS["bos"],
                eos_id=SPECIAL_IDS["eos"], minloglevel=2,
                user_defined_symbols=[PLACEHOLDER])  # always one piece, never <unk> (data_prep.normalize)
    size = vocab_size
    for _ in range(3):
        try:
            model = io.BytesIO()
            with open(input_file, encoding="utf-8", newline="\n") as f:
                spm.SentencePieceTrainer.train(sentence_iterator=(line.rstrip("\n") for line in f),
                                               model_writer=model, vocab_size=size, **args)
            break
        except RuntimeError as e:
            too_high, too_low = _TOO_HIGH.search(str(e)), _TOO_LOW.search(str(e))
            if not (too_high or too_low):
                raise PrepareError(f"SentencePiece training failed on {input_file}: {e}") from None
            new_size = int((too_high or too_low).group(2))
            print(f"prepare: warning: {os.path.basename(model_prefix)}: vocabulary size {size} -> {new_size} "
                  f"({'the most this corpus supports' if too_high else 'the characters to cover plus specials'})",
                  file=sys.stderr)
            size = new_size
    else:
        raise PrepareError(f"SentencePiece found no usable vocabulary size for {input_file} (last tried {size})")
    return write_model(model.getvalue(), model_prefix)


def write_model(proto: bytes, model_prefix: str) -> int:
    """`{prefix}.model` and a `{prefix}.vocab` listing like spm_train's; returns the vocabulary size.

    Training from an iterator into memory keeps file paths out of the model, so the same data gives
    byte-identical models wherever DATA_DIR is.
    """
    with open(model_prefix + ".model", "wb") as f:
        f.write(proto)
    sp = spm.SentencePieceProcessor(model_proto=proto)
    with open(model_prefix + ".vocab", "w", encoding="utf-8") as f:
        for i in range(sp.get_piece_size()):
            f.write(f"{sp.id_to_piece(i)}\t{sp.get_score(i):g}\n")
    return sp.get_piece_size()


def train_vocab(sample_dir: str, out_dir: str, *, joint: bool, vocab_size: int, model_type: str,
                seed: int) -> VocabResult:
    """Models from `sample_dir/sample.{src,tgt}.txt` (or `sample.joint.txt`) -> `out_dir/spm.{src,tgt}.{model,vocab}`."""
    kw = dict(vocab_size=vocab_size, model_type=model_type, seed=seed)
    if joint:
        size = train_model(os.path.join(sample_dir, "sample.joint.txt"), os.path.join(out_dir, "spm.src"), **kw)
        for ext in ("model", "vocab"):
            shutil.copyfile(os.path.join(out_dir, f"spm.src.{ext}"), os.path.join(out_dir, f"spm.tgt.{ext}"))
        return VocabResult(size, size, vocab_size)
    sizes = [train_model(os.path.join(sample_dir, f"sample.{side}.txt"), os.path.join(out_dir, f"spm.{side}"), **kw)
             for side in ("src", "tgt")]
    return VocabResult(sizes[0], sizes[1], vocab_size)


def sample_files(sample_dir: str, joint: bool) -> tuple[str, str]:
    if joint:
        path = os.path.join(sample_dir, "sample.joint.txt")
        return path, path
    return os.path.join(sample_dir, "sample.src.txt"), os.path.join(sample_dir, "sample.tgt.txt")
