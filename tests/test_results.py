"""The measurements as records and the page made of them (benchmarks/results): docs/BENCHMARKS.md is exactly what
the records render to; every record says what it measured, on what, when and with which command, and that command
is in the checkout; the figures the README and docs/gpu.md quote are records; the writer refuses an incomplete
record. Nothing is measured here."""
from __future__ import annotations

import copy
import json
import re
import shlex
import sys

import pytest

from benchmarks.results import QUESTIONS, RecordError, check, read, record, write
from benchmarks.results.page import PAGE, latest, render
from tests.conftest import REPO
from tests.test_benchmark_commands import MODULE, PATH, cited, module_file


@pytest.fixture(scope="module")
def records():
    return read()


def test_the_page_is_what_the_records_make(records):
    page = (REPO / PAGE).read_text(encoding="utf-8")
    assert page == render(records), "docs/BENCHMARKS.md differs from the records: python -m benchmarks.results render"


def test_a_changed_figure_changes_the_page(records):
    """The comparison above can fail: a measured row's figure moved by one is seen."""
    changed = copy.deepcopy(records)
    run = next(r for r in reversed(changed) if r["question"] == "gpu" and r["table"] == "runs")
    run["figures"]["tokens_per_s"] += 1000
    assert render(changed) != render(records)


def test_every_question_has_records_and_each_names_a_command_in_the_checkout(records):
    assert {r["question"] for r in records} == set(QUESTIONS)
    for path in (REPO / "benchmarks" / "results").glob("*.jsonl"):
        assert path.stem in QUESTIONS, f"{path.name}: no such question"
    missing = set()
    for r in records:
        missing |= {f"python -m {m}" for m in cited(MODULE, r["command"]) if module_file(m) is None}
        missing |= {p for p in cited(PATH, r["command"]) if not (REPO / p).exists()}
        words = shlex.split(r["command"])
        run = [w for w in words if not re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", w)]  # after VAR=VALUE settings
        assert run[0] in ("python", "bash", "git", "/usr/bin/time"), r["command"]
        if run[:2] == ["python", "-m"]:  # a module name, then its arguments (not a quoted "module sub")
            assert re.fullmatch(r"[\w.]+", run[2]), r["command"]
    assert not missing, f"records name commands the checkout lacks: {sorted(missing)}"


def test_every_journal_link_of_a_record_resolves(records):
    from tests.test_docs import anchors

    for r in (r for r in records if r.get("journal")):
        file, _, anchor = r["journal"].partition("#")
        target = REPO / "docs" / file
        assert target.exists() and anchor in anchors(target), r["journal"]


def test_predictions_are_marked_and_come_after_every_measured_row(records):
    page = render(records)
    front = page.split("## How fast is it?")[1].split("\n## ")[0]
    rows = [line for line in front.splitlines() if line.startswith("| NVIDIA") or line.startswith("| AMD")
            or line.startswith("| Intel")]
    predicted = [i for i, line in enumerate(rows) if "*predicted*" in line]
    assert predicted and predicted == list(range(len(rows) - len(predicted), len(rows)))
    assert sum(1 for r in records if r.get("prediction")) >= 30
    gpu_measured = [line for line in rows if line.startswith("| NVIDIA H200 |")]
    assert len(gpu_measured) >= 10  # the first screen answers for a GPU with measured rows


def _numbers(records) -> list[float]:
    out = []

    def walk(v):
        if isinstance(v, (list, tuple)):
            for x in v:
                walk(x)
        elif isinstance(v, dict):
            for x in v.values():
                walk(x)
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            out.append(float(v))
    for r in records:
        walk([r["settings"], r["figures"], r["ratios"]])
    return out


def quoted(text: str) -> list[str]:
    """The figures a text quotes: decimals and thousands (not dates, not percentages, not section numbers)."""
    text = re.sub(r"\d{4}-\d{2}-\d{2}|(cuDNN|torch|DeepSpeed|Python|OpenNMT-py) [\w.+]+", "", text)
    return [m for m in re.findall(r"(?<![\w.-])(\d{1,3}(?:,\d{3})+|\d+\.\d+(?:e-\d+)?)(?![\d%]|\.\d)", text)]


def has_record(figure: str, numbers: list[float]) -> bool:
    if "," in figure:
        return any(round(v) == int(figure.replace(",", "")) for v in numbers)
    if "e" in figure:
        return any(abs(v - float(figure)) <= 1e-12 for v in numbers)
    digits = len(figure.split(".")[1])
    return any(round(v, digits) == float(figure) for v in numbers)


@pytest.mark.parametrize("doc, start, end", [("README.md", "## One result", "## Where to read next"),
                                             ("docs/gpu.md", "## What one H200 measured", "**What paces the step")])
def test_the_figures_the_docs_quote_are_records(records, doc, start, end):
    text = (REPO / doc).read_text(encoding="utf-8").split(start)[1].split(end)[0]
    numbers = _numbers(records)
    figures = quoted(text)
    assert len(figures) >= 10
    assert [f for f in figures if not has_record(f, numbers)] == []


def test_the_quote_finder_sees_a_figure_no_record_holds(records):
    assert quoted("at 1.13x on 2026-12-03, 329,739 tokens/s, 39% busy, 3.2e-8, cuDNN 9.19") == ["1.13", "329,739", "3.2e-8"]
    assert not has_record("31.41", _numbers(records))


def test_the_writer_appends_checked_records_and_refuses_incomplete_ones(tmp_path):
    rec = record("scaling", "runs", command="python -m benchmarks.scaling --only data_2", settings={"layout": "data_2"},
                 figures={"tokens_per_s": 1234.5, "by_round": [1, 2]}, ratios={"of_the_ceiling": 0.7})
    assert rec["machine"] and rec["date"] and "commit" in rec
    write([rec, rec], root=tmp_path)
    assert read("scaling", root=tmp_path) == [rec, rec]
    assert json.loads((tmp_path / "scaling.jsonl").read_text().splitlines()[0]) == rec
    for bad, message in ((dict(rec, question="speed"), "not one of"), ({k: v for k, v in rec.items() if k != "command"},
                                                                        "missing"),
                         (dict(rec, figures={"x": {"nested": 1}}), "figures.x"), (dict(rec, date="4 Dec"), "date")):
        with pytest.raises(RecordError, match=message):
            check(bad)
    (tmp_path / "scaling.jsonl").write_text('{"question": "scaling"}\n')
    with pytest.raises(RecordError, match="scaling.jsonl:1"):
        read("scaling", root=tmp_path)


def test_a_record_takes_numpy_numbers_as_python_ones():
    """A count of numpy booleans is a numpy integer, which is no int: validate's summary record was refused for it
    after a 25-minute run (2026-12-07). record() turns numpy scalars into Python numbers; a boolean stays refused."""
    np = pytest.importorskip("numpy")
    rec = record("planner", "validation summary", command="python -m benchmarks.planner validate", settings={},
                 figures={"rows": sum(np.float64(x) <= 0.1 for x in (0.05, 0.2)), "ms": np.float64(1.5),
                          "by_round": [np.int64(3), np.float32(0.5)]}, ratios={"share": np.float64(0.25)})
    assert rec["figures"] == {"rows": 1, "ms": 1.5, "by_round": [3, 0.5]} and rec["ratios"] == {"share": 0.25}
    assert all(type(v) in (int, float) for v in [rec["figures"]["rows"], rec["figures"]["ms"], *rec["figures"]["by_round"]])
    with pytest.raises(RecordError, match="figures.ok"):
        record("planner", "validation summary", command="x", settings={}, figures={"ok": np.bool_(True)})


def test_latest_keeps_the_newest_run_with_all_its_variants():
    def rec(date, time, command, variant, key="k"):
        return {"date": date, "time": time, "command": command, "variant": variant, "key": key}
    old = rec("2026-12-01", "10:00", "a", "x")
    new = [rec("2026-12-02", "09:00", "b", "x"), rec("2026-12-02", "09:00", "b", "y")]
    other_run_same_hour = rec("2026-12-02", "09:00", "c", "z")
    got = latest([old, *new, other_run_same_hour], key=lambda r: r["key"])
    assert got == [other_run_same_hour]  # the later written of two runs of one hour
    assert latest([old, *new], key=lambda r: r["key"]) == new
    assert latest([old, *new], key=lambda r: (r["key"], r["variant"])) == new


def test_a_gpu_checks_files_become_records(tmp_path):
    from benchmarks.results import gpu_records, stamp

    run = {"name": "patent_bf16", "model": "patent", "precision": "bf16", "micro_batch": 128, "untimed_steps": 144,
           "pairs_per_s": 4152.4, "tokens_per_s": 329738.6, "step_ms_mean": 30.8, "peak_memory_mib": 8466.0,
           "cpu_ms_per_step": {"main": 20.0, "pt_autograd_0": 9.9, "batches_0": 3.0}, "mfu_datasheet": 0.11}
    report = {"environment": {"gpu": "NVIDIA H200"}, "runs": [run, {"name": "cut", "error": "deadline"}],
              "latency": {"batch": 128, "hidden": 1024, "op_overhead_us": 9.8, "sync_us": 10.2, "lstm_step_us": 17.0,
                          "lstm_step_bwd_us": 19.8}}
    (tmp_path / "gpu_check.json").write_text(json.dumps(report))
    recs = stamp(gpu_records.records(tmp_path, command="bash benchmarks/gpu/gpu_check.sh"), date="2026-12-04",
                 commit="0286383")
    assert [(r["table"], r["machine"], r["date"], r["commit"]) for r in recs] == [
        ("runs", "NVIDIA H200", "2026-12-04", "0286383"), ("latency", "NVIDIA H200", "2026-12-04", "0286383")]
    assert recs[0]["figures"]["host_cpu_ms_per_step"] == pytest.approx(29.9)
    assert recs[0]["settings"]["pairs_per_step"] == 128 and recs[0]["ratios"]["mfu_datasheet"] == 0.11


def test_the_benchmarks_write_records_the_page_reads(monkeypatch):
    """What the scaling goals and the OpenNMT-py peer write (their to_records) lands in the page's tables: the goal
    names are the page's, the runs' figures its columns."""
    import argparse

    from benchmarks.peers import opennmt_peer
    from benchmarks.results import page
    from benchmarks.scaling import goals

    monkeypatch.setattr(sys, "argv", ["x", "--goals"])
    run = lambda tps, kernel="fused": {"tokens_per_s": tps, "pairs_per_s": tps / 21, "step_ms_median": 500.0,  # noqa: E731
                                       "kernel": kernel}
    rows = {"single 1 thread fused": [run(100)], "single 1 thread stepwise": [run(90, "stepwise")],
            "ceiling": [run(190)], "ceiling half batch": [run(150)], "single 2 threads": [run(150)],
            "data_2": [run(170)], "pipeline_2 units=4": [run(100)], "hybrid_2 shipped": [run(180)]}
    recs = goals.to_records({"wide": {"bf16": rows}}, "python -m benchmarks.scaling --goals")
    assert {r["settings"]["goal"] for r in recs if r["table"] == "goals"} == set(page.GOALS)
    peer = lambda p: {"pairs_per_s": p, "rounds_pairs_per_s": [p], "step_ms_median": 64000 / p,  # noqa: E731
                      "tokens_per_pair": 21.0}
    results = {("OpenNMT-py, no input feeding", "fp32"): peer(300.0), ("OpenNMT-py, input feeding", "fp32"): peer(200.0),
               ("ours single", "fp32"): peer(360.0), ("ours single", "bf16"): peer(500.0)}
    recs += opennmt_peer.to_records(results, argparse.Namespace(threads=2, ours=[]), busy=False)
    for r in recs:
        check(r)
    text = render(recs)
    assert "| hybrid_2 / ceiling | **0.95x** | not measured | not measured | not measured | >= 0.90x |" in text
    front = text.split("## Parity")[0]
    assert "| wide | bf16 | hybrid_2 (shipped) | 64 | 8.57 | 180 |" in front  # 180 / 21 pairs/s, as the run gave them
    assert "| enja-small | fp32 | single 2 threads | 64 | 360 | 7,560 † | 177.8 | 300 / 200 | 1.20x / 1.80x |" in front
    assert "ceiling" not in front.split("| machine |")[1]  # the ceiling is a limit, in Scaling, not a layout


def test_a_cpu_without_avx512_is_another_machine_than_one_of_the_same_name_with_it():
    """Two AMD EPYCs of one name, one with AVX-512 and one with AVX2 only (bf16 emulated there), were one machine in
    the records and the second's rows replaced the first's in BENCHMARKS.md (2026-12-06)."""
    from benchmarks.results import cpu_label

    assert cpu_label("AMD EPYC (2 cores)", {"avx2", "avx512f", "avx512_bf16"}) == "AMD EPYC (2 cores)"
    assert cpu_label("AMD EPYC (2 cores)", {"avx", "avx2"}) == "AMD EPYC, AVX2 only (2 cores)"
    assert cpu_label("Intel Xeon (2 cores)", {"avx2", "avx512f", "amx_tile", "amx_bf16"}) == "Intel Xeon (2 cores), AMX"
    assert cpu_label("Neoverse-V2 (2 cores)", {"sve", "bf16"}) == "Neoverse-V2 (2 cores)"


def test_a_records_command_carries_the_environment_that_changes_the_run(monkeypatch):
    """`MIMALLOC_PURGE_DELAY=1000 python -m benchmarks.scaling.rank_cpu` measures another trainer than the same
    command without it: the variables the trainer and its libraries read are part of the command, others are not."""
    from benchmarks.results import command

    monkeypatch.setattr(sys, "argv", ["rank_cpu.py", "--steps", "40"])
    env = {"MIMALLOC_PURGE_DELAY": "1000", "HYBRID_NMT_ALLOCATOR": "glibc", "HOME": "/root", "PATH": "/bin"}
    assert command("benchmarks.scaling.rank_cpu", env) == \
        "HYBRID_NMT_ALLOCATOR=glibc MIMALLOC_PURGE_DELAY=1000 python -m benchmarks.scaling.rank_cpu --steps 40"
    assert command("benchmarks.scaling.rank_cpu", {"HOME": "/root"}) == "python -m benchmarks.scaling.rank_cpu --steps 40"
