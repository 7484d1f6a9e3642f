"""What a training process prints outside a terminal: one compact line per logged step, none of
DeepSpeed's start-up noise unless logging.verbose=true."""
from __future__ import annotations

import re
import sys

import pytest

from tests.conftest import REPO, run_cli
from trainer.config import merge_overrides
from trainer.observe.logger import compact_line

NOISE = ("Using topology", "SEED_LAYERS", "Attempting to get learning rate", "built successfully",
         "Setting accelerator to CPU", "stage=0 layers=")


def test_compact_line_has_the_numbers_a_log_needs():
    row = {"step": 50, "epoch": 0, "epoch_progress": 0.379, "loss": 4.25, "ppl": 61.7, "lr": 0.002,
           "tokens_per_s": 12345.6, "skipped_steps": 0}
    line = compact_line(row, total_steps=200, elapsed=100.0, eta="5m00s")
    assert line == ("step 50/200  epoch 1 (37%)  loss 4.2500  ppl 61.70  lr 2.00e-03  12,346 tok/s  elapsed 1m40s  "
                    "ETA 5m00s")  # epochs counted from 1 on the console, the percentage rounded down
    assert compact_line(row, 200, 30.0).endswith("elapsed 0m30s  ETA -")
    # fp16: the loss scale after the step, and the skipped steps once there are any (any precision)
    fp16 = {**row, "loss_scale": 32768.0, "skipped_steps": 2}
    assert "lr 2.00e-03  loss scale 32768  skipped 2  12,346 tok/s" in compact_line(fp16, 200, 100.0)
    assert "skipped 3  12,346" in compact_line({**row, "skipped_steps": 3}, 200, 100.0)
    assert "loss scale" not in line and "skipped" not in line  # bf16/fp32 rows carry no scale; none skipped
    assert "epoch 1 (100%)" in compact_line({**row, "epoch_progress": 1.0}, 200, 100.0)
    assert "epoch 1 (99%)" in compact_line({**row, "epoch_progress": 0.9999}, 200, 100.0)  # not done: not 100%


def test_the_eta_counts_steps_after_the_first_and_the_validations_left(monkeypatch):
    from trainer.observe import eta as eta_module
    from trainer.observe.eta import Eta

    # the first step builds and warms everything up: no ETA from it, then the pace after it (issue 30: 'ETA 4h09m')
    eta = Eta(200)
    assert eta.after({"step": 1}, 30.0) == "-"
    assert eta.after({"step": 50}, 79.0) == "2m30s"  # 1 s a step, 150 left; no dev set: no validation
    resumed = Eta(200)  # a resumed run counts its own pace, from its first row
    assert resumed.after({"step": 41}, 5.0) == "-" and resumed.after({"step": 50}, 14.0) == "2m30s"
    # every eval_every steps and at the last step (200 is not a multiple of 60: 60, 120, 180 and 200)
    dev = Eta(200, eval_every=60, dev_sentences=100)
    assert [dev.validations_left(s) for s in (0, 59, 60, 180, 199, 200)] == [4, 4, 3, 1, 1, 0]
    assert Eta(200, eval_every=50, dev_sentences=100).validations_left(150) == 1  # only 200's
    assert Eta(200, eval_every=50).validations_left(10) == 0  # no dev set
    # before the first validation: estimated from the dev set's size: 100 sentences x 0.01 s a training pair x 4
    monkeypatch.setattr(eta_module, "VALIDATION_PER_PAIR", 4.0)
    assert dev.after({"step": 1, "sentences_seen": 100}, 30.0) == "-"
    assert dev.after({"step": 11, "sentences_seen": 1100}, 40.0) == "3m25s (with 4 validations: 0m16s estimated)"
    assert Eta(200, 60, 100).after({"step": 11}, 40.0) == "-"  # (its first row)
    # after one: its own seconds, taken out of the pace (still 1 s a step), no longer estimated
    assert dev.after({"step": 60, "sentences_seen": 6000, "validation_s": 25.0}, 114.0) == (
        "3m35s (with 3 validations: 1m15s)")  # 140 steps x 1 s + 3 x 25 s
    assert dev.after({"step": 200, "sentences_seen": 20000, "validation_s": 20.0}, 299.0) == "0m00s"


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
    # with a dev set (one validation left, at step 100): estimated from its 50 sentences, then its own 20 s
    monkeypatch.setattr("trainer.observe.eta.VALIDATION_PER_PAIR", 4.0)
    clock = iter([0.0, 600.0, 610.0, 640.0])
    log = RunLogger(str(tmp_path), cfg, total_steps=100, dev_sentences=50)
    for step, extra in ((1, {}), (2, {}), (3, {"validation_s": 20.0})):
        log.log({"step": step, "loss": 4.0, "ppl": 54.6, "lr": 1e-3, "tokens_per_s": 1000.0,
                 "sentences_seen": 64 * step, **extra})
    log.close()
    lines = capsys.readouterr().out.splitlines()
    assert [line.split("ETA ")[1] for line in lines] == [  # 50 x 10/64 s a pair x 4 = 31 s
        "-", "16m51s (with 1 validation: 0m31s estimated)", "16m30s (with 1 validation: 0m20s)"]


@pytest.mark.slow
def test_a_log_file_tells_the_story_and_deepspeed_stays_quiet(tiny_data, tmp_path):
    base = [sys.executable, "launch/train.py", "--deepspeed_config", "ds_configs/single.json",
            f"data.dir={tiny_data}", "model.emb_dim=16", "model.hidden=16", "train.max_steps=10",
            "train.eval_every=10", "train.log_every=5", "logging.wandb_mode=disabled", "logging.progress=true",
            "decode.dev_max_sentences=8"]
    out = run_cli([*base, f"run.dir={tmp_path / 'quiet'}"], timeout=300)
    text = out.stdout + out.stderr
    lines = [m.group(1) for m in re.finditer(r"^step (\d+)/10  epoch \d \(\d+%\)  loss \S+  ppl \S+  lr \S+  \S+ tok/s  "
                                             r"elapsed \S+  ETA .+$", out.stdout, re.M)]
    assert lines == ["1", "5", "10"], out.stdout
    assert "loss scale" not in out.stdout  # bf16: nothing is scaled
    assert re.search(r"^step 5/10 .*  ETA \S+ \(with 1 validation: \S+ estimated\)$", out.stdout, re.M), out.stdout
    assert not [n for n in NOISE if n in text], text
    first = next(line for line in out.stdout.splitlines() if line.startswith("step 1/10 "))
    assert first.endswith("ETA -")  # no ETA from the warm-up step (issue 30)
    decode = out.stdout.index("dev BLEU: decoding 8 dev sentences (beam 1) with ")  # said before the silent part
    assert decode < out.stdout.index("step 10: dev loss")
    loud = run_cli(merge_overrides(base, [f"run.dir={tmp_path / 'loud'}", "logging.verbose=true",
                                          "train.max_steps=1"]), timeout=300)  # (what is said at the start)
    assert "SEED_LAYERS" in loud.stdout + loud.stderr  # everything comes back


@pytest.mark.slow
def test_fp16s_loss_scale_and_skipped_steps_reach_the_console_the_metrics_and_wandb(tiny_data, tmp_path):
    """Issue 42: they were in train_state.json alone. A non-finite step 3 (HNMT_FAULTS) halves the scale and is
    skipped; the run ends inside its first epoch, and its last line says so."""
    import json

    from tests.wandb_records import summary

    ds = json.loads((REPO / "ds_configs" / "single.json").read_text())
    ds.update(bf16={"enabled": False}, fp16={"enabled": True, "initial_scale_power": 10, "loss_scale_window": 100})
    (tmp_path / "fp16.json").write_text(json.dumps(ds))
    run, temp = tmp_path / "run", tmp_path / "tmp"
    temp.mkdir()
    out = run_cli([sys.executable, "launch/train.py", "--deepspeed_config", tmp_path / "fp16.json",
                   f"data.dir={tiny_data}", "model.emb_dim=16", "model.hidden=16", "train.max_steps=6",
                   "train.eval_every=4", "train.log_every=2", "logging.wandb_mode=offline", "logging.progress=false",
                   "decode.dev_max_sentences=8", f"run.dir={run}"],
                  timeout=300, env_extra={"HNMT_FAULTS": "nan@3", "WANDB_MODE": "offline", "TMPDIR": str(temp)}).stdout
    # the process leaves by os._exit (trainer.training.cli.leave): the temporary directories wandb made when
    # imported are removed there, as interpreter exit would have (every run had left two in /tmp)
    assert not [p.name for p in temp.iterdir() if p.name.endswith(("wandb-media", "wandb-artifacts"))]
    scales = dict(re.findall(r"^step (\d+)/6  epoch 1 \(\d+%\)  .*  loss scale (\d+)(?:  skipped 1)?  ", out, re.M))
    assert scales == {"1": "1024", "2": "1024", "4": "512", "6": "512"}, out
    assert re.search(r"^step 4/6 .*loss scale 512  skipped 1  ", out, re.M) and "skipped 1" not in out.split("step 3:")[0]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    by_step = {r["step"]: r for r in rows}
    assert [by_step[s]["loss_scale"] for s in (2, 3, 4)] == [1024.0, 512.0, 512.0]
    assert [by_step[s]["skipped_steps"] for s in (2, 3, 6)] == [0, 1, 1]
    assert all(r["epoch"] == 0 and 0 < r["epoch_progress"] < 1 for r in rows)  # 6 x 64 of 600 pairs
    assert [r["step"] for r in rows if r.get("validation_s", 0) > 0] == [4, 6]
    done = out.strip().splitlines()[-2]  # (the last: wandb's sync command)
    assert done.startswith("done: step 6, ") and "data: no epoch finished (epoch 1 at 64% of its 600" in done, done
    [records] = (run / "wandb").glob("offline-run-*/run-*.wandb")
    logged = {int(h["_step"]): h for h in summary(str(records))["history"] if "loss" in h}
    assert logged[3]["loss_scale"] == "512" and logged[3]["skipped_steps"] == "1" and "epoch_progress" in logged[3]
    assert "validation_s" in logged[4]


@pytest.mark.slow
def test_a_refusal_under_the_readmes_training_command_is_our_line_and_the_launchers_exit_code(tmp_path):
    """On a machine without a GPU, the docs' command (docs/training.md: DS_ACCELERATOR=cpu, --log_level error)
    prints none of the launcher's start-up lines (Setting CUDA_VISIBLE_DEVICES=0,1, the world info, the command):
    a refusal is our one line per rank and the launcher's exit-code line; --log_level critical leaves only ours."""
    from tests.conftest import deepspeed_cmd

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


# ---- where the data stream is: the console's epoch, the metrics' epoch_progress, the final line ----
class _Lengths:
    """A corpus of `n` pairs of random lengths (what BatchStream reads of ParallelData)."""

    def __init__(self, n: int):
        import numpy as np

        rng = np.random.default_rng(0)
        self.src_len, self.tgt_len = rng.integers(1, 30, n), rng.integers(1, 30, n)
        self.data_dir, self.split = "mem", "train"

    def __len__(self) -> int:
        return len(self.src_len)


STREAM = dict(max_sentences=8, max_tokens=0, seed=3, bucket_batches=4, min_batch=6)


def test_the_stream_says_how_far_through_the_corpus_its_batches_reach():
    from trainer.data import BatchStream, make_batches

    stream = BatchStream(_Lengths(101), **STREAM)
    batches, left = make_batches(stream.data.src_len, stream.data.tgt_len, epoch=0, **STREAM)
    assert left > 0 and stream.position().fraction == 0.0 and stream.position().epochs_done == 0
    seen = 0
    for _ in batches:
        assert stream.position().epochs_done == 0
        seen += len(stream.next_indices())
        where = stream.position()
        assert (where.epoch, where.pairs, where.total) == (0, seen, 101 - left)
    assert where.fraction == 1.0 and where.epochs_done == 1 and where.describe() == "epoch 1 (100%)"
    stream.next_indices()  # the second epoch's first batch
    assert stream.position().epoch == 1 and stream.position().epochs_done == 1
    assert stream.left_out_of(0) == left
    fresh = BatchStream(_Lengths(101), **STREAM)  # a resumed stream never made epoch 0's batches: made again
    fresh.load_state_dict(stream.state_dict())
    assert fresh.left_out_of(0) == left and fresh.position() == stream.position()


def test_the_prefetcher_reports_the_consumers_position_not_the_threads():
    from trainer.data import BatchStream, Prefetcher

    class Pairs(_Lengths):
        def batch(self, indices):
            return list(indices)

    plain, ahead = BatchStream(Pairs(101), **STREAM), Prefetcher(BatchStream(Pairs(101), **STREAM), ahead=4)
    assert ahead.position() == plain.position()
    for _ in range(20):  # across an epoch boundary, the thread up to four batches ahead
        plain.next()
        ahead.next()
        assert ahead.position() == plain.position()
    restored = Prefetcher(BatchStream(Pairs(101), **STREAM), ahead=2)
    restored.load_state_dict(ahead.state_dict())
    assert restored.position() == plain.position() and restored.left_out_of(0) == plain.left_out_of(0)
    ahead.close()
    restored.close()


def test_the_epoch_limit_stops_at_the_step_that_finishes_the_epoch():
    """train.max_epochs=1 stops after the step that hands out epoch 1's last batch (it stopped one step into the
    second epoch), and the final line says so."""
    from types import SimpleNamespace

    from trainer.data import BatchStream
    from trainer.training.loop import data_summary, stop_summary
    from trainer.training.stopping import StopCheck

    rt = SimpleNamespace(all_reduce=lambda t, op: t, rank=0)
    cfg = SimpleNamespace(max_time_min=0, max_epochs=1, max_steps=1000, early_stop_patience=0)
    stream = BatchStream(_Lengths(101), **STREAM)
    check = StopCheck(runtime=rt, train_cfg=cfg, state=SimpleNamespace(step=0), stream=stream,
                      log=SimpleNamespace(failed=None))
    steps = 0
    while True:
        stream.next_indices()
        steps += 1
        if check.after_step():
            break
    assert stream.position().fraction == 1.0 and stream.position().epoch == 0 and steps == stream.index
    assert stop_summary("epochs", steps, cfg) == "; ended before train.max_steps=1000: train.max_epochs=1 reached"
    assert stop_summary("epochs", 1000, cfg) == stop_summary(None, 5, cfg) == ""  # max_steps reached anyway
    assert stop_summary("signal", 5, cfg, "SIGTERM") == "; ended before train.max_steps=1000: stopped by SIGTERM"
    left = stream.left_out_of(0)
    assert data_summary(stream) == (f"data: 1 epoch finished; epoch 1 left out {left} pairs (fewer than "
                                    f"data.min_batch_sentences remained after its last batch)")


def test_the_final_line_says_no_epoch_finished_when_none_did():
    """Issue 42: 'pairs left out of the last epoch: 5' ended a run that had finished no epoch."""
    from trainer.data import BatchStream
    from trainer.training.loop import data_summary

    stream = BatchStream(_Lengths(101), **STREAM)
    for _ in range(3):
        stream.next_indices()
    where = stream.position()
    assert data_summary(stream) == (f"data: no epoch finished (epoch 1 at {where.percent}% of its {where.total} "
                                    f"training pairs)")
    while stream.position().epochs_done < 2:
        stream.next_indices()
    stream.next_indices()
    assert data_summary(stream).startswith(f"data: 2 epochs finished, epoch 3 at {stream.position().percent}% of its ")
    assert data_summary(stream).endswith(f"; epoch 2 left out {stream.left_out_of(1)} pairs (fewer than "
                                         f"data.min_batch_sentences remained after its last batch)")
