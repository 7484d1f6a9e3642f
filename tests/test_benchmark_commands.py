"""Every benchmark command the docs cite still runs: each `benchmarks/...` path and `python -m benchmarks...`
module named in README.md, docs/*.md, the benchmarks themselves and the trainer's docstrings exists, and
every benchmark answers --help without running anything, quickly: nothing heavy (torch, DeepSpeed) is
imported before its arguments are parsed. No benchmark runs here."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.conftest import REPO

PATH = re.compile(r"(?<![\w./:-])benchmarks/[\w./-]*\w")  # (not `git show REV:benchmarks/...`: another commit's)
MODULE = re.compile(r"python3? -m (benchmarks(?:\.\w+)*)")
HEAVY = ("torch", "deepspeed")
# runs a module as `python -m MODULE --help` does, then says how it exited and what heavy modules it imported
HELP = """
import json, runpy, sys
module = sys.argv[1]
sys.argv = [module, "--help"]
code = 0
try:
    runpy.run_module(module, run_name="__main__", alter_sys=True)
except SystemExit as e:
    code = e.code or 0
print(json.dumps({"exit": code, "heavy": [m for m in %r if m in sys.modules]}), file=sys.stderr)
""" % (HEAVY,)


def citing_files() -> list:
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md")),
            *sorted(p for p in (REPO / "benchmarks").rglob("*") if p.suffix in (".py", ".sh")),
            *sorted(p for p in (REPO / "trainer").rglob("*") if p.suffix in (".py", ".yaml"))]


def cited(pattern: re.Pattern, text: str) -> set[str]:
    return {m.group(1) if m.groups() else m.group(0) for m in pattern.finditer(text)}


def module_file(module: str):
    """The file `python -m MODULE` runs: a package's __main__.py or the module's .py (None: neither)."""
    base = REPO.joinpath(*module.split("."))
    return next((p for p in (base / "__main__.py", base.with_suffix(".py")) if p.is_file()), None)


def entry_points() -> list[str]:
    """Every runnable benchmark, as the module `python -m` takes."""
    out = []
    for path in sorted((REPO / "benchmarks").rglob("*.py")):
        parts = path.relative_to(REPO).with_suffix("").parts
        if path.name == "__main__.py":
            out.append(".".join(parts[:-1]))
        elif 'if __name__ == "__main__":' in path.read_text(encoding="utf-8"):
            out.append(".".join(parts))
    return out


def test_every_cited_benchmark_path_and_module_exists():
    missing = {}
    for f in citing_files():
        text = f.read_text(encoding="utf-8")
        bad = sorted(p for p in cited(PATH, text) if not (REPO / p).exists())
        bad += sorted(f"python -m {m}" for m in cited(MODULE, text) if module_file(m) is None)
        if bad:
            missing[str(f.relative_to(REPO))] = bad
    assert not missing, f"cited but not in the checkout: {missing}"


def test_the_docs_cite_the_benchmarks_and_the_finder_sees_them():
    docs = "".join(p.read_text(encoding="utf-8") for p in [REPO / "README.md", *(REPO / "docs").rglob("*.md")])
    modules, entries = cited(MODULE, docs), set(entry_points())
    assert {"benchmarks.scaling", "benchmarks.planner", "benchmarks.gpu.gpu_profile"} <= modules
    assert modules <= entries, f"cited modules that are no benchmark: {sorted(modules - entries)}"
    assert "benchmarks/gpu/gpu_check.sh" in cited(PATH, docs)
    # the patterns themselves: a stale path and module are seen as such
    assert cited(PATH, "see `benchmarks/scaling.py::x`") == {"benchmarks/scaling.py"}
    assert not (REPO / "benchmarks" / "scaling.py").exists() and module_file("benchmarks.scaling_goals") is None


def _help(module: str) -> tuple[str, dict, str]:
    proc = subprocess.run([sys.executable, "-c", HELP, module], cwd=REPO, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
    lines = proc.stderr.strip().splitlines()
    try:
        return module, json.loads(lines[-1]), proc.stdout
    except (IndexError, json.JSONDecodeError):
        pytest.fail(f"{module} --help: {proc.stderr[-2000:]}")


def test_every_benchmark_answers_help_without_importing_torch():
    modules = entry_points()
    assert len(modules) >= 20 and "benchmarks.scaling" in modules and "benchmarks.peers.opennmt_runner" in modules
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(_help, modules))
    for module, got, out in results:
        assert got["exit"] == 0 and out.strip(), f"python -m {module} --help: exit {got['exit']}\n{out[-1000:]}"
        assert not got["heavy"], f"python -m {module} --help imports {got['heavy']} before parsing its arguments"


@pytest.mark.parametrize("script", sorted(str(p.relative_to(REPO)) for p in (REPO / "benchmarks").rglob("*.sh")))
def test_every_benchmark_shell_script_parses(script):
    proc = subprocess.run(["bash", "-n", script], cwd=REPO, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
