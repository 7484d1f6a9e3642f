"""Strict JSON and YAML (issue 30, part A item 6): every file a user hands us is parsed by data_prep.userfiles,
which refuses a key stated twice and nesting past MAX_DEPTH with one line naming the file, the line and the key,
where Python's parsers let the last value win silently or fail with a RecursionError (or a crash) at depth.
Each reader is tried with the variants the issue named and with more of the same class; a walk of the code
fails on a JSON or YAML parse outside the strict module."""
from __future__ import annotations

import ast
import json
import os
import sys

import pytest

from data_prep.userfiles import MAX_DEPTH, UserFileError, check_yaml, parse_json
from tests.conftest import REPO, run_cli
from trainer.config import ConfigError, load_config
from trainer.ds_config import DSConfigError
from trainer.parallel.deepspeed_json import load_ds_config

DEEP = "[" * 100_000 + "]" * 100_000  # the issue's depth


def _ds_twice(key: str, value) -> str:
    """ds_configs/single.json with `key` stated again as `value` on the line after its own."""
    lines = (REPO / "ds_configs" / "single.json").read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if line.strip().startswith(f'"{key}":'))
    lines.insert(at + 1, f'{lines[at][:len(lines[at]) - len(lines[at].lstrip())]}"{key}": {value},')
    return "\n".join(lines)


def _refused(path, text: str, read, error: type[Exception], expected: str) -> None:
    """`text` written to `path` and read with `read`: refused with `error`, one line starting with the path."""
    path.write_text(text)
    with pytest.raises(error, match=expected) as e:
        read(str(path))
    assert str(e.value).startswith(str(path)) and "\n" not in str(e.value), str(e.value)


@pytest.mark.parametrize("text,expected", [
    (_ds_twice("train_micro_batch_size_per_gpu", 1000000),  # the issue's: 64, then 1000000
     r":3: invalid JSON: found duplicate key 'train_micro_batch_size_per_gpu' \(first on line 2\)"),
    (_ds_twice("lr", 1000), r":8: invalid JSON: found duplicate key 'optimizer.params.lr' \(first on line 7\)"),
    ('{"parallel_layout": {"mode": "hybrid", "stages": [{"layers": 1}, {"layers": 1, "layers": 2}]}}',
     r"found duplicate key 'parallel_layout.stages\[1\].layers'"),
    ('{"a": 1, "\\u0061": 2}', "found duplicate key 'a'"),  # the same key, spelled with an escape
    ('{"x": ' + DEEP + "}", r":1: nested deeper than 64 levels"),
    ('{\n"x":\n' + "[\n" * 200 + "]" * 200 + "}", rf":{3 + MAX_DEPTH - 1}: nested deeper than 64 levels"),
    ('{"x": ' + '{"y": ' * 100 + "1" + "}" * 101, "nested deeper than 64 levels"),
])
def test_the_deepspeed_json_refuses_repeated_keys_and_deep_nesting(tmp_path, text, expected):
    _refused(tmp_path / "ds.json", text, lambda p: load_ds_config(p, 10), DSConfigError, expected)


def test_the_repeated_micro_batch_of_the_issue_is_not_read_as_its_last_value(tmp_path):
    text = _ds_twice("train_micro_batch_size_per_gpu", 1000000)
    assert json.loads(text)["train_micro_batch_size_per_gpu"] == 1000000  # what Python's parser would have used
    path = tmp_path / "ds.json"
    path.write_text(text)
    with pytest.raises(DSConfigError, match="found duplicate key 'train_micro_batch_size_per_gpu'"):
        load_ds_config(str(path), 10)
    path.write_text((REPO / "ds_configs" / "single.json").read_text())
    assert load_ds_config(str(path), 10)["train_micro_batch_size_per_gpu"] == 64  # stated once, it passes


def test_a_deepspeed_json_that_is_a_fifo_or_a_device_is_refused_unread(tmp_path):
    fifo = tmp_path / "ds.json"
    os.mkfifo(fifo)
    with pytest.raises(DSConfigError, match="ds.json: a DeepSpeed JSON must be a regular file, not a FIFO"):
        load_ds_config(str(fifo), 10)
    (tmp_path / "zero.json").symlink_to("/dev/zero")
    with pytest.raises(DSConfigError, match=r"not a character device \(a link to /dev/zero\)"):
        load_ds_config(str(tmp_path / "zero.json"), 10)


@pytest.mark.parametrize("text,expected", [
    ('{"device": {"name": "x"}, "roofline": {}, "device": {"name": "y"}}', "found duplicate key 'device'"),
    ('{"device": {}, "layers": {"bf16": {"1": {"head": [[1, 2,\n3, 4, 5]], "head": []}}}}',
     r":2: invalid JSON: found duplicate key 'layers.bf16.1.head'"),
    ('{"device": {}, "layers": ' + DEEP + "}", "nested deeper than 64 levels"),
])
def test_a_planner_profile_refuses_repeated_keys_and_deep_nesting(tmp_path, text, expected):
    from trainer.planner.profile import ProfileError, load

    _refused(tmp_path / "p.json", text, load, ProfileError, expected)


@pytest.mark.parametrize("text,expected", [
    ("train:\n  max_steps: 3\n  seed: 2\n  max_steps: 5\n",
     r":4:3: YAML syntax error: found duplicate key 'train.max_steps' \(first on line 2\)"),
    ("model:\n  hidden: 8\ntrain:\n  max_steps: 3\nmodel:\n  layers: 2\n", r":5:1: .*found duplicate key 'model'"),
    ("data:\n  dir: {a: [1, {b: 1, b: 2}]}\n", r"found duplicate key 'data.dir.a\[1\].b'"),
    ("model:\n  hidden: " + DEEP + "\n", ":2: nested deeper than 64 levels"),
    ("model:\n  hidden:\n" + "".join(" " * (2 * i + 4) + "- \n" for i in range(100)), "nested deeper than 64 levels"),
    ("train:\n" + "".join(" " * (2 * i + 2) + f"k{i}:\n" for i in range(100)) + " " * 202 + "x: 1\n",
     "nested deeper than 64 levels"),
])
def test_the_yaml_config_refuses_repeated_keys_and_deep_nesting(tmp_path, text, expected):
    """A YAML nested 100,000 deep crashed the interpreter in omegaconf's recursive loader (a segfault, no message)."""
    _refused(tmp_path / "c.yaml", text, load_config, ConfigError, expected)


def test_overrides_are_read_as_strictly_as_files():
    with pytest.raises(ConfigError, match=r"override 'train.max_steps=\[\[\[.*nested deeper than 64 levels"):
        load_config(None, ["train.max_steps=" + "[" * 50_000 + "]" * 50_000])
    with pytest.raises(ConfigError, match="found duplicate key 'a'"):
        load_config(None, ["run.name={a: 1, a: 2}"])
    with pytest.raises(ConfigError, match="train.max_steps is already given"):  # as in a file (issue 42)
        load_config(None, ["train.max_steps=7", "train.max_steps=9"])


def test_a_yaml_config_that_is_a_fifo_is_refused_unread(tmp_path):
    os.mkfifo(tmp_path / "c.yaml")
    with pytest.raises(ConfigError, match="c.yaml: a config must be a regular file, not a FIFO"):
        load_config(str(tmp_path / "c.yaml"))


@pytest.mark.parametrize("text,expected", [
    ('{"vocab": {"src_size": 80, "tgt_size": 80}, "checksum": "x",\n"vocab": {"src_size": 8, "tgt_size": 8}}',
     r"manifest.json:2: invalid JSON: found duplicate key 'vocab' \(first on line 1\)"),
    ('{"vocab": {"src_size": 80, "tgt_size": 80}, "checksum": "x", "splits": ' + DEEP + "}",
     "manifest.json:1: nested deeper than 64 levels"),
])
def test_the_data_manifest_refuses_repeated_keys_and_deep_nesting(tmp_path, text, expected):
    """Read through the file layer, as any user file: the data file's own error, not a checkpoint's."""
    from data_prep.userfiles import UserFileError
    from trainer.checkpoint.files import CheckpointError
    from trainer.data import read_manifest

    (tmp_path / "manifest.json").write_text(text)
    with pytest.raises(UserFileError, match=expected) as e:
        read_manifest(str(tmp_path))
    assert not isinstance(e.value, CheckpointError)


def test_run_files_with_deep_or_repeated_json_are_refused_without_a_traceback(tmp_path):
    from data_prep.outdir import json_marker
    from data_prep.lock import holder
    from trainer.observe.plots import read_metrics
    from trainer.observe.logger import truncate_metrics

    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text('{"step": 1, "loss": 2.0}\n{"step": 2, "x": ' + "[" * 3000 + "]" * 3000 + '}\n'
                       '{"step": 3, "step": 2}\n{"step": 3}\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl:2: not a JSON object"):
        read_metrics(str(tmp_path))
    note = truncate_metrics(str(metrics), 5)
    assert note.startswith(f"{metrics}: dropped 2 unreadable row(s) (line 2, 3;")
    assert [r["step"] for r in read_metrics(str(tmp_path))] == [1, 3]
    marker = tmp_path / "manifest.json"
    marker.write_text('{"checksum": "c", "checksum": "d"}')
    assert json_marker(["checksum"])(str(marker)) is False
    marker.write_text('{"checksum": ' + "[" * 3000 + "]" * 3000 + "}")
    assert json_marker(["checksum"])(str(marker)) is False
    lock = tmp_path / "train.lock"
    lock.write_text("[" * 2000 + "]" * 2000)
    assert holder(str(lock)) is None
    lock.write_text('{"pid": 1, "host": "h", "since": "t"}')
    assert holder(str(lock)) == "pid 1 on h since t"


def test_every_shipped_json_and_yaml_passes_the_strict_reader():
    """The limits refuse nothing the project itself writes or ships (profiles nest the deepest: 7 levels)."""
    from data_prep.userfiles import read_json

    shipped = sorted([*REPO.glob("ds_configs/*.json"), *REPO.glob("trainer/planner/profiles/*.json")])
    assert len(shipped) >= 5
    for path in shipped:
        read_json(str(path), 1 << 20)
    for path in sorted(REPO.glob("trainer/configs/*.yaml")):
        load_config(str(path))


def test_the_strict_parser_keeps_what_json_allows_and_names_the_line_it_was_given():
    assert parse_json('{"a": {"b": [1, {"a": 2}]}, "b": "{[\\"a\\": 1, \\"a\\": 2]}"}', "x") == \
        {"a": {"b": [1, {"a": 2}]}, "b": '{["a": 1, "a": 2]}'}  # the same key in other objects; brackets in text
    with pytest.raises(UserFileError, match=r"^f:7: invalid JSON: found duplicate key 'k'"):
        parse_json('{"k": 1, "k": 2}', "f", line=7)
    check_yaml("a: [1, {b: 1}]\nb: {a: 1}\nc: &x [1]\nd: *x\n", "y")
    with pytest.raises(UserFileError, match="y:1: nested deeper than 3 levels"):
        check_yaml("a: [[[1]]]\n", "y", max_depth=3)


# ---- no parse outside the strict module -------------------------------------------------------------------------

PARSERS = {("json", "load"), ("json", "loads"), ("yaml", "load"), ("yaml", "safe_load"), ("yaml", "full_load"),
           ("yaml", "unsafe_load"), ("yaml", "load_all"), ("yaml", "safe_load_all"), ("yaml", "compose"),
           ("OmegaConf", "load"), ("OmegaConf", "from_dotlist"), ("OmegaConf", "from_cli")}
ALLOWED = {  # where a parse may stand, and why
    ("data_prep/userfiles.py", "json.loads"),  # the strict module itself
    ("trainer/config.py", "OmegaConf.load"),  # after userfiles.check_yaml of the same text
    ("trainer/config.py", "OmegaConf.from_dotlist"),  # an override, after userfiles.check_yaml of its value
}


def parses_in(path) -> list[str]:
    """`module.function` of every JSON/YAML parse called in the file (`from json import loads` included)."""
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module in ("json", "yaml"):
            found += [f"{node.module}.{a.name}" for a in node.names if (node.module, a.name) in PARSERS]
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                isinstance(node.func.value, ast.Name) and (node.func.value.id, node.func.attr) in PARSERS:
            found.append(f"{node.func.value.id}.{node.func.attr}")
    return found


def test_no_json_or_yaml_is_parsed_outside_the_strict_module():
    """benchmarks/ reads only what its own scripts wrote, and is left out."""
    offenders = []
    for top in ("trainer", "data_prep", "launch"):
        for path in sorted((REPO / top).rglob("*.py")):
            rel = str(path.relative_to(REPO))
            offenders += [f"{rel}: {p}" for p in parses_in(path) if (rel, p) not in ALLOWED]
    assert offenders == []
    assert all(call in parses_in(REPO / rel) for rel, call in ALLOWED)  # the table names no parse that is gone


def test_the_parse_walk_finds_a_parse(tmp_path):
    path = tmp_path / "x.py"
    path.write_text("import json\nfrom yaml import safe_load\n\ndef f(t):\n    return json.loads(t)\n")
    assert sorted(parses_in(path)) == ["json.loads", "yaml.safe_load"]


@pytest.mark.slow
def test_the_clis_say_one_line_for_a_deep_or_repeated_json(tmp_path):
    ds = tmp_path / "ds.json"
    ds.write_text(_ds_twice("train_micro_batch_size_per_gpu", 1000000))
    r = run_cli([sys.executable, "launch/train.py", "--deepspeed_config", ds, "--dry-run"], check=False, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr and "found duplicate key" in r.stderr
    profile = tmp_path / "p.json"
    profile.write_text('{"device": ' + DEEP + "}")
    r = run_cli([sys.executable, "launch/plan.py", "--devices", "2", "--profile", profile], check=False, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines()[-1] == f"error: {profile}:1: nested deeper than 64 levels of objects and " \
                                                f"lists; refused"
