"""What a newcomer with a fresh clone and the README meets (issue 30, part B items 2 and 3): rerunning the
quickstart keeps the earlier run aside instead of deleting it, and the planner commands the README leads to
(docs/planner.md) run on a clone without data, or are refused with the command that prepares what they need."""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, launch_main, run_cli

TOP = ("launch", "trainer", "data_prep", "ds_configs", "benchmarks")


def fresh_clone(root: Path) -> Path:
    """The checkout's code without data/ or runs/ (links to its directories)."""
    root.mkdir()
    for name in TOP:
        (root / name).symlink_to(REPO / name)
    return root


# ---- the quickstart keeps an earlier run ----------------------------------------------------------------------

FAKE = """#!/usr/bin/env bash
# stands in for {name}: records its arguments; deepspeed writes a run.dir as training would
echo "{name} $*" >> "$FAKE_LOG"
for a in "$@"; do case "$a" in run.dir=*) mkdir -p "${{a#run.dir=}}" && echo new > "${{a#run.dir=}}/metrics.jsonl";; esac; done
"""


def _quickstart(clone: Path, tmp_path: Path) -> subprocess.CompletedProcess:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name in ("python", "deepspeed", "nvidia-smi"):
        (bin_dir / name).write_text(FAKE.format(name=name))
        (bin_dir / name).chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_LOG": str(tmp_path / "log")}
    return subprocess.run(["bash", str(clone / "launch" / "quickstart.sh")], env=env, capture_output=True,
                          text=True, timeout=60, check=True)


def test_rerunning_the_quickstart_keeps_the_earlier_run_aside_and_says_so(tmp_path):
    clone = fresh_clone(tmp_path / "clone")
    first = _quickstart(clone, tmp_path)
    assert "kept" not in first.stdout and (clone / "runs" / "demo" / "metrics.jsonl").read_text() == "new\n"
    (clone / "runs" / "demo" / "metrics.jsonl").write_text("a resumed run's hours\n")
    kept = [_quickstart(clone, tmp_path) for _ in range(2)]  # twice within a second: two places, none overwritten
    aside = sorted((clone / "runs").glob("demo.prev-*"))
    assert len(aside) == 2 and (aside[0] / "metrics.jsonl").read_text() == "a resumed run's hours\n"
    for proc, path in zip(kept, aside):
        assert f"quickstart: ./runs/demo exists: kept it as ./runs/{path.name}; training a new run in ./runs/demo" \
               in proc.stdout
    assert (clone / "runs" / "demo" / "metrics.jsonl").read_text() == "new\n"
    log = (tmp_path / "log").read_text()
    assert "python -m data_prep.demo_corpus --out ./data/demo_text" in log and "--out ./data/demo " in log
    header = (REPO / "launch" / "quickstart.sh").read_text().split("set -euo")[0]
    assert "kept aside, moved to runs/demo.prev-DATE-TIME" in header
    readme = (REPO / "README.md").read_text()
    assert "runs/demo.prev-" in readme[:readme.index("2. Set up and run the tests")]


# ---- the planner commands of the docs (docs/planner.md, once the README's section) ----------------------------

def doc_commands(doc: str) -> list[list[str]]:
    """The commands of a doc's bash blocks as argv lists (continuations joined, comments and
    [optional] parts dropped, `E=...` assignments applied)."""
    text = (REPO / doc).read_text(encoding="utf-8")
    commands, names = [], {}
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = re.sub(r"\[[^\]]*\]", "", line.split(" #")[0]).strip()
            if re.fullmatch(r"[A-Z]+=\S+", line):
                key, _, value = line.partition("=")
                names[key] = value
            elif line:
                commands.append([re.sub(r"\$(\w+)", lambda m: names.get(m.group(1), m.group(0)), a)
                                 for a in shlex.split(line)])
    return commands


def _run(clone: Path, argv: list[str], *extra: str, env=None, timeout=600) -> subprocess.CompletedProcess:
    argv = [sys.executable if a == "python" else a for a in argv]
    return run_cli([*argv, *extra], cwd=clone, check=False, timeout=timeout, env_extra=env)


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_the_readmes_planner_commands_run_on_a_fresh_clone_or_say_how_to_prepare_their_data(tmp_path, capsys,
                                                                                             monkeypatch):
    commands = doc_commands("docs/planner.md")
    plans = [c for c in commands if c[:2] == ["python", "launch/plan.py"]]
    assert len(plans) == 4 and commands[0] == ["bash", "launch/prepare_demo.sh"]
    clone = fresh_clone(tmp_path / "clone")
    with monkeypatch.context() as m:  # the refusals through plan.py's main in this process, from the clone (the
        m.chdir(clone)                # commands below run it as the real process, three times)
        for argv in plans:  # nothing prepared yet: each says the command that prepares what it needs
            code, _, err = launch_main("plan", argv[2:], capsys)
            assert code == 2 and "Traceback" not in err, err[-3000:]
            if "paper_size" in " ".join(argv):
                assert "not prepared (no manifest.json)" in err and "--out data/enja32k_joint" in err
            elif "my_machine.json" in argv and "--calibrate" not in argv:
                assert "--profile my_machine.json: no such file" in err  # made by the --calibrate before it
            else:
                assert "data.dir=data/demo: not prepared (no manifest.json)" in err
                assert "prepare it first: bash launch/prepare_demo.sh" in err
    assert not [p.name for p in clone.iterdir() if p.name not in TOP]  # the refusals wrote nothing
    small = {"PAIRS": "600", "VOCAB": "600"}  # the README's command on a smaller corpus
    assert _run(clone, commands[0], env=small).returncode == 0
    assert (clone / "data" / "demo" / "manifest.json").exists()
    tiny = ["model.emb_dim=16", "model.hidden=16", "--steps", "2"]  # the commands, at a tiny model and few steps
    for argv in plans:
        if "paper_size" in " ".join(argv):
            continue  # its corpus is not in a fresh clone; its refusal above named the command
        extra = [a for a in tiny if a != "--steps" and a != "2"] + ["--quick"] if "--calibrate" in argv else tiny
        r = _run(clone, argv, *extra)
        assert r.returncode == 0, r.stderr[-3000:]
        if "--calibrate" not in argv:
            assert "plan: " in r.stdout and "| 1 |" in r.stdout
    assert (clone / "my_machine.json").exists()
