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
    loud = run_cli([*base, f"run.dir={tmp_path / 'loud'}", "logging.verbose=true"], timeout=300)
    assert "SEED_LAYERS" in loud.stdout + loud.stderr  # everything comes back
