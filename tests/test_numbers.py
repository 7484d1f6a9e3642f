"""Number placeholders (data_prep.numbers) through prepare and the translator, and Japanese pieces bounded by
MeCab's words (`prepare --pretokenize auto`, data_prep.vocab)."""
from __future__ import annotations

import json

import pytest
import sentencepiece as spm
import torch

from data_prep import numbers, vocab
from data_prep.binary import load_pair
from data_prep.demo_corpus import generate, raw_japanese
from data_prep.prepare import main as prepare_main
from trainer.artifacts.model_files import ModelFileError, number_slots
from trainer.config import DecodeConfig, ModelConfig
from trainer.inference.options import DecodeOptions
from trainer.inference.text import TextPipeline
from trainer.inference.translator import Translator
from trainer.model.seq2seq import build_model

torch.set_num_threads(1)


def test_masking_matches_values_across_widths_and_restores_in_the_target_width():
    src, nums = numbers.mask_source("the housing 12 of claim 3 holds 12 and 7 .", 2)
    assert src == "the housing ⟨n1⟩ of claim ⟨n2⟩ holds ⟨n1⟩ and 7 ." and nums == ["12", "3"]  # 7: no slot left
    assert numbers.slot_counts(src, len(nums)) == [2, 1]
    tgt, replaced, full = numbers.mask_target("請求項３のハウジング１２は7を保持する", nums, [2, 1])
    assert tgt == "請求項⟨n2⟩のハウジング⟨n1⟩は7を保持する" and (replaced, full) == (2, 2)
    assert numbers.restore("請求項⟨n2⟩の⟨n1⟩と⟨n5⟩", nums, fullwidth=True) == "請求項３の１２と"  # ⟨n5⟩: none
    assert numbers.restore("claim ⟨n2⟩", nums) == "claim 3"
    assert numbers.mask_source("no digits", 8) == ("no digits", []) and numbers.mask_source("1 2", 0) == ("1 2", [])
    assert numbers.mask_pair("claim 05", "請求項5", 8) == ("claim ⟨n1⟩", "請求項5")  # compared as written


def test_target_numbers_are_matched_as_a_multiset():
    """A target run is masked only as often as the source has its value: the claim number, not an ordinal
    or a count that happens to equal it."""
    src = "The battery of claim 1 , wherein the first electrode has 2 layers ."
    tgt = "請求項１に記載の電池であって、第１の電極は２つの層と第１の層を有する"
    assert numbers.mask_pair(src, tgt, 8) == (
        "The battery of claim ⟨n1⟩ , wherein the first electrode has ⟨n2⟩ layers .",
        "請求項⟨n1⟩に記載の電池であって、第１の電極は⟨n2⟩つの層と第１の層を有する")
    # twice in the source: twice in the target; a third one stays
    assert numbers.mask_pair("claim 3 or claim 3", "請求項3または請求項3、第3", 8)[1] == "請求項⟨n1⟩または請求項⟨n1⟩、第3"
    # a hostile source spelling a placeholder does not break the counts
    assert numbers.slot_counts("⟨n1⟩ ⟨n9⟩ ⟨n2⟩", 1) == [1]


def test_number_config_is_checked_like_any_user_file():
    assert number_slots(None, "m") is None
    assert number_slots({"slots": 8, "fullwidth": True}, "m") == {"slots": 8, "fullwidth": True}
    for bad in ({"slots": 99, "fullwidth": False}, {"slots": 8}, {"slots": "8", "fullwidth": False}, [8],
                {"slots": 8, "fullwidth": 1, "x": 2}):
        with pytest.raises(ModelFileError, match="^m: numbers: "):
            number_slots(bad, "m")


def test_word_segmenter_keeps_text_and_placeholders_whole():
    seg = vocab.word_segmenter("mecab-ipadic")
    line = "請求項⟨n1⟩に記載の風力タービンは、管状の ハンドル ⟨formula⟩を有する"
    out = seg(line)
    assert out.replace(vocab.PRETOKENIZE_DELIMITER, "") == line
    assert "\t⟨n1⟩\t" in out and "\t⟨formula⟩\t" in out and "記載\tの\t風力\tタービン" in out
    assert vocab.pretokenizer_name("ja", "auto") == "mecab-ipadic"
    assert vocab.pretokenizer_name("ja_JP", "none") is None and vocab.pretokenizer_name("en", "auto") is None


def _corpus(tmp_path, pairs=600, fullwidth=False):
    rows = generate(pairs=pairs, dev=20, test=5, seed=3)
    paths = {}
    for split, data in rows.items():
        for side, lang in (("src", "en"), ("tgt", "ja")):
            lines = [en if side == "src" else raw_japanese(ja) for en, ja in data]
            if side == "tgt" and fullwidth:
                lines = [line.translate(str.maketrans("0123456789", "０１２３４５６７８９")) for line in lines]
            path = tmp_path / f"{split}.{lang}"
            path.write_text("\n".join(lines) + "\n", encoding="utf-8")
            paths[f"--{split}-{side}"] = str(path)
    return paths


def _prepare(tmp_path, name, *extra, fullwidth=False):
    out = tmp_path / name
    args = ["--format", "moses", "--src-lang", "en", "--tgt-lang", "ja", "--out", str(out), "--vocab-size", "500",
            "--model-type", "bpe", "--workers", "1", *extra]
    for k, v in _corpus(tmp_path, fullwidth=fullwidth).items():
        args += [k, v]
    assert prepare_main(args) == 0
    return out, json.loads((out / "manifest.json").read_text())


def test_prepare_masks_shared_numbers_and_records_the_target_width(tmp_path):
    out, manifest = _prepare(tmp_path, "np", "--number-placeholders", "8", "--pretokenize", "none", fullwidth=True)
    assert manifest["numbers"] == {"slots": 8, "fullwidth": True}
    sp = {side: spm.SentencePieceProcessor(model_file=str(out / f"spm.{side}.model")) for side in ("src", "tgt")}
    assert all(sp["tgt"].piece_to_id(p) not in (0, 1) for p in numbers.slot_pieces(8))  # user symbols
    src, tgt = load_pair(str(out), "train")
    decoded = [(sp["src"].decode(list(map(int, s))), sp["tgt"].decode(list(map(int, t))))
               for s, t in zip(src, tgt)]
    claims = [(s, t) for s, t in decoded if "claim ⟨n1⟩" in s]
    assert claims and all("請求項⟨n1⟩" in t for _, t in claims)
    assert not any(ch.isdigit() for s, _ in decoded[:50] for ch in numbers.SLOT_RE.sub("", s))  # every number
    # the text files of the eval splits (what translation and dev BLEU read) stay as they were
    assert any(c in (out / "dev.tgt.txt").read_text(encoding="utf-8") for c in "０１２３４５６７８９")
    _, off = _prepare(tmp_path, "off", "--pretokenize", "none")
    assert off["numbers"] is None
    assert prepare_main(["--format", "moses", "--train-src", "x", "--train-tgt", "y", "--out", str(tmp_path / "z"),
                         "--number-placeholders", "9"]) == 2


def test_pretokenize_auto_bounds_japanese_pieces_by_words(tmp_path):
    out, manifest = _prepare(tmp_path, "pt", "--vocab-size", "3000")
    assert manifest["vocab"]["pretokenize"] == {"src": None, "tgt": "mecab-ipadic"}
    seg = vocab.word_segmenter("mecab-ipadic")
    words = {w for line in (tmp_path / "train.ja").read_text(encoding="utf-8").splitlines()
             for w in seg(line).replace(" ", vocab.PRETOKENIZE_DELIMITER).split(vocab.PRETOKENIZE_DELIMITER)}
    sp = spm.SentencePieceProcessor(model_file=str(out / "spm.tgt.model"))
    ordinals = set(vocab.ordinal_pieces("ja"))  # "第1" ...: one piece on purpose (data_prep.vocab, ORDINAL_PREFIXES)
    pieces = [sp.id_to_piece(i).lstrip("\u2581") for i in range(sp.get_piece_size())
              if not (sp.is_control(i) or sp.is_unknown(i) or sp.is_byte(i) or sp.id_to_piece(i).startswith("⟨")
                      or sp.id_to_piece(i) in ordinals)]
    assert all(any(p in w for w in words) for p in pieces if p)  # no piece spans two words
    _, raw = _prepare(tmp_path, "raw", "--vocab-size", "3000", "--pretokenize", "none")
    assert raw["vocab"]["pretokenize"] == {"src": None, "tgt": None}
    sp_raw = spm.SentencePieceProcessor(model_file=str(tmp_path / "raw" / "spm.tgt.model"))
    spanning = [sp_raw.id_to_piece(i).lstrip("\u2581") for i in range(sp_raw.get_piece_size())]
    assert not all(any(p in w for w in words) for p in spanning if len(p) > 1)  # what auto prevents


def test_translator_masks_the_input_and_puts_numbers_back(tmp_path):
    out, manifest = _prepare(tmp_path, "tr", "--number-placeholders", "4", "--pretokenize", "none", fullwidth=True)
    src_sp, tgt_sp = (spm.SentencePieceProcessor(model_file=str(out / f"spm.{s}.model")) for s in ("src", "tgt"))
    model = build_model(ModelConfig(emb_dim=8, hidden=8, layers=1, dropout=0.0, label_smoothing=0.0),
                        src_sp.get_piece_size(), tgt_sp.get_piece_size(), seed=0)
    line = "the housing 12 according to claim 7 ."

    def biased(piece):  # a model that writes only this piece, as long as it may
        with torch.no_grad():
            model.head.proj.weight.zero_()
            model.head.proj.bias.fill_(-10.0)
            model.head.proj.bias[tgt_sp.piece_to_id(piece)] = 10.0
        return Translator(model, TextPipeline(src_sp, tgt_sp, {}, tgt_lang="ja", number_slots=manifest["numbers"]),
                          DecodeOptions.from_config(DecodeConfig()), "cpu")

    t = biased("⟨n2⟩")
    segments, (_, nums) = t.text.source(line)
    assert nums == ["12", "7"] and src_sp.decode(segments[0]) == "the housing ⟨n1⟩ according to claim ⟨n2⟩ ."
    text = t.translate([line], beam=1, max_len_ratio=0.1)[0]
    assert text and set(text) == {"７"}  # ⟨n2⟩ -> the second number, in the target's (full) width
    assert biased("⟨n3⟩").translate([line], beam=1, max_len_ratio=0.1) == [""]  # no third number: dropped
    # forced decoding masks the reference with the source's numbers, as prepare masked the training targets
    ref = "請求項７のハウジング１２"
    assert t.score([line], [ref])[0][1] == len(tgt_sp.encode("請求項⟨n2⟩のハウジング⟨n1⟩")) + 1
    assert t.score([line], [ref])[0][1] < len(tgt_sp.encode(ref)) + 1
