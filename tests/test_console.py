"""What a training process prints outside a terminal: one compact line per logged step, none of
DeepSpeed's start-up noise unless logging.verbose=true."""
from __future__ import annotations

import re
import sys

import pytest

from tests.conftest import run_cli
from trainer.observe.logger import compact_line

NOISE = ("Using topology", "SEED_LAYERS", "Attempting to get learning rate", "built successfully",
         "Setting accelerator to CPU", "stage=0 layers=")


def test_compact_line_has_the_numbers_a_log_needs():
    row = {"step": 50, "loss": 4.25, "ppl": 61.7, "lr": 0.002, "tokens_per_s": 12345.6}
    line = compact_line(row, total_steps=200, elapsed=100.0, start_step=0)
    assert line == "step 50/200  loss 4.2500  ppl 61.70  lr 2.00e-03  12,346 tok/s  elapsed 1m40s  ETA 5m00s"
    assert compact_line(row, 200, 100.0, start_step=40).endswith("ETA 25m00s")  # a resumed run counts its own pace
    # the first step builds and warms everything up: no ETA from it, then the pace after it (issue 30: 'ETA 4h09m')
    first = {**row, "step": 1}
    assert compact_line(first, 200, 30.0, 0, pace=None).endswith("elapsed 0m30s  ETA -")
    assert compact_line(row, 200, 79.0, 0, pace=(30.0, 1)).endswith("elapsed 1m19s  ETA 2m30s")  # 1 s a step, 150 left


def test_the_logger_shows_no_eta_until_the_first_step_is_done(tmp_path, capsys, monkeypatch):
    from types import SimpleNamespace

    from trainer.config import load_config
    from trainer.observe import logger
    from trainer.observe.logger import RunLogger

    clock = iter([0.0, 600.0, 610.0, 620.0])  # the logger's start; a 600 s first step, then 10 s a step
    monkeypatch.setattr(logger, "time", SimpleNamespace(perf_counter=lambda: next(clock)))
    cfg = load_config(None, ["logging.wandb_mode=disabled", "logging.progress=false", "train.log_every=1"])
    log = RunLogger(str(tmp_path), cfg, total_steps=100)
    for step in (1, 2, 3):
        log.log({"step": step, "loss": 4.0, "ppl": 54.6, "lr": 1e-3, "tokens_per_s": 1000.0})
    log.close()
    lines = capsys.readouterr().out.splitlines()
    assert [line.split("ETA ")[1] for line in lines] == ["-", "16m20s", "16m10s"]  # not 600 s x 99 steps = 16h30m


@pytest.mark.slow
def test_a_log_file_tells_the_story_and_deepspeed_stays_quiet(tiny_data, tmp_path):
    base = [sys.executable, "launch/train.py", "--deepspeed_config", "ds_configs/single.json",
            f"data.dir={tiny_data}", "model.emb_dim=16", "model.hidden=16", "train.max_steps=10",
            "train.eval_every=10", "train.log_every=5", "logging.wandb_mode=disabled", "logging.progress=true",
            "decode.dev_max_sentences=8"]
    out = run_cli([*base, f"run.dir={tmp_path / 'quiet'}"], timeout=300)
    text = out.stdout + out.stderr
    lines = [m.group(1) for m in re.finditer(r"^step (\d+)/10  loss \S+  ppl \S+  lr \S+  \S+ tok/s  elapsed \S+  ETA \S+$",
                                             out.stdout, re.M)]
    assert lines == ["1", "5", "10"], out.stdout
    assert not [n for n in NOISE if n in text], text
    first = next(line for line in out.stdout.splitlines() if line.startswith("step 1/10 "))
    assert first.endswith("ETA -")  # no ETA from the warm-up step (issue 30)
    decode = out.stdout.index("dev BLEU: decoding 8 dev sentences (beam 1) with ")  # said before the silent part
    assert decode < out.stdout.index("step 10: dev loss")
    loud = run_cli([*base, f"run.dir={tmp_path / 'loud'}", "logging.verbose=true"], timeout=300)
    assert "SEED_LAYERS" in loud.stdout + loud.stderr  # everything comes back


@pytest.mark.slow
def test_a_refusal_under_the_readmes_training_command_is_our_line_and_the_launchers_exit_code(tmp_path):
    """On a machine without a GPU, the docs' command (docs/training.md: DS_ACCELERATOR=cpu, --log_level error)
    prints none of the launcher's start-up lines (Setting CUDA_VISIBLE_DEVICES=0,1, the world info, the command):
    a refusal is our one line per rank and the launcher's exit-code line; --log_level critical leaves only ours."""
    from tests.conftest import REPO, deepspeed_cmd

    readme = (REPO / "docs" / "training.md").read_text(encoding="utf-8")  # once the README's training commands
    assert "export DS_ACCELERATOR=cpu" in readme and "deepspeed --log_level error --num_gpus 2 launch/train.py" in readme
    for level in ("error", "critical"):
        cmd = deepspeed_cmd(2, "launch/train.py", "--deepspeed_config", "ds_configs/hybrid_2.json", "model.nope=1")
        cmd[cmd.index("--num_gpus"):cmd.index("--num_gpus")] = ["--log_level", level]
        r = run_cli(cmd, check=False, timeout=300, env_extra={"DS_ACCELERATOR": "cpu"})
        lines = (r.stdout + r.stderr).strip().splitlines()
        ours = [line for line in lines if line.startswith("error: command-line override: bad config key 'model.nope'")]
        # the launcher kills the other rank when the first refuses; if that rank had not refused yet it says so
        killed = [line for line in lines if re.fullmatch(r"rank [01]: stopped by SIGTERM before training started", line)]
        assert r.returncode == 2 and 1 <= len(ours) and len(ours) + len(killed) <= 2, lines
        rest = [line for line in lines if line not in ours and line not in killed]
        if level == "error":
            assert len(rest) == 1 and "[ERROR]" in rest[0] and rest[0].endswith("exits with return code = 2"), rest
        else:
            assert rest == [], rest
