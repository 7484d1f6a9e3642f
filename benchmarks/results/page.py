"""docs/BENCHMARKS.md from the records: `python -m benchmarks.results render` writes it, `render()` returns it
(tests/test_results.py holds the file to it). One table that answers "how fast, on what, against what", then one
table per question: the latest measurement of each row per machine, "not measured" where a machine has none.
Nothing here measures or computes a figure beyond a division the row's own record holds (marked †)."""
from __future__ import annotations

from collections import defaultdict

from benchmarks.results import QUESTIONS, read

PAGE = "docs/BENCHMARKS.md"
NAV = ("[README](../README.md) · [architecture](architecture.md) · [configuration](configuration.md) · "
       "[layouts](layouts.md) · [planner](planner.md) · [data](data.md) · [training](training.md) · "
       "[translation](translation.md) · [GPU](gpu.md) · [reliability](RELIABILITY.md) · [benchmarks](BENCHMARKS.md) · "
       "[tests](testing.md)")
# anchors other docs link to, kept beside the headings that replaced them
OLD_ANCHORS = {"gpu": "gpu-readiness"}
MODEL_ORDER = ("patent", "paper-size", "wide", "enja-small")
MACHINES = {  # what a machine's name in the records stands for, where the name says less
    "NVIDIA H200": "NVIDIA H200: one GPU of a lent device (torch 2.11.0+cu130, cuDNN 9.19)",
    "NVIDIA H200 (second machine)": "NVIDIA H200 (second machine): another lent device of the same kind, whose host "
                                    "ran the same step slower",
    "AMD EPYC (2 cores)": "AMD EPYC (2 cores): this workplace's KVM machine with AVX-512 (its bf16 faster than fp32), "
                          "torch 2.13.0+cpu",
    "AMD EPYC, AVX2 only (2 cores)": "AMD EPYC, AVX2 only (2 cores): a KVM machine without AVX-512 or AMX, where PyTorch "
                                     "emulates bf16 (a GEMM 47-104x fp32's time), torch 2.13.0+cpu",
    "Intel Xeon without AMX (2 cores)": "Intel Xeon without AMX (2 cores): family 6 model 207, AVX-512-bf16, no AMX "
                                        "flag exposed (its bf16 is slower than fp32)",
    "Intel Xeon with AMX (2 cores)": "Intel Xeon with AMX (2 cores): AVX-512, AVX-512-bf16 and AMX, 24 GiB",
}
THROUGHPUT = {("scaling", "runs"), ("peers", "runs"), ("gpu", "runs")}


# ---- choosing rows ----------------------------------------------------------------------------------------------------------
def when(rec: dict) -> tuple:
    return rec["date"], rec.get("time") or ""


def latest(records: list[dict], key) -> list[dict]:
    """For each key(record), the records of its newest measurement: the newest by date and hour (the later written
    of a tie), with every record of the same command, date and hour (one run that measured several variants)."""
    newest: dict = {}
    for rec in records:
        if key(rec) not in newest or when(rec) >= when(newest[key(rec)]):
            newest[key(rec)] = rec
    runs = {(key(r), when(r), r["command"]) for r in newest.values()}
    return [r for r in records if (key(r), when(r), r["command"]) in runs]


def machines(records: list[dict]) -> list[str]:
    """Every machine of the records: GPUs first, then CPUs, each kind newest measurement first."""
    newest: dict = {}
    for r in records:
        newest[r["machine"]] = max(newest.get(r["machine"], ("", "")), when(r))
    by_age = sorted(newest, key=lambda m: newest[m], reverse=True)
    return [m for m in by_age if "NVIDIA" in m] + [m for m in by_age if "NVIDIA" not in m]


# ---- cells ------------------------------------------------------------------------------------------------------------------------
def number(v, digits: int | None = None) -> str:
    """A figure as the page writes it: thousands separated, a list as 'a / b', text as it is, None as '-'."""
    if v is None:
        return "-"
    if isinstance(v, list):
        return " / ".join(number(x, digits) for x in v)
    if isinstance(v, str):
        return v
    if isinstance(v, int) and digits is None:
        return f"{v:,}"
    if digits is None:
        digits = 0 if abs(v) >= 100 else 1 if abs(v) >= 10 else 2 if abs(v) >= 0.1 else 3
    text = f"{v:,.{digits}f}"
    return text if abs(v) >= 1e-3 or v == 0 else f"{v:.1e}"


def ratio(v) -> str:
    return "-" if v is None else " / ".join(f"{x:.2f}x" for x in v) if isinstance(v, list) else f"{v:.2f}x"


def link(rec: dict) -> str:
    return f"[journal]({rec['journal']})" if rec.get("journal") else ""


def stamp(rec: dict) -> str:
    return rec["date"] + (f" {rec['time']}" if rec.get("time") else "")


def row(cells) -> str:
    return "| " + " | ".join(str(c).replace("|", "/") for c in cells) + " |"


def table(head: list[str], rows: list[list]) -> list[str]:
    align = ["---:" if h.endswith(("/s", "ms", "MiB", "x", "BLEU", "chrF", "%", "per step", "(MB)")) else "---"
             for h in head]
    return [row(head), "|" + "|".join(align) + "|", *(row(r) for r in rows)]


def commands(records: list[dict]) -> list[str]:
    """The commands of the rows shown, once each, as a list under the table."""
    cmds = list(dict.fromkeys(r["command"] for r in records))
    return ["", "Commands (each row's record names its own, with its commit):", "",
            *(f"- `{c}`" for c in cmds)] if cmds else []


def by_machine(records: list[dict]) -> list[dict]:
    """Records in the page's machine order (GPUs, then CPUs, newest first), each machine's in written order."""
    every = machines(records)
    return sorted(records, key=lambda r: every.index(r["machine"]))


def not_measured(records: list[dict], every: list[str], note: str = "") -> list[str]:
    missing = [m for m in every if m not in {r["machine"] for r in records}]
    return ["", f"Not measured on: {', '.join(missing)}{note}."] if missing else []


# ---- How fast is it? ---------------------------------------------------------------------------------------------------------------
PEER = "OpenNMT-py"


def _runs(records: list[dict]) -> list[dict]:
    """The throughput records of shipped settings (an A/B's `overrides` row stays in its question's table)."""
    rates = {"pairs_per_s", "tokens_per_s", "pairs_per_s_by_round", "tokens_per_s_by_round"}
    return [r for r in records if (r["question"], r["table"]) in THROUGHPUT and rates & set(r["figures"])
            and "overrides" not in r["settings"]]


def _run_key(r: dict) -> tuple:
    """machine x model x precision x layout (and who ran it, and the batch); a precision's first word, so that an
    fp32 run that said less about TF32 is replaced by a later fp32 run."""
    s = r["settings"]
    return (r["machine"], s.get("model"), (s.get("precision") or "").split(" ")[0], s.get("layout"),
            s.get("system", "ours"), s.get("pairs_per_step"))


def _predictions(records: list[dict]) -> list[dict]:
    """The planner's one-GPU predictions, one per model, scenario and profile (NVLink; the fewest devices)."""
    preds = [r for r in records if r.get("prediction") and r["figures"].get("one_gpu_step_ms") is not None
             and r["settings"].get("link", "nvlink") == "nvlink"]
    key = lambda r: (r["machine"], r["settings"].get("model"), r["settings"].get("scenario"),  # noqa: E731
                     r["settings"].get("profile"))
    fewest = {}
    for r in sorted(latest(preds, key), key=lambda r: r["settings"].get("devices", 1)):
        fewest.setdefault(key(r), r)
    return list(fewest.values())


def speed_cells(r: dict) -> list:
    """pairs/s, tokens/s and ms per step of a throughput record (or of a prediction)."""
    f = r["figures"]
    pairs = f.get("pairs_per_s", f.get("pairs_per_s_by_round"))
    tokens = f.get("tokens_per_s", f.get("tokens_per_s_by_round"))
    ms = f.get("step_ms", f.get("step_ms_median", f.get("one_gpu_step_ms")))
    pairs_cell, tokens_cell = number(pairs), number(tokens)
    if pairs is None and r.get("prediction") and ms:
        pairs_cell = number(1000 * r["settings"]["pairs_per_step"] / ms) + " †"
    if tokens is None and isinstance(pairs, (int, float)) and f.get("tokens_per_pair"):
        tokens_cell = number(pairs * f["tokens_per_pair"]) + " †"
    return [pairs_cell, tokens_cell, number(ms, 1) if ms else "-"]


def peer_cells(r: dict, peers: list[dict]) -> list[str]:
    """OpenNMT-py's pairs/s without and with input feeding from the same run as `r`, and r's ratios to them."""
    same = {p["settings"]["system"]: p for p in peers if p["machine"] == r["machine"] and when(p) == when(r)
            and p["command"] == r["command"]}
    rates = [next((number(p["figures"].get("pairs_per_s")) for name, p in same.items()
                   if name.endswith(feed)), "-") for feed in ("no input feeding", ", input feeding")]
    q = r["ratios"]
    ratios = [ratio(q[k]) if k in q else "-" for k in ("over_opennmt_no_input_feeding", "over_opennmt_input_feeding")]
    return [" / ".join(rates) if rates != ["-", "-"] else "-", " / ".join(ratios) if ratios != ["-", "-"] else "-"]


def _order(every: list[str]):
    def key(r: dict) -> tuple:
        s = r["settings"]
        model = s.get("model")
        return (bool(r.get("prediction")), every.index(r["machine"]),
                MODEL_ORDER.index(model) if model in MODEL_ORDER else len(MODEL_ORDER), s.get("precision") or "",
                str(s.get("pairs_per_step")), s.get("layout") or "", s.get("system", "ours"))
    return key


def how_fast(records: list[dict]) -> list[str]:
    every = machines(records)
    runs = _runs(records)
    peers = [r for r in runs if r["settings"].get("system", "").startswith(PEER)]
    ours = [r for r in latest(runs, _run_key) if r not in peers and "ceiling" not in (r["settings"].get("layout") or "")]
    rows = []
    for r in sorted(ours + _predictions(records), key=_order(every)):
        s = r["settings"]
        layout = s.get("layout") or f"single, 1 GPU, scenario {s.get('scenario')}"
        layout += "".join(f" ({x})" for x in (s.get("variant"), s.get("system") if s.get("system", "ours") != "ours"
                                                else None) if x)
        machine = r["machine"] + (f" — *predicted* from {s.get('profile', 'estimates')}" if r.get("prediction") else "")
        rows.append([machine, s.get("model"), s.get("precision"), layout, s.get("pairs_per_step") or "-",
                     *speed_cells(r), *peer_cells(r, peers), stamp(r), link(r)])
    head = ["machine", "model", "precision", "layout", "pairs per step", "pairs/s", "tokens/s", "ms per step",
            "OpenNMT-py pairs/s, same run: without / with input feeding", "ours / OpenNMT-py", "measured", ""]
    return [
        "## How fast is it?", "", *in_short(ours, every), "",
        "Ours, a row per machine, model, precision and layout: its newest measurement (a run that measured several "
        "variants shows each). OpenNMT-py 3.5.1 stands beside ours where the same run measured it. Rows marked "
        "*predicted* are the planner's, never measured, and come last.", "",
        *table(head, rows), "",
        "GPU rows: the GPU check's runs through the real CLI, over the steps no metrics row timed. A list is the "
        "rounds of one run; † is the row's own division (pairs per step / ms per step, or pairs/s x the src+tgt "
        "tokens per pair its command printed). The models: enja-small (emb/hidden 256, 2+2 LSTM layers, 8k BPE per "
        "side), wide (the same at 1024), paper-size (4+4 layers of 1024, a joint 32k BPE), patent (paper-size "
        "without dropout, on sentences 4x as long: ~33 source and ~47 target pieces). The machines: "
        + "; ".join(MACHINES.get(m, m) for m in every) + ".", ""]


def in_short(ours: list[dict], every: list[str]) -> list[str]:
    """A line per machine: its fastest measured row by tokens/s (pairs/s where a run printed no tokens/s), and
    ours against OpenNMT-py in that machine's newest run of both."""
    out = []
    for m in every:
        mine = [r for r in ours if r["machine"] == m]
        rate = "tokens_per_s" if any(isinstance(r["figures"].get("tokens_per_s"), (int, float)) for r in mine) \
            else "pairs_per_s"
        scalar = [r for r in mine if isinstance(r["figures"].get(rate), (int, float))]
        if not scalar:
            continue
        best = max(scalar, key=lambda r: r["figures"][rate])
        s = best["settings"]
        line = (f"- **{m}**: up to {number(best['figures'][rate])} {rate.replace('_per_s', '/s')} ({s.get('model')}, "
                f"{s.get('precision')}, {s.get('layout')}, {s.get('pairs_per_step')} pairs per step; {stamp(best)})")
        peer = [r for r in mine if r["ratios"].get("over_opennmt_no_input_feeding") is not None
                or r["ratios"].get("over_opennmt_input_feeding") is not None]
        if peer:
            newest = max(when(r) for r in peer)
            line += "; against OpenNMT-py 3.5.1 measured beside it: " + ", ".join(
                f"{r['settings']['precision']} {ratio(r['ratios'][k])} {feed} input feeding" for r in peer
                if when(r) == newest for k, feed in (("over_opennmt_no_input_feeding", "without"),
                                                     ("over_opennmt_input_feeding", "with")) if k in r["ratios"])
            line += f" ({newest[0]})"
        out.append(line + ".")
    return ["In short, the fastest measured row of each machine, and ours against OpenNMT-py:", "", *out]


# ---- one table per question ----------------------------------------------------------------------------------------------------------
GOALS = {  # the scaling goals by name (benchmarks/scaling/goals.py), as the table words them
    "ceiling": "ceiling: two singles at once / one alone",
    "hybrid_2 of the ceiling": "hybrid_2 / ceiling",
    "data_2 of the ceiling": "data_2 / ceiling",
    "hybrid_2 over data_2": "hybrid_2 / data_2",
    "half batch": "half batch: two half-batch singles at once / ceiling",
    "data_2 of the half-batch ceiling": "data_2 / half-batch ceiling",
    "hybrid_2 over one process": "hybrid_2 / one process, 1 thread",
    "hybrid_2 over pipeline_2": "hybrid_2 / pipeline_2 units=4",
}
COMBOS = (("wide", "bf16"), ("wide", "fp32"), ("enja-small", "bf16"), ("enja-small", "fp32"))


def _goal_cell(r: dict | None) -> str:
    if r is None:
        return "not measured"
    q, target = r["ratios"], r["settings"].get("target")
    spread = "min" in q and round(q["min"], 2) != round(q["max"], 2)
    text = ratio(q["measured"]) + (f" ({q['min']:.2f}-{q['max']:.2f})" if spread else "")
    return f"**{text}**" if target and q["measured"] >= target else text


def scaling(records: list[dict]) -> tuple[list[str], list[dict]]:
    goals = latest([r for r in records if r["table"] == "goals"],
                   lambda r: (r["machine"], r["settings"]["goal"], r["settings"]["model"], r["settings"]["precision"]))
    cells = {(r["machine"], r["settings"]["goal"], r["settings"]["model"], r["settings"]["precision"]): r for r in goals}
    rows = []
    for m in machines(goals):
        for goal in GOALS:
            got = [cells.get((m, goal, model, p)) for model, p in COMBOS]
            if not any(got):
                continue
            first = next(r for r in got if r)
            target = {r["settings"].get("target") for r in got if r and r["settings"].get("target")}
            rows.append([m, GOALS[goal], *(_goal_cell(r) for r in got),
                         " / ".join(f">= {t:.2f}x" for t in sorted(target)) or "-",
                         ", ".join(sorted({stamp(r) for r in got if r})), link(first)])
    head = ["machine", "goal", "wide bf16", "wide fp32", "small bf16", "small fp32", "target (bold: met)", "measured",
            ""]
    intro = ("Every 2-rank layout against one process with 1 thread and against the machine's own limit, the "
             "*ceiling*: two single processes started together, each on its own core (their summed tokens/s is the "
             "most a 2-rank layout can reach there). Ratios of tokens/s taken side by side in one run; a range is "
             "the rounds of one run. Targets: hybrid_2 >= 0.90 of the ceiling, data_2 >= 0.85, hybrid_2 >= 1.2x "
             "data_2 at the wide model.")
    ranks, rank_rows = rank_cpu(records)
    return [intro, "", *table(head, rows), "", *rank_rows], goals + ranks


def rank_cpu(records: list[dict]) -> tuple[list[dict], list[str]]:
    """Each rank's main + autograd CPU ms per step as a fraction of one process's (a rank doing half the work: 0.5)."""
    def setting(r: dict) -> str:  # the environment and overrides it ran with, beside the shipped JSONs
        return " ".join([*r["settings"].get("environment", []), *r["settings"].get("extra", [])]) or "-"

    shown = by_machine(latest([r for r in records if r["table"] == "rank cpu"],
                              lambda r: (r["machine"], r["settings"]["layout"], r["settings"]["precision"], setting(r))))
    rows = [[r["machine"], r["settings"]["layout"], r["settings"]["precision"], setting(r),
             number(r["ratios"].get("rank_cpu_of_one_process", r["figures"].get("main_autograd_cpu_ms"))),
             number(r["figures"].get("wall_ms"), 1), stamp(r), link(r)] for r in shown]
    if not rows:
        return [], []
    return shown, ["Each rank's CPU work (main and autograd threads) against one process's, the fixed costs a layout "
                   "cannot divide (target: at most 0.6 for every rank; one process's own row in ms). half_batch_pair, "
                   "measured in the same rounds: two single processes of half the batch each, started together, each "
                   "updating the whole model: the floor of a layout whose every rank holds the whole model; "
                   "half_batch_alone (since 2026-12-07 21:54): one of them alone, the part of that floor that is a "
                   "step's own work, the rest being the two processes sharing the machine:", "",
                   *table(["machine", "layout", "precision", "setting", "CPU of one process: rank 0 / rank 1",
                           "wall ms", "measured", ""], rows)]


def parity(records: list[dict]) -> tuple[list[str], list[dict]]:
    shown = by_machine(latest(records, lambda r: (r["machine"], r["settings"]["what"], r["settings"].get("layouts"))))
    rows = [[r["settings"]["what"], r["settings"].get("layouts"), r["settings"].get("precision"),
             number(r["figures"].get("max_abs_difference")), number(r["figures"].get("tolerance")), r["machine"],
             stamp(r), link(r)] for r in shown]
    intro = ("Do the parallel layouts compute the single-process step? The tests hold it on every run of the suite; "
             "the figures are what they printed.")
    return [intro, "", *table(["what", "layouts", "precision", "largest difference", "tolerance", "machine",
                               "measured", ""], rows)], shown


def peers(records: list[dict]) -> tuple[list[str], list[dict]]:
    runs = [r for r in records if r["table"] == "runs"]
    shown = by_machine(latest(runs, lambda r: (r["machine"], r["settings"]["system"], r["settings"]["precision"],
                                               r["settings"].get("overrides"))))
    rows = [[r["machine"], r["settings"]["system"], r["settings"]["precision"], r["settings"].get("overrides", "-"),
             number(r["figures"].get("pairs_per_s")), number(r["figures"].get("pairs_per_s_by_round")),
             peer_cells(r, [])[1], stamp(r), link(r)] for r in shown]
    intro = ("One rank against OpenNMT-py 3.5.1 on the same model and batches (enja-small, 64 pairs per step, 2 "
             "threads), measured side by side in one run; ours over OpenNMT-py without and with input feeding. The "
             "target: fp32 >= 1.2x OpenNMT-py without input feeding. The pairs/s is the command's median round.")
    transformer_lines, transformers = _transformer_table(records)
    return [intro, "", *table(["machine", "who", "precision", "setting", "pairs/s", "by round",
                               "vs OpenNMT-py, without / with input feeding", "measured", ""], rows), "",
            *transformer_lines], shown + transformers


def _transformer_table(records: list[dict]) -> tuple[list[str], list[dict]]:
    """A Transformer beside ours after the same training wall time (benchmarks.peers.transformer_peer)."""
    shown = by_machine(latest([r for r in records if r["table"] == "transformer"],
                              lambda r: (r["machine"], r["settings"]["system"], r["settings"]["precision"],
                                         r["settings"]["minutes"])))
    rows = [[r["machine"], r["settings"]["system"], r["settings"]["model"], r["settings"]["precision"],
             r["settings"]["threads"], f"{r['settings']['minutes']:g}", r["settings"]["batch"],
             number(r["figures"]["steps"]), number(r["figures"]["test_bleu"], 2), number(r["figures"]["train_s"]),
             number(r["figures"]["decode_s"]), stamp(r), link(r)] for r in shown]
    intro = ("A Transformer (OpenNMT-py 3.5.1: 3+3 layers, d_model 256, in its own virtualenv) beside ours on "
             "enja-small, each trained for the same minutes of wall time on the same CPU and the same 8k BPE pieces, "
             "then test BLEU (500 sentences, beam 5, sacreBLEU 13a); decoding's wall time apart "
             "(`python -m benchmarks.peers.transformer_peer`, whose docstring says how each side is set up and timed):")
    return [intro, "", *(table(["machine", "who", "model", "precision", "threads", "minutes", "batch", "steps",
                                "test BLEU", "train wall s", "decode wall s", "measured", ""], rows) if rows
                         else ["not measured"])], shown


def bleu(records: list[dict]) -> tuple[list[str], list[dict]]:
    shown = by_machine(latest([r for r in records if r["table"] == "scores"],
                              lambda r: (r["machine"], r["settings"]["what"])))
    rows = []
    for r in shown:
        f, s = r["figures"], r["settings"]
        score = number(f["test_bleu"], 2) if "test_bleu" in f else number(f.get("test_bleu_mean"), 2) \
            if "test_bleu_mean" in f else ", ".join(f"{k[5:]} {v:.2f}" for k, v in f.items() if k.startswith("bleu_"))
        rows.append([s["what"], s.get("corpus"), s["tokenize"].split(" (")[0], s.get("steps", "-"), score,
                     number(f.get("test_chrf", f.get("chrf")), 2), r["machine"], stamp(r), link(r)])
    intro = ("What training reaches: sacreBLEU on the test set (beam 5 unless said), with the tokenizer named "
             "(13a for the early enja-small rows, ja-mecab for a Japanese target since).")
    return [intro, "", *table(["what", "data", "tokenizer", "steps", "test BLEU", "chrF", "machine", "measured",
                               ""], rows)], shown


def planner(records: list[dict]) -> tuple[list[str], list[dict]]:
    summaries = by_machine(latest([r for r in records if r["table"] == "validation summary"],
                                  lambda r: (r["machine"], r["settings"].get("rounds", 1),
                                             r["settings"].get("rescored", False))))
    rows = [[r["machine"], number(r["figures"].get("rows_within_10_pct")),
             number(r["figures"].get("rows_within_10_pct_per_step_median")), r["settings"]["rows"],
             r["settings"].get("rounds", 1), "yes" if r["settings"].get("rescored") else "no", stamp(r), link(r)]
            for r in summaries]
    preds = latest([r for r in records if r["table"] == "prediction"],
                   lambda r: (r["machine"], r["settings"]["model"], r["settings"]["scenario"], r["settings"]["link"],
                              r["settings"].get("profile"), r["settings"]["devices"]))
    by_row = defaultdict(dict)
    for r in preds:
        s = r["settings"]
        by_row[(r["machine"], s["model"], s["scenario"], s.get("profile", "estimates"), s["link"], stamp(r),
                link(r))][s["devices"]] = r
    pred_rows = []
    for (machine, model, scenario, profile, link_, when_, journal), cells in by_row.items():
        one = next(iter(cells.values()))["figures"]["one_gpu_step_ms"]
        pred_rows.append([machine, model, scenario, profile, link_, number(one, 1),
                          *(_pick(cells.get(n)) for n in (2, 4, 8)), when_, journal])
    auto_lines, autos = _auto_table(records)
    gpu_lines, gpus = _gpu_validation_table(records)
    intro = ("The layout planner (`launch/plan.py`) against measured steps on this machine kind (32 layouts of "
             "enja-small; a row is within when its predicted step is within 10% of the measured one), and what it "
             "predicts for GPUs: **predictions, not measurements**.")
    return [intro, "", *table(["machine", "rows within 10% (mean step)", "by the per-step median", "rows", "rounds",
                               "rescored", "measured", ""], rows), "",
            "Predicted (the planner's pick on N GPUs, and each mode's best speed-up over one GPU):", "",
            *table(["GPU", "model", "scenario", "profile", "link", "one GPU ms", "2 GPUs", "4 GPUs", "8 GPUs",
                    "predicted", ""], pred_rows), "",
            *auto_lines, "", *gpu_lines], summaries + preds + autos + gpus


def _auto_table(records: list[dict]) -> tuple[list[str], list[dict]]:
    """parallel_layout auto's choice trained against the fastest shipped layout (benchmarks.planner auto-check)."""
    autos = latest([r for r in records if r["table"] == "auto"],
                   lambda r: (r["machine"], r["settings"]["model"], r["settings"]["precision"]))
    rows = [[r["machine"], r["settings"]["model"], r["settings"]["precision"], f"`{r['settings']['chosen']}`" +
             "".join(f" ({name}'s layout)" for name in r["settings"].get("chosen_is", [])),
             number(r["figures"]["auto_step_ms"], 1), r["settings"]["fastest_shipped"],
             number(r["figures"]["fastest_shipped_step_ms"], 1), f"{100 * r['ratios']['auto_slower_by']:+.1f}%",
             r["settings"].get("rounds", 1), stamp(r), link(r)] for r in autos]
    intro = ("`parallel_layout: {\"mode\": \"auto\"}` trained against the fastest shipped 2-rank layout (2 ranks x 1 "
             "thread, measured; the goal: auto within 5%):")
    return [intro, "", *(table(["machine", "model", "precision", "auto chose", "its ms/step", "fastest shipped",
                                "its ms/step", "auto slower by", "rounds", "measured", ""], rows) if rows
                         else ["not measured"])], autos


def _gpu_validation_table(records: list[dict]) -> tuple[list[str], list[dict]]:
    """Every training run of a GPU check predicted by the planner on this CPU, against the check's measured
    steady-state step (benchmarks.planner validate-gpu --record), worst last within each check."""
    rows = latest([r for r in records if r["table"] == "gpu validation"],
                  lambda r: (r["settings"]["check"], r["machine"], r["settings"]["run"]))
    rows.sort(key=lambda r: (r["settings"]["check"], abs(r["ratios"]["error"])))
    cells = [[_check_name(r["settings"]), r["machine"], r["settings"]["run"],
              r["settings"]["math"], r["settings"]["pairs"], r["settings"]["steady_steps"],
              number(r["figures"]["measured_step_ms"], 1), number(r["figures"]["predicted_step_ms"], 1),
              f"{100 * r['ratios']['error']:+.1f}%" + (" **" if abs(r["ratios"]["error"]) > 0.10 else ""),
              r["settings"]["role"], r.get("note", ""), stamp(r), link(r)] for r in rows]
    intro = ("A GPU check's training runs, each predicted by the planner on this CPU from the run's config, data and "
             "batches, against the steady-state ms per step the check measured (`python -m benchmarks.planner "
             "validate-gpu --from DIR --record`; `calibrates`: a run whose timing files set the host prices; ** off "
             "by more than 10%, with what the command names as its cause, and the journal's reading linked):")
    return [intro, "", *(table(["check (measured on)", "GPU", "run", "math", "pairs", "steady steps",
                                "measured ms/step", "predicted ms/step", "error", "role", "why it is off",
                                "predicted", ""], cells)
                         if cells else ["not predicted"])], rows


def _check_name(settings: dict) -> str:
    """A GPU check's directory, and the date its device profile says it measured on where it says one."""
    when = settings["measured_on"]
    return settings["check"] + ("" if when == "not recorded" else f" ({when})")


def _pick(r: dict | None) -> str:
    if r is None:
        return "-"
    q = r["ratios"]
    return (f"{r['figures']['pick']}; hybrid {q.get('hybrid_speedup', 0):.2f}x, data {q.get('data_speedup', 0):.2f}x, "
            f"pipeline {q.get('pipeline_speedup', 0):.2f}x")


def memory(records: list[dict]) -> tuple[list[str], list[dict]]:
    rss = latest([r for r in records if r["table"] == "rss over 30 minutes"],
                 lambda r: (r["machine"], r["settings"]["layout"], r["settings"]["variant"], r["settings"]["rank"]))
    rows = [[r["settings"]["layout"], r["settings"]["variant"], r["settings"]["rank"], r["settings"]["malloc"],
             number(r["figures"].get("at_9_per_10")), number(r["figures"].get("growth_1_per_2_to_9_per_10")),
             number(r["figures"].get("peak_mb")), number(r["figures"].get("steps")), r["machine"], stamp(r), link(r)]
            for r in rss]
    zero = latest([r for r in records if r["table"] == "zero1 optimizer state"],
                  lambda r: (r["machine"], r["settings"]["layout"], r["settings"]["precision"]))
    zrows = [[r["settings"]["layout"], r["settings"]["precision"], number(r["figures"]["optimizer_mib_per_rank"]),
              number(r["figures"]["optimizer_mib_per_rank_zero1"]), ratio(r["ratios"]["zero1_over_without"]),
              r["machine"], stamp(r), link(r)] for r in zero]
    intro = ("Resident memory per rank over 30 minutes of training (six runs at once on a loaded machine: the "
             "variants of a layout compare, not the step times), and the optimizer state ZeRO stage 1 keeps per rank "
             "(bytes of tensors: no machine dependence). GPU peak memory: the next question.")
    return [intro, "", *table(["layout", "variant", "rank", "malloc", "RSS at 9/10 (MB)", "growth, 1/2 to 9/10 (MB)",
                               "peak (MB)", "steps", "machine", "measured", ""], rows), "",
            *table(["layout", "precision", "optimizer MiB per rank", "with ZeRO-1", "ZeRO-1 / without", "machine",
                    "measured", ""], zrows)], rss + zero


def gpu(records: list[dict]) -> tuple[list[str], list[dict]]:
    runs = latest([r for r in records if r["table"] == "runs"], _run_key)
    rows = []
    for r in sorted(runs, key=_order(machines(runs))):
        s, f, q = r["settings"], r["figures"], r["ratios"]
        mfu = f"{100 * q['mfu_datasheet']:.1f}% {q.get('mfu_of_precision', '')}".strip() if "mfu_datasheet" in q else "-"
        rows.append([r["machine"], s["run"], s.get("system", "ours"), s["precision"],
                     s["layout"] + (f" ({s['variant']})" if s.get("variant") else ""), s.get("pairs_per_step"),
                     number(f.get("tokens_per_s")), number(f.get("step_ms"), 1), number(f.get("host_cpu_ms_per_step"), 1),
                     mfu, number(f.get("peak_memory_mib")), stamp(r), link(r)])
    latency = latest([r for r in records if r["table"] == "latency"], lambda r: r["machine"])
    lrows = [[r["machine"], *(number(r["figures"][k], 1) for k in ("op_overhead_us", "sync_us", "lstm_step_us",
                                                                   "lstm_step_bwd_us")), stamp(r)] for r in latency]
    prof = latest([r for r in records if r["table"] == "profiled step"], lambda r: (r["machine"], r["settings"]["run"]))
    prows = [[r["machine"], r["settings"]["run"], r["settings"]["steps"], number(r["figures"].get("wall_ms_per_step"), 1),
              number(r["figures"].get("device_busy_ms_per_step"), 1),
              f"{100 * r['ratios']['device_busy_fraction']:.0f}%" if "device_busy_fraction" in r["ratios"] else "-",
              number(r["figures"].get("kernels_per_step")), number(r["figures"].get("device_syncs_per_step")), stamp(r)]
             for r in prof]
    goals = latest([r for r in records if r["table"] == "goals"], lambda r: (r["machine"], r["settings"]["goal"]))
    grows = [[r["machine"], r["settings"]["goal"], number(r["figures"]["measured"]), number(r["settings"]["target"]),
              r["figures"].get("met", "-"), stamp(r)] for r in goals]
    intro = ("The GPU check's training runs through the real CLI on one GPU (one process): rates over the steps "
             "no metrics row timed (a timed step synchronises the device at every instruction); host CPU is the "
             "main and autograd threads' ms per step; MFU against the datasheet peak of the precision the matrix "
             "work ran in. What paces the step and which settings to start from: [gpu.md](gpu.md).")
    return [intro, "", *table(["machine", "run", "who", "precision", "layout", "pairs per step", "tokens/s",
                               "ms per step", "host CPU ms", "MFU", "peak MiB", "measured", ""], rows), "",
            "Latencies the planner prices (us), measured by the check:", "",
            *table(["machine", "host per launched op", "a device sync", "LSTM time step, forward",
                    "LSTM time step, backward", "measured"], lrows), "",
            "Profiled steps (torch.profiler with the CUDA kernels):", "",
            *table(["machine", "run", "steps", "wall ms", "device busy ms", "device busy", "kernels per step",
                    "device syncs per step", "measured"], prows), "", "The goals of the device-paced issue:", "",
            *table(["machine", "goal", "measured", "target", "met", "measured"], grows)], runs + latency + prof + goals


def data(records: list[dict]) -> tuple[list[str], list[dict]]:
    shown = latest([r for r in records if r["table"] == "prepare at scale"],
                   lambda r: (r["machine"], r["settings"]["corpus"], r["settings"]["pairs"], r["settings"]["workers"]))
    rows = [[r["settings"]["corpus"], number(r["settings"]["pairs"]), r["settings"]["workers"],
             number(r["figures"]["pairs_per_s"]), number(r["figures"]["wall_s"], 1), number(r["figures"]["cpu_s"]),
             number(r["figures"]["peak_pss_tree_mb"]), number(r["figures"]["peak_rss_largest_process_mb"]),
             r["machine"], stamp(r), link(r)] for r in shown]
    shapes = by_machine(latest([r for r in records if r["table"] == "shapes"],
                               lambda r: (r["machine"], r["settings"]["data"], r["settings"]["length_multiple"])))
    srows = [[r["settings"]["data"], r["settings"].get("pairs_per_step", "-"), r["settings"]["length_multiple"],
              number(r["figures"].get("batch_shapes")), number(r["figures"].get("step_shapes")),
              number(r["figures"].get("padded_positions_pct")), stamp(r), link(r)] for r in shapes]
    intro = ("`prepare` on millions of pairs (read, clean, deduplicate, SentencePiece, binarize): targets >= 20k "
             "pairs/s on 2 cores, peak memory < 2 GB and within 10% from 1M to 2M pairs.")
    return [intro, "", *table(["corpus", "pairs", "workers", "pairs/s", "wall s", "CPU s", "peak PSS, tree (MB)",
                               "largest process RSS (MB)", "machine", "measured", ""], rows), "",
            "The trainer's batch shapes over 1,000 steps, by `data.length_multiple` (counts):", "",
            *table(["data", "pairs per step", "widths padded to a multiple of", "batch shapes", "step shapes",
                    "padded positions %", "measured", ""], srows)], shown + shapes


def syncs(records: list[dict]) -> tuple[list[str], list[dict]]:
    shown = latest(records, lambda r: (r["machine"], r["settings"]["size"], r["settings"]["layout"],
                                       r["settings"]["precision"]))
    rows = [[r["settings"]["size"], r["settings"]["layout"], r["settings"]["precision"],
             *(number(r["figures"].get(k)) for k in ("syncs_per_step_before", "syncs_per_step", "launches_per_step_before",
                                                     "launches_per_step_cpu_chunk", "launches_per_step_accelerator_chunk")),
             r["machine"], stamp(r), link(r)] for r in shown]
    intro = ("Device syncs and launched operators per optimizer step, counted on a CPU by the operators a GPU would "
             "run (trainer/observe/op_counter.py); per rank where several. Counts, not timings.")
    return [intro, "", *table(["size", "layout", "precision", "syncs before", "syncs", "launches before",
                               "launches (CPU loss chunk)", "launches (accelerator chunk)", "machine", "measured", ""],
                              rows)], shown


SECTIONS = {"parity": parity, "scaling": scaling, "peers": peers, "bleu": bleu, "planner": planner,
            "memory": memory, "gpu": gpu, "data": data, "syncs": syncs}


def render(records: list[dict] | None = None) -> str:
    """The whole page from the records (all of benchmarks/results/*.jsonl by default)."""
    records = read() if records is None else records
    every = machines(records)
    out = ["# Benchmarks: how fast, on what, against what", "", NAV, "",
           f"*Generated by `python -m benchmarks.results render` from the {len(records)} records in "
           "`benchmarks/results/*.jsonl` (one per measurement, each with its command, commit, machine and date); "
           "edit the records or the renderer, never this page: `tests/test_results.py` fails when the two disagree. "
           "Why a figure is what it is: the [journal](journal/README.md), linked from each row.*", "",
           *how_fast(records)]
    for question, title in QUESTIONS.items():
        mine = [r for r in records if r["question"] == question]
        lines, shown = SECTIONS[question](mine)
        anchor = OLD_ANCHORS.get(question)
        out += [*([f'<a id="{anchor}"></a>', ""] if anchor else []), f"## {title}", "", *lines,
                *commands(shown), *not_measured(mine, every), ""]
    return "\n".join(out).rstrip("\n") + "\n"
