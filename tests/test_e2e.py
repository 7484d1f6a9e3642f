"""A tiny end-to-end run through the real CLIs: demo corpus -> prepare -> 2-rank hybrid training
(loss drops) -> translate on one process -> evaluate --json."""
from __future__ import annotations

import gzip
import json
import os
import sys

import pytest

from tests.conftest import REPO, deepspeed_cmd, launch_main, read_metrics, run_cli

pytestmark = pytest.mark.slow  # real CLIs as processes; the fast tier is `pytest -m "not slow" tests`


def bf16_lstm_op() -> str:
    """The operator a bf16 LSTM layer runs as on this CPU: oneDNN's where PyTorch runs bf16 in oneDNN (AVX-512,
    AMX), PyTorch's own LSTM elsewhere (an AVX2-only AMD EPYC, where torch.ops.mkldnn._is_mkldnn_bf16_supported()
    is false: no aten::mkldnn_rnn_layer at all)."""
    import torch

    return "aten::mkldnn_rnn_layer" if torch.ops.mkldnn._is_mkldnn_bf16_supported() else "aten::lstm"


def test_hybrid_training_then_single_process_translation(tiny_data, tmp_path, capsys):
    run_dir = tmp_path / "run"
    ds = json.loads((REPO / "ds_configs" / "hybrid_2.json").read_text())
    ds["scheduler"]["params"].update(warmup_num_steps=5, warmup_max_lr=0.003)  # a short run: warm up fast
    (tmp_path / "ds.json").write_text(json.dumps(ds))
    train = run_cli(deepspeed_cmd(2, "launch/train.py", "--deepspeed_config", tmp_path / "ds.json",
                          f"data.dir={tiny_data}", f"run.dir={run_dir}", "model.emb_dim=32", "model.hidden=64",
                          "train.max_steps=40", "train.eval_every=20", "train.log_every=5",
                          "decode.dev_max_sentences=20", "logging.wandb_mode=offline", "logging.progress=false",
                          "train.profile_from=30", "train.profile_steps=3"),
            timeout=400)
    rows = read_metrics(run_dir)
    if len(os.sched_getaffinity(0)) >= 2:  # train.pin_cores=auto: each CPU rank on a core of its own
        assert "cores: this rank's threads on " in train.stdout, train.stdout[-3000:]
    lstm = bf16_lstm_op()  # hybrid_2.json trains in bf16
    for rank in (0, 1):  # what the steps 31-33 of each rank were made of
        prof = json.loads((run_dir / "profile" / f"rank{rank}.json").read_text())
        assert prof["steps"] == [31, 33] and prof["ops"][lstm]["calls"] > 0, sorted(prof["ops"])
        assert ("c10d::send" in prof["ops"] or "c10d::isend" in prof["ops"]) and prof["self_cpu_ms_per_step"] > 0
        trace = json.loads(gzip.decompress((run_dir / "profile" / f"rank{rank}.trace.json.gz").read_bytes()))
        assert any(e.get("name") == lstm for e in trace["traceEvents"])
    losses = [r["loss"] for r in rows]
    assert rows[0]["step"] == 1 and rows[-1]["step"] == 40
    assert losses[-1] < losses[0] - 1.0, losses
    dev = [r for r in rows if "dev_loss" in r]
    assert [r["step"] for r in dev] == [20, 40] and all("dev_bleu" in r for r in dev)
    assert all(r["tokens_per_s"] > 0 and "lr" in r for r in rows)
    ckpts = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert "best" in ckpts and "latest" in ckpts and "step_00000040" in ckpts
    # the hybrid-trained run translates on one process (per-global-layer checkpoint files)
    src = tiny_data / "test.src.txt"
    out = tmp_path / "hyp.txt"
    run_cli([sys.executable, "launch/translate.py", "--run", run_dir, "--checkpoint", "last", "--input", src,
             "--output", out, "--beam", "3"], timeout=300)
    n_in = len(src.read_text(encoding="utf-8").splitlines())
    assert len(out.read_text(encoding="utf-8").split("\n")) - 1 == n_in
    proc = run_cli([sys.executable, "launch/evaluate.py", "--run", run_dir, "--src", src,
                    "--ref", tiny_data / "test.tgt.txt", "--json", "--beam", "1"], timeout=300)
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(result) >= {"bleu", "chrf", "signature"} and "tok:ja-mecab" in result["signature"]  # raw Japanese target
    assert 0 <= result["bleu"] <= 100 and 0 <= result["chrf"] <= 100 and result["sentences"] == n_in
    # the quickstart's report: a baseline scored the same way beside the model, then sample sentences
    # (evaluate's main in this process: the process itself ran just above)
    code, report, _ = launch_main("evaluate", ["--run", run_dir, "--src", src, "--ref", tiny_data / "test.tgt.txt",
                                               "--beam", "1", "--baseline", tiny_data / "test.tgt.txt", "--show", "2"],
                                  capsys)
    lines = report.splitlines()
    assert code == 0 and lines[1].split()[0] == "model" and float(lines[1].split()[1]) == result["bleu"]
    assert lines[2].split()[0] == "test.tgt.txt" and lines[2].split()[1:] == ["100.00", "100.00"]
    assert report.count("reference: ") == 2 and "[2] source:" in report
    # wandb ran offline without an API key, inside the run directory, and holds what a dashboard needs
    runs = list((run_dir / "wandb").glob("offline-run-*"))
    assert runs
    from tests.wandb_records import summary

    logged = summary(str(next(runs[0].glob("run-*.wandb"))))
    assert {"model", "train", "deepspeed", "layout"} <= set(logged["config"])
    assert json.loads(logged["config"]["layout"])["mode"] == "hybrid"
    assert json.loads(logged["config"]["deepspeed"])["parallel_layout"]["num_pp"] == 2
    keys = {k for h in logged["history"] for k in h}
    assert {f"rank{r}/{c}" for r in (0, 1) for c in ("busy", "waiting", "communicating", "idle", "rss_mb")} <= keys
    tables = [h for h in logged["history"] if h.get("dev_samples._type") == '"table-file"']
    assert len(tables) == 2 and all(h["dev_samples.ncols"] == "4" for h in tables)
    table = json.loads(next(runs[0].glob("files/media/table/dev_samples_*.table.json")).read_text())
    assert table["columns"] == ["step", "source", "reference", "hypothesis"] and len(table["data"]) == 8
    assert f"wandb sync {runs[0]}" in train.stdout
    # a picture without wandb
    png = run_cli([sys.executable, "launch/plot.py", run_dir], timeout=120).stdout.strip()
    assert png == str(run_dir / "training.png") and (run_dir / "training.png").read_bytes()[:4] == b"\x89PNG"
