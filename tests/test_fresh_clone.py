"""What a newcomer with a fresh clone and the README meets (issue 30, part B item 3): the README's planner
commands run on a clone without data, or are refused with the command that prepares what they need."""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, run_cli

TOP = ("launch", "trainer", "data_prep", "ds_configs", "benchmarks")


def fresh_clone(root: Path) -> Path:
    """The checkout's code without data/ or runs/ (links to its directories)."""
    root.mkdir()
    for name in TOP:
        (root / name).symlink_to(REPO / name)
    return root


# ---- the README's planner commands ----------------------------------------------------------------------------

def readme_commands(section: str) -> list[list[str]]:
    """The commands of a README section's bash blocks as argv lists (continuations joined, comments and
    [optional] parts dropped, `E=...` assignments applied)."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    text = readme[readme.index(section):]
    text = text[:text.index("\n## ", 1)]
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
def test_the_readmes_planner_commands_run_on_a_fresh_clone_or_say_how_to_prepare_their_data(tmp_path):
    commands = readme_commands("### Choosing a layout")
    plans = [c for c in commands if c[:2] == ["python", "launch/plan.py"]]
    assert len(plans) == 4 and commands[0] == ["bash", "launch/prepare_demo.sh"]
    clone = fresh_clone(tmp_path / "clone")
    for argv in plans:  # nothing prepared yet: each says the command that prepares what it needs
        r = _run(clone, argv, timeout=300)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
        if "paper_size" in " ".join(argv):
            assert "not prepared (no manifest.json)" in r.stderr and "--out data/enja32k_joint" in r.stderr
        elif "my_machine.json" in argv and "--calibrate" not in argv:
            assert "--profile my_machine.json: no such file" in r.stderr  # made by the --calibrate before it
        else:
            assert "data.dir=data/demo: not prepared (no manifest.json)" in r.stderr
            assert "prepare it first: bash launch/prepare_demo.sh" in r.stderr
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
