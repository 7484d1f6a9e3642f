"""The project's embedded default corpus: synthetic English -> Japanese patent claims.

    python -m data_prep.demo_corpus --out DIR [--pairs 20000] [--dev 500] [--test 500] [--seed 1] [--report]
        [--ja-spaces] [--en-tokens]

writes DIR/{train,dev,test}.{en,ja} in the Moses layout (line i of .en pairs with line i of .ja).
Sentences come from a small claim grammar over the lexicon in `data_prep.demo_lexicon`:

    A device comprising a housing, a sensor coupled to the housing, and a controller
        configured to adjust the temperature of the chamber.
    装置は、筐体、筐体に結合されたセンサ、及びチャンバの温度を調整するように構成された制御部を備える。

Both sides are written as real patent text is: the English capitalised and untokenised (`--en-tokens`
writes the grammar's tokens, "a device comprising a housing , ..."), the Japanese without spaces
(`--ja-spaces` keeps the grammar's word boundaries: "装置 は 、 筐体 、 ..."). `generate` returns the
token- and word-separated forms, which the grammar builds and `report` counts.

Every English word has one Japanese rendering and there is no noise, so the only thing to learn
is the reordering: verbs go last, modifiers and relative clauses go before their noun, and
"the X of the Y" becomes "Y の X". `monotone_baseline` (word-by-word, English order) shows how
much of the score that reordering is worth; `--report` prints its test BLEU.

Each builder below returns a `Phrase` holding both languages, so a derivation yields its English
and Japanese at once and the Japanese is a function of the derivation. The grammar never lets two
derivations produce the same English (no coordination inside objects, no adjective-noun overlaps),
so the Japanese is also a function of the English sentence.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import random
import re
import sys
from typing import NamedTuple, Sequence

import sacrebleu

from data_prep import files
from data_prep.demo_lexicon import (
    ADJECTIVES, ADJUNCTS, COMPONENTS, FUNCTION_GLOSSES, HEADS, LIMITS, MATERIALS, METHOD_VERBS, ORDINALS, PARTS,
    PROPERTIES, RELATIONS, VERBS, Noun, Relation, Verb, Word,
)

SPLITS = ("train", "dev", "test")
LANGS = ("en", "ja")
MIN_TOKENS, MAX_TOKENS = 6, 50  # English tokens; longer or shorter draws are redrawn


class Phrase(NamedTuple):
    """One constituent in both languages, each a space-tokenized string.

    For a relative clause `en` is what follows the head noun and `ja` what precedes it."""

    en: str
    ja: str


def _join(*parts: str) -> str:
    return " ".join(p for p in parts if p)


def _with_article(det: str, words: str) -> str:
    if det == "a" and words[0] in "aeiou":
        det = "an"
    return _join(det, words)


def _passive(stem: str, final: bool) -> str:
    """`さ れ` + `た` before a noun, + `る` when it ends the clause."""
    return f"{stem} {'る' if final else 'た'}"


# ---- noun phrases ----------------------------------------------------------------------------------

def noun_phrase(noun: Noun | Word, det: str = "the", adjectives: Sequence[Word] = (),
                modifier: Phrase | None = None) -> Phrase:
    """`det adjectives noun modifier` -> `modifier adjectives noun`."""
    core = _join(*(a.en for a in adjectives), noun.en)
    mod_en, mod_ja = modifier if modifier else ("", "")
    return Phrase(_join(_with_article(det, core), mod_en), _join(mod_ja, *(a.ja for a in adjectives), noun.ja))


def plurality(noun: Noun, adjectives: Sequence[Word] = ()) -> Phrase:
    """`a plurality of first electrodes` -> `複数 の 第 1 の 電極`."""
    en = _join(*(a.en for a in adjectives), noun.plural)
    return Phrase(f"a plurality of {en}", _join("複数 の", *(a.ja for a in adjectives), noun.ja))


def of_phrase(head: Word, owner: Phrase, det: str = "the") -> Phrase:
    """`the temperature of the chamber` -> `チャンバ の 温度` (nests: `C の B の A`)."""
    return Phrase(f"{_with_article(det, head.en)} of {owner.en}", f"{owner.ja} の {head.ja}")


def listing(items: Sequence[Phrase]) -> Phrase:
    """`A and B` / `A , B , and C` -> `A 及び B` / `A 、 B 、 及び C`."""
    if len(items) == 1:
        return items[0]
    *init, last = items
    if len(items) == 2:
        return Phrase(f"{init[0].en} and {last.en}", f"{init[0].ja} 及び {last.ja}")
    return Phrase(" , ".join(i.en for i in init) + f" , and {last.en}",
                  " 、 ".join(i.ja for i in init) + f" 、 及び {last.ja}")


# ---- clauses modifying a noun (`final=True` gives the clause-ending form, for "wherein X is ...") -----

def related(relation: Relation, obj: Phrase, final: bool = False) -> Phrase:
    """`coupled to the housing` -> `筐体 に 結合 さ れ た`."""
    return Phrase(f"{relation.en} {obj.en}", f"{obj.ja} {relation.post} {_passive(relation.stem, final)}")


def configured_to(verb: Verb, obj: Phrase, final: bool = False) -> Phrase:
    """`configured to adjust X` -> `X を 調整 する よう に 構成 さ れ た`."""
    return Phrase(f"configured to {verb.base} {obj.en}", f"{obj.ja} を {verb.ja} よう に {_passive('構成 さ れ', final)}")


def made_of(material: Word, final: bool = False) -> Phrase:
    return Phrase(f"made of {material.en}", f"{material.ja} で {_passive('形成 さ れ', final)}")


def having(obj: Phrase) -> Phrase:
    return Phrase(f"having {obj.en}", f"{obj.ja} を 有する")


def for_doing(verb: Verb, obj: Phrase) -> Phrase:
    return Phrase(f"for {verb.gerund} {obj.en}", f"{obj.ja} を {verb.ja} ため の")


# ---- method steps and conditions ------------------------------------------------------------------

def adjunct(prep: Word, obj: Phrase) -> Phrase:
    return Phrase(f"{prep.en} {obj.en}", f"{obj.ja} {prep.ja}")


def based_on(obj: Phrase) -> Phrase:
    return Phrase(f"based on {obj.en}", f"{obj.ja} に 基づい て")


def step(verb: Verb, obj: Phrase, extra: Phrase | None = None) -> Phrase:
    """`forming a layer on the substrate` -> `基板 上 に 層 を 形成 する`."""
    extra_en, extra_ja = extra if extra else ("", "")
    return Phrase(_join(verb.gerund, obj.en, extra_en), _join(extra_ja, obj.ja, "を", verb.ja))


def comparison(quantity: Phrase, limit: Word, exceeds: bool) -> Phrase:
    """`the pressure of the tank exceeds a threshold` -> `タンク の 圧力 が 閾値 を 超える`."""
    verb_en, verb_ja = ("exceeds", "超える") if exceeds else ("falls below", "下回る")
    return Phrase(f"{quantity.en} {verb_en} {limit.en}", f"{quantity.ja} が {limit.ja} を {verb_ja}")


def determining_whether(condition: Phrase) -> Phrase:
    return Phrase(f"determining whether {condition.en}", f"{condition.ja} か 否 か を 判定 する")


# ---- "wherein" clauses: each ends in a finite predicate ---------------------------------------------

def is_(subject: Phrase, participle: Phrase) -> Phrase:
    """`the sensor is coupled to the housing` -> `センサ は 筐体 に 結合 さ れ る`."""
    return Phrase(f"{subject.en} is {participle.en}", f"{subject.ja} は {participle.ja}")


def comprises(subject: Phrase, parts: Sequence[Phrase]) -> Phrase:
    body = listing(parts)
    return Phrase(f"{subject.en} comprises {body.en}", f"{subject.ja} は {body.ja} を 備える")


def includes(subject: Phrase, many: Phrase) -> Phrase:
    return Phrase(f"{subject.en} includes {many.en}", f"{subject.ja} は {many.ja} を 含む")


def compared(left: Phrase, right: Phrase, greater: bool) -> Phrase:
    """`A is greater than B` -> `A は B より 大きい`."""
    en, ja = ("greater", "大きい") if greater else ("less", "小さい")
    return Phrase(f"{left.en} is {en} than {right.en}", f"{left.ja} は {right.ja} より {ja}")


def acts_when(subject: Phrase, verb: Verb, obj: Phrase, condition: Phrase) -> Phrase:
    """`S adjusts X when C` -> `S は 、 C と 、 X を 調整 する`."""
    return Phrase(f"{subject.en} {verb.third} {obj.en} when {condition.en}",
                  f"{subject.ja} は 、 {condition.ja} と 、 {obj.ja} を {verb.ja}")


# ---- whole claims: every Japanese claim ends in a verb (or adjective) before 。 ------------------------

def device_claim(head: Noun, components: Sequence[Phrase], wherein: Phrase | None = None) -> Phrase:
    """`a device comprising A , B , and C .` -> `装置 は 、 A 、 B 、 及び C を 備える 。`"""
    body = listing(components)
    en = f"{_with_article('a', head.en)} comprising {body.en}"
    if wherein is None:
        return Phrase(f"{en} .", f"{head.ja} は 、 {body.ja} を 備える 。")
    return Phrase(f"{en} , wherein {wherein.en} .", f"{head.ja} は 、 {body.ja} を 備え 、 {wherein.ja} 。")


def method_claim(verb: Verb, obj: Phrase, steps: Sequence[Phrase]) -> Phrase:
    """`a method of V X , comprising : A ; and B .` -> `X を V 方法 は 、 A 工程 と 、 B 工程 と を 含む 。`"""
    *init, last = steps
    en = (f"a method of {verb.gerund} {obj.en} , comprising : " + "".join(f"{s.en} ; " for s in init)
          + f"and {last.en} .")
    ja = f"{obj.ja} を {verb.ja} 方法 は 、 " + " 、 ".join(f"{s.ja} 工程 と" for s in steps) + " を 含む 。"
    return Phrase(en, ja)


def dependent_claim(head: Phrase, claim: int, wherein: Phrase) -> Phrase:
    """`the device according to claim 3 , wherein W .` -> `請求 項 3 に 記載 の 装置 に おい て 、 W 。`"""
    return Phrase(f"{head.en} according to claim {claim} , wherein {wherein.en} .",
                  f"請求 項 {claim} に 記載 の {head.ja} に おい て 、 {wherein.ja} 。")


def further_comprising(head: Phrase, claim: int, addition: Phrase, is_method: bool) -> Phrase:
    tail = "工程 を さらに 含む" if is_method else "を さらに 備える"
    return Phrase(f"{head.en} according to claim {claim} , further comprising {addition.en} .",
                  f"請求 項 {claim} に 記載 の {head.ja} は 、 {addition.ja} {tail} 。")


METHOD = Phrase("the method", "方法")


class ClaimSampler:
    """Draws claims from the grammar above; all randomness comes from the given `random.Random`."""

    def __init__(self, rng: random.Random, max_tokens: int = MAX_TOKENS):
        self.rng, self.max_tokens = rng, max_tokens
        self.pick = rng.choice

    def chance(self, p: float) -> bool:
        return self.rng.random() < p

    def adjectives(self) -> list[Word]:
        ordinal = [self.pick(ORDINALS)] if self.chance(0.15) else []
        return ordinal + ([self.pick(ADJECTIVES)] if self.chance(0.2) else [])

    def simple(self, det: str = "the") -> Phrase:
        return noun_phrase(self.pick(COMPONENTS), det, self.adjectives())

    def place(self) -> Phrase:
        """A component or a part of one: `the upper surface of the substrate`."""
        return of_phrase(self.pick(PARTS), self.simple()) if self.chance(0.5) else self.simple()

    def quantity(self) -> Phrase:
        """`the temperature of [the surface of] the chamber`."""
        owner = of_phrase(self.pick(PARTS), self.simple()) if self.chance(0.25) else self.simple()
        return of_phrase(self.pick(PROPERTIES), owner)

    def thing(self) -> Phrase:
        """The object of a verb."""
        return self.quantity() if self.chance(0.45) else self.place()

    def participle(self, final: bool) -> Phrase:
        r = self.rng.random()
        if r < 0.55:
            return related(self.pick(RELATIONS), self.place(), final)
        if r < 0.85:
            return configured_to(self.pick(VERBS), self.thing(), final)
        return made_of(self.pick(MATERIALS), final)

    def relative_clause(self) -> Phrase:
        r = self.rng.random()
        if r < 0.75:
            return self.participle(final=False)
        if r < 0.87:
            return having(self.simple("a"))
        return for_doing(self.pick(VERBS), self.thing())

    def component(self) -> tuple[Phrase, Phrase]:
        """An introduced component (`a sensor coupled to ...`) and how later clauses refer to it."""
        noun, adjs = self.pick(COMPONENTS), self.adjectives()
        modifier = self.relative_clause() if self.chance(0.8) else None
        return noun_phrase(noun, "a", adjs, modifier), noun_phrase(noun, "the", adjs)

    def condition(self) -> Phrase:
        return comparison(self.quantity(), self.pick(LIMITS), exceeds=self.chance(0.5))

    def wherein(self, subject: Phrase) -> Phrase:
        r = self.rng.random()
        if r < 0.4:
            return is_(subject, self.participle(final=True))
        if r < 0.52:
            return comprises(subject, [self.simple("a") for _ in range(self.pick((2, 2, 3)))])
        if r < 0.62:
            return includes(subject, plurality(self.pick(COMPONENTS), self.adjectives()))
        if r < 0.77:
            prop = self.pick(PROPERTIES)
            return compared(of_phrase(prop, subject), of_phrase(prop, self.simple()), greater=self.chance(0.5))
        return acts_when(subject, self.pick(VERBS), self.thing(), self.condition())

    def step(self) -> Phrase:
        if self.chance(0.12):
            return determining_whether(self.condition())
        r = self.rng.random()
        extra = None
        if r < 0.4:
            extra = adjunct(self.pick(ADJUNCTS), self.simple())
        elif r < 0.55:
            extra = based_on(self.quantity())
        return step(self.pick(VERBS), self.thing(), extra)

    def claim(self) -> Phrase:
        r = self.rng.random()
        if r < 0.25:
            components = [self.component() for _ in range(self.pick((2, 2, 3, 3, 3, 4)))]
            wherein = self.wherein(self.pick(components)[1]) if self.chance(0.3) else None
            return device_claim(self.pick(HEADS), [full for full, _ in components], wherein)
        if r < 0.55:
            obj = noun_phrase(self.pick(HEADS + COMPONENTS), "a")
            return method_claim(self.pick(METHOD_VERBS), obj, [self.step() for _ in range(self.pick((2, 2, 3, 3, 4)))])
        is_method = self.chance(0.35)
        head = METHOD if is_method else noun_phrase(self.pick(HEADS), "the")
        claim_no = self.rng.randint(1, 20)
        if self.chance(0.65):
            subject = self.simple() if self.chance(0.7) else self.place()
            return dependent_claim(head, claim_no, self.wherein(subject))
        addition = self.step() if is_method else self.component()[0]
        return further_comprising(head, claim_no, addition, is_method)

    def sentence(self) -> Phrase:
        """A claim of MIN_TOKENS..max_tokens English tokens."""
        while True:
            claim = self.claim()
            if MIN_TOKENS <= len(claim.en.split()) <= self.max_tokens:
                return claim


def generate(pairs: int = 20000, seed: int = 1, dev: int = 500, test: int = 500,
             max_tokens: int = MAX_TOKENS) -> dict[str, list[tuple[str, str]]]:
    """{split: [(en, ja), ...]} with no English sentence repeated within or across splits, each of at most
    `max_tokens` English tokens (shorter claims: the same grammar, fewer and shorter lists and clauses).

    Each split draws from its own stream (seeded by seed and split name), test first, then dev,
    then train skipping what the held-out splits took; so test and dev do not depend on --pairs."""
    taken: set[str] = set()
    corpus: dict[str, list[tuple[str, str]]] = {}
    for split, count in (("test", test), ("dev", dev), ("train", pairs)):
        sampler = ClaimSampler(random.Random(f"demo-corpus:{seed}:{split}"), max_tokens)
        rows: list[tuple[str, str]] = []
        for _ in range(20 * count + 1000):
            if len(rows) == count:
                break
            en, ja = sampler.sentence()
            if en not in taken:
                taken.add(en)
                rows.append((en, ja))
        if len(rows) < count:
            raise RuntimeError(f"{split}: only {len(rows)} distinct sentences after many draws; asked for {count}")
        corpus[split] = rows
    return {split: corpus[split] for split in SPLITS}


def raw_japanese(ja: str) -> str:
    """The grammar's word-separated Japanese as running text: Japanese puts no spaces between words (the
    lexicon has no Latin words on the Japanese side that the spaces would keep apart)."""
    return ja.replace(" ", "")


_SPACE_BEFORE_PUNCT = re.compile(r" ([,.;:])")


def natural_english(en: str) -> str:
    """The grammar's English tokens as patent text is written: the first letter capitalised and no space
    before punctuation ("the device according to claim 3 , wherein ..." -> "The device according to claim 3,
    wherein ..."). A model trained on tokenised, lowercased English misreads such input (it translated "The
    method according to claim 3, ..." with the wrong subject), and translate does not tokenise."""
    text = _SPACE_BEFORE_PUNCT.sub(r"\1", en)
    return text[:1].upper() + text[1:]


def as_written(corpus: dict[str, list[tuple[str, str]]], ja_spaces: bool = False,
               en_tokens: bool = False) -> dict[str, list[tuple[str, str]]]:
    """The corpus as a file holds it: natural English (`en_tokens`: the grammar's tokens) and raw Japanese
    (`ja_spaces`: the grammar's words)."""
    return {s: [(en if en_tokens else natural_english(en), ja if ja_spaces else raw_japanese(ja)) for en, ja in rows]
            for s, rows in corpus.items()}


def write_corpus(out_dir: str, pairs: int = 20000, seed: int = 1, dev: int = 500, test: int = 500,
                 ja_spaces: bool = False, corpus: dict | None = None,
                 en_tokens: bool = False) -> dict[str, list[tuple[str, str]]]:
    """Writes out_dir/{train,dev,test}.{en,ja} (of `corpus`, default: `generate`'s) and returns what it wrote:
    natural English unless `en_tokens`, the Japanese without spaces unless `ja_spaces`."""
    corpus = as_written(corpus or generate(pairs=pairs, seed=seed, dev=dev, test=test), ja_spaces, en_tokens)
    files.make_dirs(out_dir, "the corpus directory", "--out")
    for split, rows in corpus.items():
        for i, lang in enumerate(LANGS):
            with files.replace(os.path.join(out_dir, f"{split}.{lang}"), "the corpus") as f:
                f.writelines(row[i] + "\n" for row in rows)
    return corpus


@functools.cache
def _phrase_table() -> tuple[dict[tuple[str, ...], str], int]:
    """English word sequence -> Japanese, from the lexicon and the function-word glosses."""
    table: dict[tuple[str, ...], str] = {}

    def add(en: str, ja: str) -> None:
        table.setdefault(tuple(en.split()), ja)

    for en, ja in FUNCTION_GLOSSES.items():
        add(en, ja)
    for noun in COMPONENTS + HEADS:
        add(noun.en, noun.ja)
        add(noun.plural, noun.ja)
    for word in PARTS + PROPERTIES + MATERIALS + ORDINALS + ADJECTIVES + LIMITS:
        add(word.en, word.ja)
    for verb in VERBS:
        for form in (verb.base, verb.third, verb.gerund):
            add(form, verb.ja)
    for rel in RELATIONS:
        add(rel.en, f"{rel.post} {_passive(rel.stem, final=False)}")
    return table, max(len(k) for k in table)


def monotone_baseline(src_lines: Sequence[str]) -> list[str]:
    """Word-by-word lexicon translation in English order (longest lexicon match first; unknown
    tokens such as claim numbers are copied). What a model gets without learning to reorder."""
    table, longest = _phrase_table()
    out = []
    for line in src_lines:
        words, i, ja = line.split(), 0, []
        while i < len(words):
            for n in range(min(longest, len(words) - i), 0, -1):
                gloss = table.get(tuple(words[i:i + n]))
                if gloss is not None:
                    break
            else:
                n, gloss = 1, words[i]
            if gloss:
                ja.append(gloss)
            i += n
        out.append(" ".join(ja))
    return out


def report(corpus: dict[str, list[tuple[str, str]]]) -> dict:
    """Counts, vocabulary and mean lengths (over train, in the grammar's words), and the monotone baseline's
    test BLEU as the quickstart scores a model: on the raw Japanese, tokenized by MeCab (ja-mecab)."""
    train = corpus["train"]
    stats: dict = {"pairs": {split: len(rows) for split, rows in corpus.items()}}
    for i, lang in enumerate(LANGS):
        lengths = [len(row[i].split()) for row in train]
        stats[f"train_{lang}"] = {
            "vocab": len({tok for row in train for tok in row[i].split()}),
            "mean_tokens": round(sum(lengths) / max(len(lengths), 1), 2),
            "max_tokens": max(lengths, default=0),
        }
    test_en = [en for en, _ in corpus["test"]]
    test_ja = [ja for _, ja in corpus["test"]]
    hyps, refs = [raw_japanese(h) for h in monotone_baseline(test_en)], [raw_japanese(r) for r in test_ja]
    stats["test_bleu_monotone_baseline"] = round(sacrebleu.corpus_bleu(hyps, [refs], tokenize="ja-mecab").score, 2)
    stats["test_chrf_monotone_baseline"] = round(sacrebleu.corpus_chrf(hyps, [refs]).score, 2)
    return stats


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="directory for {train,dev,test}.{en,ja}")
    parser.add_argument("--pairs", type=int, default=20000, help="training pairs")
    parser.add_argument("--dev", type=int, default=500)
    parser.add_argument("--test", type=int, default=500)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--report", action="store_true", help="print corpus statistics and baseline BLEU as JSON")
    parser.add_argument("--ja-spaces", action="store_true",
                        help="write the Japanese with spaces between words (default: raw, as patents are)")
    parser.add_argument("--en-tokens", action="store_true",
                        help="write the English as the grammar's lowercase tokens, a space before each comma and "
                             "period (default: as patents are written, 'The device according to claim 3, wherein')")
    parser.add_argument("--max-words", type=int, default=MAX_TOKENS,
                        help="longest English claim in words (default %(default)s; the quickstart uses shorter ones)")
    parser.add_argument("--baseline-out", default=None, metavar="FILE",
                        help="write the word-by-word baseline's translation of the test set here (one per line, "
                             "as the Japanese is written), for launch/evaluate.py --baseline")
    args = parser.parse_args(argv)
    if not (args.out or args.report or args.baseline_out):
        parser.error("nothing to do: give --out DIR, --baseline-out FILE and/or --report")
    if args.max_words < MIN_TOKENS:
        parser.error(f"--max-words {args.max_words}: must be at least {MIN_TOKENS}")
    sizes = dict(pairs=args.pairs, seed=args.seed, dev=args.dev, test=args.test, max_tokens=args.max_words)
    try:
        with files.command():  # a stop signal: one line, the file under way removed
            corpus = generate(**sizes)
            if args.out:
                write_corpus(args.out, ja_spaces=args.ja_spaces, corpus=corpus, en_tokens=args.en_tokens)
            if args.baseline_out:
                hyps = monotone_baseline([en for en, _ in corpus["test"]])
                with files.replace(args.baseline_out, "the baseline translations", flag="--baseline-out") as f:
                    f.writelines((h if args.ja_spaces else raw_japanese(h)) + "\n" for h in hyps)
    except OSError as e:  # the file layer's one line
        parser.exit(2, f"{parser.prog}: error: {e}\n")
    if args.report:
        print(json.dumps(report(corpus), indent=2, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
