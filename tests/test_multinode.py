"""Several nodes through DeepSpeed's own launcher, as a user starts them without ssh (docs/training.md
"Several nodes"): a two-line hostfile, one `deepspeed --no_ssh --node_rank R` per node, the rendezvous at
--master_addr/--master_port. Here both "nodes" are processes on this machine (one rank each), so the
run directory is trivially on a shared filesystem; the layout is hybrid_2 across the two nodes.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, read_metrics, run_cli, run_ranks
from trainer.config import merge_overrides
from tests.harness import free_port
from trainer.checkpoint import files as checkpoint

NODES = ("node-a", "node-b")
SCHEDULE = "train.schedule_steps=30"  # a run stopped at 20 and resumed to 30 follows the 30-step schedule


def _ds_config(tmp_path: Path) -> Path:
    """The shipped hybrid_2.json with a short warm-up; the schedule's 30 steps come from the YAML (SCHEDULE), so
    a run stopped at 20 and resumed to 30 follows the same learning rates as one that goes to 30 at once."""
    ds = json.loads((REPO / "ds_configs" / "hybrid_2.json").read_text())
    ds["scheduler"]["params"].update(warmup_num_steps=5)  # its length: train.schedule_steps=30 (SCHEDULE)
    path = tmp_path / "hybrid_2.json"
    path.write_text(json.dumps(ds))
    return path


def _train_args(data: Path, run: Path, ds: Path, *overrides) -> list[str]:
    # train.threads=1: both "nodes" share this machine's cores (on real nodes the default, cores per
    # local rank, is right: the launcher sets LOCAL_SIZE per node)
    return merge_overrides(["launch/train.py", "--deepspeed_config", str(ds), f"data.dir={data}", f"run.dir={run}",
            "model.layers=2", "model.emb_dim=16", "model.hidden=16", "model.dropout=0.3", "train.seed=7",
            "train.threads=1", "train.save_every=10", "train.eval_every=100", "train.log_every=1",
            "train.keep_last=5", "data.min_batch_sentences=8", "decode.dev_max_sentences=8",
            "logging.wandb_mode=disabled", "logging.progress=false"], overrides)


def start_nodes(hostfile: Path, args: list[str], logs: Path) -> list[subprocess.Popen]:
    """One `deepspeed --hostfile H --no_ssh --node_rank R --master_addr 127.0.0.1` per node, each in a
    process session of its own (what a job script on each node would run)."""
    port, procs = free_port(), []
    env = dict(os.environ, PYTHONUNBUFFERED="1", WANDB_MODE="disabled", PYTHONPATH=str(REPO))
    for rank in range(len(NODES)):
        cmd = [sys.executable, "-m", "deepspeed.launcher.runner", "--hostfile", str(hostfile), "--no_ssh",
               "--node_rank", str(rank), "--master_addr", "127.0.0.1", "--master_port", str(port), *args]
        log = (logs / f"node{rank}.log").open("w")
        procs.append(subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                                      start_new_session=True))
    return procs


def wait_nodes(procs: list[subprocess.Popen], logs: Path, timeout: float) -> list[str]:
    """Every node's exit; a node still running after `timeout` fails the test (all are killed)."""
    deadline = time.time() + timeout
    for proc in procs:
        try:
            proc.wait(timeout=max(1.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            for p in procs:
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
            pytest.fail(f"a node was still running after {timeout}s:\n" + _tails(logs))
    return [(logs / f"node{r}.log").read_text() for r in range(len(procs))]


def _tails(logs: Path) -> str:
    return "\n".join(f"--- node{r} ---\n{(logs / f'node{r}.log').read_text()[-2500:]}" for r in range(len(NODES)))


def two_nodes(hostfile: Path, args: list[str], logs: Path, timeout: float = 240) -> list[str]:
    logs.mkdir(parents=True, exist_ok=True)
    procs = start_nodes(hostfile, args, logs)
    outs = wait_nodes(procs, logs, timeout)
    codes = [p.returncode for p in procs]
    assert codes == [0, 0], f"node exits {codes}\n{_tails(logs)}"
    return outs


@pytest.fixture
def hostfile(tmp_path) -> Path:
    path = tmp_path / "hostfile"
    path.write_text("".join(f"{name} slots=1\n" for name in NODES))
    return path


@pytest.mark.slow
def test_two_nodes_train_save_and_resume(tiny_data, tmp_path, hostfile):
    """hybrid_2 over two nodes: 20 steps, saved; resumed from step 20 to 30. Every loss equals that of
    the same job launched on one node (`deepspeed --num_gpus 2`): the node split changes nothing."""
    ds, run = _ds_config(tmp_path), tmp_path / "run"
    outs = two_nodes(hostfile, _train_args(tiny_data, run, ds, "train.max_steps=20", SCHEDULE), tmp_path / "first")
    for rank, out in enumerate(outs):  # each node's launcher started exactly its own rank
        assert f"nnodes=2, num_local_procs=1, node_rank={rank}" in out, out[-3000:]
    assert "global_rank_mapping=defaultdict(<class 'list'>, {'node-a': [0], 'node-b': [1]})" in outs[0]
    assert checkpoint.read_pointer(str(run), "latest") == "step_00000020"
    step20 = run / "checkpoints" / "step_00000020"
    assert checkpoint.verify(str(step20)) == []
    state = json.loads((step20 / "train_state.json").read_text())
    assert state["step"] == 20 and state["world_size"] == 2
    assert state["layout"]["mode"] == "hybrid" and (state["layout"]["num_pp"], state["layout"]["num_dp"]) == (2, 1)
    # which rank wrote what: stage 0 (node-a) the embeddings and pair layer 0, stage 1 (node-b) pair
    # layer 1 and the head, both their RNG states
    files = {p.name for p in step20.iterdir()}
    for part in ("layer_00", "layer_01", "layer_02", "head"):
        assert {f"{part}-model_states.pt", f"{part}-optim_states.pt"} <= files, files
    assert {"rng-rank_00.pt", "rng-rank_01.pt"} <= files
    stages = {json.loads(p.read_text())["rank"]: json.loads(p.read_text())["stage"]
              for p in (run / "timing").glob("rank*.json")}
    assert stages == {0: 0, 1: 1}
    assert [r["step"] for r in read_metrics(run)] == list(range(1, 21))

    outs = two_nodes(hostfile, _train_args(tiny_data, run, ds, "train.max_steps=30", "train.resume=auto", SCHEDULE),
                     tmp_path / "resume")
    assert f"resume: from {step20} (step 20)" in outs[0]
    rows = read_metrics(run)
    assert [r["step"] for r in rows] == list(range(1, 31))  # no step twice, none missing
    assert checkpoint.read_pointer(str(run), "latest") == "step_00000030"
    assert json.loads((run / "checkpoints" / "step_00000030" / "train_state.json").read_text())["step"] == 30
    assert rows[-1]["dev_bleu"] is not None  # rank 0 decoded from files both nodes wrote

    one_node = tmp_path / "one_node"
    run_ranks(2, _train_args(tiny_data, one_node, ds, "train.max_steps=30", SCHEDULE), timeout=240)  # the reference
    want = {r["step"]: r["loss"] for r in read_metrics(one_node)}
    got = {r["step"]: r["loss"] for r in rows}
    assert got == want, [(s, want[s], got[s]) for s in want if want[s] != got[s]]


@pytest.mark.slow
def test_a_dead_node_ends_the_other(tiny_data, tmp_path, hostfile):
    """kill -9 of node-b's launcher and rank (the node is gone): node-a's rank names the lost peer and
    the newest checkpoint, exits 3, and its launcher exits 3 within seconds."""
    ds, run, logs = _ds_config(tmp_path), tmp_path / "run", tmp_path / "logs"
    logs.mkdir()
    procs = start_nodes(hostfile, _train_args(tiny_data, run, ds, "train.max_steps=100000"), logs)
    deadline = time.time() + 180
    while not (run / "checkpoints" / "step_00000010").exists():
        if time.time() > deadline or any(p.poll() is not None for p in procs):
            for p in procs:
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
            pytest.fail("no checkpoint at step 10:\n" + _tails(logs))
        time.sleep(0.2)
    os.killpg(procs[1].pid, signal.SIGKILL)
    killed = time.time()
    out = wait_nodes(procs, logs, 60)[0]
    elapsed = time.time() - killed
    print(f"node-b killed: node-a's launcher exited {procs[0].returncode} after {elapsed:.1f}s")
    assert procs[0].returncode == 3, out[-3000:]
    # (which transfer failed depends on where rank 0 was: a receive from rank 1, or a collective)
    assert "error: rank 0: lost contact with a peer rank" in out
    assert "newest complete checkpoint: step_000000" in out and "train.resume=auto" in out
    latest = checkpoint.read_pointer(str(run), "latest")
    assert latest and checkpoint.verify(str(run / "checkpoints" / latest)) == []
