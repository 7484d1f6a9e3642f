"""The project's measurements as data: one record per measurement, appended to benchmarks/results/<question>.jsonl
(committed: the evidence behind docs/BENCHMARKS.md, which `python -m benchmarks.results render` writes from them).

A record says what was asked and how it was answered:

    question    which question it answers (QUESTIONS: parity, scaling, peers, bleu, planner, memory, gpu, data, syncs)
    table       the family of measurements it belongs to within the question ("goals", "runs", "validation", ...)
    command     the command that measured it, as run from the checkout's root
    commit      the checkout's commit (None where the record's source did not say)
    machine     the CPU model (with its cores) or the GPU's name
    date        YYYY-MM-DD; `time` the hour, where known
    settings    what was held fixed: model, precision, layout, threads, ...
    figures     the absolute figures: pairs_per_s, tokens_per_s, step_ms, memory_mib, bleu, ... (a key names its unit)
    ratios      ratios measured side by side in the same run (against one process, the ceiling, OpenNMT-py, ...)
    prediction  true for what a model predicts (the planner), never measured
    journal     docs/journal/DATE.md#anchor: the reasoning behind the figure, where there is one
    note, source  free text; `source` names where an imported record was read (a doc and its commit)

Every benchmark writes through `write`; nothing else appends to these files. Only the standard library here:
the benchmarks import this before their arguments are parsed.
"""
from __future__ import annotations

import datetime
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from benchmarks.common import REPO, cpu_model

RESULTS = REPO / "benchmarks" / "results"
# question -> the page's heading for it (its anchor is what other docs link to)
QUESTIONS = {
    "parity": "Parity",
    "scaling": "Scaling",
    "peers": "Against OpenNMT-py",
    "bleu": "BLEU",
    "planner": "The planner",
    "memory": "Memory",
    "gpu": "On a GPU",
    "data": "Data preparation at scale",
    "syncs": "Device syncs",
}
FIELDS = ("question", "table", "command", "commit", "machine", "date", "settings", "figures", "ratios")
OPTIONAL = ("time", "prediction", "journal", "note", "source")


class RecordError(ValueError):
    """A record that does not say what it measured, on what, when or how; the message names the field."""


def machine() -> str:
    """This machine as a record names it: the GPU's name when one is visible to torch (already imported by the
    benchmark that ran on it), else the CPU model with its cores, and whether the CPU exposes AMX (the bf16 GEMMs
    differ by far without it)."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        info = ""
    flags = next((set(line.split(":", 1)[1].split()) for line in info.splitlines() if line.startswith("flags")), set())
    return cpu_label(cpu_model(), flags)


def cpu_label(model: str, flags: set) -> str:
    """`model` ("NAME (N cores)") with what decides its bf16: ", AMX" where the CPU has it, and "NAME, AVX2 only
    (N cores)" for an x86 CPU without AVX-512 (PyTorch emulates bf16 there: a GEMM 47-104x fp32's time on an AMD EPYC,
    2026-12-06), so that two CPUs of one name but not one instruction set are two machines in the records."""
    if "avx2" in flags and "avx512f" not in flags:
        name, paren, cores = model.partition(" (")
        model = f"{name}, AVX2 only{paren}{cores}"
    return f"{model}{', AMX' if any(f.startswith('amx') for f in flags) else ''}"


def commit() -> str | None:
    """The checkout's short commit, `-dirty` when tracked files have uncommitted changes (None outside git). The
    records themselves (benchmarks/results/*.jsonl) do not count: a benchmark of several runs appends one after
    each, and its later runs measured the same code."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                              check=True, timeout=30).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".",
                                ":(exclude)benchmarks/results/*.jsonl"], cwd=REPO,
                               capture_output=True, text=True, check=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("-dirty" if dirty else "")


# Variables of the environment that change what a measured run does (the trainer's allocator and its settings,
# oneDNN's, the thread runtimes'): a command is not the same measurement without them.
SETTING_VARIABLES = ("HYBRID_NMT_", "MIMALLOC_", "ONEDNN_", "DNNL_", "OMP_", "KMP_", "MKL_", "GLIBC_TUNABLES",
                     "LD_PRELOAD")


def command(module: str, environ=os.environ) -> str:
    """This process's command line as `[VAR=VALUE ...] python -m MODULE ARGS` (what a reader types to measure it
    again, with the variables of SETTING_VARIABLES set here); `module` is the dotted name alone (a subcommand is
    in sys.argv already)."""
    if not re.fullmatch(r"[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*", module):
        raise ValueError(f"{module!r}: not a module name (the subcommand and options come from sys.argv)")
    return shlex.join([*environment(environ), "python", "-m", module, *sys.argv[1:]])


def environment(environ=os.environ) -> list[str]:
    """`VAR=VALUE` for each variable of SETTING_VARIABLES set in `environ`, sorted: for a record's settings too,
    where a table tells its rows apart by them."""
    return [f"{k}={v}" for k, v in sorted(environ.items()) if k.startswith(SETTING_VARIABLES)]


def record(question: str, table: str, *, command: str, settings: dict, figures: dict, ratios: dict | None = None,
           prediction: bool = False, note: str | None = None, machine_name: str | None = None) -> dict:
    """A record of a measurement taken now, on this machine, at this checkout's commit."""
    now = datetime.datetime.now()
    rec = {"question": question, "table": table, "command": command, "commit": commit(),
           "machine": machine_name or machine(), "date": now.strftime("%Y-%m-%d"), "time": now.strftime("%H:%M"),
           "settings": settings, "figures": _plain(figures), "ratios": _plain(ratios or {})}
    if prediction:
        rec["prediction"] = True
    if note:
        rec["note"] = note
    check(rec)
    return rec


def _plain(value):
    """Figures as Python numbers: a numpy scalar (a median, a count of numpy booleans) becomes its Python value, so
    that the check and the JSON see a number (numpy's integers are no int; its floats pass as float already)."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if type(value).__module__ == "numpy" and hasattr(value, "item"):
        return value.item()
    return value


def stamp(records: list[dict], *, date: str, commit: str | None, time: str | None = None) -> list[dict]:
    """Records made now from files another machine wrote at another time (a GPU check's $OUT): their own date,
    hour and commit in place of today's."""
    for rec in records:
        rec.update(date=date, commit=commit)
        if time:
            rec["time"] = time
        else:
            rec.pop("time", None)
        check(rec)
    return records


def check(rec: dict) -> None:
    """Raise RecordError when a record lacks a field, names an unknown question, or holds a figure that is no
    number (nor a list of numbers, nor text as its source stated it)."""
    missing = [f for f in FIELDS if f not in rec]
    unknown = [f for f in rec if f not in FIELDS + OPTIONAL]
    if missing or unknown:
        raise RecordError(f"record {rec.get('question')}/{rec.get('table')}: missing {missing}, unknown {unknown}")
    if rec["question"] not in QUESTIONS:
        raise RecordError(f"record question {rec['question']!r}: not one of {', '.join(QUESTIONS)}")
    if not rec["command"] or not rec["machine"] or not isinstance(rec["settings"], dict):
        raise RecordError(f"record {rec['question']}/{rec['table']}: no command, machine or settings")
    try:
        datetime.date.fromisoformat(rec["date"])
    except (TypeError, ValueError):
        raise RecordError(f"record {rec['question']}/{rec['table']}: date {rec['date']!r} is not YYYY-MM-DD") from None
    for group in ("figures", "ratios"):
        for key, value in rec[group].items():
            if not _is_figure(value):
                raise RecordError(f"record {rec['question']}/{rec['table']}: {group}.{key} = {value!r}")


def _is_figure(value) -> bool:
    if isinstance(value, list):
        return all(_is_figure(v) for v in value)
    return value is None or isinstance(value, (str, float, int)) and not isinstance(value, bool)


def path(question: str, root: Path = RESULTS) -> Path:
    return root / f"{question}.jsonl"


def write(records: list[dict], root: Path = RESULTS) -> list[Path]:
    """Append each record (checked) to ROOT/<question>.jsonl, one JSON line each; returns the files written."""
    for rec in records:
        check(rec)
    written = []
    for rec in records:
        target = path(rec["question"], root)
        with open(target, "a", encoding="utf-8") as f:
            f.write(json.dumps(rec, ensure_ascii=False, sort_keys=False) + "\n")
        if target not in written:
            written.append(target)
    if written:
        print(f"records: {len(records)} appended to {', '.join(os.path.relpath(p, REPO) for p in written)}")
    return written


def read(question: str | None = None, root: Path = RESULTS) -> list[dict]:
    """The records of one question (or of all), in the order they were written; each is checked."""
    out = []
    for q in [question] if question else QUESTIONS:
        target = path(q, root)
        if not target.exists():
            continue
        for n, line in enumerate(target.read_text(encoding="utf-8").splitlines(), 1):
            try:
                rec = json.loads(line)
                check(rec)
            except (json.JSONDecodeError, RecordError) as e:
                raise RecordError(f"{target}:{n}: {e}") from None
            if rec["question"] != q:
                raise RecordError(f"{target}:{n}: a record of question {rec['question']!r}")
            out.append(rec)
    return out
