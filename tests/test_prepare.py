"""`python -m data_prep.prepare`: readers, filters and their counts, errors, SentencePiece + binarization."""
from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from collections import Counter
from itertools import permutations
from pathlib import Path

import numpy as np
import pytest
import sentencepiece as spm

from data_prep.binary import SPECIAL_IDS, TokenArray, load_pair
from data_prep.filters import LengthFilter, median_ratio
from data_prep.normalize import normalize
from data_prep.prepare import escape, main, unescape
from data_prep.readers import READERS, Malformed, Pair, PrepareError, count_lines, open_reader

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
ENJA = SHARED_DATA / "small_parallel_enja"
PARAPAT_EN_JA = SHARED_DATA / "parapat_samples" / "en_ja.tsv"


def write(path: Path, data: str | bytes) -> Path:
    path.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)
    return path


def prepare(*argv) -> int:
    return main([str(a) for a in argv])


def load_manifest(out: Path) -> dict:
    m = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    assert m["pairs_read"] == m["pairs_kept"] + sum(m["rejected"].values())
    for split in m["splits"].values():
        assert split["pairs_read"] == split["pairs_kept"] + sum(split["rejected"].values())
    assert m["pairs_read"] == sum(s["pairs_read"] for s in m["splits"].values())
    return m


def read_rejects(out: Path) -> list[dict]:
    with open(out / "rejects.tsv", encoding="utf-8", newline="") as f:
        rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    assert rows[0] == ["reason", "origin", "src", "tgt"]
    return [dict(zip(rows[0], map(unescape, r))) for r in rows[1:]]


def cli(*argv) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "data_prep.prepare", *map(str, argv)], cwd=REPO,
                          capture_output=True, text=True, timeout=60)


# --- normalisation and readers ------------------------------------------------------------------------------

def test_normalize():
    assert normalize("  a\u00a0 b\t\tc\u2028d\u0085e \u3000 ") == "a b c d e"
    assert normalize("x\x00y\x07z\x7f\u200bw\ufeff") == "xyz\u200bw"  # controls and BOM go, ZWSP is not a control
    assert normalize("ＡＢＣ１２３（２００）") == "ＡＢＣ１２３（２００）"
    assert normalize("ＡＢＣ１２３（２００）", nfkc=True) == "ABC123(200)"
    assert normalize("ＡＢＣ Déjà", nfkc=True, lowercase=True) == "abc déjà"
    assert normalize("\x01 \x02") == ""


def test_escape_round_trip():
    for text in ["a\tb\nc\rd\\e", "\\t", "", "plain"]:
        assert "\t" not in escape(text) and "\n" not in escape(text)
        assert unescape(escape(text)) == text


def test_moses_reader_line_endings(tmp_path):
    src = write(tmp_path / "a.en", "one\r\ntwo\u2028still\rtwo\nthree")  # CRLF, U+2028, lone CR, no final newline
    tgt = write(tmp_path / "a.ja", "eins\nzwei\u0085noch\r\ndrei\n")
    assert count_lines(src) == count_lines(tgt) == 3
    records = list(open_reader("moses", str(src), str(tgt)))
    assert records == [Pair("one", "eins", f"{src}:1"), Pair("two\u2028still\rtwo", "zwei\u0085noch", f"{src}:2"),
                       Pair("three", "drei", f"{src}:3")]


def test_tsv_reader_malformed_and_no_quoting(tmp_path):
    path = write(tmp_path / "c.tsv", 'a "quoted\tb"\nx\ty\tz\n\n"""q"""\t""')
    records = list(open_reader("tsv", str(path)))
    assert records[0] == Pair('a "quoted', 'b"', f"{path}:1")
    assert isinstance(records[1], Malformed) and records[1].reason == "malformed"
    assert records[1].origin == f"{path}:2" and "found 3" in records[1].message
    assert str(records[1].error()).startswith(f"{path}:2:")
    assert isinstance(records[2], Malformed) and records[2].origin == f"{path}:3"  # empty line: 1 field
    assert records[3] == Pair('"""q"""', '""', f"{path}:4")
    assert len(records) == 4


def test_aspec_reader(tmp_path):
    train = write(tmp_path / "train.txt", "0.9 ||| D1 ||| 1 ||| 猫 だ 。 ||| it is a cat .\n"
                                          "bad line without separators\n")
    dev = write(tmp_path / "dev.txt", "D2 ||| 7 ||| 犬 だ 。 ||| it is a dog .")
    assert list(open_reader("aspec", str(train)))[0] == Pair("it is a cat .", "猫 だ 。", f"{train}:1")
    bad = list(open_reader("aspec", str(train)))[1]
    assert isinstance(bad, Malformed) and bad.origin == f"{train}:2"
    assert list(open_reader("aspec", str(dev), src_lang="ja", tgt_lang="en")) == [
        Pair("犬 だ 。", "it is a dog .", f"{dev}:1")]
    with pytest.raises(PrepareError, match="both"):
        open_reader("aspec", str(dev), src_lang="en", tgt_lang="en")


def test_reader_registry_and_invalid_utf8(tmp_path):
    assert {"moses", "tsv", "aspec"} <= set(READERS)
    path = write(tmp_path / "u.tsv", b"ok\tfine\nbad \xff\tx\n")
    records = list(open_reader("tsv", str(path)))
    assert isinstance(records[0], Pair)
    assert isinstance(records[1], Malformed) and records[1].reason == "invalid_utf8"
    assert records[1].origin == f"{path}:2" and "\\xff" in records[1].src
    with pytest.raises(PrepareError, match="no such file"):
        open_reader("tsv", str(tmp_path / "missing.tsv"))
    with pytest.raises(PrepareError, match="moses"):
        open_reader("moses", str(path))  # needs two files


def test_length_filter_rules():
    f = LengthFilter(max_len=20, min_len=2, max_ratio=3.0)
    assert f.reason(21, 5) == "too_long" and f.reason(1, 5) == "too_short"
    assert f.reason(3, 10) == "ratio" and f.reason(4, 12) is None  # 12 / 4 is exactly 3
    assert f.reason(2, 9) is None  # longer side below RATIO_MIN_PIECES: no ratio check
    scaled = LengthFilter(max_len=100, min_len=1, max_ratio=3.0, expected_ratio=2.5)
    assert scaled.reason(10, 60) is None and scaled.reason(10, 80) == "ratio" and scaled.reason(10, 8) == "ratio"
    assert median_ratio([(1, 2), (2, 2), (10, 50)]) == 2.0


# --- the pipeline ---------------------------------------------------------------------------------------------

WORDS = ["cat", "dog", "sun", "red", "big", "old", "new", "sky"]
GOOD = [" ".join(p) for p in permutations(WORDS, 3)][:40]  # 3 words, 11 chars: 3..12 pieces


def crafted_corpus(tmp_path: Path) -> tuple[Path, Path, Path, Path]:
    """40 good pairs (tgt == src) plus rejects whose reason follows from bounds on piece counts alone."""
    pairs = [(g, g) for g in GOOD]
    pairs += [("", "cat dog sun"), ("\x00\x07 ", "cat dog sun"), ("cat dog", " \u3000 ")]  # 3 empty
    pairs += [(GOOD[0], GOOD[0]), (GOOD[1], GOOD[1]), ("  " + GOOD[0].replace(" ", "   "), GOOD[0])]  # 3 duplicate
    pairs += [(" ".join(["cat"] * 50), " ".join(["dog"] * 50))]  # too_long: >= 50 pieces > --max-len 40
    pairs += [("a", "a b c d")]  # too_short: "a" is <= 2 pieces < --min-len 3
    pairs += [("a b c", " ".join("abcdefghijklmnopqrst"))]  # ratio: 20..40 pieces vs 3..6 pieces
    src = write(tmp_path / "train.src", "\n".join(s for s, _ in pairs) + "\n")
    tgt = write(tmp_path / "train.tgt", "\n".join(t for _, t in pairs) + "\n")
    dev_lines = [GOOD[0], GOOD[0], " ".join(["sky"] * 50), "", "ＲＥＤ  sun\u2028dog"]  # only the empty one goes
    dev_src = write(tmp_path / "dev.src", "\n".join(dev_lines))
    dev_tgt = write(tmp_path / "dev.tgt", "\n".join(dev_lines))
    return src, tgt, dev_src, dev_tgt


# tgt == src and both sides English: the copy and script rules (tests/test_cleaning.py) would drop them all
CRAFTED_OPTS = ["--format", "moses", "--joint-vocab", "--max-len", 40, "--min-len", 3, "--nfkc", "--keep-copies",
                "--no-script-filter"]


def test_filter_counts_and_rejects(tmp_path):
    src, tgt, dev_src, dev_tgt = crafted_corpus(tmp_path)
    out = tmp_path / "data"
    assert prepare("--train-src", src, "--train-tgt", tgt, "--dev-src", dev_src, "--dev-tgt", dev_tgt,
                   "--out", out, *CRAFTED_OPTS) == 0
    m = load_manifest(out)
    assert m["splits"]["train"]["pairs_read"] == 49 and m["splits"]["train"]["pairs_kept"] == 40
    assert {r: n for r, n in m["splits"]["train"]["rejected"].items() if n} == {
        "empty": 3, "duplicate": 3, "too_long": 1, "too_short": 1, "ratio": 1}
    assert m["splits"]["dev"]["pairs_read"] == 5 and m["splits"]["dev"]["pairs_kept"] == 4
    assert m["splits"]["dev"]["rejected"]["empty"] == 1 and sum(m["splits"]["dev"]["rejected"].values()) == 1
    assert m["pairs_read"] == 54 and m["pairs_kept"] == 44 and m["rejected"]["empty"] == 4
    assert m["filters"]["median_tgt_src_ratio"] == 1.0  # tgt == src with one joint model

    rejects = read_rejects(out)
    assert Counter(r["reason"] for r in rejects) == Counter({r: n for r, n in m["rejected"].items() if n})
    by_origin = {r["origin"]: r["reason"] for r in rejects}
    assert by_origin[f"{src}:44"] == "duplicate" and by_origin[f"{src}:46"] == "duplicate"  # 46: after normalising
    assert by_origin[f"{src}:47"] == "too_long" and by_origin[f"{src}:49"] == "ratio"
    assert by_origin[f"{dev_src}:4"] == "empty"

    # dev keeps duplicates and long lines; the .txt references are the normalised (NFKC) text
    dev_text = (out / "dev.src.txt").read_text(encoding="utf-8").split("\n")
    assert dev_text == [GOOD[0], GOOD[0], " ".join(["sky"] * 50), "RED sun dog", ""]
    assert len(load_pair(str(out), "dev")[0]) == 4
    assert m["normalize"]["nfkc"] is True and m["normalize"]["lowercase"] is False
    assert not (out / ".prepare-tmp").exists()


def test_no_dedup_keeps_duplicates_and_rerun_drops_stale_split(tmp_path):
    src, tgt, dev_src, dev_tgt = crafted_corpus(tmp_path)
    out = tmp_path / "data"
    assert prepare("--train-src", src, "--train-tgt", tgt, "--dev-src", dev_src, "--dev-tgt", dev_tgt,
                   "--out", out, *CRAFTED_OPTS) == 0
    assert (out / "dev.src.bin").exists() and (out / "dev.tgt.txt").exists()
    assert prepare("--train-src", src, "--train-tgt", tgt, "--out", out, "--no-dedup", *CRAFTED_OPTS) == 0
    m = load_manifest(out)
    assert m["rejected"]["duplicate"] == 0 and m["splits"]["train"]["pairs_kept"] == 43
    assert "dev" not in m["splits"] and not list(out.glob("dev.*"))


def check_round_trip(out: Path, expected: list[tuple[str, str]], m: dict) -> int:
    """Every kept pair decodes to its normalised text (unless it holds <unk>); returns how many hold <unk>."""
    src, tgt = load_pair(str(out), "train")
    assert len(src) == len(tgt) == len(expected) == m["splits"]["train"]["pairs_kept"]
    with_unk = 0
    for side, arr, k in (("src", src, 0), ("tgt", tgt, 1)):
        model = spm.SentencePieceProcessor(model_file=str(out / m["vocab"][f"{side}_model"]))
        assert model.get_piece_size() == m["vocab"][f"{side}_size"]
        assert arr.offsets[0] == 0 and arr.offsets[-1] == len(arr.tokens) == m["splits"]["train"]["tokens"][side]
        assert np.all(arr.lengths >= 1) and arr.lengths.sum() == len(arr.tokens)
        assert arr.tokens.min() >= SPECIAL_IDS["unk"] and arr.tokens.max() < model.get_piece_size()
        assert not np.isin(arr.tokens, [SPECIAL_IDS["pad"], SPECIAL_IDS["bos"], SPECIAL_IDS["eos"]]).any()
        assert int((arr.tokens == SPECIAL_IDS["unk"]).sum()) == m["splits"]["train"]["unk"][side]
        for i in range(len(arr)):
            ids = arr[i].tolist()
            if SPECIAL_IDS["unk"] in ids:
                with_unk += 1
            else:
                assert model.decode(ids) == expected[i][k]
    return with_unk


def test_round_trip_and_joint_vocab(tmp_path):
    src, tgt, _, _ = crafted_corpus(tmp_path)
    out = tmp_path / "data"
    assert prepare("--train-src", src, "--train-tgt", tgt, "--out", out, *CRAFTED_OPTS) == 0
    m = load_manifest(out)
    assert check_round_trip(out, [(g, g) for g in GOOD], m) == 0
    assert m["vocab"]["joint"] is True and m["vocab"]["src_size"] == m["vocab"]["tgt_size"]
    assert m["vocab"]["src_size"] < m["vocab"]["requested_size"] == 8000  # lowered for the tiny corpus
    assert (out / "spm.src.model").read_bytes() == (out / "spm.tgt.model").read_bytes()
    assert (out / "spm.src.vocab").read_bytes() == (out / "spm.tgt.vocab").read_bytes()
    assert m["checksum"] and sorted(m["checksum_files"]) == sorted(
        f"train.{s}.{e}" for s in ("src", "tgt") for e in ("bin", "idx"))


def enja_subset(tmp_path: Path, n: int = 3000) -> tuple[Path, Path]:
    paths = []
    for lang in ("en", "ja"):
        with open(ENJA / f"train.{lang}", encoding="utf-8") as f:
            head = [next(f) for _ in range(n)]
        paths.append(write(tmp_path / f"train.{lang}", "".join(head)))
    return paths[0], paths[1]


@pytest.mark.skipif(not ENJA.is_dir(), reason="shared small_parallel_enja not present")
def test_small_parallel_enja_separate_vocab(tmp_path):
    train_en, train_ja = enja_subset(tmp_path)
    out = tmp_path / "data"
    assert prepare("--train-src", train_en, "--train-tgt", train_ja, "--dev-src", ENJA / "dev.en",
                   "--dev-tgt", ENJA / "dev.ja", "--format", "moses", "--out", out, "--vocab-size", 1000) == 0
    m = load_manifest(out)
    assert m["splits"]["train"]["pairs_read"] == 3000 and m["splits"]["dev"]["pairs_read"] == 500
    assert m["splits"]["dev"]["pairs_kept"] == 500 and m["splits"]["train"]["pairs_kept"] >= 2900
    assert m["vocab"]["joint"] is False and m["vocab"]["src_size"] == 1000
    assert m["vocab"]["tgt_size"] >= 1000  # raised to cover the Japanese characters if 1000 is too few
    assert (out / "spm.src.model").read_bytes() != (out / "spm.tgt.model").read_bytes()
    assert [i["path"] for i in m["inputs"]] == [os.path.abspath(p) for p in (train_en, train_ja)] + [
        os.path.abspath(ENJA / f"dev.{lang}") for lang in ("en", "ja")]
    assert m["inputs"][0]["bytes"] == train_en.stat().st_size and len(m["inputs"][0]["sha256"]) == 64
    assert {"pairs_read", "pairs_kept", "rejected", "splits", "vocab", "normalize", "inputs", "format", "options",
            "created", "checksum"} <= set(m)
    assert m["options"]["vocab_size"] == 1000 and m["format"] == "moses"

    rejected = {r["origin"] for r in read_rejects(out)}
    pairs = zip(*(p.read_text(encoding="utf-8").split("\n")[:-1] for p in (train_en, train_ja)))
    expected = [(normalize(s), normalize(t)) for i, (s, t) in enumerate(pairs, 1) if f"{train_en}:{i}" not in rejected]
    assert check_round_trip(out, expected, m) < 0.05 * len(expected)
    dev_ref = [normalize(x) for x in (ENJA / "dev.ja").read_text(encoding="utf-8").split("\n")[:-1]]
    assert (out / "dev.tgt.txt").read_text(encoding="utf-8").split("\n")[:-1] == dev_ref
    assert len(TokenArray.load(str(out), "dev", "tgt")) == 500


@pytest.mark.skipif(not ENJA.is_dir(), reason="shared small_parallel_enja not present")
def test_spm_sample_is_seeded_and_models_do_not_depend_on_data_dir(tmp_path):
    train_en, train_ja = enja_subset(tmp_path)
    runs = {}
    for name, seed in (("a", 1), ("b", 1), ("c", 2)):
        assert prepare("--train-src", train_en, "--train-tgt", train_ja, "--format", "moses", "--out",
                       tmp_path / name, "--spm-sample", 500, "--seed", seed, "--vocab-size", 1200) == 0
        runs[name] = load_manifest(tmp_path / name)
    assert (tmp_path / "a" / "spm.tgt.model").read_bytes() == (tmp_path / "b" / "spm.tgt.model").read_bytes()
    assert runs["a"]["checksum"] == runs["b"]["checksum"]
    assert runs["a"]["vocab"]["src_model_sha256"] == runs["b"]["vocab"]["src_model_sha256"]
    assert runs["a"]["vocab"]["src_model_sha256"] != runs["c"]["vocab"]["src_model_sha256"]
    assert runs["a"]["vocab"]["src_size"] < 1200  # 500 sampled sentences cannot fill it


@pytest.mark.skipif(not PARAPAT_EN_JA.is_file(), reason="shared parapat sample not present")
def test_parapat_tsv(tmp_path):
    out = tmp_path / "data"
    assert prepare("--train-src", PARAPAT_EN_JA, "--format", "tsv", "--out", out, "--joint-vocab") == 0
    m = load_manifest(out)
    assert m["splits"]["train"]["pairs_read"] == 5  # the last record has no final newline
    assert m["format"] == "tsv" and m["inputs"][0]["bytes"] == PARAPAT_EN_JA.stat().st_size
    src, tgt = load_pair(str(out), "train")
    assert len(src) == len(tgt) == m["pairs_kept"] >= 1


# --- errors ----------------------------------------------------------------------------------------------------

def test_moses_line_count_mismatch_writes_nothing(tmp_path):
    src = write(tmp_path / "x.en", "a\nb\nc\n")
    tgt = write(tmp_path / "x.ja", "a\nb")
    out = tmp_path / "data"
    r = cli("--train-src", src, "--train-tgt", tgt, "--format", "moses", "--out", out)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert str(src) in r.stderr and str(tgt) in r.stderr and "3 lines" in r.stderr and "has 2" in r.stderr
    assert not out.exists()


def test_missing_input_is_one_line_exit_2(tmp_path):
    missing = tmp_path / "nope.tsv"
    r = cli("--train-src", missing, "--format", "tsv", "--out", tmp_path / "data")
    assert r.returncode == 2
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1 and str(missing) in r.stderr
    assert not (tmp_path / "data").exists()


def test_malformed_tsv_fails_with_file_line(tmp_path, capsys):
    path = write(tmp_path / "m.tsv", "a\tb\nc\td\te\n")
    assert prepare("--train-src", path, "--format", "tsv", "--out", tmp_path / "data") == 2
    err = capsys.readouterr().err
    assert f"{path}:2:" in err and "found 3" in err and len(err.strip().splitlines()) == 1


def test_invalid_utf8_fail_and_skip(tmp_path, capsys):
    src = write(tmp_path / "u.en", "one two\nthree \xff four\nfive six\n".encode("latin-1"))
    tgt = write(tmp_path / "u.ja", "eins zwei\ndrei vier\nfuenf sechs\n")
    out = tmp_path / "data"
    base = ["--train-src", src, "--train-tgt", tgt, "--format", "moses", "--out", out, "--tgt-lang", "de"]
    assert prepare(*base) == 2
    assert f"{src}:2: invalid UTF-8" in capsys.readouterr().err
    assert not out.exists()

    assert prepare(*base, "--on-error", "skip") == 0
    m = load_manifest(out)
    assert m["rejected"]["invalid_utf8"] == 1 and m["pairs_read"] == 3 and m["pairs_kept"] == 2
    assert read_rejects(out) == [{"reason": "invalid_utf8", "origin": f"{src}:2", "src": "three \\xff four",
                                  "tgt": ""}]


def test_failed_rerun_keeps_previous_dataset(tmp_path):
    src, tgt, _, _ = crafted_corpus(tmp_path)
    out = tmp_path / "data"
    assert prepare("--train-src", src, "--train-tgt", tgt, "--out", out, *CRAFTED_OPTS) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    bad = write(tmp_path / "bad.tgt", b"\xff\n" * 49)
    assert prepare("--train-src", src, "--train-tgt", bad, "--out", out, *CRAFTED_OPTS) == 2
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
