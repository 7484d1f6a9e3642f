"""The measuring tools of benchmarks/ without running a benchmark: OpenNMT-py's options mirror the reference
model, a folder the peer script did not make is never used as its environment, the GEMM peak is measured
and its file is read, checked and re-measured when it comes from another CPU."""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import pytest

from benchmarks import common
from benchmarks.micro import peak
from benchmarks.peers import opennmt_peer, opennmt_runner
from tests.conftest import REPO
from trainer.config import load_config

REFERENCE = REPO / "trainer" / "configs" / "enja_small.yaml"
SINGLE = REPO / "ds_configs" / "single.json"


def test_peer_options_mirror_the_reference_model_and_batches():
    opts = opennmt_peer.peer_options(REFERENCE, SINGLE)
    model, ds = load_config(str(REFERENCE)).model, json.loads(SINGLE.read_text())
    assert (opts["word_vec_size"], opts["hidden_size"], opts["layers"]) == (model.emb_dim, model.hidden, model.layers)
    assert (opts["word_vec_size"], opts["hidden_size"], opts["layers"]) == (256, 256, 2)
    assert opts["encoder_type"] == opts["decoder_type"] == "rnn" and opts["rnn_type"] == "LSTM"
    assert opts["global_attention"] == "general" and opts["dropout"] == [0.2] and opts["label_smoothing"] == 0.1
    assert opts["batch_type"] == "sents" and opts["batch_size"] == ds["train_micro_batch_size_per_gpu"] == 64
    assert opts["accum_count"] == [ds["gradient_accumulation_steps"]]
    params = ds["optimizer"]["params"]
    assert opts["optim"] == "adam" and opts["learning_rate"] == params["lr"]
    assert [opts["adam_beta1"], opts["adam_beta2"]] == params["betas"]
    assert opts["max_grad_norm"] == ds["gradient_clipping"]
    assert opts["src_vocab_size"] == opts["tgt_vocab_size"] == common.VOCAB_SIZE == 8000
    assert "input_feed" not in opts  # each run sets it


def test_peer_options_refuse_what_they_cannot_mirror(tmp_path):
    config = tmp_path / "bi.yaml"
    config.write_text(REFERENCE.read_text().replace("  layers: 2\n", "  layers: 2\n  bidirectional_bottom: true\n"))
    with pytest.raises(opennmt_peer.PeerError, match="model.bidirectional_bottom"):
        opennmt_peer.peer_options(config, SINGLE)
    sgd = tmp_path / "sgd.json"
    sgd.write_text(SINGLE.read_text().replace('"Adam"', '"SGD"'))
    with pytest.raises(opennmt_peer.PeerError, match="optimizer.type"):
        opennmt_peer.peer_options(REFERENCE, sgd)


def test_peer_venv_leaves_a_folder_it_did_not_make_alone(tmp_path):
    foreign = tmp_path / "venv"
    foreign.mkdir()
    (foreign / "keep.txt").write_text("someone's")
    with pytest.raises(opennmt_peer.PeerError, match="not made by this script"):
        opennmt_peer.peer_venv(foreign)
    assert (foreign / "keep.txt").read_text() == "someone's" and len(list(foreign.iterdir())) == 1


def test_peer_venv_reuses_a_finished_build_and_rebuilds_an_unfinished_one(tmp_path, monkeypatch):
    venv = tmp_path / "venv"
    venv.mkdir()
    packages = [opennmt_peer.torch_pin(), *opennmt_peer.PEER_PACKAGES]
    (venv / opennmt_peer.MARKER).write_text(json.dumps({"packages": packages, "runner_check": {"onmt": "3.5.1"}}))
    assert opennmt_peer.peer_venv(venv) == venv / "bin" / "python"  # reused: nothing started

    (venv / opennmt_peer.MARKER).write_text(json.dumps({"packages": packages, "runner_check": None}))
    calls = []
    monkeypatch.setattr(opennmt_peer.subprocess, "run", lambda cmd, **kw: calls.append(cmd) or
                        type("P", (), {"returncode": 1, "stderr": "no venv module", "stdout": ""})())
    with pytest.raises(opennmt_peer.PeerError, match="could not create a virtual environment"):
        opennmt_peer.peer_venv(venv)
    assert calls and calls[0][1:3] == ["-m", "venv"]  # the interrupted build was removed and started again


def test_torch_pin_is_the_cpu_build_of_requirements():
    pinned = next(line.split("==")[1].strip() for line in (REPO / "requirements.txt").read_text().splitlines()
                  if line.startswith("torch=="))
    assert opennmt_peer.torch_pin() == f"torch=={pinned}+cpu"


def test_median_round_reports_the_median_run():
    rounds = [{"pairs_per_s": 300.0, "x": 1}, {"pairs_per_s": 100.0, "x": 2}, {"pairs_per_s": 200.0, "x": 3}]
    assert opennmt_peer.median_round(rounds)["x"] == 3
    assert opennmt_peer.median_round(rounds)["rounds_pairs_per_s"] == [300.0, 100.0, 200.0]


def test_the_peers_profile_window_writes_ops_and_phases_per_step(tmp_path):
    """The runner's torch.profiler window (steps 2-3 of 4) writes what our trainer's profile has, plus the
    CPU ms of each marked phase, per step."""
    import torch
    from torch.profiler import record_function

    out = tmp_path / "profile.json"
    window = opennmt_runner._Window(2, 2, str(out))
    x = torch.randn(64, 64, requires_grad=True)
    for step in range(1, 5):
        window.before(step)
        with record_function("phase: forward"):
            y = (x @ x).sum()
        with record_function("phase: backward"):
            y.backward()
        window.after(step)
        assert out.exists() == (step >= 3)
    got = json.loads(out.read_text())
    assert got["steps"] == [2, 3]
    assert set(got["phases"]) == {"forward", "backward"} and all(v > 0 for v in got["phases"].values())
    assert got["ops"]["aten::mm"]["calls"] >= 1 and not any(k.startswith("phase: ") for k in got["ops"])
    assert got["wall_ms_per_step"] > 0 and got["self_cpu_ms_per_step"] > 0


def test_operators_are_grouped_by_what_they_compute():
    group = opennmt_peer.op_group
    assert group("aten::mkldnn_rnn_layer_backward").startswith("LSTM")
    assert group("aten::mm").startswith("GEMMs") and group("aten::addmm").startswith("GEMMs")
    assert group("aten::_fused_adam_").startswith("optimizer") and group("aten::addcmul_").startswith("optimizer")
    assert group("aten::addcmul").startswith("softmax")  # ours: the loss's gradient, not Adam's in-place update
    assert group("aten::_log_softmax_backward_data").startswith("softmax")
    assert group("aten::bernoulli_").startswith("dropout") and group("aten::copy_").startswith("copies")
    assert group("aten::mul").startswith("everything else")


def test_the_profile_report_says_how_many_milliseconds_stand_between_ours_and_the_goal(capsys):
    def profile(ops, phases):
        return {"steps": [6, 60], "wall_ms_per_step": sum(ops.values()) + 5, "self_cpu_ms_per_step": sum(ops.values()),
                "phases": phases, "ops": {k: {"self_ms": v, "calls": 1} for k, v in ops.items()}}

    peer = profile({"aten::mm": 30.0, "aten::sqrt": 9.0}, {"forward": 10.0})
    ours = profile({"aten::mm": 40.0, "aten::_fused_adam_": 7.0}, {"head": 20.0})
    results = {("OpenNMT-py, no input feeding", "fp32"): {"pairs_per_s": 320.0},
               ("ours single", "fp32"): {"pairs_per_s": 320.0}}
    got = opennmt_peer.report_profiles({"OpenNMT-py": peer, "ours": ours}, results)
    assert got["goal_ms"]["ours"] == pytest.approx(200.0) and got["goal_ms"]["needed"] == pytest.approx(200.0 / 1.2)
    assert "33.3 ms to remove" in capsys.readouterr().out
    assert got["groups"]["GEMMs (mm, addmm, bmm)"] == {"peer": 30.0, "ours": 40.0}
    assert got["groups"]["optimizer (Adam, clipping's norm)"] == {"peer": 9.0, "ours": 7.0}
    assert got["operators"][0] == {"op": "aten::mm", "peer_ms": 30.0, "ours_ms": 40.0}


def test_spacy_stand_in_fails_loudly_when_used(monkeypatch):
    if "spacy" in sys.modules or opennmt_runner.importlib.util.find_spec("spacy") is not None:
        pytest.skip("spacy is installed here")
    monkeypatch.delitem(sys.modules, "spacy", raising=False)
    opennmt_runner._stand_in_for_spacy()
    stand_in = sys.modules.pop("spacy")
    with pytest.raises(RuntimeError, match="terminology transform"):
        stand_in.load("en_core_web_sm")
    assert not hasattr(stand_in, "__file__")  # introspection sees a plain module, not an error


def test_the_transformer_peers_schedules_are_sized_to_the_budget():
    """Each side's expected steps are the budget over its probe's seconds per step after the warm-up; the
    Transformer's noam warms up over a tenth of them (at most 4000) and peaks at PEAK_LR whatever the warm-up."""
    from benchmarks.peers import transformer_peer as tp

    rows = [(1, 9.0), (2, 9.6), (3, 10.1), (4, 10.5), (5, 11.0), (6, 11.5)]  # step 1 waited for the first batches
    assert tp.probe_rate(rows, warmup=4) == pytest.approx(0.5)
    assert tp.expected_steps(600.0, 0.5) == 1200 and tp.expected_steps(1.0, 5.0) == 1
    with pytest.raises(tp.PeerError, match="two after step 4"):
        tp.probe_rate(rows[:4], warmup=4)
    with pytest.raises(tp.PeerError, match="cannot size a schedule"):
        tp.expected_steps(600.0, 0.0)
    for steps, warmup in ((1200, 120), (5, 1), (10**6, 4000)):
        got_warmup, factor = tp.noam(steps)
        assert got_warmup == warmup
        assert factor * tp.D_MODEL ** -0.5 * warmup ** -0.5 == pytest.approx(tp.PEAK_LR)  # noam's peak, at the warm-up
    # the usual factor 2 with warm-up 4000 at d_model 256 is the peak chosen
    assert 2 * 256 ** -0.5 * 4000 ** -0.5 == pytest.approx(tp.PEAK_LR, rel=0.02)
    opts = tp.transformer_options(warmup=120, learning_rate=0.7, batch_tokens=1024)
    assert opts["encoder_type"] == opts["decoder_type"] == "transformer" and opts["enc_layers"] == opts["dec_layers"] == 3
    assert (opts["hidden_size"], opts["word_vec_size"], opts["heads"], opts["transformer_ff"]) == (256, 256, 4, 1024)
    assert opts["dropout"] == opts["attention_dropout"] == [0.1] and opts["label_smoothing"] == 0.1
    assert (opts["decay_method"], opts["warmup_steps"], opts["learning_rate"]) == ("noam", 120, 0.7)
    assert (opts["batch_type"], opts["batch_size"]) == ("tokens", 1024) and opts["position_encoding"]
    assert opts["src_vocab_size"] == opts["tgt_vocab_size"] == common.VOCAB_SIZE


def test_the_runners_budget_hands_no_batch_once_spent():
    """opennmt_runner.py --budget-s: the budget counts from the loop's first batch (the corpus read before it is
    start-up) and no batch is fetched once it is spent; without a budget it is a clock only."""
    now = [100.0]
    budget = opennmt_runner._Budget(10.0, clock=lambda: now[0])
    fetched = []

    def batches():
        now[0] += 8.0  # OpenNMT-py reads and sorts the corpus before its first batch
        for i in range(100):
            fetched.append(i)
            yield i

    assert budget.since(budget.start) is None and not budget.spent()  # the loop has not begun
    taken = []
    for b in budget.batches(batches()):
        taken.append(b)
        now[0] += 3.0  # a step
    assert taken == [0, 1, 2, 3] and fetched == [0, 1, 2, 3]  # after 12 s no fifth batch was even fetched
    assert budget.spent() and budget.since(budget.start) == pytest.approx(12.0)
    assert budget.since(budget.loop_start) == pytest.approx(20.0)
    clock_only = opennmt_runner._Budget(None, clock=lambda: now[0])
    assert list(clock_only.batches(iter(range(5)))) == [0, 1, 2, 3, 4] and not clock_only.spent()


def _transformer_rows() -> list[dict]:
    signature = "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0"
    test = lambda b: {"bleu": b, "chrf": b + 3, "signature": signature}  # noqa: E731
    return [{"system": "OpenNMT-py 3.5.1, Transformer", "model": "Transformer 3+3, d_model 256, 4 heads, FFN 1024",
             "precision": "fp32", "steps": 1310, "train_s": 600.4, "decode_s": 41.2, "batch": "1024 tokens",
             "schedule": "noam, warm-up 131", "test": test(18.25)},
            {"system": "ours", "model": "enja-small", "precision": "bf16", "steps": 4480, "train_s": 600.1,
             "decode_s": 30.6, "batch": "64 pairs", "schedule": "warm-up 100, linear decay to 0 at step 4500",
             "test": test(27.5)}]


def test_the_transformer_peers_table_and_records_say_budget_steps_and_bleu(monkeypatch):
    from benchmarks.peers import transformer_peer as tp
    from benchmarks.results import check
    from benchmarks.results.page import render

    lines = tp.table(_transformer_rows(), threads=2, minutes=10.0, cpu="AMD EPYC (2 cores)")
    assert lines[0].startswith("| system | precision | threads | minutes | steps done | test BLEU (13a) |")
    assert lines[2] == "| OpenNMT-py 3.5.1, Transformer | fp32 | 2 | 10 | 1310 | 18.25 | 600 | 41 | AMD EPYC (2 cores) |"
    assert lines[3] == "| ours | bf16 | 2 | 10 | 4480 | 27.50 | 600 | 31 | AMD EPYC (2 cores) |"
    monkeypatch.setattr(sys, "argv", ["x", "--minutes", "10"])
    recs = tp.to_records(_transformer_rows(), argparse.Namespace(threads=2, minutes=10.0, seed=1), busy=False)
    for r in recs:
        check(r)
    assert [(r["question"], r["table"], r["figures"]["test_bleu"]) for r in recs] == [
        ("peers", "transformer", 18.25), ("peers", "transformer", 27.5)]
    text = render(recs)
    assert "| enja-small | bf16 | 2 | 10 | 64 pairs | 4,480 | 27.50 | 600 | 30.6 |" in text
    assert "python -m benchmarks.peers.transformer_peer --minutes 10" in text


def test_peak_measures_positive_rates_per_precision_and_thread_count():
    result = peak.measure([1, 2], reps=2, rounds=2, shapes={"tiny": (48, 64, 32), "small": (96, 64, 64)})
    for precision in ("fp32", "bf16"):
        for n in ("1", "2"):
            by_shape = [result["shapes"][s][precision][n] for s in ("tiny", "small")]
            assert all(r > 0 for r in by_shape) and result[precision][n] == max(by_shape)
    assert result["cpu"] == common.cpu_model()


def _peak_file(path: Path, cpu: str) -> None:
    path.write_text(json.dumps({"cpu": cpu, "fp32": {"1": 1e11, "2": 2e11}, "bf16": {"1": 4e11, "2": 8e11}}))


def test_matmul_peak_reads_this_machines_file_without_measuring(tmp_path, monkeypatch):
    _peak_file(tmp_path / "peak.json", common.cpu_model())
    monkeypatch.setattr(common.subprocess, "run", lambda *a, **k: pytest.fail("measured again"))
    assert common.matmul_peak(tmp_path)["bf16"]["2"] == 8e11


def test_matmul_peak_measures_again_for_another_cpu(tmp_path, monkeypatch):
    _peak_file(tmp_path / "peak.json", "some other CPU (64 cores)")
    calls = []

    def fake_measure(cmd, **kw):
        calls.append(cmd)
        _peak_file(tmp_path / "peak.json", common.cpu_model())

    monkeypatch.setattr(common.subprocess, "run", fake_measure)
    assert common.matmul_peak(tmp_path)["cpu"] == common.cpu_model()
    assert len(calls) == 1 and calls[0][1:3] == ["-m", "benchmarks.micro.peak"]


@pytest.mark.parametrize("text", ["[1, 2]", '{"cpu": "x", "fp32": {"1": 0, "2": 1}, "bf16": {"1": 1, "2": 1}}',
                                  '{"fp32": {"1": 1}}', "not json"])
def test_matmul_peak_refuses_a_bad_file_with_its_path(tmp_path, text):
    (tmp_path / "peak.json").write_text(text)
    with pytest.raises(SystemExit, match="peak.json: not a peak file"):
        common.matmul_peak(tmp_path)


def _peer_results(no_feed: float, feed: float, fp32: float, bf16: float) -> dict:
    runs = {("OpenNMT-py, no input feeding", "fp32"): no_feed, ("OpenNMT-py, input feeding", "fp32"): feed,
            ("ours single", "fp32"): fp32, ("ours single", "bf16"): bf16}
    return {key: {"pairs_per_s": v, "step_ms_median": 64000 / v, "tokens_per_pair": 20.0} for key, v in runs.items()}


def test_peer_report_gives_ratios_goal_and_flags_a_busy_machine(capsys):
    args = argparse.Namespace(threads=2, steps=60, warmup=5)
    cores = len(os.sched_getaffinity(0))
    assert not opennmt_peer.report(_peer_results(400, 300, 500, 610), [float(cores)] * 5, args)
    out = capsys.readouterr().out
    assert "| ours single | fp32 | 500 | 128 | 20.0 | 1.25x | 1.67x |" in out
    assert "1.25x (met)" in out and "2.03x (met)" in out and "busy" not in out
    assert "by round: 1.25x; per src+tgt token" in out
    assert opennmt_peer.report(_peer_results(400, 300, 450, 500), [cores + 8.0], args)
    out = capsys.readouterr().out
    assert "1.12x (not met)" in out and "1.67x (not met)" in out and "not a measurement of record" in out


def test_peer_report_puts_an_a_b_setting_beside_ours_round_by_round(capsys):
    """--ours-b: one more fp32 run of ours with a setting, in the table and against ours round by round."""
    args = argparse.Namespace(threads=2, steps=60, warmup=5)
    results = _peer_results(400, 300, 500, 610)
    results["ours single", "fp32"]["rounds_pairs_per_s"] = [500, 480]
    results["ours single, train.loss_projection=chunked", "fp32"] = {
        "pairs_per_s": 450, "step_ms_median": 142.2, "tokens_per_pair": 20.0, "rounds_pairs_per_s": [450, 432]}
    opennmt_peer.report(results, [1.0], args)
    out = capsys.readouterr().out
    assert "| ours single, train.loss_projection=chunked | fp32 | 450 | 142 | 20.0 | 1.12x | 1.50x |" in out
    assert "train.loss_projection=chunked against ours single (fp32) by round: 0.90x, 0.90x" in out
    assert "1.25x (met)" in out  # the goal is the defaults' row


def test_loss_projection_times_both_cuts_and_their_gemms():
    import torch

    from benchmarks.micro.loss_projection import rows

    got = rows(40, 8, 30, 16, torch.float32, reps=2)
    assert set(got) == {"logits, chunk GEMMs", "logits, one GEMM", "weight grad, ones column",
                        "weight grad + column sums", "loss, chunked", "loss, whole"}
    assert all(0 < ms < 5000 for ms in got.values())


def test_head_rows_times_the_reference_head_forward_and_backward():
    import torch

    from benchmarks.micro import head_rows

    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        ms = head_rows.head_ms(2, torch.float32, reps=1, src_len=3, tgt_len=4, real=3)
    finally:
        torch.set_num_threads(threads)
    assert 0 < ms < 10_000


def test_number_copy_counts_masking_and_ordinals():
    from benchmarks.quality import number_copy

    src = ["the battery of claim 1 , wherein the first electrode has 2 layers .", "a motor ."]
    tgt = ["請求項１に記載の電池であって、第１の電極は２つの層を有する", "モータ"]
    out = number_copy.masking(src, tgt, 8)
    assert out["multiset"] == {"target_runs_masked": 2, "ordinals_masked": 0, "pairs": 2}
    assert out["by_value"] == {"target_runs_masked": 3, "ordinals_masked": 1, "pairs": 2}
    # a wrong ordinal that is none of the source's numbers; then one that is the claim number
    got = number_copy.ordinals(src[:1], ["請求項1に記載の第1の電極"], ["請求項1に記載の第3の電極"])
    assert got == {"ordinals": 1, "ordinals_right": 0.0, "wrong_ordinals": 1, "source_numbers_as_ordinals": 0}
    got = number_copy.ordinals(["claim 2 , the first electrode"], ["請求項2の第1の電極"], ["請求項2の第2の電極"])
    assert got == {"ordinals": 1, "ordinals_right": 0.0, "wrong_ordinals": 1, "source_numbers_as_ordinals": 1}


def test_scaling_runs_single_processes_with_both_lstm_kernels():
    """The baseline of every ratio is the faster single process, so a single process runs with each
    kernel; the parallel runs with the chosen one (or each, for `both`)."""
    from benchmarks.scaling.layouts import RUNS, with_kernels

    runs = with_kernels([r for r in RUNS if r[0] in ("single 1 thread", "data_2")], "stepwise")
    assert [(r[0], r[-1]) for r in runs] == [("single 1 thread fused", "fused"),
                                             ("single 1 thread stepwise", "stepwise"), ("data_2", "stepwise")]
    both = with_kernels([r for r in RUNS if r[0] == "data_2"], "both")
    assert [r[0] for r in both] == ["data_2 fused", "data_2 stepwise"]
    zero = with_kernels([r for r in RUNS if r[0] == "data_2 zero1"], "fused")
    assert [(r[0], r[5]) for r in zero] == [("data_2 zero1", {"zero_optimization": {"stage": 1}})]


def test_lstm_kernels_times_each_kernel_cut_in_chunks():
    import torch
    from benchmarks.micro.lstm_kernels import time_chunks

    lstm = torch.nn.LSTM(8, 8, batch_first=True)
    x = torch.randn(2, 6, 8)
    for kernel in ("fused", "stepwise"):
        fwd, bwd = time_chunks(lstm, x, 3, kernel, repeats=1)
        assert fwd > 0 and bwd > 0


def _trace(spans: dict) -> dict:
    """A timeline trace.json of one step: {rank: [(op, start ms, dur ms)]}."""
    from trainer.observe.timeline import category

    return {"traceEvents": [{"name": op, "cat": category(op), "ph": "X", "pid": 9, "tid": rank,
                             "ts": 1000.0 * start, "dur": 1000.0 * dur}
                            for rank, ops in spans.items() for op, start, dur in ops]}


HYBRID_STEP = {  # two ranks, 2 chunks: rank 1 waits to fill, rank 0 waits for the head and the backward
    0: [("forward", 0, 10), ("send_forward", 10, 1), ("forward", 11, 10), ("send_forward", 21, 1),
        ("recv_shard", 22, 18), ("head", 40, 30), ("send_shard_grad", 70, 1), ("recv_backward", 71, 9),
        ("backward", 80, 20), ("recv_backward", 100, 2), ("backward", 102, 20), ("optimizer_step", 122, 5),
        ("reduce_metrics", 127, 3)],
    1: [("recv_forward", 0, 11), ("forward", 11, 10), ("recv_forward", 21, 1), ("forward", 22, 10),
        ("scatter_shard", 32, 1), ("head", 33, 35), ("gather_grad", 68, 2), ("backward", 70, 10),
        ("send_backward", 80, 1), ("backward", 81, 19), ("send_backward", 100, 1), ("optimizer_step", 101, 28),
        ("reduce_metrics", 129, 1)],
}


def test_where_ms_puts_every_ms_of_the_step_in_one_place():
    from benchmarks.scaling.goals import PHASES, where_ms

    got = where_ms(_trace(HYBRID_STEP))
    for rank, row in got.items():
        assert row["step"] == pytest.approx(130)
        parts = ("forward", "backward", "head", "optimizer", *PHASES)
        assert sum(row[k] for k in parts) == pytest.approx(130), rank
    assert got[0]["before head"] == pytest.approx(18 + 1) and got[0]["head to backward"] == pytest.approx(10)
    assert got[0]["optimizer"] == got[1]["optimizer"] == pytest.approx(5)  # the fastest rank's: its own work
    assert got[1]["fill"] == pytest.approx(11) and got[1]["drain"] == pytest.approx(30 - 1 - 5 + 1)


def test_goals_are_ratios_within_a_round_and_met_only_in_every_round(tmp_path, capsys):
    from benchmarks.scaling import goals as scaling_goals

    def run(tps, step=500.0, cpu=None):
        timing = {0: {"forward": 0.05, "backward": 0.05, "head": 0.0}, 1: {"forward": 0.05, "backward": 0.05}}
        return {"tokens_per_s": tps, "step_ms_median": step, "timing": timing, "kernel": "stepwise",
                "run_dir": str(tmp_path), "cpu": cpu or {}}

    (tmp_path / "timeline").mkdir()
    (tmp_path / "timeline" / "trace.json").write_text(json.dumps(_trace(HYBRID_STEP)))
    fractions = lambda b0, b1: {"rank0/busy": b0, "rank1/busy": b1, "rank0/communicating": 1 - b0,  # noqa: E731
                                "rank1/communicating": 1 - b1, "rank0/waiting": 0.0, "rank1/waiting": 0.0}
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps({"step": i + 1, "step_time_s": 0.5, **fractions(*b)}) + "\n"
                                                    for i, b in enumerate([(0.5, 0.5)] * 3 + [(0.9, 0.8), (0.7, 0.9)])))
    rows = {"single 1 thread fused": [run(100), run(100)], "single 1 thread stepwise": [run(90), run(110)],
            "ceiling": [run(190, cpu={0: {"main": 480.0}}), run(200, cpu={0: {"main": 470.0}})],
            "ceiling half batch": [run(150, step=300.0), run(160, step=290.0)],
            "single 2 threads": [run(150), run(150)], "data_2": [run(170), run(160)],
            "pipeline_2 units=4": [run(100), run(100)],
            "hybrid_2 shipped": [run(180), run(176, cpu={0: {"main": 300.0, "gloo_tcp_loop x4": 20.0}})]}
    results = {"wide": {"bf16": rows}}
    table = {g["goal"]: g for g in scaling_goals.goals_table(results)}
    assert scaling_goals.shipped_layout("wide") == {"micro_batches": 1, "time_chunks": 4, "head_split": "time"}
    assert table["ceiling"]["min"] == pytest.approx(200 / 110) and table["ceiling"]["max"] == pytest.approx(1.9)
    assert table["ceiling"]["met"] is None  # reported, no target
    assert table["hybrid_2 of the ceiling"]["min"] == pytest.approx(0.88) and table["hybrid_2 of the ceiling"]["max"] == pytest.approx(0.947, abs=1e-3)
    assert not table["hybrid_2 of the ceiling"]["met"]  # 0.9 of the ceiling is reached in one round only
    assert table["data_2 of the ceiling"]["min"] == pytest.approx(0.8) and not table["data_2 of the ceiling"]["met"]  # 160/200
    assert table["hybrid_2 over data_2"]["min"] == pytest.approx(180 / 170) and not table["hybrid_2 over data_2"]["met"]  # the wide model's target: 1.2x
    # what halving the batch costs by itself, and what data_2 loses beyond it: reported, no target
    assert table["half batch"]["min"] == pytest.approx(0.789, abs=1e-3) and table["half batch"]["met"] is None
    assert table["data_2 of the half-batch ceiling"]["max"] == pytest.approx(170 / 150) and table["data_2 of the half-batch ceiling"]["min"] == pytest.approx(1.0)
    older = {k: v for k, v in rows.items() if k != "ceiling half batch"}  # a result from before that row
    assert {g["goal"] for g in scaling_goals.goals_table({"wide": {"bf16": older}})} == set(table) - {
        "half batch", "data_2 of the half-batch ceiling"}
    g = scaling_goals.gap(rows, "hybrid_2 of the ceiling", 0.9, 0)  # round 1: 180 tok/s at 500 ms against 0.9 x 190
    assert g["needed_ms"] == pytest.approx(500 * 180 / (0.9 * 190)) and g["gap_ms"] == pytest.approx(500 - g["needed_ms"])
    assert scaling_goals.from_json(json.loads(json.dumps(results))) == results  # --report-only reads them back
    out = scaling_goals.report(results, 2)
    assert set(out["gaps"]) == {"hybrid_2 of the ceiling_wide_bf16", "data_2 of the ceiling_wide_bf16",
                                 "hybrid_2 over data_2_wide_bf16"}
    where = out["gaps"]["hybrid_2 of the ceiling_wide_bf16"]
    assert where["round"] == 2  # the median round (of equal steps, the later)
    assert set(where["ranks"]) == {0, 1} and where["cpu"]["ceiling run"] == {"main": 470.0}
    assert where["half_batch_step_ms"] == 290.0  # the median round's half-batch run, printed beside the ranks
    printed = capsys.readouterr().out
    assert "gloo_tcp_loop x4 20.0" in printed and "| half-batch run |" in printed
    # every step after the warm-up: 50 and 100 ms apart; the step's least communicating: 50 ms each time
    assert where["skew"]["busy_diff_ms"] == pytest.approx(75) and where["skew"]["comm_wait_least_ms"] == pytest.approx(50)
    assert "the ranks' busy ms differ by 75 on average" in printed

def test_replica_lengths_replays_a_data_parallel_runs_slices_beside_its_ranks_busy_time(tiny_data, tmp_path):
    """What each data_2 replica was handed, from the run's own files: the trainer's batches cut by its cutter; rank 1's
    extra busy ms regressed on its extra padded target positions."""
    import numpy as np
    from omegaconf import OmegaConf

    from benchmarks.common import replica_lengths
    from trainer.config import load_config
    from trainer.parallel.cut import cut_replica
    from trainer.parallel.layout import LayoutSpec
    from trainer.planner.plan import workload

    run = tmp_path / "run"
    run.mkdir()
    cfg = load_config(None, [f"data.dir={tiny_data}", "data.min_batch_sentences=2", "train.seed=3"])
    OmegaConf.save(cfg, run / "config.yaml")
    ds = {**json.loads((REPO / "ds_configs" / "data_2.json").read_text()), "train_micro_batch_size_per_gpu": 4}
    (run / "ds_config.json").write_text(json.dumps(ds))
    spec = LayoutSpec.from_ds_config(ds, 2)
    windows = workload(cfg, ds, steps=12).windows
    tgt = np.asarray([[cut_replica(spec, w[0], k).replica.tgt_in.shape[1] for k in range(2)] for w in windows], float)
    busy0 = 100.0 + np.arange(12)  # rank 1 busier by 7 ms per extra target position, plus 5
    busy1 = busy0 + 7 * (tgt[:, 1] - tgt[:, 0]) + 5
    rows = [{"step": i + 1, "step_time_s": 1.0, "rank0/busy": b0 / 1000, "rank1/busy": b1 / 1000}
            for i, (b0, b1) in enumerate(zip(busy0, busy1))]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    got = replica_lengths(run, warmup=3)
    assert got["steps"] == 9 and got["rows"] == [4.0, 4.0] and all(t > 8 for t in got["tokens"])
    assert got["tgt_positions"] == pytest.approx(tgt[3:].mean(0).tolist())
    assert (tgt[3:, 1] - tgt[3:, 0]).std() > 0  # the tiny corpus's replicas differ step by step
    assert got["ms_per_position"] == pytest.approx(7.0) and got["corr"] == pytest.approx(1.0)
    assert got["intercept_ms"] == pytest.approx(5.0)
    single = run / "ds_config.json"
    single.write_text((REPO / "ds_configs" / "single.json").read_text())
    assert replica_lengths(run) is None  # not data-parallel


def test_goal_5_prints_the_milliseconds_between_from_the_peers_profile(tmp_path, capsys):
    from benchmarks.scaling.goals import peer_goal

    assert peer_goal(tmp_path / "none.json") is None  # no peer run: said how to make one
    runs = {"ours single fp32": {"pairs_per_s": 330.0}, "OpenNMT-py, no input feeding fp32": {"pairs_per_s": 300.0}}
    profile = {"goal_ms": {"ours": 193.9, "needed": 177.8},
               "groups": {"lstm": {"peer": 60.0, "ours": 70.0}, "optimizer": {"peer": 30.0, "ours": 12.0},
                          "softmax": {"peer": 20.0, "ours": 24.0}}}
    path = tmp_path / "opennmt_peer.json"
    path.write_text(json.dumps({"runs": runs, "cpu": "a CPU", "threads": 2, "profile": profile}))
    out = peer_goal(path)
    assert out["ratio"] == pytest.approx(1.1) and not out["met"] and out["stand_between_ms"] == pytest.approx(16.1)
    printed = capsys.readouterr().out
    assert "16.1 ms stand between" in printed and "lstm 70.0 / 60.0, softmax 24.0 / 20.0" in printed


def test_batching_reports_each_sides_padding_at_each_length_sort_window():
    """benchmarks.data.batching: the padding of both sides and of each, for each window of --bucket-batches; a
    window as long as the corpus sorts it all at once and pads no more than a shorter one."""
    import numpy as np

    from benchmarks.data import batching

    rng = np.random.default_rng(0)
    src, tgt = rng.integers(1, 30, 4000), rng.integers(1, 30, 4000)
    short, whole = (batching.measure(src, tgt, 16, 0, window) for window in (4, 1000))
    for m in (short, whole):
        assert 0 <= m["src_padding_share"] < 1 and 0 <= m["tgt_padding_share"] < 1
        assert min(m["src_padding_share"], m["tgt_padding_share"]) <= m["padding_share"] \
            <= max(m["src_padding_share"], m["tgt_padding_share"])
    assert whole["padding_share"] < short["padding_share"] and whole["src_padding_share"] < 0.01


def test_shapes_counts_fewer_distinct_shapes_and_more_padding_with_a_larger_multiple():
    import numpy as np

    from benchmarks.data.shapes import count

    rng = np.random.default_rng(0)
    src, tgt = rng.integers(3, 60, 3000), rng.integers(3, 70, 3000)
    plain, eight, sixteen = (count(src, tgt, steps=200, sentences=32, multiple=m) for m in (1, 8, 16))
    assert plain["src_widths"] > eight["src_widths"] > sixteen["src_widths"] >= 1
    assert plain["batch_shapes"] > eight["batch_shapes"] >= sixteen["batch_shapes"]
    assert plain["head_token_counts"] == eight["head_token_counts"]  # the head's count is rounded either way
    assert 0 <= plain["padding_share"] < eight["padding_share"] < sixteen["padding_share"] < 1
    # more steps than one epoch's batches: the next epochs are drawn, as training does
    assert count(src[:200], tgt[:200], steps=50, sentences=32, multiple=8)["batch_shapes"] >= 1


def test_rank_cpu_reports_each_layout_above_the_machines_floor(capsys):
    """The floor (two half-batch single processes at once) is a row of its own, not held to the goal, and each
    layout's worst rank is reported against the same precision's floor."""
    from benchmarks.scaling import rank_cpu

    result = {"single fp32": {"cpu_ms": {0: 300.0}, "wall_ms": 300.0},
              "half_batch_pair fp32": {"cpu_ms": {0: 180.0, 1: 186.0}, "wall_ms": 190.0},
              "data_2 fp32": {"cpu_ms": {0: 192.0, 1: 201.0}, "wall_ms": 210.0}}
    assert rank_cpu.fractions(result)["half_batch_pair fp32"] == {0: 0.6, 1: 0.62}
    assert rank_cpu.above_floor(result) == [
        "data_2 fp32: worst rank 0.67, the floor 0.62 (two half-batch processes at once): +0.05 of one process's CPU "
        "is the layout's own"]
    rank_cpu.report(result, "a CPU", 40)
    rows = capsys.readouterr().out.splitlines()
    assert any(r.startswith("| half_batch_pair fp32 | 1 | 186.0 | 0.62 |") and "floor: whole model per rank" in r for r in rows)
    assert any(r.startswith("| data_2 fp32 | 1 | 201.0 | 0.67 |") and "**not met**" in r for r in rows)
    result["half_batch_alone fp32"] = {"cpu_ms": {0: 174.0}, "wall_ms": 174.0}  # the floor split in two
    assert rank_cpu.above_floor(result)[0] == (
        "half_batch_pair fp32: the floor 0.62 = 0.58 for a half batch alone (a step's work that does not halve) +0.04 "
        "for two processes sharing the machine")
    rank_cpu.report(result, "a CPU", 40)
    assert any(r.startswith("| half_batch_alone fp32 | 0 | 174.0 | 0.58 |") and "does not halve" in r
               for r in capsys.readouterr().out.splitlines())
    del result["half_batch_pair fp32"], result["half_batch_alone fp32"]  # --no-floor: no comparison
    assert rank_cpu.above_floor(result) == []


def test_rank_cpu_takes_each_runs_fraction_from_its_own_round():
    """A run's median round is compared with that round's single, not with the median single (another round,
    minutes apart on a machine whose speed drifts): 2026-12-07's bf16 data_2 showed 0.65 for rounds of 0.70-0.71."""
    from benchmarks.scaling import rank_cpu

    def rnd(single, data):
        return {"single bf16": {"cpu_ms": {0: single}, "wall_ms": 1.0},
                "data_2 bf16": {"cpu_ms": {0: data, 1: data}, "wall_ms": 1.0}}

    rounds = [rnd(170.0, 120.0), rnd(183.0, 130.0), rnd(190.0, 133.0)]  # 0.706, 0.710, 0.700
    result = rank_cpu.median_round(rounds)
    assert result["data_2 bf16"]["round"] == 1 and result["data_2 bf16"]["cpu_ms"][0] == 120.0
    assert rank_cpu.fractions(result)["data_2 bf16"] == {0: 0.706, 1: 0.706}  # not 120 / 183 = 0.656
    assert result["single bf16"]["cpu_ms"][0] == 183.0  # the median single
    saved = json.loads(json.dumps(rounds))  # WORK/rank_cpu.json: ranks as strings
    assert rank_cpu.median_round(rank_cpu.from_json(saved)) == result


def test_the_planners_validation_records_take_numpy_errors():
    """validate's errors come out of numpy (per-step medians): its summary record counted them into a numpy integer,
    which the records refuse, and a 25-minute validation of 2026-12-07 ended without its records."""
    import argparse

    import numpy as np

    from benchmarks.planner.__main__ import validation_records

    rows = [{"precision": "fp32", "label": f"row {i}", "measured_ms": np.float64(200.0),
             "predicted_ms": np.float64(190.0 + 20 * i), "error": np.float64(-0.05 + 0.1 * i),
             "step_error_median": np.float64(0.02 * i), "errors_by_round": [np.float64(0.01)]} for i in range(3)]
    out = validation_records(rows, argparse.Namespace(rescore=False), 1)
    assert out[-1]["figures"] == {"rows_within_10_pct": 2, "rows_within_10_pct_per_step_median": 3}
    assert type(out[-1]["figures"]["rows_within_10_pct"]) is int


def test_the_planners_validation_names_why_each_row_misses():
    """Issue 40 asks for every CPU row within 10% or each miss named: a row whose rounds straddle the price, or one
    of whose rounds is within 10%, is this machine's spread; otherwise the instruction type whose price misses
    most, on its rank, against the step's own gap."""
    from benchmarks.planner.__main__ import miss_cause

    ops = {"measured_ops": {"0": {"head": 0.050, "optimizer_step": 0.0175}, "1": {"head": 0.052, "optimizer_step": 0.018}},
           "predicted_ops": {0: {"head": 0.048, "optimizer_step": 0.0113}, 1: {"head": 0.049, "optimizer_step": 0.0113}}}
    row = {"measured_ms": 120.0, "predicted_ms": 100.0, **ops}
    assert miss_cause({**row, "errors_by_round": [-0.17, -0.15]}) == (
        "optimizer_step on rank 1 of 2, beside the other: 18.0 ms measured, priced 6.7 ms too fast (the step: 20.0 ms "
        "too fast); its rounds -17.0% / -15.0%")
    assert miss_cause({**row, "errors_by_round": [-0.22, 0.11]}) == (
        "the machine's spread: its rounds -22.0% / +11.0%, 33 points apart, on both sides of the price")
    assert miss_cause({**row, "errors_by_round": [-0.16, -0.02]}).endswith("14 points apart, one within 10%")
    saved = json.loads(json.dumps({**row, "errors_by_round": [-0.17]}))  # plan_validation.json: ranks as strings
    assert miss_cause(saved).startswith("optimizer_step on rank 1 of 2")
    assert miss_cause({"measured_ms": 1.0, "predicted_ms": 2.0, "errors_by_round": [1.0]}).endswith("not known")
