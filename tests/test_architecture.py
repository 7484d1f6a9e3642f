"""The package walls of trainer/ as tests: the module graph (every import, those inside functions and under
TYPE_CHECKING included) has no cycle; inference never reaches training, the parallel runtime or the planner;
checkpointing never reaches training, inference or the runtime, and training reaches it only through the
Checkpointer; the model knows nothing of ranks, files or runs; nothing in trainer/ or data_prep/ imports launch/
or benchmarks/; trainer.ds_config never reaches trainer.parallel; a run's parts are built only by
trainer/training/build.py's Build; every import the table of each package allows is all it uses (benchmarks/ too: a subject never
imports another, nor launch/); and no function is longer than MAX_FUNCTION_LINES (benchmarks/ too). Each check is shown to find what it looks for on a graph (or a file) with the fault in it."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.conftest import REPO

TOPS = ("trainer", "data_prep", "launch", "benchmarks")

# What each package of trainer/ may import from the project (prefixes of module names); the architecture
# map of docs/architecture.md says the same.
MAY_IMPORT = {
    "trainer.model": ("trainer.model", "data_prep.dataformat"),
    "trainer.artifacts": ("trainer.artifacts", "trainer.config", "trainer.data", "trainer.model", "data_prep.dataformat"),
    "trainer.observe": ("trainer.observe", "trainer.artifacts", "trainer.parallel.schedule", "trainer.config",
                        "data_prep.dataformat"),
    "trainer.inference": ("trainer.inference", "trainer.artifacts", "trainer.checkpoint.files",
                          "trainer.checkpoint.structure", "trainer.model", "trainer.config", "trainer.data",
                          "trainer.metrics", "data_prep.dataformat"),
    "trainer.checkpoint": ("trainer.checkpoint", "trainer.artifacts", "trainer.parallel.layout", "data_prep.dataformat"),
    "trainer.parallel": ("trainer.parallel", "trainer.model", "trainer.data", "trainer.observe.op_counter",
                         "trainer.ds_config", "data_prep.dataformat"),
    # the DeepSpeed JSON's own checks; what DeepSpeed and the layout say of it is trainer.parallel.deepspeed_json's
    "trainer.ds_config": ("trainer.ds_config", "data_prep.dataformat"),
}
# benchmarks/: each subject (scaling, peers, planner, gpu, ...) stands on the shared helpers, the records' writer and
# the project's packages, never on another subject nor on launch/ (the entry points are run as commands); the writer
# and the helpers stand on no subject.
BENCH_SUBJECTS = ("data", "gpu", "micro", "peers", "planner", "quality", "reliability", "scaling")
MAY_IMPORT.update({
    "benchmarks.common": ("benchmarks.common", "trainer", "data_prep"),
    "benchmarks.results": ("benchmarks.results", "benchmarks.common", "trainer.artifacts.run_dir"),
    **{f"benchmarks.{s}": (f"benchmarks.{s}", "benchmarks.common", "benchmarks.results", "trainer", "data_prep")
       for s in BENCH_SUBJECTS},
})
MAY_IMPORT["benchmarks.micro"] += ("benchmarks.gpu.gpu_profile",)  # the GEMM timer: the CPU's peak is the device's
MAY_IMPORT["benchmarks.planner"] += ("benchmarks.gpu.gpu_patent",)  # validate-gpu rebuilds the check's patent data
ONLY_THROUGH = {  # package -> {another package: the only modules of it the first may import}
    # the loop asks the Checkpointer; nothing in training/ knows a checkpoint's files
    "trainer.training": {"trainer.checkpoint": ("trainer.checkpoint.checkpointer", "trainer.checkpoint.state",
                                                "trainer.checkpoint.resume")},
}
NEVER = {  # package -> what it must never reach, even through others (the transitive closure)
    "trainer.checkpoint": ("trainer.training", "trainer.inference", "trainer.planner", "trainer.parallel.runtime",
                           "trainer.parallel.deepspeed_adapter"),
    "trainer.inference": ("trainer.training", "trainer.parallel", "trainer.planner"),
    "trainer.model": ("trainer.training", "trainer.parallel", "trainer.planner", "trainer.inference",
                      "trainer.artifacts", "trainer.observe", "trainer.data"),
    "trainer.ds_config": ("trainer.parallel", "trainer.training", "trainer.planner"),
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {_module_name(p): p for top in TOPS for p in sorted((REPO / top).rglob("*.py"))}


def _resolve(name: str, known) -> str | None:
    parts = name.split(".")
    for k in range(len(parts), 0, -1):
        if ".".join(parts[:k]) in known:
            return ".".join(parts[:k])
    return None


def imports_of(module: str, path: Path, known) -> set[str]:
    """Every project module `module` imports, wherever the import statement stands."""
    out = set()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {r for a in node.names if (r := _resolve(a.name, known))}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([node.module] if node.module else []))
            for a in node.names:  # `from pkg import module` names a module; `from module import name` a name
                r = _resolve(f"{base}.{a.name}", known) if f"{base}.{a.name}" in known else _resolve(base, known)
                if r:
                    out.add(r)
    out.discard(module)
    return out


def graph() -> dict[str, set[str]]:
    mods = modules()
    return {m: imports_of(m, p, mods) for m, p in mods.items()}


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in g.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def reach(g: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for w in g.get(todo.pop(), ()):
            if w not in seen:
                seen.add(w)
                todo.append(w)
    return seen


def _in(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_no_import_cycles_anywhere():
    assert cycles(graph()) == []


def test_the_cycle_finder_sees_a_cycle_through_a_function_level_import(tmp_path):
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("import b\n")
    b.write_text("def f():\n    from a import x\n")
    known = {"a": a, "b": b}
    g = {"a": imports_of("a", a, known), "b": imports_of("b", b, known)}
    assert g == {"a": {"b"}, "b": {"a"}} and cycles(g) == [["a", "b"]]


def test_every_benchmark_subject_has_its_wall():
    subjects = {m.split(".")[1] for m in modules() if m.startswith("benchmarks.") and m.count(".") >= 2} - {"results"}
    assert subjects == set(BENCH_SUBJECTS)


def test_the_benchmark_wall_sees_one_subject_importing_another():
    g = graph()
    g["benchmarks.scaling.goals"] = g["benchmarks.scaling.goals"] | {"benchmarks.planner.__main__"}
    bad = [d for d in g["benchmarks.scaling.goals"]
           if not any(_in(d, a) for a in MAY_IMPORT["benchmarks.scaling"])]
    assert bad == ["benchmarks.planner.__main__"]


def test_packages_import_only_what_their_table_allows():
    g = graph()
    offenders = {}
    for module, deps in g.items():
        for package, allowed in MAY_IMPORT.items():
            if _in(module, package):
                bad = sorted(d for d in deps if not any(_in(d, a) for a in allowed))
                if bad:
                    offenders[module] = bad
    assert offenders == {}


def _through_offenders(g: dict[str, set[str]]) -> dict[str, list[str]]:
    offenders = {}
    for package, rules in ONLY_THROUGH.items():
        for module in (m for m in g if _in(m, package)):
            bad = sorted(d for d in g[module] for other, allowed in rules.items()
                         if _in(d, other) and d not in allowed)
            if bad:
                offenders[module] = bad
    return offenders


def test_training_reaches_checkpoints_only_through_the_checkpointer():
    assert _through_offenders(graph()) == {}


def test_the_through_rule_sees_a_loop_that_reads_checkpoint_files():
    g = graph()
    g["trainer.training.loop"] = g["trainer.training.loop"] | {"trainer.checkpoint.files"}
    assert _through_offenders(g) == {"trainer.training.loop": ["trainer.checkpoint.files"]}


@pytest.mark.parametrize("package", sorted(NEVER))
def test_inference_and_the_model_never_reach_training(package):
    g = graph()
    for module in (m for m in g if _in(m, package)):
        reached = sorted(m for m in reach(g, module) if any(_in(m, p) for p in NEVER[package]))
        assert reached == [], f"{module} reaches {reached}"


def test_the_ds_config_wall_sees_an_import_of_parallel():
    """trainer.ds_config reaching for the layout (as layout_world once did, inside a function) is caught by both
    the table and the reach check."""
    g = graph()
    assert reach(g, "trainer.ds_config") & {"trainer.parallel.layout", "trainer.parallel.deepspeed_adapter"} == set()
    g["trainer.ds_config"] = g["trainer.ds_config"] | {"trainer.parallel.layout"}
    assert "trainer.parallel.layout" in reach(g, "trainer.ds_config")
    assert not any(_in("trainer.parallel.layout", a) for a in MAY_IMPORT["trainer.ds_config"])


def test_nothing_in_the_packages_imports_launch_or_benchmarks():
    g = graph()
    bad = {m: sorted(d for d in deps if d.split(".")[0] in ("launch", "benchmarks"))
           for m, deps in g.items() if m.split(".")[0] in ("trainer", "data_prep")}
    assert {m: d for m, d in bad.items() if d} == {}


def test_the_walls_see_a_forbidden_import(tmp_path):
    """A translator module that imports the training loop inside a function is caught by the reach check."""
    g = graph()
    g["trainer.inference.translator"] = g["trainer.inference.translator"] | {"trainer.training.loop"}
    assert "trainer.training.loop" in reach(g, "trainer.inference.cli")
    assert imports_of("trainer.inference.fake", _write(tmp_path, "def f():\n    from trainer.training import loop\n"),
                      modules()) == {"trainer.training.loop"}


# A run's parts (the runtime, the rank module, the DeepSpeed engine, the schedule's interpreter) are built in
# trainer/training/build.py's Build, the calibration's world of one too; the wrappers are defined beside what
# they wrap (the adapter calls deepspeed.initialize, rank_module builds RankModule).
BUILT_IN_ONE_PLACE = ("trainer/training/build.py", "trainer/parallel/deepspeed_adapter.py",
                      "trainer/parallel/rank_module.py")
PARTS = ("build_rank_module", "RankModule", "StepRunner")
PART_OWNERS = {"initialize": ("dsa", "deepspeed", "deepspeed_adapter"),
               **{verb: ("ParallelRuntime",) for verb in ("start", "start_agreed", "on_started")}}


def part_constructions(path: Path) -> list[str]:
    """Where `path` builds a part of a run itself: a call of build_rank_module / RankModule / StepRunner (by name
    or through a module), dsa.initialize / deepspeed.initialize, ParallelRuntime.start / start_agreed."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
        owner = f.value.id if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) else None
        if name in PARTS or owner in PART_OWNERS.get(name, ()):
            found.append(f"{path.name}:{node.lineno} {owner + '.' if owner else ''}{name}")
    return found


def test_runs_are_built_in_one_place():
    assert [c for top in TOPS for p in sorted((REPO / top).rglob("*.py"))
            if p.relative_to(REPO).as_posix() not in BUILT_IN_ONE_PLACE for c in part_constructions(p)] == []
    assert part_constructions(REPO / "trainer" / "training" / "build.py")  # the pattern matches the builder


def test_the_one_place_check_sees_an_engine_built_by_hand(tmp_path):
    text = ("from trainer.parallel import deepspeed_adapter as dsa, interpreter\n"
            "def f(module, rt, ds):\n"
            "    engine = dsa.initialize(module, module.parameters(), ds, rt.grid)\n"
            "    return interpreter.StepRunner(rt, engine, module, 8), ParallelRuntime.start(rt.spec)\n")
    assert part_constructions(_write(tmp_path, text)) == [
        "fake.py:3 dsa.initialize", "fake.py:4 interpreter.StepRunner", "fake.py:4 ParallelRuntime.start"]


MAX_FUNCTION_LINES = 60


def long_functions(path: Path) -> list[str]:
    """Functions of `path` longer than MAX_FUNCTION_LINES (decorators and docstring included)."""
    return [f"{path.name}:{n.lineno} {n.name} ({n.end_lineno - n.lineno + 1} lines)"
            for n in ast.walk(ast.parse(path.read_text(), str(path)))
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.end_lineno - n.lineno + 1 > MAX_FUNCTION_LINES]


def test_functions_stay_short():
    assert [f for top in ("trainer", "data_prep", "launch", "benchmarks") for p in sorted((REPO / top).rglob("*.py"))
            for f in long_functions(p)] == []


def test_the_length_check_sees_a_long_function(tmp_path):
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES))
    assert long_functions(_write(tmp_path, f"def f():\n{body}")) == [f"fake.py:1 f ({MAX_FUNCTION_LINES + 1} lines)"]


def _write(tmp_path, text: str) -> Path:
    path = tmp_path / "fake.py"
    path.write_text(text)
    return path
