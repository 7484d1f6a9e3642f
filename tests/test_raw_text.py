"""Raw patent text (issue: real patent text end to end): BLEU tokenizers by target language, SentencePiece with
byte fallback / digit splitting / per-language coverage / soft size, formulas restored, long-input segments."""
from __future__ import annotations

import io

import pytest
import sentencepiece as spm

from data_prep.clean import count_words
from data_prep.normalize import PLACEHOLDER, repair, restore_formulas
from data_prep.segment import TrainingLimits, join_segments, segment
from data_prep.vocab import ALPHABETIC_COVERAGE, CJK_COVERAGE, character_coverage, required_size, train_model
from trainer import metrics

# --- BLEU on raw CJK text --------------------------------------------------------------------------------

REF_JA = ["基板の温度は２５℃である。", "前記制御部は前記ヒータを停止する。", "前記センサは前記筐体に取り付けられている。"]
HYP_JA = [REF_JA[0], REF_JA[1], "前記センサは前記筐体に固定されている。"]  # one word changed


def test_13a_cannot_score_raw_japanese_and_the_language_tokenizers_can():
    thirteen = metrics.score(HYP_JA, REF_JA, "13a")
    mecab = metrics.score(HYP_JA, REF_JA, "ja-mecab")
    assert thirteen.bleu < 1  # each sentence is about one token: nothing to count n-grams of (measured 0.00)
    assert mecab.bleu > 80 and "tok:ja-mecab" in mecab.bleu_signature
    assert metrics.score(HYP_JA, REF_JA, "char").bleu > 80 and mecab.chrf > 80


@pytest.mark.parametrize("lang,expected", [("ja", "ja-mecab"), ("ja-JP", "ja-mecab"), ("zh", "zh"), ("zh_TW", "zh"),
                                           ("ko", "ko-mecab"), ("en", "13a"), ("de", "13a")])
def test_auto_tokenizer_follows_the_target_language(lang, expected):
    assert metrics.resolve_tokenize("auto", lang) == expected
    assert metrics.resolve_tokenize("char", lang) == "char"  # an explicit choice is kept
    assert metrics.tokenizer_problem(expected) is None  # installed by requirements.txt, works offline


def test_auto_tokenizer_guesses_from_the_references_when_the_manifest_has_no_language():
    assert metrics.manifest_lang({"options": {"tgt_lang": "ko-KR"}}) == "ko"
    assert metrics.manifest_lang({"languages": {"tgt": "zh"}, "options": {"tgt_lang": "ja"}}) == "zh"
    assert metrics.resolve_tokenize("auto", None, REF_JA) == "ja-mecab"
    assert metrics.resolve_tokenize("auto", None, ["기판의 온도는 25도이다."]) == "ko-mecab"
    assert metrics.resolve_tokenize("auto", None, ["基板的温度为25度。"]) == "zh"
    assert metrics.resolve_tokenize("auto", None, ["The substrate is heated."]) == "13a"


def test_a_missing_tokenizer_package_is_a_clear_config_error(monkeypatch):
    import builtins

    from trainer.config import ConfigError, load_config

    real_import = builtins.__import__

    def no_mecab(name, *args, **kwargs):
        if name in ("MeCab", "ipadic"):
            raise ImportError(f"No module named '{name}'")
        return real_import(name, *args, **kwargs)

    import sacrebleu.tokenizers.tokenizer_ja_mecab as ja  # the tokenizer's module imports MeCab when built

    monkeypatch.setattr(builtins, "__import__", no_mecab)
    monkeypatch.delitem(__import__("sys").modules, ja.__name__)
    monkeypatch.delitem(__import__("sys").modules, "MeCab", raising=False)
    with pytest.raises(ConfigError, match=r"decode.bleu_tokenize=ja-mecab: tokenizer ja-mecab needs mecab-python3"):
        load_config(None, ["decode.bleu_tokenize=ja-mecab"])
    with pytest.raises(ValueError, match=r"decode.bleu_tokenize=auto \(-> ja-mecab\)"):
        metrics.dev_tokenize("auto", {"languages": {"tgt": "ja"}}, "/nonexistent")
    assert metrics.dev_tokenize("auto", {"languages": {"tgt": "en"}}, "/nonexistent") == "13a"
    with pytest.raises(Exception, match="one of auto, 13a"):
        load_config(None, ["decode.bleu_tokenize=mecab"])


# --- SentencePiece ------------------------------------------------------------------------------------------

def _train(tmp_path, lines, size, coverage=ALPHABETIC_COVERAGE, model_type="unigram"):
    path = tmp_path / "sample.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    n = train_model(str(path), str(tmp_path / "m"), vocab_size=size, model_type=model_type, seed=1, coverage=coverage)
    return n, spm.SentencePieceProcessor(model_file=str(tmp_path / "m.model"))


JA_LINES = [f"第{i}の基板の温度を測定する工程と、前記温度が閾値を超えた場合に加熱を停止する工程とを含む方法。"
            for i in range(1, 200)] + ["センサは筐体に結合されている。", "制御部はヒータを制御する。"] * 50


def test_byte_fallback_keeps_unseen_characters_and_digits_are_split(tmp_path):
    _, sp = _train(tmp_path, JA_LINES, 400, coverage=CJK_COVERAGE)
    text = "基板の温度は２５℃である"  # ℃, ２ and ５ never occur in the training text
    ids = sp.encode(text)
    assert 1 not in ids and sp.decode(ids) == text  # no <unk>, the exact text back
    assert any(sp.id_to_piece(i).startswith("<0x") for i in ids)
    pieces = sp.encode("第123の基板", out_type=str)
    assert "1" in pieces and "2" in pieces and "3" in pieces  # a number is spelt digit by digit: it can be copied


def test_alphabetic_languages_cover_every_character(tmp_path):
    lines = [f"the tolerance is ± {i} μm at 25 ° C and the sensor {i} is heated ." for i in range(300)]
    lines += ["a substrate comprising a layer ."] * 300
    _, sp = _train(tmp_path, lines, 300, coverage=character_coverage("en"))
    for symbol in ("±", "μ", "°"):
        assert sp.piece_to_id(symbol) not in (0, 1) or sp.piece_to_id("▁" + symbol) not in (0, 1), symbol
        assert not any(p.startswith("<0x") for p in sp.encode(f"a {symbol} b", out_type=str)), symbol
    assert character_coverage("en") == 1.0 and character_coverage("ja") == character_coverage("en", "zh-CN") == 0.9995


def test_vocabulary_size_is_soft_above_and_raised_below(tmp_path, capsys):
    n, _ = _train(tmp_path, JA_LINES, 20000, coverage=CJK_COVERAGE)
    assert 300 < n < 20000  # a small corpus gets the vocabulary it supports, no error
    needed = required_size(JA_LINES, CJK_COVERAGE)
    n, sp = _train(tmp_path, JA_LINES, 100, coverage=CJK_COVERAGE)
    assert n == needed and sp.get_piece_size() == needed and "vocabulary size 100 -> " in capsys.readouterr().err
    # the count is SentencePiece's own: one less and it refuses
    with pytest.raises(RuntimeError, match="Vocabulary size is smaller than required_chars"):
        spm.SentencePieceTrainer.train(sentence_iterator=iter(JA_LINES), model_writer=io.BytesIO(),
                                       vocab_size=needed - 1, character_coverage=CJK_COVERAGE, byte_fallback=True,
                                       user_defined_symbols=[PLACEHOLDER], minloglevel=2, pad_id=0, unk_id=1,
                                       bos_id=2, eos_id=3, normalization_rule_name="identity")


# --- formulas ------------------------------------------------------------------------------------------------

def test_formula_markup_is_remembered_in_order_and_put_back():
    formulas: list = []
    text, _ = repair("water <chem>H<sub>2</sub>O</chem> and ⟨formula⟩ and <maths id='m1'><math><mi>x</mi></math></maths>",
                     markup=True, formulas=formulas)
    assert text == "water ⟨formula⟩ and ⟨formula⟩ and ⟨formula⟩"
    assert formulas == ["<chem>H<sub>2</sub>O</chem>", PLACEHOLDER, "<maths id='m1'><math><mi>x</mi></math></maths>"]
    assert restore_formulas("水⟨formula⟩と⟨formula⟩と⟨formula⟩", formulas) == (
        "水<chem>H<sub>2</sub>O</chem>と⟨formula⟩と<maths id='m1'><math><mi>x</mi></math></maths>")
    assert restore_formulas("水⟨formula⟩と⟨formula⟩⟨formula⟩⟨formula⟩", formulas[:2]) == "水<chem>H<sub>2</sub>O</chem>と⟨formula⟩"
    assert restore_formulas("水", formulas[:1]) == "水 <chem>H<sub>2</sub>O</chem>"  # never lost
    assert restore_formulas("no formula here", []) == "no formula here"


# --- long inputs ----------------------------------------------------------------------------------------------

CLAIM_EN = ("A device comprising a housing, a sensor coupled to the housing, and a controller configured to adjust "
            "the temperature of the chamber. The device according to claim 1, wherein the sensor measures the "
            "pressure of the chamber; and wherein the controller stops the heater.")
CLAIM_JA = ("基板の温度を測定する工程と、前記温度が閾値を超えた場合に加熱を停止する工程と、を含む方法。"
            "装置は筐体を備える。前記筐体は樹脂で形成されている。")


@pytest.mark.parametrize("text,limits,lang", [
    (CLAIM_EN, TrainingLimits(max_words=12, max_pieces=1000), "en"),
    (CLAIM_EN, TrainingLimits(max_words=0, max_pieces=40), "en"),
    (CLAIM_JA, TrainingLimits(max_words=20, max_pieces=1000), "ja"),
    ("あ" * 50, TrainingLimits(max_words=0, max_pieces=12), "ja"),
])
def test_segments_fit_the_training_limits_and_lose_nothing(text, limits, lang):
    pieces = len  # a character per piece
    parts = segment(text, pieces, limits)
    assert len(parts) > 1 and all(limits.fits(p, pieces(p)) for p in parts)
    assert join_segments(parts, lang).replace(" ", "") == text.replace(" ", "")
    if lang == "en":
        assert join_segments(parts, lang) == text  # cut at spaces only, rejoined with one
    assert segment("short.", pieces, limits) == ["short."]


def test_sentences_are_cut_before_clauses():
    limits = TrainingLimits(max_words=30, max_pieces=1000)
    parts = segment(CLAIM_EN, len, limits)
    assert parts[0].endswith("chamber.") and parts[1].startswith("The device")  # the sentence end, not a comma
    assert all(count_words(p) <= 30 for p in parts)


def test_limits_come_from_the_manifest_prepare_writes():
    assert TrainingLimits.from_manifest({"filters": {"max_len": 120, "max_words": 80}}) == TrainingLimits(80, 120)
    assert TrainingLimits.from_manifest({}) == TrainingLimits(250, 200)  # prepare's defaults
