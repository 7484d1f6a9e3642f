"""The real path, tested: a few training steps on raw Japanese (the demo corpus writes it without spaces, as
patents are), then the translation surface a practitioner uses: pipes, n-best, alignments, formulas, empty
lines, evaluate with the language's tokenizer, forced-decoding scores, checkpoint averaging, ensembles."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO, launch_main, read_metrics, run_cli

CHEM = "<chem>SiO<sub>2</sub></chem>"


@pytest.fixture(scope="module")
def raw_run(tiny_data, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("raw_run")
    assert " " not in (tiny_data / "dev.tgt.txt").read_text(encoding="utf-8")  # raw Japanese references
    ds = json.loads((REPO / "ds_configs" / "single.json").read_text())
    ds["scheduler"]["params"].update(warmup_num_steps=5, warmup_max_lr=0.005)
    (tmp / "ds.json").write_text(json.dumps(ds))
    run_dir = tmp / "run"
    run_cli([sys.executable, "launch/train.py", "--deepspeed_config", tmp / "ds.json", f"data.dir={tiny_data}",
             f"run.dir={run_dir}", "model.emb_dim=32", "model.hidden=64", "train.max_steps=80",
             "train.eval_every=20", "train.log_every=10", "train.keep_last=4", "train.threads=1",
             "decode.dev_max_sentences=40", "logging.wandb_mode=disabled", "logging.progress=false",
             # an 80-step model rarely says </s>: without a cap every hypothesis runs to 2 x source + 10 pieces, and
             # the decoding of this file's tests (plumbing, not quality) was most of its time
             "decode.max_len_ratio=1.2", "decode.max_len_add=4"], timeout=600)
    return run_dir


@pytest.mark.slow
def test_dev_bleu_moves_with_the_japanese_tokenizer(raw_run):
    dev = [r for r in read_metrics(raw_run) if "dev_bleu" in r]
    assert [r["step"] for r in dev] == [20, 40, 60, 80]
    bleu = [r["dev_bleu"] for r in dev]
    assert len(set(bleu)) > 1 and all(0 <= b <= 100 for b in bleu), bleu  # 13a would give ~0 throughout
    assert all(r["dev_chrf"] > 0 for r in dev)
    best = (raw_run / "checkpoints" / "best").read_text().strip()
    best_step = int(best.split("_")[-1])
    assert best_step > 20 and bleu[[r["step"] for r in dev].index(best_step)] == max(bleu)  # best moved on


def piped(args: list, stdin: str, check: bool = True, timeout: int = 300) -> subprocess.CompletedProcess:
    """run_cli with `stdin` written to the command's standard input (a pipe, not a terminal)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", WANDB_MODE="disabled", PYTHONPATH=str(REPO))
    try:
        proc = subprocess.run([str(a) for a in args], cwd=REPO, env=env, input=stdin, capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"timed out after {timeout}s: {' '.join(map(str, args))}")
    if check and proc.returncode != 0:
        pytest.fail(f"exit {proc.returncode}: {' '.join(map(str, args))}\n{proc.stderr[-4000:]}")
    return proc


def translate(run_dir, *args, stdin: str):
    return piped([sys.executable, "launch/translate.py", "--run", run_dir, *args], stdin)


@pytest.mark.slow
def test_translate_pipes_streams_and_keeps_formulas_and_empty_lines(raw_run, tiny_data, capsys):
    src = (tiny_data / "test.src.txt").read_text(encoding="utf-8").splitlines()[:6]
    lines = [src[0], "", f"the layer is made of {CHEM} and the sensor is coupled to the housing .", *src[1:]]
    proc = translate(raw_run, "--beam", "2", "--buffer-size", "3", stdin="\n".join(lines) + "\n")
    out = proc.stdout.split("\n")
    assert out[-1] == "" and len(out) - 1 == len(lines)  # one line per input line, streamed in chunks of 3
    assert out[1] == "" and out[0] and out[3]
    assert out[2].count(CHEM) == 1 and "⟨formula⟩" not in out[2]
    assert "sentences/s" in proc.stderr and "tokens/s" in proc.stderr
    assert "100%" not in proc.stderr  # no progress bar when stderr is not a terminal
    # n-best with scores, and alignments, in the documented TSV format
    proc = translate(raw_run, "--beam", "3", "--n-best", "3", "--alignments", "--input", "-", "--output", "-",
                     stdin="\n".join(src[:2]) + "\n")
    rows = [line.split("\t") for line in proc.stdout.splitlines()]
    assert [r[0] for r in rows] == ["0", "0", "0", "1", "1", "1"] and all(len(r) == 4 for r in rows)
    for k in (0, 3):
        scores = [float(r[1]) for r in rows[k:k + 3]]
        assert scores == sorted(scores, reverse=True) and all(s < 0 for s in scores)
    for r in rows:
        links = [tuple(map(int, pair.split("-"))) for pair in r[3].split()]
        assert [t for _, t in links] == list(range(len(links))) and all(s >= 0 for s, _ in links)
    code, _, err = launch_main("translate", ["--run", raw_run, "--n-best", "4", "--beam", "2"], capsys)  # in-process
    assert code == 2 and err.strip().startswith("error: --n-best 4") and "Traceback" not in err


@pytest.mark.slow
def test_evaluate_score_average_and_ensemble(raw_run, tiny_data, tmp_path, capsys):
    src, ref = tiny_data / "test.src.txt", tiny_data / "test.tgt.txt"
    n = len(src.read_text(encoding="utf-8").splitlines())
    flags = ["--src", src, "--ref", ref, "--json", "--beam", "1"]
    auto = json.loads(run_cli([sys.executable, "launch/evaluate.py", *flags, "--run", raw_run]).stdout.splitlines()[-1])
    assert "tok:ja-mecab" in auto["signature"] and auto["tokenize"] == "ja-mecab"
    code, out, _ = launch_main("evaluate", [*flags, "--run", raw_run, "--tokenize", "13a", "--max-len-ratio", "1.5",
                                            "--length-penalty", "0.6"], capsys)  # the same entry point, in-process
    assert code == 0
    forced = json.loads(out.splitlines()[-1])
    assert "tok:13a" in forced["signature"] and forced["sentences"] == n
    scored = run_cli([sys.executable, "launch/score.py", "--run", raw_run, "--src", src, "--ref", ref]).stdout
    rows = [line.split("\t") for line in scored.splitlines()]
    assert len(rows) == n and all(float(r[0]) < 0 and int(r[1]) > 1 for r in rows)
    assert all(abs(float(r[0]) / int(r[1]) - float(r[2])) < 1e-3 for r in rows)
    model = tmp_path / "avg.pt"
    out = run_cli([sys.executable, "launch/average.py", "--run", raw_run, "--last", "2", "--out", model]).stdout
    assert "step_00000060, step_00000080" in out and model.exists()
    for models in (["--model", model], ["--run", raw_run, "--checkpoint", "best", "--checkpoint", "last"]):
        # in-process: translate's real process is tested above (pipes, n-best) and below (its terminal)
        code, _, err = launch_main("translate", [*models, "--input", src, "--output", tmp_path / "o.txt",
                                                 "--beam", "2"], capsys)
        assert code == 0 and len((tmp_path / "o.txt").read_text(encoding="utf-8").splitlines()) == n, err
    code, _, err = launch_main("average", ["--run", raw_run, "--last", "9", "--out", model], capsys)  # in-process
    assert code == 2 and "train.keep_last >= 9" in err


@pytest.mark.slow
def test_translate_shows_a_progress_bar_on_a_terminal(raw_run, tiny_data, tmp_path):
    import fcntl
    import pty
    import struct
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # a terminal of 100 columns
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=str(REPO))
    proc = subprocess.Popen([sys.executable, "launch/translate.py", "--run", str(raw_run), "--input",
                             str(tiny_data / "test.src.txt"), "--output", str(tmp_path / "out.txt"), "--beam", "1"],
                            cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=slave)
    os.close(slave)
    seen = b""
    while True:
        try:
            data = os.read(master, 4096)
        except OSError:  # the child closed the terminal
            break
        if not data:
            break
        seen += data
    assert proc.wait(timeout=300) == 0
    os.close(master)
    text = seen.decode("utf-8", "replace")
    n = len((tiny_data / "test.src.txt").read_text(encoding="utf-8").splitlines())
    assert "100%" in text and f"{n}/{n}" in text and "sent" in text, text[-2000:]
    assert "sentences/s" in text
