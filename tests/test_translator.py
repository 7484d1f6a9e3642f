"""trainer.inference.translator on tiny models without training: empty lines, output that stays one line, formulas
put back, long inputs segmented within the training limits, n-best and alignments, ensembles, batching and
forced-decoding scores that agree with the search."""
from __future__ import annotations

import os

import pytest
import torch

from data_prep.binary import EOS_ID
from data_prep.demo_corpus import generate, raw_japanese
from data_prep.normalize import PLACEHOLDER
from data_prep.segment import TrainingLimits
from data_prep.vocab import train_model
from trainer.config import DecodeConfig, ModelConfig
from trainer.inference.loading import ensemble
from trainer.inference.options import DecodeOptions
from trainer.inference.text import TextPipeline, one_line
from trainer.inference.translator import Translator
from trainer.model.search import Ensemble, beam_search_nbest
from trainer.model.seq2seq import build_model

torch.set_num_threads(1)

TINY = ModelConfig(emb_dim=8, hidden=8, layers=1, attention="general", dropout=0.0, label_smoothing=0.0)
NORM = {"entities": True, "markup": True, "cjk_spaces": "keep"}
CHEM = "<chem>SiO<sub>2</sub></chem>"
MATH = "<math><mi>x</mi><mo>+</mo><mn>1</mn></math>"


@pytest.fixture(scope="module")
def spm_models(tmp_path_factory):
    import sentencepiece as spm

    root = tmp_path_factory.mktemp("spm")
    rows = generate(pairs=400, dev=5, test=5)["train"]
    for side, lines in (("src", [en for en, _ in rows]), ("tgt", [raw_japanese(ja) for _, ja in rows])):
        (root / f"{side}.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
        train_model(str(root / f"{side}.txt"), str(root / f"spm.{side}"), vocab_size=600, model_type="bpe", seed=1)
    return [spm.SentencePieceProcessor(model_file=str(root / f"spm.{s}.model")) for s in ("src", "tgt")]


def translator(spm_models, seed=0, limits=TrainingLimits(), decode=DecodeConfig(), bias=None, model=None):
    src_sp, tgt_sp = spm_models
    model = model or build_model(TINY, src_sp.get_piece_size(), tgt_sp.get_piece_size(), seed=seed)
    if bias is not None:  # every step prefers these pieces, in this order, whatever the input
        with torch.no_grad():
            model.head.proj.weight.zero_()
            model.head.proj.bias.fill_(-10.0)
            for rank, piece in enumerate(bias):
                model.head.proj.bias[piece] = 10.0 - rank
    return Translator(model, TextPipeline(src_sp, tgt_sp, NORM, tgt_lang="ja", limits=limits),
                      DecodeOptions.from_config(decode), "cpu")


def test_empty_and_blank_lines_translate_to_empty_lines(spm_models):
    t = translator(spm_models, bias=[spm_models[1].piece_to_id("の")])  # a model that never wants to stop
    out = t.translate_nbest(["", "   ", "\u3000", "a sensor ."], n_best=2, beam=2)
    assert [h.text for h in out[0]] == ["", ""] and out[1][0].text == "" and out[2][0].text == ""
    assert out[0][0].score == 0.0 and out[0][0].pieces == 0
    assert out[3][0].text != ""


def test_output_is_one_line_whatever_bytes_the_model_spells(spm_models):
    tgt_sp = spm_models[1]
    newline, tab, nul, cr = (tgt_sp.piece_to_id(f"<0x{b:02X}>") for b in (0x0A, 0x09, 0x00, 0x0D))
    no = tgt_sp.piece_to_id("の")
    assert {newline, tab, nul, cr} < set(range(4, tgt_sp.get_piece_size()))  # byte fallback pieces exist
    assert "\n" in tgt_sp.decode([no, newline, no])  # what one_line has to undo
    assert one_line(tgt_sp.decode([no, newline, no, tab, no, nul, cr, no])) == "の の の の"
    for piece in (newline, tab, nul):  # a model that spells nothing else gives an empty line, not a break
        assert translator(spm_models, bias=[piece]).translate(["a sensor ."], beam=1, max_len_ratio=0.5) == [""]


def test_formulas_come_back_in_order_and_surplus_placeholders_go(spm_models):
    tgt_sp = spm_models[1]
    placeholder = tgt_sp.piece_to_id(PLACEHOLDER)
    t = translator(spm_models, bias=[placeholder])  # emits only placeholders, as many as it may
    line = f"the value of {CHEM} is larger than the value of {MATH} ."
    text = t.translate([line], beam=1)[0]
    assert text == f"{CHEM}{MATH}"  # two placeholders restored, the rest dropped
    # a model that never writes a placeholder still keeps the formulas, at the end
    text = translator(spm_models, bias=[tgt_sp.piece_to_id("の")]).translate([line], beam=1, max_len_ratio=0.2)[0]
    assert text.endswith(f"{CHEM} {MATH}") and PLACEHOLDER not in text
    # a placeholder already in the input (a prepared corpus) stands for itself
    text = t.translate([f"the value of {PLACEHOLDER} ."], beam=1)[0]
    assert text == PLACEHOLDER


def test_long_inputs_are_cut_within_the_training_limits_and_rejoined(spm_models):
    src_sp = spm_models[0]
    limits = TrainingLimits(max_words=250, max_pieces=20)
    sentences = [en for en, _ in generate(pairs=30, dev=1, test=1)["train"] if len(src_sp.encode(en)) > 20][:3]
    line = " ".join(s[0].upper() + s[1:] for s in sentences)
    t = translator(spm_models, limits=limits, bias=[spm_models[1].piece_to_id("の")])
    segments, _ = t.text.source(line)
    assert len(segments) >= 3 and all(len(ids) <= 20 for ids in segments)
    assert " ".join(src_sp.decode(ids) for ids in segments).split() == line.split()  # nothing lost or repeated
    out = t.translate_nbest([line], beam=1, max_len_ratio=0.1, alignments=True)[0][0]
    per_segment = [int((len(ids) + 1) * 0.1) + DecodeConfig().max_len_add for ids in segments]  # EOS counts
    assert out.pieces == sum(per_segment) and out.text == "の" * sum(per_segment)  # joined without spaces (ja)
    assert {s for s, _ in out.alignment} <= set(range(sum(len(ids) for ids in segments)))
    assert [t for _, t in out.alignment] == list(range(out.pieces))
    short = "a sensor ."
    assert t.text.source(short)[0] == [src_sp.encode(short)]  # a line that fits stays whole


def test_nbest_is_sorted_distinct_and_scored_like_forced_decoding(spm_models):
    t = translator(spm_models, seed=3)
    lines = ["a sensor coupled to the housing .", "the method according to claim 2 ."]
    results = t.translate_nbest(lines, n_best=4, beam=4, max_len_ratio=0.5)
    src = torch.tensor([t.text.encode(lines[0]) + [EOS_ID]])
    hyps = beam_search_nbest(t.model, src, torch.tensor([src.shape[1]]), beam=4, max_len=10, n_best=4)[0]
    assert len({tuple(h.tokens) for h in hyps}) == 4  # four different hypotheses
    for nbest in results:
        assert len(nbest) == 4
        assert [h.score for h in nbest] == sorted((h.score for h in nbest), reverse=True)
        for h in nbest:  # length_penalty 1: the score is the log-prob per piece (+ end of sentence)
            assert h.score == pytest.approx(h.logprob / (h.pieces + 1), rel=1e-5)
    # forced decoding of the search's own hypotheses gives the search's log-probs
    for h in hyps:
        tgt_in = torch.tensor([[2] + h.tokens])
        tgt_out = torch.tensor([h.tokens + [EOS_ID]])
        forced = Ensemble(t.model).force(src, torch.tensor([src.shape[1]]), tgt_in, tgt_out)
        assert float(forced.sum()) == pytest.approx(h.logprob, abs=1e-3)
    # and the text interface scores references (normalised, encoded) the same way; empty pairs score 0
    refs = [raw_japanese(ja) for _, ja in generate(pairs=2, dev=1, test=1)["train"]]
    scored = t.score(lines + ["x"], refs + [""])
    assert scored[2] == (0.0, 0)
    for line, ref, (logprob, tokens) in zip(lines, refs, scored):
        ids = t.text.tgt_sp.encode(ref)
        one = torch.tensor([t.text.encode(line) + [EOS_ID]])
        forced = Ensemble(t.model).force(one, torch.tensor([one.shape[1]]), torch.tensor([[2] + ids]),
                                         torch.tensor([ids + [EOS_ID]]))
        assert tokens == len(ids) + 1 and logprob == pytest.approx(float(forced.sum()), abs=1e-3) and logprob < 0
    with pytest.raises(ValueError, match="--beam 0: the beam size must be >= 1"):
        t.translate(lines, beam=0)


def test_ensemble_averages_probabilities(spm_models):
    a, b = (translator(spm_models, seed=s) for s in (1, 2))
    src = torch.tensor([a.text.encode("a sensor .") + [EOS_ID]])
    lengths = torch.tensor([src.shape[1]])
    pair, alone = Ensemble([a.model, b.model]), [Ensemble(a.model), Ensemble(b.model)]
    last = torch.full((1, 1), 2)
    logp, _, _ = pair.step(pair.start(src, lengths, 1), last)
    each = [e.step(e.start(src, lengths, 1), last)[0] for e in alone]
    assert torch.allclose(logp.exp(), (each[0].exp() + each[1].exp()) / 2, atol=1e-6)
    twice = beam_search_nbest([a.model, a.model], src, lengths, beam=3, max_len=8)
    once = beam_search_nbest(a.model, src, lengths, beam=3, max_len=8)
    assert twice[0][0].tokens == once[0][0].tokens
    assert twice[0][0].logprob == pytest.approx(once[0][0].logprob, abs=1e-4)
    both = ensemble([a, b], ["a", "b"])
    assert len(both.models) == 2 and both.translate(["a sensor ."], beam=2)


def test_ensemble_refuses_other_vocabularies(spm_models, tmp_path):
    import sentencepiece as spm

    (tmp_path / "x.txt").write_text("\n".join(f"line {i} of other text" for i in range(50)), encoding="utf-8")
    train_model(str(tmp_path / "x.txt"), str(tmp_path / "x"), vocab_size=300, model_type="bpe", seed=1)
    other_sp = spm.SentencePieceProcessor(model_file=str(tmp_path / "x.model"))
    a = translator(spm_models)
    b = translator((spm_models[0], other_sp))
    with pytest.raises(ValueError, match="target SentencePiece model"):
        ensemble([a, b], ["one.pt", "two.pt"])


def test_batches_respect_sentence_and_token_caps(spm_models):
    t = translator(spm_models)
    lengths = [5, 50, 7, 30, 30, 2, 49]
    batches = t.batches(lengths, batch_size=3, max_tokens=100)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for b in batches:
        assert len(b) <= 3 and (len(b) == 1 or len(b) * (max(lengths[i] for i in b) + 1) <= 100)
    assert [lengths[b[0]] for b in batches] == sorted((lengths[b[0]] for b in batches), reverse=True)
    assert t.batches(lengths, batch_size=3, max_tokens=0) == [[1, 6, 3], [4, 2, 0], [5]]


def test_device_defaults_to_cuda_when_torch_sees_one(spm_models, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    src_sp, tgt_sp = spm_models
    model = build_model(TINY, src_sp.get_piece_size(), tgt_sp.get_piece_size())
    options = DecodeOptions.from_config(DecodeConfig())
    assert Translator(model, TextPipeline(src_sp, tgt_sp, NORM), options).device.type == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    from trainer.inference.translator import default_device

    assert default_device() == "cuda"


def test_dev_beam_zero_is_a_config_error():
    from trainer.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="decode.dev_beam=0"):
        load_config(None, ["decode.dev_beam=0"])
    assert load_config(None, []).decode.bleu_tokenize == "auto"
    patent = load_config(os.path.join(os.path.dirname(__file__), "..", "trainer", "configs", "patent.yaml"))
    assert patent.data.max_tokens > 0 and patent.train.keep_last >= 2  # token-capped batches; averaging
