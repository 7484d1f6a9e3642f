"""Cleaning (data_prep.normalize + data_prep.clean): one fixture per defect, exact counts, reasons and origins."""
from __future__ import annotations

import csv
import json
from collections import Counter
from pathlib import Path

import pytest
import sentencepiece as spm

from data_prep.binary import SPECIAL_IDS, load_pair
from data_prep.clean import (CleaningOptions, Cleaner, count_words, in_script, script_of, split_sentences,
                             text_key)
from data_prep.filters import REASONS
from data_prep.normalize import PLACEHOLDER, normalize, repair
from data_prep.prepare import main, unescape

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
PARAPAT = SHARED_DATA / "parapat_samples"
ENJA = SHARED_DATA / "small_parallel_enja"
JA = {"entities": True, "markup": True, "cjk_spaces": "auto"}

NOUNS = [("device", "装置"), ("lid", "蓋"), ("valve", "弁"), ("motor", "モータ"), ("pump", "ポンプ"),
         ("sensor", "センサ"), ("gear", "歯車"), ("shaft", "軸")]
# 56 distinct, pre-tokenized en-ja pairs: "the valve has a gear ." / "弁 は 歯車 を 有する 。"
GOOD = [(f"the {a} has a {b} .", f"{ja} は {jb} を 有する 。") for a, ja in NOUNS for b, jb in NOUNS if a != b]


def write_moses(tmp_path: Path, name: str, pairs: list[tuple[str, str]]) -> tuple[Path, Path]:
    paths = (tmp_path / f"{name}.en", tmp_path / f"{name}.ja")
    for k, path in enumerate(paths):
        path.write_bytes("".join(p[k] + "\n" for p in pairs).encode("utf-8", "surrogatepass"))
    return paths


def prepare(*argv) -> int:
    return main([str(a) for a in argv])


def load_manifest(out: Path) -> dict:
    m = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    for s in (m, *m["splits"].values()):
        assert s["pairs_read"] == s["pairs_kept"] + sum(s["rejected"].values())
    return m


def read_rejects(out: Path) -> list[dict]:
    with open(out / "rejects.tsv", encoding="utf-8", newline="") as f:
        rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    return [dict(zip(rows[0], map(unescape, r))) for r in rows[1:]]


def nonzero(counts: dict) -> dict:
    return {k: v for k, v in counts.items() if v}


# --- the repairs, one defect each -----------------------------------------------------------------------------

def test_entities_unescaped_once_and_double_escaped_twice():
    assert repair("a &amp; b &lt;c&gt; &#x3b1;&#945; x&nbsp;y", entities=True) == ("a & b <c> αα x y", {"entities"})
    assert repair("AT&amp;amp;T &amp;lt;5", entities=True) == ("AT&T <5", {"double_escaped"})
    # not references: no ";", unknown names, a third level
    assert normalize("R&D &para x &foo; &amp;amp;amp;", entities=True) == "R&D &para x &foo; &amp;"
    assert normalize("a &amp; b") == "a &amp; b"  # off unless asked (old manifests)


def test_markup_placeholder_and_stripped_tags():
    text = ('H<sub>2</sub>O, <i>E. coli</i> and <maths id="m1" num="1"><math><mi>x</mi></math>'
            '<img id="i1" file="a.tif" img-format="tif"/></maths> or <chem>CH<sub>4</sub></chem><br/>end')
    assert repair(text, markup=True) == (f"H2O, E. coli and {PLACEHOLDER} or {PLACEHOLDER} end", {"markup"})
    assert normalize("x<img src='f.png'>y <MATH>a</MATH>", markup=True) == f"x{PLACEHOLDER}y {PLACEHOLDER}"
    assert normalize("if a<b and c>d, <b>", markup=True) == "if a<b and c>d,"  # only well-formed known tags
    assert normalize("10&lt;sup&gt;-3&lt;/sup&gt;", entities=True, markup=True) == "10-3"  # escaped markup
    assert normalize(PLACEHOLDER, nfkc=True, lowercase=True) == PLACEHOLDER


def test_controls_and_line_breakers_never_survive():
    text = "a\u2028b\u2029c\x85d\x0be\x0cf\rg\x07h\ud800i\ufffej\uffffk\ufdd0l\U0010ffffm\ufeff&#x2028;n&#10;o"
    out, repairs = repair(text, entities=True)
    assert out == "a b c d e f ghijklm n o" and repairs == {"controls", "entities"}
    assert len(out.splitlines()) == 1
    assert repair("plain text", entities=True, markup=True) == ("plain text", set())


def test_cjk_spaces_only_in_running_text():
    assert normalize("パンチ工具６の頭 部１９の上面", cjk_spaces="auto") == "パンチ工具６の頭部１９の上面"
    tokenized = "誰 が 一番 に 着 く か 私 に は 分か り ま せ ん 。"
    assert normalize(tokenized, cjk_spaces="auto") == tokenized
    assert normalize("火事 だ ！ 逃げろ ！", cjk_spaces="auto") == "火事 だ ！ 逃げろ ！"  # full-width punctuation
    assert normalize(tokenized, cjk_spaces="collapse") == tokenized.replace(" ", "")
    assert normalize("繁殖可能なＦ０ ＸＹ雌動物", cjk_spaces="collapse") == "繁殖可能なＦ０ ＸＹ雌動物"  # two tokens
    assert normalize("頭 部", cjk_spaces="keep") == "頭 部"
    flags = CleaningOptions(src_lang="en-US", tgt_lang="ja").normalize_flags
    assert flags("src")["cjk_spaces"] == "keep" and flags("tgt")["cjk_spaces"] == "auto"


@pytest.mark.skipif(not ENJA.is_dir(), reason="shared small_parallel_enja not present")
def test_small_parallel_enja_text_is_untouched():
    """Its Japanese is word-segmented; the default repairs must leave every line as before."""
    for name in ("dev.ja", "test.ja", "train.ja"):
        lines = (ENJA / name).read_text(encoding="utf-8").split("\n")[:-1][:10000]
        assert [normalize(x, **JA) for x in lines] == [normalize(x) for x in lines]


# --- the rules' building blocks -------------------------------------------------------------------------------

def test_script_check():
    en, ja, zh, ko = (script_of(x) for x in ("en_GB", "ja", "zh-Hant", "ko"))
    assert script_of("xx") is None and script_of(None) is None and script_of("RU") == ("cyrillic", 0.5)
    assert in_script("The pump (UE) has a 5°C valve α.", en) and not in_script("ポンプは弁を有する。DNA", en)
    assert in_script("ＴＡＭＳはＨＥＭＡ及びＰＥＧＤＡを含む", ja) and in_script("緩衝部材", ja)
    assert not in_script("die Pumpe hat ein Zahnrad", ja) and not in_script("ＤＮＡ", ja)
    assert in_script("(1) 12.5 %", ja) and in_script("1A", ja)  # fewer than 3 letters: not checked
    assert in_script("本发明的ZnO基同质结发光二极管", zh) and not in_script("the sampling device", zh)
    assert in_script("상기 TAMS는 하이드로겔을 포함한다", ko) and not in_script("前記装置は弁を有する", ko)
    assert in_script("Αυτό είναι ένα PCT σύστημα", script_of("el"))


def test_words_sentences_and_keys():
    assert count_words("the pump has 2 gears .") == 6 and count_words("弁 は 歯車 を") == 5
    assert count_words("緩衝部材２０を") == 6  # full-width digits are not Han or kana: one word
    assert split_sentences("A lid is shown in Fig. 2, e.g. B unit. The pump runs! J. Smith said so. 3 is ok.") == [
        "A lid is shown in Fig. 2, e.g. B unit.", "The pump runs!", "J. Smith said so. 3 is ok."]
    assert split_sentences("蓋を有する。弁は「開く。」 ポンプ？") == ["蓋を有する。", "弁は「開く。」", "ポンプ？"]
    assert text_key("The Cat, (１２)!") == text_key("the cat 12") == "thecat12" != text_key("the cat 13")


def test_dev_cleaner_only_repairs_and_drops_empty():
    cleaner = Cleaner(CleaningOptions(src_lang="en", tgt_lang="ja"), train=False)
    assert [o.reason for o in cleaner.clean("d:1", "x y", "x y")] == [None]  # a copy in a wrong script: kept
    assert [o.reason for o in cleaner.clean("d:2", "x\u2028", "&nbsp;")] == ["empty"]
    assert cleaner.repaired == Counter({"controls": 1, "entities": 1})


# --- the pipeline: every defect counted under its reason, with its origin --------------------------------------

DEFECTS = [  # (name, src, tgt, reason or None when the pair is kept after a repair)
    ("empty", "the pump .", "\u3000\x07", "empty"),
    ("too_long", " ".join(["the device has a lid ."] * 60), "装置 は 蓋 を 有する 。" * 60, "too_long_text"),
    ("copy", "ABC-123", "ＡＢＣ－１２３", "copy"),  # also the wrong script: the first reason counts
    ("latin_ja", "the pump has a gear .", "die Pumpe hat ein Zahnrad .", "wrong_script"),
    ("cjk_en", "モータ の 軸 。", "モータ は 軸 を 有する 。", "wrong_script"),
    ("duplicate", GOOD[0][0], "  " + GOOD[0][1].replace(" ", "  "), "duplicate"),  # equal after normalising
    ("near_dup", "The Device has a LID!", GOOD[0][1], "near_duplicate"),
    ("entities", "the motor &amp; the gear .", "モータ &amp; 歯車 。", None),
    ("double_escaped", "the valve &amp;lt; the pump .", "弁 &amp;lt; ポンプ 。", None),
    ("markup", "the shaft has H<sub>2</sub>O and <maths><math><mi>x</mi></math></maths> .",
     "軸 は H<sub>2</sub>O と <chem>CH<sub>4</sub></chem> を 有する 。", None),
    ("controls", "the lid\u2028of the valve\x07 .", "蓋 の\x85弁 。\ufeff", None),
    ("cjk_spaces", "the lid of the head 19 .", "頭 部１９の蓋。", None),
]
TEST_OPTS = ["--format", "moses", "--src-lang", "en", "--tgt-lang", "ja", "--vocab-size", 200, "--max-ratio", 50]


def defect_corpus(tmp_path: Path) -> tuple[Path, Path, dict[str, int]]:
    pairs = GOOD + [(s, t) for _, s, t, _ in DEFECTS]
    src, tgt = write_moses(tmp_path, "train", pairs)
    return src, tgt, {name: len(GOOD) + i for i, (name, *_) in enumerate(DEFECTS, start=1)}


def test_every_defect_counted_with_reason_and_origin(tmp_path):
    src, tgt, line = defect_corpus(tmp_path)
    dev = write_moses(tmp_path, "dev", [(s, t) for _, s, t, _ in DEFECTS])
    out = tmp_path / "data"
    assert prepare("--train-src", src, "--train-tgt", tgt, "--dev-src", dev[0], "--dev-tgt", dev[1],
                   "--out", out, *TEST_OPTS) == 0
    m = load_manifest(out)
    train, dev_stats = m["splits"]["train"], m["splits"]["dev"]
    assert train["pairs_read"] == len(GOOD) + len(DEFECTS) == 68 and train["pairs_kept"] == len(GOOD) + 5
    assert nonzero(train["rejected"]) == {"empty": 1, "too_long_text": 1, "copy": 1, "wrong_script": 2,
                                          "duplicate": 1, "near_duplicate": 1}
    assert nonzero(train["repaired"]) == {"entities": 1, "double_escaped": 1, "markup": 1, "controls": 2,
                                          "cjk_spaces": 1}  # "controls": the empty pair's BEL too
    rejects = {r["origin"]: r for r in read_rejects(out)}
    for name, _, _, reason in DEFECTS:
        if reason:
            assert rejects[f"{src}:{line[name]}"]["reason"] == reason, name
    assert rejects[f"{src}:{line['latin_ja']}"]["tgt"] == "die Pumpe hat ein Zahnrad ."

    # dev: repaired the same way, only the empty pair dropped
    assert dev_stats["pairs_read"] == len(DEFECTS) and nonzero(dev_stats["rejected"]) == {"empty": 1}
    assert nonzero(dev_stats["repaired"]) == nonzero(train["repaired"])
    assert rejects[f"{dev[0]}:1"]["reason"] == "empty"
    dev_src = (out / "dev.src.txt").read_text(encoding="utf-8").split("\n")[:-1]
    dev_tgt = (out / "dev.tgt.txt").read_text(encoding="utf-8").split("\n")[:-1]
    assert len(dev_src) == len(dev_tgt) == len(DEFECTS) - 1  # no line break survived
    kept = dict(zip([name for name, *_ in DEFECTS[1:]], zip(dev_src, dev_tgt)))
    assert kept["double_escaped"] == ("the valve < the pump .", "弁 < ポンプ 。")
    assert kept["markup"] == (f"the shaft has H2O and {PLACEHOLDER} .", f"軸 は H2O と {PLACEHOLDER} を 有する 。")
    assert kept["controls"] == ("the lid of the valve .", "蓋 の 弁 。")
    assert kept["cjk_spaces"][1] == "頭部１９の蓋。"

    # the trainer's normalize(text, **manifest["normalize"]) gives the text the model was trained on
    assert [normalize(s, **m["normalize"]) for _, s, _, _ in DEFECTS[1:]] == dev_src
    assert [normalize(t, **m["normalize_tgt"]) for _, _, t, _ in DEFECTS[1:]] == dev_tgt

    # the placeholder is one piece of its own, so a kept pair with it decodes back exactly
    sp = spm.SentencePieceProcessor(model_file=str(out / "spm.tgt.model"))
    assert sp.piece_to_id(PLACEHOLDER) != SPECIAL_IDS["unk"]
    tgt_ids = load_pair(str(out), "dev")[1]
    assert sp.decode(tgt_ids[kept_index(DEFECTS, "markup")].tolist()) == kept["markup"][1]

    f = m["filters"]
    assert f["order"] == list(REASONS) and f["copy"] and f["near_dedup"] and f["long"] == "drop"
    assert f["wrong_script"]["tgt"] == {"script": "han+kana", "min_fraction": 0.1}
    assert m["normalize"] == {"nfkc": False, "lowercase": False, "entities": True, "markup": True,
                              "cjk_spaces": "keep"} and m["normalize_tgt"]["cjk_spaces"] == "auto"


def kept_index(defects: list, name: str) -> int:
    """Position of a pair among the kept dev pairs (all but the empty one)."""
    return [n for n, *_ in defects if n != "empty"].index(name)


def test_every_rule_can_be_switched_off(tmp_path):
    src, tgt, _ = defect_corpus(tmp_path)
    out = tmp_path / "data"
    assert prepare("--train-src", src, "--train-tgt", tgt, "--out", out, *TEST_OPTS, "--no-entities", "--no-markup",
                   "--cjk-spaces", "keep", "--max-words", 0, "--keep-copies", "--no-script-filter",
                   "--no-near-dedup") == 0
    m = load_manifest(out)
    train = m["splits"]["train"]
    assert nonzero(train["rejected"]) == {"empty": 1, "duplicate": 1, "too_long": 1}  # too long in pieces
    assert nonzero(train["repaired"]) == {"controls": 2}  # not switchable: never unsafe
    assert m["normalize"] == {"nfkc": False, "lowercase": False, "entities": False, "markup": False,
                              "cjk_spaces": "keep"}
    assert m["filters"]["wrong_script"] == {"src": None, "tgt": None} and m["filters"]["max_words"] == 0

    assert prepare("--train-src", src, "--train-tgt", tgt, "--out", out, *TEST_OPTS, "--no-dedup") == 0
    assert nonzero(load_manifest(out)["splits"]["train"]["rejected"]) == {
        "empty": 1, "too_long_text": 1, "copy": 1, "wrong_script": 2}  # --no-dedup: neither exact nor near


def test_long_pairs_split_at_sentence_ends(tmp_path):
    three_en = "The device is closed. The lid is open. The valve is cold."  # 12 words
    three_ja = "装置は閉じている。蓋は開いている。弁は冷たい。"  # 23 words: a Han or kana character is one
    pairs = GOOD + [(three_en, three_ja),  # 3 = 3 sentences: split, 3 pairs
                    (three_en, "装置は閉じている。蓋は開いていて、弁は冷たい。"),  # 3 != 2: dropped
                    ("The device has a valve. The pump of the device is hot and the motor is cold.",
                     "装置は弁を有する。装置のポンプは熱く、モータは冷たい。")]  # 9 + 18 words; 1st half: GOOD[1]
    src, tgt = write_moses(tmp_path, "train", pairs)
    out = tmp_path / "data"
    assert prepare("--train-src", src, "--train-tgt", tgt, "--out", out, *TEST_OPTS, "--max-words", 20,
                   "--long", "split") == 0
    m = load_manifest(out)
    train = m["splits"]["train"]
    assert train["long_split"] == {"pairs": 2, "segments": 5}
    assert train["pairs_read"] == len(GOOD) + 1 + 3 + 2  # each sentence pair counts as read
    assert nonzero(train["rejected"]) == {"too_long_text": 1, "near_duplicate": 1}
    assert train["pairs_kept"] == len(GOOD) + 3 + 1
    n = len(GOOD)
    assert {r["origin"]: r["reason"] for r in read_rejects(out)} == {
        f"{src}:{n + 2}": "too_long_text", f"{src}:{n + 3}#1": "near_duplicate"}

    assert prepare("--train-src", src, "--train-tgt", tgt, "--out", out, *TEST_OPTS, "--max-words", 20) == 0
    assert nonzero(load_manifest(out)["splits"]["train"]["rejected"]) == {"too_long_text": 3}


# --- real ParaPat lines -----------------------------------------------------------------------------------------

@pytest.mark.skipif(not PARAPAT.is_dir(), reason="shared parapat samples not present")
@pytest.mark.parametrize("name,src_lang,tgt_lang", [("en_ja", "en", "ja"), ("en_zh", "en", "zh"),
                                                     ("de_en", "de", "en"), ("en_fr", "en", "fr"),
                                                     ("en_ko", "en", "ko")])
def test_parapat_samples_lose_nothing_to_the_text_rules(tmp_path, name, src_lang, tgt_lang):
    """Real patent sentences in five language pairs: no copy, script or duplicate false positives."""
    path = PARAPAT / f"{name}.tsv"
    out = tmp_path / "data"
    assert prepare("--train-src", path, "--dev-src", path, "--format", "tsv", "--src-lang", src_lang,
                   "--tgt-lang", tgt_lang, "--out", out, "--joint-vocab", "--max-ratio", 50) == 0
    m = load_manifest(out)
    assert m["splits"]["train"]["pairs_read"] == 5 and m["splits"]["train"]["pairs_kept"] == 5
    assert m["splits"]["dev"]["pairs_kept"] == 5
    if name == "en_ja":  # record 5: "パンチ工具６の頭 部１９の上面" (a stray space inside a word)
        assert nonzero(m["repaired"]) == {"cjk_spaces": 2}  # train and dev
        dev_tgt = (out / "dev.tgt.txt").read_text(encoding="utf-8").split("\n")
        assert "パンチ工具６の頭部１９の上面" in dev_tgt[4] and "頭 部" not in dev_tgt[4]
        assert "繁殖可能なＦ０ ＸＹ雌動物" in dev_tgt[3]
    else:
        assert nonzero(m["repaired"]) == {}


@pytest.mark.skipif(not (PARAPAT / "en_ja.tsv").is_file(), reason="shared parapat sample not present")
def test_parapat_full_width_with_nfkc(tmp_path):
    out = tmp_path / "data"
    path = PARAPAT / "en_ja.tsv"
    assert prepare("--train-src", path, "--dev-src", path, "--format", "tsv", "--src-lang", "en", "--tgt-lang", "ja",
                   "--out", out, "--joint-vocab", "--nfkc") == 0
    m = load_manifest(out)
    assert m["splits"]["dev"]["repaired"]["nfkc"] == 5  # every Japanese line has full-width digits
    dev_tgt = (out / "dev.tgt.txt").read_text(encoding="utf-8").split("\n")
    assert dev_tgt[0] == "コンピュータシステム(200)は、データベース部(204)に接続されている。"
    assert "繁殖可能なF0 XY雌動物" in dev_tgt[3]
