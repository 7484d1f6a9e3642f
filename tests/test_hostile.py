"""Hostile and careless input (issue 11): crafted checkpoints, model files, configs, corpora, archives and
output directories, each built small and fast (bombs are tiny archives, limits lowered where a real one
would be large). Every case ends in a clear one-line error naming the file, or a counted reject -- never a
traceback, a hang, a huge allocation or a file written where it does not belong.
docs/RELIABILITY.md ("Hostile input") lists each case and its test."""
from __future__ import annotations

import io
import json
import os
import shutil
import sys
from pathlib import Path

import pytest
import sentencepiece as spm
import torch

from tests.conftest import run_cli
from trainer import checkpoint as ck
from trainer.config import ConfigError, load_config, to_yaml
from trainer.model import build_model
from trainer.model_files import ModelFileError
from trainer.translator import Translator

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
    overrides = [f"model.{k}={v}" for k, v in {"emb_dim": 8, "hidden": 8, "layers": 1, **model}.items()]
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
    translator = Translator.from_run(str(run))
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
        Translator.from_run(str(run))


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
    ("{not json", "unreadable (JSONDecodeError"),
    ("[" * 100_000 + "]" * 100_000, "unreadable (RecursionError"),
    (b"\xff\xfe{}", "unreadable (UnicodeDecodeError"),
])
def test_malformed_manifest_is_refused_with_a_message(tmp_path, content, expected):
    run = fake_run(tmp_path / "run")
    path = step_dir(run) / ck.MANIFEST
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    [problem] = ck.verify(str(step_dir(run)))
    assert problem.startswith(str(path)) and expected in problem
    with pytest.raises(ck.CheckpointError, match="--allow-unverified"):
        Translator.from_run(str(run))
    assert Translator.from_run(str(run), allow_unverified=True).origin["step"] == 5  # the user said so


def test_a_checkpoint_without_manifest_is_refused_unless_allowed(tmp_path):
    run = fake_run(tmp_path / "run")
    (step_dir(run) / ck.MANIFEST).unlink()
    layer = step_dir(run) / "layer_01-model_states.pt"
    weights = torch.load(layer, weights_only=True)
    weights = {k: v + 1 for k, v in weights.items()}
    torch.save(weights, layer)  # tampered weights: nothing can tell without checksums
    with pytest.raises(ck.CheckpointError, match="manifest.json: missing.*--allow-unverified"):
        Translator.from_run(str(run))
    out = tmp_path / "out.txt"
    (tmp_path / "in.txt").write_text("the cat\n")
    args = ["--run", run, "--input", tmp_path / "in.txt", "--output", out]
    refused = run_cli([sys.executable, "launch/translate.py", *args], check=False, timeout=120)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr and "manifest.json: missing" in refused.stderr
    run_cli([sys.executable, "launch/translate.py", *args, "--allow-unverified"], timeout=120)
    assert len(out.read_text().splitlines()) == 1


def test_an_unfinished_save_of_the_run_itself_loads_for_the_dev_decode(tmp_path):
    run = fake_run(tmp_path / "run")
    tmp = run / "checkpoints" / "step_00000007.tmp"
    shutil.copytree(step_dir(run), tmp)
    (tmp / ck.MANIFEST).unlink()  # as during a save: the manifest comes after the dev decode
    assert ck.is_unfinished_save(str(run), str(tmp))
    assert Translator.from_run(str(run), str(tmp)).origin["checkpoint"] == "step_00000007.tmp"
    elsewhere = tmp_path / "step_00000007.tmp"
    shutil.copytree(tmp, elsewhere)
    assert not ck.is_unfinished_save(str(run), str(elsewhere))
    with pytest.raises(ck.CheckpointError, match="missing"):
        Translator.from_run(str(run), str(elsewhere))


@pytest.mark.parametrize("pointer", ["../../../etc", "/etc", "step_5/../../x", "latest", "x" * 300])
def test_best_and_latest_pointers_must_name_a_checkpoint_of_the_run(tmp_path, pointer):
    run = fake_run(tmp_path / "run")
    (run / "checkpoints" / "best").write_text(pointer + "\n")
    with pytest.raises(ck.CheckpointError, match="best: names .*not a checkpoint directory of this run"):
        Translator.from_run(str(run))
    assert ck.read_pointer(str(run), "latest") == "step_00000005"


def test_pointer_and_step_links_out_of_the_run_are_refused(tmp_path):
    run = fake_run(tmp_path / "run")
    other = fake_run(tmp_path / "other")
    best = run / "checkpoints" / "best"
    best.unlink()
    best.symlink_to("/dev/zero")
    with pytest.raises(ck.CheckpointError, match="best: a link to /dev/zero"):
        Translator.from_run(str(run))
    best.unlink()
    (run / "checkpoints" / "step_00000009").symlink_to(step_dir(other))
    best.write_text("step_00000009\n")
    with pytest.raises(ck.CheckpointError, match="best: names 'step_00000009'.*not a checkpoint directory"):
        Translator.from_run(str(run))
    assert ck.complete_checkpoints(str(run)) == ["step_00000005"]  # auto-resume never follows it either


# --- exported models --------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("export")
    Translator.from_run(str(fake_run(root / "run"))).export(str(root / "model.pt"))
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
    (set_config("model.layers", 4), "missing pairs.1"),
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
    (lambda b: b["model"].pop("head.proj.bias"), "missing head.proj.bias"),
    (lambda b: b["model"].__setitem__("head.proj.bias", torch.zeros(3)), r"head.proj.bias has shape \(3,\)"),
    (lambda b: b["model"].__setitem__("head.proj.bias", "x"), "head.proj.bias is a str"),
    (lambda b: b.__setitem__("normalize", {"nfkc": "yes"}), "normalisation flag nfkc='yes' is not a bool"),
    (lambda b: b.__setitem__("normalize", {"evil": True}), "unknown normalisation flag"),
    (lambda b: b.__setitem__("version", 9), "format version 9"),
])
def test_exported_model_is_validated_before_anything_is_built(exported, tmp_path, change, expected):
    path = tampered(exported, tmp_path, change)
    with pytest.raises(ValueError, match=expected) as e:
        Translator.from_export(path)
    assert str(e.value).startswith(f"--model {path}")
    assert Translator.from_export(str(exported)).translate(["the cat"], beam=1)  # the untouched file still loads


def test_exported_model_errors_are_one_line_on_the_cli(exported, tmp_path):
    path = tampered(exported, tmp_path, set_config("model.hidden", 60000))
    (tmp_path / "in.txt").write_text("the cat\n")
    r = run_cli([sys.executable, "launch/translate.py", "--model", path, "--input", tmp_path / "in.txt",
                 "--output", tmp_path / "out.txt"], check=False, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert "model.hidden=60000" in r.stderr and not (tmp_path / "out.txt").exists()
    code = tmp_path / "code.pt"
    code.write_bytes(b"\x80\x04cos\nsystem\n(S'touch " + str(tmp_path / "pwned").encode() + b"'\ntR.")
    r = run_cli([sys.executable, "launch/translate.py", "--model", code, "--input", tmp_path / "in.txt",
                 "--output", tmp_path / "out.txt"], check=False, timeout=120)
    assert r.returncode == 2 and "not a readable model file" in r.stderr and not (tmp_path / "pwned").exists()


def test_a_run_whose_config_does_not_fit_its_weights_is_refused(tmp_path):
    run = fake_run(tmp_path / "run")
    config = run / "config.yaml"
    config.write_text(config.read_text().replace("hidden: 8", "hidden: 60000"))
    with pytest.raises(ModelFileError, match=r"layer_01-model_states.pt: .* has shape .*model.hidden=60000"):
        Translator.from_run(str(run))
    config.write_text(config.read_text().replace("hidden: 60000", "hidden: 8"))
    (run / "spm.tgt.model").write_bytes(b"garbage")
    with pytest.raises(ModelFileError, match="spm.tgt.model: not a SentencePiece model"):
        Translator.from_run(str(run))


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


def test_yaml_syntax_error_on_the_train_cli_is_one_line(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("model: !!python/object/apply:os.system ['true']\n")
    r = run_cli([sys.executable, "launch/train.py", "--deepspeed_config", "ds_configs/single.json", "--config", path],
                check=False, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr and "YAML tags are not allowed" in r.stderr
