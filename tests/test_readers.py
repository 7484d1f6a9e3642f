"""data_prep.readers: every input format and its defects, auto-detection, metadata filters, split by document."""
from __future__ import annotations

import csv
import gzip
import json
import random
import tracemalloc
import zipfile
from collections import Counter
from pathlib import Path
from typing import Iterator

import pytest

from data_prep.prepare import main, unescape
from data_prep.readers import (DocSplit, InputError, MetaFilter, Pair, PrepareError, detect_format,
                               lang_matches, open_reader, write_tmx)

PARAPAT = Path(__file__).resolve().parents[2] / "shared" / "data" / "parapat_samples"
needs_parapat = pytest.mark.skipif(not PARAPAT.is_dir(), reason="shared parapat samples not present")


def write(path: Path, data: str | bytes) -> Path:
    path.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)
    return path


def records(fmt: str, src: Path, tgt: Path | None = None, **options) -> list:
    reader = open_reader(fmt, str(src), None if tgt is None else str(tgt), **options)
    reader.check()
    return list(reader)


def reasons(recs: list) -> Counter:
    return Counter("pair" if isinstance(r, Pair) else r.reason for r in recs)


def prepare(*argv) -> int:
    return main([str(a) for a in argv])


def load_manifest(out: Path) -> dict:
    m = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    for counts in (m, *m["splits"].values()):
        assert counts["pairs_read"] == counts["pairs_kept"] + sum(counts["rejected"].values())
    return m


def read_rejects(out: Path) -> list[dict]:
    with open(out / "rejects.tsv", encoding="utf-8", newline="") as f:
        rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    return [dict(zip(rows[0], map(unescape, r))) for r in rows[1:]]


# English / Japanese pairs that every cleaning rule keeps (right scripts, distinct, short)
EN = ["cat", "dog", "bird", "fish", "tree", "car", "book", "door"]
JA = ["猫", "犬", "鳥", "魚", "木", "車", "本", "扉"]


def good_pairs(n: int, offset: int = 0) -> list[tuple[str, str]]:
    out = []
    for i in range(offset, offset + n):
        a, b = EN[i % 8], EN[(i // 8) % 8]
        out.append((f"the {a} sees the {b} number {i}", f"{JA[i % 8]}は{JA[(i // 8) % 8]}を見る。番号{i}"))
    return out


def tmx_doc(tus: str, version: str = "1.4") -> str:
    return (f'<?xml version="1.0" encoding="UTF-8"?>\n<tmx version="{version}">\n<header srclang="en" '
            f'datatype="plaintext" segtype="sentence" adminlang="en" o-tmf="x" creationtool="t" '
            f'creationtoolversion="1"/>\n<body>\n{tus}</body>\n</tmx>\n')


def tu(*tuvs: tuple[str, str], props: str = "", attr: str = "xml:lang") -> str:
    return f"<tu>{props}" + "".join(f'<tuv {attr}="{lang}"><seg>{seg}</seg></tuv>' for lang, seg in tuvs) + "</tu>\n"


# --- TMX --------------------------------------------------------------------------------------------------------

TRICKY = [
    ("A & B < C > D", "Ａ＆Ｂ＜Ｃ＞Ｄ"),
    ("tab\there\tand there", "タブ\tあり"),
    ("line\u2028separator, next\u0085line", "行\u2028区切り"),
    ("  leading and trailing  ", "「引用」 \"quotes\" 'apos'"),
    ("CR LF\r\nand a lone CR\r.", "改行\nあり"),
    ("&amp; already escaped &lt;b&gt;", "<b>bold</b> ]]> <!-- not a comment --> <?pi?>"),
    ("astral 𠮷 and 😀", "𠮷野家で😀"),
    ("", "empty source side"),
    ("请参阅图1。", "図１を参照。"),
]


@pytest.mark.parametrize("name,encoding,version", [("a.tmx", "utf-8", "1.4"), ("a.tmx.gz", "utf-8", "1.4"),
                                                   ("a16.tmx", "utf-16", "1.4"), ("a16.tmx.gz", "utf-16", "1.4"),
                                                   ("a11.tmx", "utf-8", "1.1")])
def test_tmx_round_trip(tmp_path, name, encoding, version):
    path = tmp_path / name
    assert write_tmx(str(path), TRICKY, "en-US", "ja", encoding=encoding, version=version) == len(TRICKY)
    raw = path.read_bytes()
    assert (raw[:2] == b"\x1f\x8b") == name.endswith(".gz")
    if encoding == "utf-16" and not name.endswith(".gz"):
        assert raw[:2] in (b"\xff\xfe", b"\xfe\xff")
    if version == "1.1":
        assert b' lang="ja"' in raw and b"xml:lang" not in raw
    recs = records("tmx", path, src_lang="en", tgt_lang="ja")
    assert [(r.src, r.tgt) for r in recs] == TRICKY
    assert [r.origin for r in recs] == [f"{path}:TU#{i}" for i in range(1, len(TRICKY) + 1)]
    back = records("tmx", path, src_lang="ja", tgt_lang="en")
    assert [(r.tgt, r.src) for r in back] == TRICKY


def test_tmx_writer_rejects_what_xml_cannot_hold(tmp_path):
    with pytest.raises(ValueError, match="U\\+0007"):
        write_tmx(str(tmp_path / "x.tmx"), [("bell \x07", "x")])


def test_tmx_languages_regions_and_missing_lang(tmp_path):
    path = write(tmp_path / "l.tmx", tmx_doc(
        tu(("EN-US", "one"), ("ja-JP", "一")) +
        tu(("en", "two"), ("de", "zwei")) +  # no Japanese: missing_lang
        tu(("en-GB", "colour"), ("en-US", "color"), ("JA", "色")) +
        tu(("en_us", "four"), ("ja", "四"))))
    recs = records("tmx", path, src_lang="en", tgt_lang="ja")
    assert reasons(recs) == {"pair": 3, "missing_lang": 1}
    assert [(r.src, r.tgt) for r in recs if isinstance(r, Pair)] == [("one", "一"), ("colour", "色"), ("four", "四")]
    miss = recs[1]
    assert miss.origin == f"{path}:TU#2" and not miss.fatal and miss.src == "two" and miss.tgt == ""
    assert "'ja'" in miss.message and "en, de" in miss.message
    assert records("tmx", path, src_lang="en-US", tgt_lang="ja")[2].src == "color"  # exact region first
    assert reasons(records("tmx", path, src_lang="de", tgt_lang="en")) == {"pair": 1, "missing_lang": 3}
    v11 = write(tmp_path / "v11.tmx", tmx_doc(tu(("EN", "hello"), ("JA", "こんにちは"), attr="lang"), "1.1"))
    assert [(r.src, r.tgt) for r in records("tmx", v11, src_lang="ja", tgt_lang="en")] == [("こんにちは", "hello")]
    with pytest.raises(PrepareError, match="both"):
        open_reader("tmx", str(path), src_lang="en", tgt_lang="en-GB")
    assert lang_matches("EN_us", "en") and lang_matches("en", "en-US") and not lang_matches("en-GB", "en-US")


def test_tmx_inline_markup_drop_or_text(tmp_path):
    seg = ('Press <bpt i="1" x="1">&lt;b&gt;</bpt>Enter<ept i="1">&lt;/b&gt;</ept> now<ph x="2">&lt;br/&gt;</ph>.'
           ' <hi type="em">Really</hi><it pos="begin">{\\i}</it>!<ut>[x]</ut>')
    path = write(tmp_path / "m.tmx", tmx_doc(tu(("en", seg), ("ja", "<ph>&lt;img/&gt;</ph>押す"))))
    drop = records("tmx", path, src_lang="en", tgt_lang="ja")[0]
    assert (drop.src, drop.tgt) == ("Press Enter now. Really!", "押す")
    text = records("tmx", path, src_lang="en", tgt_lang="ja", inline="text")[0]
    assert (text.src, text.tgt) == ("Press <b>Enter</b> now<br/>. Really{\\i}![x]", "<img/>押す")
    with pytest.raises(PrepareError, match="inline"):
        open_reader("tmx", str(path), inline="keep")


def test_tmx_props_become_meta_and_document(tmp_path):
    path = write(tmp_path / "p.tmx", tmx_doc(
        tu(("en", "a"), ("ja", "あ"), props='<prop type="score-bicleaner">0.71</prop><prop type="IPC">G06F 3/01</prop>'
                                            '<prop type="ipc">H04L 29/06</prop><note>ignored</note>') .replace(
            '<tuv xml:lang="en">', '<tuv xml:lang="en"><prop type="source-document">EP1234567B1</prop>') +
        tu(("en", "b"), ("ja", "い"))))
    first, second = records("tmx", path, src_lang="en", tgt_lang="ja")
    assert first.meta == {"score-bicleaner": "0.71", "ipc": "G06F 3/01;H04L 29/06", "source-document": "EP1234567B1"}
    assert first.doc == "EP1234567B1" and second.doc is None and second.meta is None
    assert first == Pair("a", "あ", f"{path}:TU#1")  # doc and meta are annotations, not part of equality


def test_meta_filter_rules():
    def pair(**meta) -> Pair:
        return Pair("s", "t", "f:1", meta=meta or None)
    f = MetaFilter(min_score=0.5, ipc=("g06f", "H04L 29"))
    assert f.check(pair(**{"score-bicleaner": "0.5", "ipc": "G06F 3/01"})) is None
    assert f.check(pair(ipc="A01B; h04l29/06")) is None  # no score prop: kept; any code, spaces and case ignored
    assert f.check(pair(**{"score-bicleaner": "0.49", "ipc": "G06F"})).reason == "low_score"
    assert f.check(pair(**{"score-bicleaner": "nan", "ipc": "G06F"})).reason == "low_score"
    assert f.check(pair(ipc="H04W 4/00")).reason == "ipc" and f.check(pair()).reason == "ipc"
    bad = f.check(pair(**{"score-bicleaner": "high", "ipc": "G06F"}))
    assert bad.reason == "malformed" and bad.fatal and "not a number" in bad.message
    assert not MetaFilter() and MetaFilter(min_score=0.0)


def test_tmx_streams_in_constant_memory(tmp_path):
    def tus(n: int) -> Iterator[tuple[str, str, dict]]:
        for i in range(n):
            yield f"sentence number {i} " * 4, f"文 {i} " * 4, {"score-bicleaner": "0.9"}
    peaks = []
    for n in (1_000, 20_000):
        path = tmp_path / f"big{n}.tmx.gz"
        write_tmx(str(path), tus(n))
        reader = open_reader("tmx", str(path))
        tracemalloc.start()
        count = sum(1 for _ in reader)
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
        assert count == n and reader.documents is None
    assert peaks[1] < 1.25 * peaks[0], peaks  # twenty times the TUs, the same peak (no document ids to count)


def test_tmx_errors_name_file_and_position(tmp_path, capsys):
    good = tmx_doc(tu(("en", "one"), ("ja", "一")) + tu(("en", "two"), ("ja", "二")))
    truncated = write(tmp_path / "t.tmx", good[:good.index("二")])
    recs = iter(open_reader("tmx", str(truncated)))
    assert next(recs) == Pair("one", "一", f"{truncated}:TU#1")
    with pytest.raises(InputError, match=rf"^{truncated}:6:\d+: bad XML: "):
        next(recs)
    assert prepare("--train-src", truncated, "--out", tmp_path / "data", "--on-error", "skip") == 2
    err = capsys.readouterr().err
    assert err.startswith(f"prepare: error: {truncated}:6:") and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "data").exists()
    broken = write(tmp_path / "b.tmx", good.replace("<seg>one</seg>", "<seg>one</sag>"))
    with pytest.raises(InputError, match=rf"^{broken}:5:\d+: bad XML: mismatched tag"):
        list(open_reader("tmx", str(broken)))
    utf16 = write(tmp_path / "u.tmx", good.encode("utf-16-le"))  # no BOM, declaration says UTF-8
    with pytest.raises(InputError, match=rf"^{utf16}:1:\d+: bad XML: .*UTF-16 without a byte-order mark"):
        list(open_reader("tmx", str(utf16)))
    gz = tmp_path / "g.tmx.gz"
    noise = "".join(random.Random(0).choices("abcdefghijklmnopqrstuvwxyz", k=100_000))  # incompressible
    gz.write_bytes(gzip.compress(good.replace("</body>", f"<!-- {noise} --></body>").encode())[:-2000])
    with pytest.raises(InputError, match=rf"^{gz}: truncated gzip file"):
        list(open_reader("tmx", str(gz)))
    not_tmx = write(tmp_path / "n.tmx", '<?xml version="1.0"?><html><body/></html>')
    with pytest.raises(InputError, match=rf"^{not_tmx}:1: not a TMX file: the root element is <html>"):
        list(open_reader("tmx", str(not_tmx)))
    no_seg = write(tmp_path / "s.tmx", tmx_doc('<tu><tuv xml:lang="en"><seg>x</seg></tuv><tuv xml:lang="ja"/></tu>\n'))
    [rec] = records("tmx", no_seg)
    assert rec.reason == "malformed" and rec.fatal and rec.origin == f"{no_seg}:TU#1" and "no <seg>" in rec.message


# --- ParaPat ----------------------------------------------------------------------------------------------------

@needs_parapat
def test_parapat_type1_real_samples():
    cs_en = PARAPAT / "cs-en.type1.tsv"
    recs = records("parapat", cs_en, src_lang="cs", tgt_lang="en")
    assert reasons(recs) == {"pair": 4}
    assert [r.doc for r in recs] == ["6516810", "7642751", "5343155", "5346635"]
    assert recs[0].meta == {"index": "1372", "family_id": "6516810"} and recs[0].origin == f"{cs_en}:2"
    assert recs[0].src.startswith("Řešení se týká herbicidů") and recs[0].tgt.startswith("The present invention")
    swapped = records("parapat", cs_en, src_lang="en", tgt_lang="cs")
    assert [(r.tgt, r.src) for r in swapped] == [(r.src, r.tgt) for r in recs]

    el_en = PARAPAT / "el-en.type1.tsv"
    greek = records("parapat", el_en, src_lang="el", tgt_lang="en")
    assert reasons(greek) == {"pair": 4}
    assert greek[0].src.startswith("αφές") and greek[0].tgt.startswith("offee")  # truncated on both sides, as is
    assert greek[3].tgt.startswith('"""ew type of water take for """"lay flat""""')  # no quote processing
    other = records("parapat", el_en, src_lang="cs", tgt_lang="en")
    assert reasons(other) == {"other_pair": 4} and not other[0].fatal and "el-en" in other[0].message


@needs_parapat
def test_parapat_type2_real_sample_and_direction_from_name(tmp_path):
    en_ja = PARAPAT / "en_ja.tsv"  # five records, no final newline
    recs = records("parapat", en_ja, src_lang="en", tgt_lang="ja")
    assert reasons(recs) == {"pair": 5} and recs[-1].origin == f"{en_ja}:5"
    assert recs[0].src.startswith("The computer system (200)") and recs[0].tgt.startswith("コンピュータシステム（２００）")
    assert all(r.doc is None for r in recs)
    back = records("parapat", en_ja, src_lang="ja", tgt_lang="en")
    assert [(r.tgt, r.src) for r in back] == [(r.src, r.tgt) for r in recs]
    with pytest.raises(PrepareError, match=rf"{en_ja}: the file name says en-ja, not en-zh"):
        records("parapat", en_ja, src_lang="en", tgt_lang="zh")
    assert reasons(records("parapat", PARAPAT / "de_en.tsv", src_lang="en", tgt_lang="de")) == {"pair": 5}


def test_parapat_type1_mixed_pairs_and_defects(tmp_path):
    path = write(tmp_path / "mixed.tsv", "index\tfamily_id\tsrc_lang\tsrc_abs\ttgt_lang\ttgt_abs\n"
                 "1\tF1\tcs\tJedna\ten\tOne\n"
                 "2\tF2\ten\tTwo\tcs\tDva\n"
                 "3\tF3\tde\tDrei\ten\tThree\n"
                 "4\tF4\tcs\tCtyri\ten\n"
                 "5\tF5\tcs\t\"Pet\ten\t\"Five\"\"\n".encode() + b"6\tF6\tcs\t\xff\ten\tSix")
    recs = records("parapat", path, src_lang="cs", tgt_lang="en")
    assert reasons(recs) == {"pair": 3, "other_pair": 1, "malformed": 1, "invalid_utf8": 1}
    assert [(r.src, r.tgt, r.doc) for r in recs if isinstance(r, Pair)] == [
        ("Jedna", "One", "F1"), ("Dva", "Two", "F2"), ('"Pet', '"Five""', "F5")]
    assert recs[3].origin == f"{path}:5" and "found 5" in recs[3].message


# --- NTCIR, ASPEC-JC, OPUS zips ------------------------------------------------------------------------------

def test_ntcir_ids_checked(tmp_path):
    src = write(tmp_path / "train.ja", "JP-2003-1-1\t猫だ。\nJP-2003-1-2\t犬だ。\nJP-2003-2-1\t鳥だ。\nno tab here\n"
                                       "JP-2003-3-1\t木だ。")
    tgt = write(tmp_path / "train.en", "JP-2003-1-1\tA cat.\nJP-2003-1-2\tA dog.\nJP-2003-2-9\tA bird.\n"
                                       "JP-2003-2-2\tx\nJP-2003-3-1\tA tree.\n")
    recs = records("ntcir", src, tgt, src_lang="ja", tgt_lang="en")
    assert reasons(recs) == {"pair": 3, "malformed": 2}
    assert [(r.src, r.tgt, r.doc) for r in recs if isinstance(r, Pair)] == [
        ("猫だ。", "A cat.", "JP-2003-1"), ("犬だ。", "A dog.", "JP-2003-1"), ("木だ。", "A tree.", "JP-2003-3")]
    assert recs[2].origin == f"{src}:3" and f"'JP-2003-2-1' here but 'JP-2003-2-9' at {tgt}:3" in recs[2].message
    assert recs[3].origin == f"{src}:4" and "DOCID-SENTID" in recs[3].message
    short = write(tmp_path / "short.en", "JP-1-1\tA cat.\n")
    with pytest.raises(PrepareError, match=f"{src} has 5 lines but {short} has 1"):
        records("ntcir", src, short)


def test_aspec_jc(tmp_path):
    path = write(tmp_path / "train.txt", "A-B-12-1 ||| 猫 が いる 。 ||| 有 一只 猫 。\nbroken ||| only two\n"
                                         "A-B-12-2 ||| 犬 。 ||| 狗 。")
    recs = records("aspec-jc", path, src_lang="zh", tgt_lang="ja")
    assert reasons(recs) == {"pair": 2, "malformed": 1}
    assert (recs[0].src, recs[0].tgt, recs[0].doc) == ("有 一只 猫 。", "猫 が いる 。", "A-B-12")
    assert "expected 3" in recs[1].message and recs[2].origin == f"{path}:3"
    with pytest.raises(PrepareError, match="ASPEC-JC holds only ja/zh"):
        open_reader("aspec-jc", str(path), src_lang="en", tgt_lang="ja")
    je = write(tmp_path / "je.txt", "0.9 ||| DOC-7 ||| 1 ||| 猫 。 ||| a cat .")
    assert records("aspec", je)[0].doc == "DOC-7"


def opus_zip(path: Path, members: dict[str, str]) -> Path:
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name, text in members.items():
            zf.writestr(name, text)
    return path


def test_opus_zip(tmp_path):
    path = opus_zip(tmp_path / "en-ja.txt.zip", {
        "README": "EuroPat v3\n", "LICENSE": "CC\n",
        "EuroPat.en-ja.en": b"One.\nTwo.\nThree \xff.\n",
        "EuroPat.en-ja.ja": "一。\n二。\n三。",
        "EuroPat.en-ja.ids": "en/EP1.xml\tja/JP1.xml\t1\t1\nen/EP1.xml\tja/JP1.xml\t2\t2\n"
                             "en/EP2.xml\tja/JP2.xml\t1\t1\n"})
    recs = records("opus-zip", path, src_lang="ja", tgt_lang="en")
    assert [(r.src, r.tgt, r.doc) for r in recs[:2]] == [("一。", "One.", "en/EP1.xml"), ("二。", "Two.", "en/EP1.xml")]
    assert recs[0].origin == f"{path}:EuroPat.en-ja.ja:1"
    assert reasons(recs) == {"pair": 2, "invalid_utf8": 1} and recs[2].tgt == "Three \\xff."
    mismatch = opus_zip(tmp_path / "m.zip", {"C.de-en.de": "a\nb\nc\n", "C.de-en.en": "a\nb\n"})
    with pytest.raises(InputError, match=rf"^{mismatch}:C.de-en.de:3: C.de-en.de has more lines than C.de-en.en"):
        records("opus-zip", mismatch, src_lang="de", tgt_lang="en")
    regions = opus_zip(tmp_path / "r.zip", {"C.en-pt_BR.en": "hello\n", "C.en-pt_BR.pt_BR": "olá\n"})
    assert [(r.src, r.tgt) for r in records("opus-zip", regions, src_lang="pt", tgt_lang="en")] == [("olá", "hello")]


def test_opus_zip_errors(tmp_path):
    path = opus_zip(tmp_path / "de-en.zip", {"README": "x", "C.de-en.de": "a\n", "C.de-en.en": "a\n"})
    with pytest.raises(PrepareError, match=rf"^{path}: the zip holds no member pair for en->ja: expected "
                                           r"'Corpus.en-ja.en' and 'Corpus.en-ja.ja'.*it holds: README, C.de-en.de"):
        records("opus-zip", path, src_lang="en", tgt_lang="ja")
    fake = write(tmp_path / "fake.zip", "not a zip")
    with pytest.raises(InputError, match=rf"^{fake}: not a readable zip file"):
        records("opus-zip", fake)


# --- line formats: UTF-16 and auto-detection -------------------------------------------------------------------

def test_utf16_line_file_is_an_error(tmp_path):
    for name, data in (("bom.tsv", "a\tb\n".encode("utf-16")), ("nobom.tsv", "a\tb\nc\td\n".encode("utf-16-le"))):
        path = write(tmp_path / name, data)
        with pytest.raises(InputError, match=rf"^{path}:1: the file looks like UTF-16"):
            records("tsv", path)


def test_detect_format(tmp_path):
    cases = {
        "a.tmx": tmx_doc(""), "b.xml": tmx_doc("").encode("utf-16"), "c.zip": b"PK\x03\x04rest",
        "t1.tsv": "index\tfamily_id\tsrc_lang\tsrc_abs\ttgt_lang\ttgt_abs\n1\tF\tcs\ta\ten\tb\n",
        "en_ja.tsv": "a\tb\n", "pairs.tsv": "a\tb\n", "je.txt": "0.9 ||| D ||| 1 ||| ja ||| en\n",
        "je_dev.txt": "D ||| 1 ||| ja ||| en\n", "jc.txt": "A-1 ||| ja ||| zh\n"}
    expected = {"a.tmx": "tmx", "b.xml": "tmx", "c.zip": "opus-zip", "t1.tsv": "parapat", "en_ja.tsv": "parapat",
                "pairs.tsv": "tsv", "je.txt": "aspec", "je_dev.txt": "aspec", "jc.txt": "aspec-jc"}
    for name, data in cases.items():
        assert detect_format(str(write(tmp_path / name, data))) == expected[name], name
    gz = tmp_path / "d.tmx.gz"
    gz.write_bytes(gzip.compress(tmx_doc("").encode()))
    assert detect_format(str(gz)) == "tmx"
    en, ja = write(tmp_path / "x.en", "hello\n"), write(tmp_path / "x.ja", "こんにちは\n")
    assert detect_format(str(en), str(ja)) == "moses"
    n1, n2 = write(tmp_path / "n.ja", "D1-1\t猫\nD1-2\t犬\n"), write(tmp_path / "n.en", "D1-1\tcat\nD1-2\tdog\n")
    assert detect_format(str(n1), str(n2)) == "ntcir"
    for name, data in (("plain.txt", "just a sentence\n"), ("three.tsv", "a\tb\tc\n"), ("empty.txt", "")):
        with pytest.raises(PrepareError, match="give --format"):
            detect_format(str(write(tmp_path / name, data)))
    other_gz = tmp_path / "lines.txt.gz"
    other_gz.write_bytes(gzip.compress(b"a\tb\n"))
    with pytest.raises(PrepareError, match="gzip file that is not TMX"):
        detect_format(str(other_gz))


# --- split by document ------------------------------------------------------------------------------------------

def ntcir_corpus(tmp_path: Path, n_docs: int = 20, reverse: bool = False, tag: str = "") -> tuple[Path, Path]:
    """Document d holds 2 + d % 4 pairs; sentence text names its document."""
    rows = []
    for d in range(n_docs):
        for s in range(2 + d % 4):
            i = d * 10 + s
            en, ja = good_pairs(1, i)[0]
            rows.append((f"JP-{d:03d}-{s}", f"{en} in document {d}", f"{ja}文書{d}"))
    rows = rows[::-1] if reverse else rows
    src = write(tmp_path / f"doc{tag}.en", "".join(f"{i}\t{e}\n" for i, e, _ in rows))
    tgt = write(tmp_path / f"doc{tag}.ja", "".join(f"{i}\t{j}\n" for i, _, j in rows))
    return src, tgt


def test_doc_split_views(tmp_path):
    src, tgt = ntcir_corpus(tmp_path)
    reader = open_reader("ntcir", str(src), str(tgt))
    split = DocSplit(reader, {"dev": 6, "test": 6}, seed=1)
    views = {name: list(view) for name, view in split.views.items()}
    docs = {name: {r.doc for r in recs} for name, recs in views.items()}
    assert not (docs["dev"] & docs["test"]) and not (docs["train"] & (docs["dev"] | docs["test"]))
    assert sum(map(len, views.values())) == sum(2 + d % 4 for d in range(20))
    per_doc = Counter(r.doc for recs in views.values() for r in recs)
    for name in ("dev", "test"):
        assert len(views[name]) >= 6 > len(views[name]) - min(per_doc[d] for d in docs[name])  # greedy, minimal
        assert split.views[name].documents == len(docs[name]) == split.info["documents"][name]
        assert split.info["pairs"][name] == len(views[name])
    assert split.views["train"].paths == [str(src), str(tgt)] and split.views["dev"].paths == []

    again = DocSplit(open_reader("ntcir", str(src), str(tgt)), {"dev": 6, "test": 6}, seed=1)
    assert [r.origin for r in again.views["dev"]] == [r.origin for r in views["dev"]]  # before train: own pass
    rsrc, rtgt = ntcir_corpus(tmp_path, reverse=True, tag="r")
    reordered = DocSplit(open_reader("ntcir", str(rsrc), str(rtgt)), {"dev": 6, "test": 6}, seed=1)
    assert {r.doc for r in reordered.views["dev"]} == docs["dev"]  # the file order does not matter
    other = DocSplit(open_reader("ntcir", str(src), str(tgt)), {"dev": 6, "test": 6}, seed=2)
    assert {r.doc for r in other.views["dev"]} != docs["dev"]
    with pytest.raises(PrepareError, match="cannot hold out dev >= 40 and test >= 40 pairs by document"):
        DocSplit(open_reader("ntcir", str(src), str(tgt)), {"dev": 40, "test": 40}, seed=1)


def test_split_by_doc_cli(tmp_path, capsys):
    src, tgt = ntcir_corpus(tmp_path)
    out = tmp_path / "data"
    assert prepare("--train-src", src, "--train-tgt", tgt, "--src-lang", "en", "--tgt-lang", "ja", "--out", out,
                   "--split-by-doc", "--dev-size", 6, "--test-size", 5, "--seed", 3) == 0
    m = load_manifest(out)
    info = m["split_by_doc"]
    assert m["formats"] == {"train": "ntcir", "dev": "ntcir", "test": "ntcir"}
    assert info["requested"] == {"dev": 6, "test": 5} and info["seed"] == 3
    assert info["pairs"]["dev"] >= 6 and info["pairs"]["test"] >= 5
    assert sum(info["pairs"].values()) == m["pairs_read"] == 70
    assert {s: m["splits"][s]["pairs_read"] for s in ("train", "dev", "test")} == info["pairs"]
    assert m["documents"] == info["documents"] and sum(m["documents"].values()) == 20
    assert [i["split"] for i in m["inputs"]] == ["train", "train"]
    dev_docs = {line.rsplit(" ", 1)[1] for line in (out / "dev.src.txt").read_text(encoding="utf-8").splitlines()}
    test_docs = {line.rsplit(" ", 1)[1] for line in (out / "test.src.txt").read_text(encoding="utf-8").splitlines()}
    assert len(dev_docs) == m["documents"]["dev"] and not dev_docs & test_docs

    base = ["--train-src", src, "--train-tgt", tgt, "--out", tmp_path / "bad"]
    en, ja = write(tmp_path / "p.en", "a\n"), write(tmp_path / "p.ja", "b\n")
    for argv, message in (
            (["--train-src", en, "--train-tgt", ja, "--out", tmp_path / "bad", "--split-by-doc", "--dev-size", 1],
             f"{en}:1: --split-by-doc needs a document id for every pair, but format 'moses' gives none"),
            (base + ["--split-by-doc", "--dev-size", 1, "--dev-src", src, "--dev-tgt", tgt], "drop --dev-src"),
            (base + ["--split-by-doc"], "needs --dev-size"),
            (base + ["--dev-size", 3], "go with --split-by-doc")):
        assert prepare(*argv) == 2
        assert message in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()


# --- prepare on every format: reasons, rejects.tsv, the manifest contract ------------------------------------

def test_prepare_tmx_with_metadata_filters(tmp_path, capsys):
    pairs = good_pairs(40)
    body = ""
    for i, (en, ja) in enumerate(pairs):
        props = (f'<prop type="score-bicleaner">{0.2 if i in (3, 4) else 0.9}</prop>'
                 f'<prop type="ipc">{"H04L 29/06" if i in (5, 6) else "G06F 3/01" if i != 7 else ""}</prop>'
                 f'<prop type="source-document">EP{i // 4}</prop>')
        body += tu(("en-GB", en), ("ja", ja), props=props if i != 8 else '<prop type="ipc">G06F</prop>')
    body += tu(("en", "lonely"), ("de", "einsam")) * 3  # TU#41-43: missing_lang
    path = write(tmp_path / "europat.tmx", tmx_doc(body))
    out = tmp_path / "data"
    argv = ["--train-src", path, "--out", out, "--min-score", 0.5, "--ipc", "G06F", "--ipc", "A01"]
    assert prepare(*argv) == 0  # missing_lang never stops the run, even with --on-error fail
    m = load_manifest(out)
    rejected = {r: n for r, n in m["splits"]["train"]["rejected"].items() if n}
    assert rejected == {"missing_lang": 3, "low_score": 2, "ipc": 3}  # ipc: two H04L and one empty prop
    assert m["pairs_read"] == 43 and m["pairs_kept"] == 35  # TU#9 has no score prop: kept
    assert m["formats"] == {"train": "tmx"} and m["format"] == "auto"
    assert m["documents"] == {"train": len({i // 4 for i in range(40) if i not in (3, 4, 5, 6, 7, 8)})}
    assert m["metadata_filters"] == {"min_score": 0.5, "score_prop": "score-bicleaner", "ipc": ["G06F", "A01"]}
    by_origin = {r["origin"]: r for r in read_rejects(out)}
    assert by_origin[f"{path}:TU#42"]["reason"] == "missing_lang" and by_origin[f"{path}:TU#42"]["src"] == "lonely"
    assert by_origin[f"{path}:TU#4"]["reason"] == "low_score" and by_origin[f"{path}:TU#8"]["reason"] == "ipc"

    broken = write(tmp_path / "broken.tmx", tmx_doc(body + '<tu><tuv xml:lang="en"><seg>x</seg></tuv>'
                                                           '<tuv xml:lang="ja"></tuv></tu>\n'))
    assert prepare("--train-src", broken, "--out", tmp_path / "b") == 2
    assert f"{broken}:TU#44: <tuv> 'ja' has no <seg>" in capsys.readouterr().err
    assert prepare("--train-src", broken, "--out", tmp_path / "b", "--on-error", "skip") == 0
    assert load_manifest(tmp_path / "b")["rejected"]["malformed"] == 1


def format_fixture(tmp_path: Path, fmt: str) -> tuple[list, dict[str, int]]:
    """Training files of `fmt` holding 30 good pairs and the defects of the format; the reader reasons expected."""
    pairs = good_pairs(30)
    if fmt == "moses":
        return [write(tmp_path / "m.en", "".join(f"{e}\n" for e, _ in pairs).encode() + b"bad \xff"),
                write(tmp_path / "m.ja", "".join(f"{j}\n" for _, j in pairs) + "最後")], {"invalid_utf8": 1}
    if fmt == "tsv":
        return [write(tmp_path / "p.tsv", "".join(f"{e}\t{j}\n" for e, j in pairs) + "one\ttwo\tthree\n")], \
            {"malformed": 1}
    if fmt == "parapat":
        rows = "".join(f"{i}\tF{i % 7}\ten\t{e}\tja\t{j}\n" for i, (e, j) in enumerate(pairs))
        return [write(tmp_path / "t1.tsv", f"{'index family_id src_lang src_abs tgt_lang tgt_abs'.replace(' ', chr(9))}"
                                           f"\n{rows}99\tF\tde\tx\ten\ty\n")], {"other_pair": 1}
    if fmt == "aspec":
        return [write(tmp_path / "a.txt", "".join(f"0.5 ||| D{i % 3} ||| {i} ||| {j} ||| {e}\n"
                                                  for i, (e, j) in enumerate(pairs)) + "x ||| y\n")], {"malformed": 1}
    if fmt == "ntcir":
        src, tgt = ntcir_corpus(tmp_path, n_docs=8)
        return [src, tgt], {}
    if fmt == "tmx":
        write_tmx(str(tmp_path / "c.tmx.gz"), pairs, encoding="utf-16")
        return [tmp_path / "c.tmx.gz"], {}
    if fmt == "opus-zip":
        return [opus_zip(tmp_path / "o.zip", {"X.en-ja.en": "".join(f"{e}\n" for e, _ in pairs),
                                              "X.en-ja.ja": "".join(f"{j}\n" for _, j in pairs)})], {}
    raise AssertionError(fmt)


@pytest.mark.parametrize("fmt", ["moses", "tsv", "parapat", "aspec", "ntcir", "tmx", "opus-zip"])
def test_prepare_every_format_keeps_the_contract(tmp_path, fmt):
    files, expected = format_fixture(tmp_path, fmt)
    out = tmp_path / "data"
    argv = ["--train-src", files[0], *(["--train-tgt", files[1]] if len(files) > 1 else []), "--out", out,
            "--on-error", "skip", "--src-lang", "en", "--tgt-lang", "ja"]
    assert prepare(*argv) == 0
    m = load_manifest(out)
    assert m["formats"]["train"] == fmt  # told by --format auto
    reader_reasons = ("malformed", "invalid_utf8", "missing_lang", "other_pair", "low_score", "ipc")
    assert {r: m["rejected"][r] for r in reader_reasons if m["rejected"][r]} == expected
    assert m["pairs_kept"] >= 25 and Counter(r["reason"] for r in read_rejects(out)) == +Counter(m["rejected"])
