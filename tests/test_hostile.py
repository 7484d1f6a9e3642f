"""Hostile and careless input (issue 11): crafted checkpoints, model files, configs, corpora, archives and
output directories, each built small and fast (bombs are tiny archives, limits lowered where a real one
would be large). Every case ends in a clear one-line error naming the file, or a counted reject -- never a
traceback, a hang, a huge allocation or a file written where it does not belong.
docs/RELIABILITY.md ("Hostile input") lists each case and its test."""
from __future__ import annotations

import gzip
import json
import os
import shutil
import sys
import time
import zipfile
from pathlib import Path

import pytest
import sentencepiece as spm
import torch

from tests.conftest import launch_main, read_metrics, run_cli
from trainer.checkpoint import files as ck
from trainer.artifacts.model_files import ModelFileError
from trainer.config import ConfigError, load_config, to_yaml
from trainer.inference.loading import export_model, load_export, load_run
from trainer.model.seq2seq import build_model

SENTENCES = [f"the {a} sees the {b} in the {c}" for a in ("cat", "dog", "bird", "fish")
             for b in ("tree", "car", "book", "door") for c in ("house", "garden", "street")]


def spm_model(path: Path) -> Path:
    spm.SentencePieceTrainer.train(sentence_iterator=iter(SENTENCES), model_prefix=str(path), vocab_size=30,
                                   pad_id=0, unk_id=1, bos_id=2, eos_id=3, minloglevel=2)
    return Path(f"{path}.model")


def fake_run(run_dir: Path, **model) -> Path:
    """A run directory as the trainer leaves it (config, data manifest, SentencePiece models, one verified
    checkpoint of a tiny untrained model), written directly: no training needed."""
    run_dir.mkdir(parents=True)
    overrides = [f"model.{k}={v}" for k, v in {"emb_dim": 8, "hidden": 8, "layers": 1, "bidirectional_bottom": False,
                                               **model}.items()]
    cfg = load_config(None, overrides)
    (run_dir / "config.yaml").write_text(to_yaml(cfg))
    (run_dir / "data_manifest.json").write_text(json.dumps({"normalize": {"nfkc": False}, "checksum": "c"}))
    for side in ("src", "tgt"):
        spm_model(run_dir / f"spm.{side}")
    vocab = spm.SentencePieceProcessor(model_file=str(run_dir / "spm.src.model")).get_piece_size()
    model = build_model(cfg.model, vocab, vocab)
    tmp = ck.begin(str(run_dir), 5)
    files = {}
    for i, layer in enumerate(model.layers()):
        files[f"{ck.layer_name(i)}-model_states.pt"] = ck.write_torch(ck.model_file(tmp, ck.layer_name(i)),
                                                                      layer.state_dict())
    files["head-model_states.pt"] = ck.write_torch(ck.model_file(tmp, ck.HEAD), model.head.state_dict())
    files[ck.META] = ck.write_json(os.path.join(tmp, ck.META), {"step": 5})
    ck.finalize(str(run_dir), 5, files)
    ck.mark_best(str(run_dir), 5)
    return run_dir


def step_dir(run_dir: Path) -> Path:
    return run_dir / "checkpoints" / "step_00000005"


def rewrite_manifest(run_dir: Path, change) -> None:
    path = step_dir(run_dir) / ck.MANIFEST
    manifest = json.loads(path.read_text())
    path.write_text(json.dumps(change(manifest)))


# --- checkpoints ------------------------------------------------------------------------------------------------

def test_a_clean_fake_run_translates(tmp_path):
    run = fake_run(tmp_path / "run")
    translator = load_run(str(run))
    assert translator.origin["step"] == 5 and len(translator.translate(["the cat sees the tree"], beam=2)) == 1


@pytest.mark.parametrize("name,expected", [
    ("../../../../../../dev/zero", "not a file name of this checkpoint directory"),
    ("/etc/shadow", "not a file name of this checkpoint directory"),
    ("..", "not a file name of this checkpoint directory"),
])
def test_manifest_naming_files_outside_is_refused_without_reading_them(tmp_path, name, expected):
    run = fake_run(tmp_path / "run")
    rewrite_manifest(run, lambda m: {**m, "files": {**m["files"], name: {"sha256": "0" * 64, "bytes": 1}}})
    problems = ck.verify(str(step_dir(run)))
    assert len(problems) == 1 and expected in problems[0] and "bytes" not in problems[0].split(expected)[1]
    with pytest.raises(ck.CheckpointError, match=expected):
        load_run(str(run))


def test_links_devices_and_unlisted_files_in_a_checkpoint_are_refused(tmp_path):
    run = fake_run(tmp_path / "run")
    ckpt = step_dir(run)
    secret = tmp_path / "secret.txt"
    secret.write_text("s3cret\n")
    meta = ckpt / ck.META
    meta.unlink()
    meta.symlink_to(secret)  # a link out of the checkpoint, under a listed name
    problems = ck.verify(str(ckpt))
    assert problems == [f"{meta}: a link to {secret}, outside {ckpt}"]
    meta.unlink()
    meta.symlink_to("/dev/zero")  # would hang a reader
    assert "outside" in ck.verify(str(ckpt))[0]
    meta.unlink()
    os.mkfifo(meta)  # a FIFO inside: not a regular file (reading it would block forever)
    assert ck.verify(str(ckpt)) == [f"{meta}: not a regular file"]
    meta.unlink()
    ck.write_json(str(meta), {"step": 5})
    assert ck.verify(str(ckpt)) == []
    (ckpt / "layer_09-model_states.pt").write_bytes(b"planted")  # a file the manifest does not vouch for
    assert ck.verify(str(ckpt)) == [f"{ckpt}/layer_09-model_states.pt: not in the manifest (added after the "
                                    f"checkpoint was saved?)"]


@pytest.mark.parametrize("content,expected", [
    ("[1, 2, 3]", "malformed: expected an object"),
    ('{"files": [1]}', "malformed: expected an object"),
    ('{"files": {"meta.json": {"sha256": 5, "bytes": "x"}}}', "malformed entry for 'meta.json'"),
    ('{"files": {"meta.json": {"sha256": "' + "0" * 64 + '", "bytes": true}}}', "malformed entry"),
    ("{not json", ":1: invalid JSON: Expecting property name"),
    ("[" * 100_000 + "]" * 100_000, ":1: nested deeper than 64 levels"),
    ('{"files": {},\n "files": {"meta.json": {}}}', ":2: invalid JSON: found duplicate key 'files' (first on line 1)"),
    (b"\xff\xfe{}", "not UTF-8 text (invalid start byte at byte 0)"),
])
def test_malformed_manifest_is_refused_with_a_message(tmp_path, content, expected):
    run = fake_run(tmp_path / "run")
    path = step_dir(run) / ck.MANIFEST
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    [problem] = ck.verify(str(step_dir(run)))
    assert problem.startswith(str(path)) and expected in problem
    with pytest.raises(ck.CheckpointError, match="--allow-unverified"):
        load_run(str(run))
    assert load_run(str(run), allow_unverified=True).origin["step"] == 5  # the user said so


@pytest.mark.slow
def test_a_checkpoint_without_manifest_is_refused_unless_allowed(tmp_path, capsys):
    run = fake_run(tmp_path / "run")
    (step_dir(run) / ck.MANIFEST).unlink()
    layer = step_dir(run) / "layer_01-model_states.pt"
    weights = torch.load(layer, weights_only=True)
    weights = {k: v + 1 for k, v in weights.items()}
    torch.save(weights, layer)  # tampered weights: nothing can tell without checksums
    with pytest.raises(ck.CheckpointError, match="manifest.json: missing.*--allow-unverified"):
        load_run(str(run))
    out = tmp_path / "out.txt"
    (tmp_path / "in.txt").write_text("the cat\n")
    args = ["--run", run, "--input", tmp_path / "in.txt", "--output", out]
    code, _, err = launch_main("translate", args, capsys)  # the refusal in this process; the real process below
    assert code == 2 and "Traceback" not in err and "manifest.json: missing" in err
    run_cli([sys.executable, "launch/translate.py", *args, "--allow-unverified"], timeout=120)
    assert len(out.read_text().splitlines()) == 1


def test_an_unfinished_save_of_the_run_itself_loads_for_the_dev_decode(tmp_path):
    run = fake_run(tmp_path / "run")
    tmp = run / "checkpoints" / "step_00000007.tmp"
    shutil.copytree(step_dir(run), tmp)
    (tmp / ck.MANIFEST).unlink()  # as during a save: the manifest comes after the dev decode
    assert ck.is_unfinished_save(str(run), str(tmp))
    assert load_run(str(run), str(tmp)).origin["checkpoint"] == "step_00000007.tmp"
    elsewhere = tmp_path / "step_00000007.tmp"
    shutil.copytree(tmp, elsewhere)
    assert not ck.is_unfinished_save(str(run), str(elsewhere))
    with pytest.raises(ck.CheckpointError, match="missing"):
        load_run(str(run), str(elsewhere))


@pytest.mark.parametrize("pointer", ["../../../etc", "/etc", "step_5/../../x", "latest", "x" * 300])
def test_best_and_latest_pointers_must_name_a_checkpoint_of_the_run(tmp_path, pointer):
    run = fake_run(tmp_path / "run")
    (run / "checkpoints" / "best").write_text(pointer + "\n")
    with pytest.raises(ck.CheckpointError, match="best: names .*not a checkpoint directory of this run"):
        load_run(str(run))
    assert ck.read_pointer(str(run), "latest") == "step_00000005"


def test_pointer_and_step_links_out_of_the_run_are_refused(tmp_path):
    run = fake_run(tmp_path / "run")
    other = fake_run(tmp_path / "other")
    best = run / "checkpoints" / "best"
    best.unlink()
    best.symlink_to("/dev/zero")
    with pytest.raises(ck.CheckpointError, match="best: a link to /dev/zero"):
        load_run(str(run))
    best.unlink()
    (run / "checkpoints" / "step_00000009").symlink_to(step_dir(other))
    best.write_text("step_00000009\n")
    with pytest.raises(ck.CheckpointError, match="best: names 'step_00000009'.*not a checkpoint directory"):
        load_run(str(run))
    assert ck.complete_checkpoints(str(run)) == ["step_00000005"]  # auto-resume never follows it either


# --- exported models --------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("export")
    export_model(load_run(str(fake_run(root / "run"))), str(root / "model.pt"))
    return root / "model.pt"


def tampered(exported: Path, tmp_path: Path, change) -> str:
    blob = torch.load(exported, weights_only=True)
    change(blob)
    path = tmp_path / "bad.pt"
    torch.save(blob, path)
    return str(path)


def set_config(key: str, value):
    def change(blob):
        section, name = key.split(".")
        blob["config"][section][name] = value
    return change


@pytest.mark.parametrize("change,expected", [
    (set_config("model.hidden", 60000), r"model.hidden=60000.*needs \(240000, 8\)"),
    (set_config("model.layers", -3), "config model.layers=-3: must be > 0"),
    (set_config("model.layers", 4), "no pairs.1"),
    (set_config("model.attention", "magic"), "model.attention='magic': must be one of"),
    (set_config("model.hidden", "wide"), "bad config key 'model.hidden'"),
    (set_config("decode.beam", 0), "decode.beam=0: must be > 0"),
    (lambda b: b.__setitem__("config", [1, 2]), "the config is a list"),
    (lambda b: b["config"].__setitem__("extra", {"x": 1}), "bad config key 'extra'"),
    (lambda b: b.pop("spm_tgt"), "incomplete model file: no spm_tgt"),
    (lambda b: b.pop("model"), "incomplete model file: no model"),
    (lambda b: b.__setitem__("spm_src", torch.frombuffer(bytearray(b"garbage!"), dtype=torch.uint8)),
     "spm_src: not a SentencePiece model"),
    (lambda b: b.__setitem__("spm_src", torch.zeros(0, dtype=torch.uint8)), "spm_src: a SentencePiece model of 0"),
    (lambda b: b.__setitem__("spm_src", torch.zeros(3)), "spm_src: expected the model's bytes"),
    (lambda b: b["model"].pop("head.proj.bias"), "no head.proj.bias"),
    (lambda b: b["model"].__setitem__("head.proj.bias", torch.zeros(3)), r"head.proj.bias has shape \(3,\)"),
    (lambda b: b["model"].__setitem__("head.proj.bias", "x"), "head.proj.bias is a str"),
    (lambda b: b.__setitem__("normalize", {"nfkc": "yes"}), "normalisation flag nfkc='yes' is not a bool"),
    (lambda b: b.__setitem__("normalize", {"evil": True}), "unknown normalisation flag"),
    (lambda b: b.__setitem__("version", 9), "format version 9"),
])
def test_exported_model_is_validated_before_anything_is_built(exported, tmp_path, change, expected):
    path = tampered(exported, tmp_path, change)
    with pytest.raises(ValueError, match=expected) as e:
        load_export(path)
    assert str(e.value).startswith(f"--model {path}")
    assert load_export(str(exported)).translate(["the cat"], beam=1)  # the untouched file still loads


def test_exported_model_errors_are_one_line_on_the_cli(exported, tmp_path, capsys):
    path = tampered(exported, tmp_path, set_config("model.hidden", 60000))
    (tmp_path / "in.txt").write_text("the cat\n")
    r = run_cli([sys.executable, "launch/translate.py", "--model", path, "--input", tmp_path / "in.txt",
                 "--output", tmp_path / "out.txt"], check=False, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert "model.hidden=60000" in r.stderr and not (tmp_path / "out.txt").exists()
    code = tmp_path / "code.pt"
    code.write_bytes(b"\x80\x04cos\nsystem\n(S'touch " + str(tmp_path / "pwned").encode() + b"'\ntR.")
    status, _, err = launch_main("translate", ["--model", code, "--input", tmp_path / "in.txt", "--output",
                                               tmp_path / "out.txt"], capsys)  # the same entry point, in this process
    assert status == 2 and "not a readable model file" in err and not (tmp_path / "pwned").exists()
    assert len(err.strip().splitlines()) == 1 and "GLOBAL os.system" in err, err  # torch's dozen lines, one here


def test_every_entry_points_refusal_is_one_line_whatever_it_quotes(capsys):
    """The backstop of the one-line contract, where every launch/ script prints its refusal (trainer.entry.fail): a
    message quoting another library's multi-line text (torch's refusal of a file was a dozen lines) is one line."""
    from trainer.entry import fail

    codes = []
    fail(ValueError("--model m.pt: not readable (torch says:\n\n  first\nsecond  \n)"), exit=codes.append)
    err = capsys.readouterr().err
    assert codes == [2] and err == "error: --model m.pt: not readable (torch says: first second )\n", err


@pytest.mark.parametrize("content,says", [
    (b"\x80\x04cos\nsystem\n(S'touch PWNED'\ntR.", "refused by the weights-only loader: Trying to load unsupported "
                                                    "GLOBAL os.system"),
    (bytes(range(7, 107)), "UnpicklingError: "),
    (b"PK\x03\x04" + b"\0" * 60, "cannot be read ("),
], ids=["code", "junk", "broken_zip"])
def test_a_file_torch_will_not_load_is_one_line_and_no_warning(tmp_path, content, says):
    """Both places that torch.load a user's file (a checkpoint's, an export) go through one loader: weights only,
    torch's pickle-protocol UserWarning kept quiet (it printed two lines before the error), its dozen-line message
    cut to the line that says what the file asked for."""
    import warnings

    from trainer.artifacts.model_files import read_export
    from trainer.checkpoint.files import load as load_checkpoint_file

    path = tmp_path / "x.pt"
    path.write_bytes(content.replace(b"PWNED", str(tmp_path / "pwned").encode()))
    for load, error in ((load_checkpoint_file, ck.CheckpointError), (read_export, ValueError)):
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            with pytest.raises(error) as e:
                load(str(path))
        message = str(e.value)
        assert "\n" not in message and len(message) < 600 and str(path) in message, message
        assert not seen, [str(w.message) for w in seen]
        if says != "cannot be read (":
            assert says in message, message
    assert not (tmp_path / "pwned").exists()


def test_a_run_whose_config_does_not_fit_its_weights_is_refused(tmp_path):
    run = fake_run(tmp_path / "run")
    config = run / "config.yaml"
    config.write_text(config.read_text().replace("hidden: 8", "hidden: 60000"))
    with pytest.raises(ModelFileError, match=r"layer_01-model_states.pt: .* has shape .*model.hidden=60000"):
        load_run(str(run))
    config.write_text(config.read_text().replace("hidden: 60000", "hidden: 8"))
    (run / "spm.tgt.model").write_bytes(b"garbage")
    with pytest.raises(ModelFileError, match="spm.tgt.model: not a SentencePiece model"):
        load_run(str(run))


# --- the YAML config --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text,expected", [
    ("model:\n  hidden: [1\n", r":3:1: YAML syntax error: did not find expected ',' or ']'"),
    ("model:\n  hidden: 5\nmodel:\n  hidden: 6\n", ":3:1: YAML syntax error: found duplicate key"),
    ("model: !!python/object/apply:os.system ['touch {pwned}']\n", ":1:8: YAML tags are not allowed"),
    ("train: !!python/name:os.system\n", "YAML tags are not allowed"),
    ("- 1\n- 2\n", "the top level must be a mapping of sections"),
    ("just a string\n", "bad config key 'just a string': Key 'just a string' not in 'Config'$"),
    ("run:\n  name: ${oc.env:HOME}\n", "run.name: interpolations"),
    ("a: &a [x, x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
     "c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]\nd: [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c]\n",
     "node expansion exceeds"),
    (b"model:\n  hidden: \xff\n", "not UTF-8 text"),
    ("x: " + "y" * (2 << 20), "bytes; a config has at most"),
])
def test_hostile_yaml_config_is_one_clear_error(tmp_path, text, expected):
    path = tmp_path / "c.yaml"
    pwned = tmp_path / "pwned"
    path.write_bytes(text if isinstance(text, bytes) else text.replace("{pwned}", str(pwned)).encode())
    with pytest.raises(ConfigError, match=expected) as e:
        load_config(str(path))
    assert str(e.value).startswith(str(path)) and "\n" not in str(e.value) and not pwned.exists()
    with pytest.raises(ConfigError, match="interpolations"):
        load_config(None, ["run.name=${oc.env:HOME}"])


@pytest.mark.slow
def test_yaml_syntax_error_on_the_train_cli_is_one_line(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("model: !!python/object/apply:os.system ['true']\n")
    r = run_cli([sys.executable, "launch/train.py", "--deepspeed_config", "ds_configs/single.json", "--config", path],
                check=False, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr and "YAML tags are not allowed" in r.stderr


# --- corpora: lines, segments, archives ----------------------------------------------------------------------

EN = ["cat", "dog", "bird", "fish", "tree", "car", "book", "door"]
JA = ["猫", "犬", "鳥", "魚", "木", "車", "本", "扉"]


def good_pairs(n: int) -> list[tuple[str, str]]:
    return [(f"the {EN[i % 8]} sees the {EN[(i // 8) % 8]} number {i}",
             f"{JA[i % 8]}は{JA[(i // 8) % 8]}を見る。番号{i}") for i in range(n)]


def moses(tmp_path: Path, name: str, pairs) -> tuple[Path, Path]:
    src, tgt = tmp_path / f"{name}.en", tmp_path / f"{name}.ja"
    src.write_bytes(b"".join((s if isinstance(s, bytes) else s.encode()) + b"\n" for s, _ in pairs))
    tgt.write_bytes(b"".join((t if isinstance(t, bytes) else t.encode()) + b"\n" for _, t in pairs))
    return src, tgt


def prepare(*argv) -> int:
    from data_prep.prepare import main
    return main([str(a) for a in argv] + ["--vocab-size", "60", "--workers", "1"])


def manifest(out: Path) -> dict:
    m = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    for counts in (m, *m["splits"].values()):
        assert counts["pairs_read"] == counts["pairs_kept"] + sum(counts["rejected"].values())
    return m


def rejects(out: Path) -> list[dict]:
    from data_prep.prepare import unescape
    lines = (out / "rejects.tsv").read_text(encoding="utf-8").split("\n")[:-1]
    header = lines[0].split("\t")
    return [dict(zip(header, map(unescape, line.split("\t")))) for line in lines[1:]]


def peak_bytes(fn) -> int:
    import tracemalloc
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_an_oversized_line_is_rejected_and_counted_without_being_read_whole(tmp_path):
    from data_prep.readers import InputLimits, open_reader
    big = "word " * 4_000_000  # 20 MB on one line
    src, tgt = moses(tmp_path, "train", [*good_pairs(30), (big, "猫"), ("the cat", big.encode() + b"\xff")])
    reader = open_reader("moses", str(src), str(tgt))
    records = []
    peak = peak_bytes(lambda: records.extend(reader))
    assert peak < 2 << 20, peak  # the 20 MB lines were never held
    bad = [r for r in records if not hasattr(r, "doc")]
    assert [(r.reason, r.origin) for r in bad] == [("oversized", f"{src}:31"), ("oversized", f"{tgt}:32")]
    assert "line of 20000000 bytes, longer than --max-line-bytes 65536" in bad[0].message
    assert bad[1].src == "the cat" and len(bad[1].tgt) == 65536  # the good source is kept beside the bad target
    small = open_reader("tsv", str(tmp_path / "x.tsv"), limits=InputLimits(max_line_bytes=10)) if (
        tmp_path / "x.tsv").write_text("short\tline\na bit longer\there\n") else None
    assert [getattr(r, "reason", "pair") for r in small] == ["pair", "oversized"]


def test_oversized_lines_in_every_split_are_counted_and_rejects_tsv_stays_small(tmp_path):
    long_line = "the pump " * 2_000  # 18 kB
    train = moses(tmp_path, "train", [*good_pairs(40), (long_line, "ポンプ"), *[("copy me", "copy me")] * 300])
    dev = moses(tmp_path, "dev", [*good_pairs(5), ("the cat", long_line)])
    out = tmp_path / "data"
    assert prepare("--format", "moses", "--train-src", train[0], "--train-tgt", train[1], "--dev-src", dev[0],
                   "--dev-tgt", dev[1], "--out", out, "--max-line-bytes", "10000", "--no-script-filter") == 0
    m = manifest(out)
    assert m["splits"]["train"]["rejected"]["oversized"] == 1 and m["splits"]["dev"]["rejected"]["oversized"] == 1
    assert m["splits"]["dev"]["pairs_kept"] == 5 and long_line not in (out / "dev.tgt.txt").read_text()
    rows = rejects(out)
    assert [r["origin"] for r in rows if r["reason"] == "oversized"] == [f"{train[0]}:41", f"{dev[1]}:6"]
    assert all(len(r["src"]) <= 1100 and len(r["tgt"]) <= 1100 for r in rows)  # excerpts, not whole lines
    assert [r for r in rows if r["origin"] == f"{dev[1]}:6"][0]["src"] == "the cat"


def test_invalid_utf8_target_keeps_the_valid_source_in_rejects(tmp_path):
    train = moses(tmp_path, "train", [*good_pairs(40), ("the valid source", b"bad \xff target")])
    out = tmp_path / "data"
    assert prepare("--format", "moses", "--train-src", train[0], "--train-tgt", train[1], "--out", out,
                   "--on-error", "skip") == 0
    [row] = [r for r in rejects(out) if r["reason"] == "invalid_utf8"]
    assert row == {"reason": "invalid_utf8", "origin": f"{train[1]}:41", "src": "the valid source",
                   "tgt": "bad \\xff target"}


def opus_zip(path: Path, members: dict, compression=zipfile.ZIP_DEFLATED) -> Path:
    with zipfile.ZipFile(path, "w", compression=compression) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return path


def test_zip_bomb_is_refused_before_unpacking(tmp_path, capsys):
    bomb = opus_zip(tmp_path / "en-ja.zip", {"C.en-ja.en": b"\0" * (40 << 20), "C.en-ja.ja": b"\0" * (40 << 20)})
    assert bomb.stat().st_size < 200_000
    out = tmp_path / "data"
    assert prepare("--train-src", bomb, "--out", out) == 2
    err = capsys.readouterr().err
    assert f"{bomb}:C.en-ja.en: unpacks to 41943040 bytes" in err and "refused as a likely zip bomb" in err
    assert len(err.strip().splitlines()) == 1 and not out.exists()
    copies = opus_zip(tmp_path / "c.zip", {"C.en-ja.en": "copy\n" * 5_000_000, "C.en-ja.ja": "copy\n" * 5_000_000})
    assert prepare("--train-src", copies, "--out", out) == 2  # not 5M "copy" rejects in rejects.tsv
    assert "more than --max-expansion 100): refused" in capsys.readouterr().err and not out.exists()
    from data_prep.readers import InputLimits, InputError, open_reader
    small = opus_zip(tmp_path / "s.zip", {"C.en-ja.en": "the cat\n" * 2_000, "C.en-ja.ja": "猫\n" * 2_000})
    open_reader("opus-zip", str(small)).check()
    lowered = open_reader("opus-zip", str(small), limits=InputLimits(max_expansion=5, expansion_slack=1000))
    with pytest.raises(InputError, match=f"^{small}:C.en-ja.en: unpacks to 16000 bytes .*likely zip bomb"):
        lowered.check()


def patch_zip(path: Path, local_offset: int, central_offset: int, value: bytes) -> None:
    data = bytearray(path.read_bytes())
    for signature, offset in ((b"PK\x03\x04", local_offset), (b"PK\x01\x02", central_offset)):
        start = 0
        while (at := data.find(signature, start)) >= 0:
            data[at + offset:at + offset + 2] = value
            start = at + 4
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("field,value,expected", [
    ((6, 8), b"\x01\x00", "the member is encrypted"),  # general purpose flag bit 0
    ((8, 10), b"\x63\x00", "compression method 99 is not supported"),  # 99: AES
])
def test_encrypted_or_unsupported_zip_members_are_clear_errors(tmp_path, capsys, field, value, expected):
    path = opus_zip(tmp_path / "en-ja.zip", {"C.en-ja.en": "the cat\n", "C.en-ja.ja": "猫\n"})
    patch_zip(path, *field, value)
    assert prepare("--train-src", path, "--out", tmp_path / "data") == 2
    err = capsys.readouterr().err
    assert f"{path}:C.en-ja.en: {expected}" in err and len(err.strip().splitlines()) == 1


def tmx(body: str, head: str = "") -> str:
    return (f'<?xml version="1.0" encoding="UTF-8"?>\n{head}<tmx version="1.4"><header srclang="en"/><body>\n'
            f'{body}</body></tmx>\n')


def tu(en: str = "the cat", ja: str = "猫") -> str:
    return f'<tu><tuv xml:lang="en"><seg>{en}</seg></tuv><tuv xml:lang="ja"><seg>{ja}</seg></tuv></tu>\n'


def tmx_records(path: Path, **options) -> list:
    from data_prep.readers import open_reader
    return list(open_reader("tmx", str(path), **options))


def test_tmx_oversized_segment_is_rejected_unstored_and_whitespace_is_never_stored(tmp_path):
    path = tmp_path / "a.tmx"
    path.write_text(tmx(tu() + tu("x" * (20 << 20)) + " \n" * (10 << 20) + tu("the dog", "犬")))
    records = []
    peak = peak_bytes(lambda: records.extend(tmx_records(path)))
    assert peak < 2 << 20, peak  # a 20 MB <seg> and 20 MB of whitespace between <tu>s, never held
    assert [getattr(r, "reason", r.src) for r in records] == ["the cat", "oversized", "the dog"]
    assert records[1].origin == f"{path}:TU#2" and "longer than --max-line-bytes 65536" in records[1].message


def test_gzipped_tmx_bomb_is_refused(tmp_path, capsys):
    path = tmp_path / "bomb.tmx.gz"
    path.write_bytes(gzip.compress(tmx(tu("a" * (200 << 20))).encode(), 9))
    assert path.stat().st_size < 1 << 20
    assert prepare("--train-src", path, "--out", tmp_path / "data") == 2
    err = capsys.readouterr().err
    assert f"{path}: decompresses to more than 100 times its compressed size" in err and "bomb" in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("doc,expected", [
    (tmx(tu("<hi>" * 5000 + "deep" + "</hi>" * 5000)), "TU#1: elements nested more than 64 deep inside the <tu>"),
    (tmx("<x>" * 20_000 + "</x>" * 20_000), "elements nested more than 10000 deep"),
    (tmx(tu(), head='<!DOCTYPE tmx [<!ENTITY a "aaaaaaaaaa"><!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;">]>'),
     "entity declaration <!ENTITY a ...>: entities are not accepted"),
    (tmx(tu("&x;"), head='<!DOCTYPE tmx [<!ENTITY x SYSTEM "file:///etc/passwd">]>'),
     "entity declaration <!ENTITY x ...>"),
    (tmx("<!-- " + "c" * (20 << 20) + " -->" + tu()), "bytes without an element or text"),
])
def test_hostile_tmx_structure_is_one_clear_error(tmp_path, capsys, doc, expected):
    path = tmp_path / "h.tmx"
    path.write_text(doc)
    assert prepare("--train-src", path, "--out", tmp_path / "data") == 2
    err = capsys.readouterr().err
    assert err.startswith(f"prepare: error: {path}:") and expected in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err and "passwd" not in err.split("ENTITY")[0]


# --- the output directory, empty dev sets, interruptions, unexpected errors -------------------------------------

def test_prepare_refuses_a_directory_holding_files_it_did_not_write(tmp_path, capsys):
    train = moses(tmp_path, "train", good_pairs(40))
    out = tmp_path / "data"
    out.mkdir()
    (out / "notes.txt").write_text("mine\n")
    (out / "rejects.tsv").write_text("my own rejects\n")
    args = ["--format", "moses", "--train-src", train[0], "--train-tgt", train[1], "--out", out]
    assert prepare(*args) == 2
    err = capsys.readouterr().err
    assert f"--out {out}: holds notes.txt, which prepare did not write" in err and "--overwrite" in err
    assert (out / "rejects.tsv").read_text() == "my own rejects\n"
    (out / "notes.txt").unlink()
    assert prepare(*args) == 2  # only names of ours, but no manifest of ours: not known to be ours
    assert "holds rejects.tsv but no manifest.json written by prepare" in capsys.readouterr().err
    (out / "notes.txt").write_text("mine\n")
    assert prepare(*args, "--overwrite") == 0
    assert (out / "notes.txt").read_text() == "mine\n" and manifest(out)["pairs_kept"] > 0
    (out / "notes.txt").unlink()
    assert prepare(*args) == 0  # replacing our own earlier output needs no flag
    (out / "manifest.json").write_text("{}")
    assert prepare(*args) == 2 and "no manifest.json written by prepare" in capsys.readouterr().err


def test_empty_dev_set_is_refused_at_prepare_and_at_training_start(tmp_path, capsys):
    train = moses(tmp_path, "train", good_pairs(40))
    for name, pairs in (("empty", []), ("blank", [(" ", "\u3000")] * 3)):
        dev = moses(tmp_path, name, pairs)
        out = tmp_path / f"data-{name}"
        assert prepare("--format", "moses", "--train-src", train[0], "--train-tgt", train[1], "--dev-src", dev[0],
                       "--dev-tgt", dev[1], "--out", out) == 2
        err = capsys.readouterr().err
        assert f"--dev-src {dev[0]}: no dev pair is left ({len(pairs)} read" in err and not out.exists()
    from data_prep.binary import TokenArrayWriter
    from trainer.data import ParallelData
    for side in ("src", "tgt"):
        TokenArrayWriter(str(tmp_path), "dev", side).close()  # a data dir from before this check
    with pytest.raises(ValueError, match="the dev split holds no sentence pair"):
        ParallelData(str(tmp_path), "dev")


@pytest.mark.parametrize("signame,code,said", [("SIGTERM", 143, "SIGTERM"), ("SIGINT", 130, "Ctrl-C"),
                                               ("SIGHUP", 129, "SIGHUP")])  # SIGHUP: a closed terminal
def test_sigterm_during_prepare_leaves_no_staging_directory(tmp_path, signame, code, said):
    import signal
    import subprocess
    import time
    pairs = [(f"{s} {i}", f"{t} {i}") for i in range(20_000) for s, t in good_pairs(8)]
    train = moses(tmp_path, "train", pairs)
    out = tmp_path / "data"
    proc = subprocess.Popen([sys.executable, "-m", "data_prep.prepare", "--format", "moses", "--train-src", train[0],
                             "--train-tgt", train[1], "--out", out, "--workers", "2"], cwd=Path(__file__).parents[1],
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 60
        while not (out / ".prepare-tmp" / "tmp" / "pairs.tsv").exists() and time.time() < deadline:
            assert proc.poll() is None, proc.stderr.read()
            time.sleep(0.05)
        proc.send_signal(getattr(signal, signame))
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == code, err
    assert f"prepare: stopped: by {said} while reading train" in err and "Traceback" not in err
    assert not out.exists()  # it was created by this run and is empty again: removed


def _prepared(tmp_path: Path, out: str, vocab_size: int = 60) -> Path:
    from data_prep.prepare import main
    train, dev = moses(tmp_path, "train", good_pairs(400)), moses(tmp_path, "dev", good_pairs(400)[:8])
    assert main([str(a) for a in ("--format", "moses", "--train-src", train[0], "--train-tgt", train[1], "--dev-src",
                                  dev[0], "--dev-tgt", dev[1], "--out", tmp_path / out, "--vocab-size", vocab_size,
                                  "--workers", 1)]) == 0
    return tmp_path / out


def test_a_prepare_into_an_out_another_prepare_holds_is_refused_and_touches_nothing(tmp_path, capsys):
    """The issue's: two prepares into one --out at once, each removing the other's staging directory; one published a
    mixed data dir. --out is held now (DATA_DIR/.prepare.lock): a second prepare is refused in one line naming the
    holder, and neither its staging directory nor its files are touched; the trainer refuses the data dir while a
    prepare holds it. Once the holder is gone, its staging directory is a killed prepare's leftover: removed, said."""
    import socket

    from data_prep import lock
    from data_prep.dataformat import PREPARE_LOCK
    from trainer.data import read_manifest
    out = _prepared(tmp_path, "data")
    capsys.readouterr()
    held, _ = lock.hold(str(out), PREPARE_LOCK, where="--out", owner="prepare")  # another prepare, at work
    (out / ".prepare-tmp").mkdir()
    (out / ".prepare-tmp" / "its-work").write_text("x")
    kept = {p: p.read_bytes() for p in out.rglob("*") if p.is_file() and p.name != PREPARE_LOCK}
    try:
        train = moses(tmp_path, "train", good_pairs(40))
        assert prepare("--format", "moses", "--train-src", train[0], "--train-tgt", train[1], "--out", out) == 2
        line = capsys.readouterr().err.strip()
        assert "\n" not in line and line.startswith(f"prepare: error: --out {out}: another prepare is writing it (pid "
                                                    f"{os.getpid()} on {socket.gethostname()} since ")
        assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file() and p.name != PREPARE_LOCK} == kept
        with pytest.raises(ValueError, match=rf"^data.dir={out}: data_prep.prepare is writing it \(pid {os.getpid()} "):
            read_manifest(str(out))
    finally:
        lock.release(held)
    assert read_manifest(str(out))["vocab"]["src_size"] > 0
    assert prepare("--format", "moses", "--train-src", train[0], "--train-tgt", train[1], "--out", out) == 0
    assert f"{out / '.prepare-tmp'}: left by a prepare that was killed; removed" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(".")) == [PREPARE_LOCK]


@pytest.mark.parametrize("mode", ["ids", "checksums", "full"])
def test_a_data_dir_whose_vocabulary_disagrees_with_its_manifest_is_refused_at_training_start(tmp_path, mode):
    """The issue's mixed data dir: a manifest of one prepare (src_size 400) beside the SentencePiece model of another
    (304 pieces), whose sha256 the manifest recorded (it hashed the shared staging directory), was accepted with
    data.verify=full. Each model's size is now compared with the manifest in every mode but none."""
    from data_prep.binary import file_sha256
    from trainer.data import read_manifest, verify
    ours, theirs = _prepared(tmp_path, "ours"), _prepared(tmp_path, "theirs", vocab_size=330)
    shutil.copyfile(theirs / "spm.src.model", ours / "spm.src.model")
    m = json.loads((ours / "manifest.json").read_text())
    m["vocab"]["src_model_sha256"] = file_sha256(str(ours / "spm.src.model"))
    (ours / "manifest.json").write_text(json.dumps(m))
    have, want = json.loads((theirs / "manifest.json").read_text())["vocab"]["src_size"], m["vocab"]["src_size"]
    assert have != want
    with pytest.raises(ValueError, match=rf"^{ours / 'spm.src.model'}: {have} pieces where the data manifest says "
                                         rf"{want} \(src_size\)"):
        verify(str(ours), read_manifest(str(ours)), mode)
    verify(str(ours), read_manifest(str(ours)), "none")  # the user's choice: nothing is checked


def test_two_prepares_into_one_out_at_once_leave_one_consistent_data_dir(tmp_path):
    """The issue's race, as it ran: both started at once. One is refused naming the other (or, had they not
    overlapped, both finish one after the other); the data dir is whole (data.verify=full), no temporary left."""
    import subprocess

    from trainer.data import read_manifest, verify
    train = moses(tmp_path, "train", good_pairs(400))
    out = tmp_path / "data"
    procs = [subprocess.Popen([sys.executable, "-m", "data_prep.prepare", "--format", "moses", "--train-src",
                               train[0], "--train-tgt", train[1], "--out", out, "--vocab-size", size, "--workers", "1"],
                              cwd=Path(__file__).parents[1], stderr=subprocess.PIPE, text=True)
             for size in ("60", "330")]
    results = [(p.wait(timeout=300), p.stderr.read()) for p in procs]
    codes = sorted(code for code, _ in results)
    assert codes in ([0, 0], [0, 2]), results
    refused = [err for code, err in results if code == 2]
    assert all(f"prepare: error: --out {out}: another prepare is writing it (pid " in err for err in refused), results
    verify(str(out), read_manifest(str(out)), "full")
    assert not [p for p in out.rglob("*") if p.name.endswith(".tmp")] and not (out / ".prepare-tmp").exists()


@pytest.mark.parametrize("then", ["names itself", "lets go", "never says"])
def test_a_lock_caught_between_its_taking_and_its_naming_is_looked_at_again(tmp_path, monkeypatch, then):
    """A CI's: two prepares started at once; the second found --out locked while the first had not yet written its
    name (or had emptied the file and not yet dropped the lock), and was refused as 'a process that did not say who
    it is'. The window is held open here (a lock on an empty file, in a thread): the second waits until the file
    names its holder, or takes the lock once it is free; a holder that never names itself is unnamed after the
    grace, as before."""
    import fcntl
    import socket
    import threading

    from data_prep import lock
    monkeypatch.setattr(lock, "NAMING_GRACE_S", 1.0 if then == "never says" else 30.0)
    path = tmp_path / "x.lock"
    first = open(path, "ab")
    fcntl.flock(first.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)  # taken, not yet named

    def later():
        time.sleep(0.3)
        if then == "names itself":
            first.write(b'{"pid": 12345, "host": "h", "since": "t"}\n')
            first.flush()
        elif then == "lets go":
            first.close()
    threading.Thread(target=later, daemon=True).start()
    try:
        if then == "lets go":
            held, former = lock.hold(str(tmp_path), "x.lock", where="--out", owner="prepare")
            assert former is None and str(os.getpid()) in path.read_text() and socket.gethostname() in path.read_text()
            lock.release(held)
            return
        assert lock.held_by(str(path)) == ("pid 12345 on h since t" if then == "names itself" else lock.UNNAMED)
        with pytest.raises(lock.Busy) as e:
            lock.hold(str(tmp_path), "x.lock", where="--out", owner="prepare")
        assert e.value.holder == ("pid 12345 on h since t" if then == "names itself" else None)
    finally:
        first.close()


def test_an_unexpected_error_is_one_line_with_the_position(tmp_path, capsys, monkeypatch):
    from data_prep import pipeline
    train = moses(tmp_path, "train", good_pairs(40))
    original = pipeline.CleanTask.__call__

    def exhausted(self, pairs):
        if len(pairs) < 40:
            raise MemoryError()
        return original(self, pairs)

    monkeypatch.setattr(pipeline, "CHUNK", 30)
    monkeypatch.setattr(pipeline.CleanTask, "__call__", exhausted)
    args = ["--format", "moses", "--train-src", train[0], "--train-tgt", train[1], "--out", tmp_path / "data"]
    assert prepare(*args) == 1
    err = capsys.readouterr().err
    assert err.strip() == f"prepare: error: out of memory while reading train, after {train[0]}:40 (lower --workers, " \
                          f"or check the input there)"
    monkeypatch.setattr(pipeline.CleanTask, "__call__", lambda self, pairs: 1 / 0)
    assert prepare(*args) == 1
    err = capsys.readouterr().err
    assert "unexpected ZeroDivisionError while reading train, after" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "data").exists()


@pytest.mark.parametrize("content,expected", [
    ("[]", "not a manifest written by data_prep.prepare"),
    ('{"vocab": {"src_size": "8000", "tgt_size": 8000}, "checksum": "x"}', "not a manifest written"),
    ('{"vocab": {"src_size": 80, "tgt_size": 80}}', "no vocab sizes or checksum"),
    ("{oops", r"manifest.json:1: invalid JSON: Expecting property name"),
])
def test_a_malformed_data_manifest_is_refused_when_training_starts(tmp_path, content, expected):
    from trainer.data import read_manifest
    (tmp_path / "manifest.json").write_text(content)
    with pytest.raises((ValueError, ck.CheckpointError), match=expected):
        read_manifest(str(tmp_path))
    (tmp_path / "manifest.json").write_text('{"vocab": {"src_size": 80, "tgt_size": 80}, "checksum": "x"}')
    assert read_manifest(str(tmp_path))["vocab"]["src_size"] == 80


def test_a_stop_whose_exception_was_swallowed_is_still_noticed(tmp_path):
    """A signal handler's exception is lost when the signal lands in a callback whose exceptions Python ignores
    (seen: logging's at-fork hook while the worker pool started); the flag it set stops prepare anyway."""
    from data_prep.pipeline import Position, Stopped
    from data_prep.prepare import build_parser
    from data_prep.prepare import prepare as run_prepare
    train = moses(tmp_path, "train", good_pairs(40))
    args = build_parser().parse_args(["--format", "moses", "--train-src", str(train[0]), "--train-tgt",
                                      str(train[1]), "--out", str(tmp_path / "data"), "--workers", "1"])
    with pytest.raises(Stopped):
        run_prepare(args, Position(stop_signal="SIGTERM"))
    assert not (tmp_path / "data").exists()


# --- run.dir: a new run never writes over files the trainer did not write -------------------------------------

def test_a_new_run_refuses_a_run_dir_holding_foreign_files(tmp_path):
    from data_prep.dataformat import OutputDirError
    from trainer.artifacts.run_dir import check_new_run_dir

    run = tmp_path / "run"
    check_new_run_dir(str(run), overwrite=False)  # not there yet
    run.mkdir()
    check_new_run_dir(str(run), overwrite=False)  # empty
    (run / "config.yaml").write_text("mine: 1\n")
    (run / "notes.txt").write_text("the user's\n")
    with pytest.raises(OutputDirError, match=r"holds notes.txt, which the trainer did not write; .*run.overwrite=true"):
        check_new_run_dir(str(run), overwrite=False)
    (run / "notes.txt").unlink()
    # only names the trainer writes, but no data manifest of a run: could be anyone's config.yaml
    with pytest.raises(OutputDirError, match="no data_manifest.json written by the trainer"):
        check_new_run_dir(str(run), overwrite=False)
    (run / "data_manifest.json").write_text('{"checksum": "abc"}')
    (run / "metrics.jsonl").write_text('{"step": 5}\n')
    check_new_run_dir(str(run), overwrite=False)  # an earlier run's own output (no checkpoint): replaced
    assert not (run / "metrics.jsonl").exists() and (run / "config.yaml").read_text() == "mine: 1\n"
    (run / "notes.txt").write_text("the user's\n")
    check_new_run_dir(str(run), overwrite=True)  # the explicit flag: allowed, and notes.txt is left alone
    assert (run / "notes.txt").read_text() == "the user's\n"
    afile = tmp_path / "afile"
    afile.write_text("x")
    with pytest.raises(OutputDirError, match="is not a directory"):
        check_new_run_dir(str(afile), overwrite=True)


@pytest.mark.slow
def test_train_cli_refuses_a_foreign_run_dir_and_leaves_it_alone(tmp_path, tiny_data):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("the user's own config\n")
    (run / "spm.src.model").write_text("not a model\n")
    (run / "metrics.jsonl").write_text('{"step": 99}\n')
    args = [sys.executable, "launch/train.py", "--deepspeed_config", "ds_configs/single.json", f"data.dir={tiny_data}",
            f"run.dir={run}", "train.max_steps=2", "logging.wandb_mode=disabled", "model.hidden=16", "model.emb_dim=16"]
    r = run_cli(args, check=False, timeout=300)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "no data_manifest.json written by the trainer" in r.stderr and "run.overwrite=true" in r.stderr
    assert (run / "config.yaml").read_text() == "the user's own config\n"
    assert (run / "metrics.jsonl").read_text() == '{"step": 99}\n'
    r = run_cli(args + ["run.overwrite=true"], check=False, timeout=300)
    assert r.returncode == 0, r.stderr
    assert [row["step"] for row in read_metrics(run) if "loss" in row] == [1, 2]  # the old row is gone


# --- vocabulary identity (issue 42, item 7) -------------------------------------------------------------------

def _record_vocabulary(run: Path) -> dict:
    """The run's data_manifest.json recording its SentencePiece models' sha256, as prepare writes it."""
    import hashlib

    manifest = json.loads((run / "data_manifest.json").read_text())
    manifest["vocab"] = {f"{side}_model_sha256": hashlib.sha256((run / f"spm.{side}.model").read_bytes()).hexdigest()
                         for side in ("src", "tgt")}
    (run / "data_manifest.json").write_text(json.dumps(manifest))
    return manifest


@pytest.mark.parametrize("side", ["tgt", "src"])
def test_a_swapped_vocabulary_of_the_same_size_is_refused_by_every_entry_point(tmp_path, capsys, side):
    """RUN/spm.tgt.model swapped for another vocabulary of the same size: every shape fits, so translate and export
    said nothing; the run's data_manifest.json records the sha256 of the right one."""
    from tests.test_checkpoint_structure import _entry_points, _refused_everywhere

    run = fake_run(tmp_path / "run")
    _record_vocabulary(run)
    assert load_run(str(run)).translate(["the cat"], beam=1)  # the recorded models load
    other = [s.replace("the", "a") for s in SENTENCES]
    spm.SentencePieceTrainer.train(sentence_iterator=iter(other), model_prefix=str(tmp_path / "other"), vocab_size=30,
                                   pad_id=0, unk_id=1, bos_id=2, eos_id=3, minloglevel=2)
    swapped = spm.SentencePieceProcessor(model_file=str(tmp_path / "other.model"))
    assert swapped.get_piece_size() == load_run(str(run)).text.tgt_sp.get_piece_size()  # the same size: shapes fit
    shutil.copy(tmp_path / "other.model", run / f"spm.{side}.model")
    _refused_everywhere(run, tmp_path, capsys, f"{run / f'spm.{side}.model'}: not the SentencePiece model "
                                               f"{run / 'data_manifest.json'} records (its sha256 is ")
    assert len(_entry_points(run, tmp_path)) == 5


def test_a_recorded_vocabulary_hash_that_is_not_one_is_refused_and_an_older_manifest_without_it_loads(tmp_path):
    run = fake_run(tmp_path / "run")
    assert load_run(str(run))  # a manifest from before the hashes: nothing to compare with
    manifest = _record_vocabulary(run)
    manifest["vocab"]["tgt_model_sha256"] = "0" * 63
    (run / "data_manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ModelFileError, match=r"data_manifest.json: vocab.tgt_model_sha256='0{63}': not a sha256"):
        load_run(str(run))


def test_a_bad_data_manifest_is_the_data_files_error_not_a_checkpoints(tmp_path):
    """DATA_DIR/manifest.json is read through the file layer like any user file (tests/test_userfiles.py: its JSON): a
    manifest over its size cap or a FIFO in its place is a one-line error naming that file, never a CheckpointError."""
    from data_prep import files
    from data_prep.dataformat import MANIFEST
    from trainer import data as data_mod

    out = _prepared(tmp_path, "data")
    good = json.loads((out / MANIFEST).read_text())
    (out / MANIFEST).write_text(json.dumps({**good, "pad": "x" * 100}))
    old, data_mod.MAX_MANIFEST_BYTES = data_mod.MAX_MANIFEST_BYTES, 50
    try:
        with pytest.raises(files.FileError, match=str(out / MANIFEST)) as e:
            data_mod.read_manifest(str(out))
        assert not isinstance(e.value, ck.CheckpointError)
    finally:
        data_mod.MAX_MANIFEST_BYTES = old
    (out / MANIFEST).unlink()
    os.mkfifo(out / MANIFEST)
    with pytest.raises(files.FileError, match=str(out / MANIFEST)):
        data_mod.read_manifest(str(out))
