"""What the surviving node of a two-node job sees when the other fails (docs/training.md, "Several nodes").

    python -m benchmarks.reliability.node_failures [--work /tmp/hybrid-nmt-nodes] [--own-hostnames]

Two "nodes" on this machine, started as on real nodes without ssh: one `deepspeed --hostfile H
--no_ssh --node_rank R --master_addr 127.0.0.1` each, hybrid_2 across them (one rank per node), the
600-pair demo corpus and a tiny model. Once step 12 is logged (checkpoint step 10 exists), one failure:

  node-b dies       kill -9 of node-b's launcher and rank together (power loss, OOM killer, preemption)
  node-a dies       the same for node-a, which holds rank 0 and the rendezvous (MASTER_ADDR)
  rank-b dies       kill -9 of node-b's training process only; its launcher lives on
  node-b stops      SIGSTOP of node-b (a hung node or a network partition), with train.comm_timeout_s=8
  unshared run.dir  no failure injected, but node-b sees its own empty run.dir (a private tmpfs over it):
                    no filesystem shared by the nodes

Printed per case: the surviving node's launcher exit code, seconds from the failure to that exit,
and the lines its rank printed. `--own-hostnames` starts each node in a UTS namespace of its own
(`unshare -u`, root only) named node-a / node-b, so ranks see different hosts as on a real cluster;
the unshared-run.dir case always needs `unshare -m` (root).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from benchmarks.common import REPO, free_port
from data_prep.dataformat import MANIFEST
from trainer.artifacts.run_dir import METRICS

NODES = ("node-a", "node-b")
QUIET = ("[INFO]", "[WARNING]", "SEED_LAYERS", "Using topology", "stage=", "DeepSpeed deepspeed.ops", "layout:")


def prepare_tiny(work: Path) -> Path:
    data = work / "tiny"
    if not (data / MANIFEST).exists():
        text = work / "text"
        subprocess.run([sys.executable, "-m", "data_prep.demo_corpus", "--out", text, "--pairs", "600", "--dev", "40",
                        "--test", "40", "--seed", "3"], cwd=REPO, check=True, capture_output=True)
        args = ["--format", "moses", "--out", data, "--vocab-size", "300", "--workers", "1"]
        for split in ("train", "dev", "test"):
            args += [f"--{split}-src", text / f"{split}.en", f"--{split}-tgt", text / f"{split}.ja"]
        subprocess.run([sys.executable, "-m", "data_prep.prepare", *map(str, args)], cwd=REPO, check=True,
                       capture_output=True)
    return data


def start(work: Path, case: str, data: Path, own_hostnames: bool) -> tuple[list[subprocess.Popen], Path]:
    run = work / case.replace(" ", "_") / "run"
    shutil.rmtree(run.parent, ignore_errors=True)
    run.parent.mkdir(parents=True)
    hostfile = work / "hostfile"
    hostfile.write_text("".join(f"{name} slots=1\n" for name in NODES))
    args = ["launch/train.py", "--deepspeed_config", "ds_configs/hybrid_2.json", f"data.dir={data}", f"run.dir={run}",
            "model.layers=2", "model.emb_dim=16", "model.hidden=16", "train.max_steps=100000", "train.save_every=10",
            "train.eval_every=100000", "train.log_every=1", "train.threads=1", "data.min_batch_sentences=8",
            "logging.wandb_mode=disabled", "logging.progress=false"]
    if case == "node-b stops":
        args.append("train.comm_timeout_s=8")
    env = dict(os.environ, WANDB_MODE="disabled", PYTHONUNBUFFERED="1", PYTHONPATH=str(REPO))
    port, procs = free_port(), []
    for rank, name in enumerate(NODES):
        setup = []
        if own_hostnames:
            setup.append(f"hostname {name}")
        if case == "unshared run.dir" and rank == 1:
            setup.append(f"mount -t tmpfs tmpfs {run.parent}")
        prefix = []
        if setup:
            flags = "-u" if own_hostnames else ""
            flags += " -m" if case == "unshared run.dir" and rank == 1 else ""
            prefix = ["unshare", *flags.split(), "sh", "-c", " && ".join(setup) + ' && exec "$@"', "sh"]
        cmd = [*prefix, sys.executable, "-m", "deepspeed.launcher.runner", "--hostfile", str(hostfile), "--no_ssh",
               "--node_rank", str(rank), "--master_addr", "127.0.0.1", "--master_port", str(port), *args]
        log = (run.parent / f"{name}.log").open("w")
        procs.append(subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                                      start_new_session=True))
    return procs, run


def _logged_step(run: Path) -> int:
    path = run / METRICS
    if not path.exists():
        return 0
    return max((json.loads(line)["step"] for line in path.read_text().splitlines() if line.strip()), default=0)


def _training_process(launcher: subprocess.Popen) -> psutil.Process:
    for p in psutil.Process(launcher.pid).children(recursive=True):
        if "launch/train.py" in p.cmdline() and "deepspeed.launcher.launch" not in " ".join(p.cmdline()):
            return p
    raise RuntimeError("no training process under the launcher")


def run_case(work: Path, case: str, data: Path, own_hostnames: bool) -> dict:
    procs, run = start(work, case, data, own_hostnames)
    survivor = 1 if case == "node-a dies" else 0
    try:
        deadline = time.time() + 300
        while case != "unshared run.dir" and _logged_step(run) < 12:
            if time.time() > deadline or any(p.poll() is not None for p in procs):
                raise RuntimeError(f"{case}: the job did not reach step 12 (see {run.parent})")
            time.sleep(0.2)
        failed_at = time.time()
        if case in ("node-b dies", "node-a dies"):
            os.killpg(procs[1 - survivor].pid, signal.SIGKILL)
        elif case == "rank-b dies":
            os.kill(_training_process(procs[1]).pid, signal.SIGKILL)
        elif case == "node-b stops":
            os.killpg(procs[1].pid, signal.SIGSTOP)
        try:
            code = procs[survivor].wait(timeout=600)
        except subprocess.TimeoutExpired:
            code = "still running after 600 s"
        seconds = time.time() - failed_at
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    log = (run.parent / f"{NODES[survivor]}.log").read_text()
    lines = [line for line in log.splitlines() if line.strip() and not any(q in line for q in QUIET)
             and not line.startswith("     ")]
    return {"case": case, "survivor": NODES[survivor], "exit": code, "seconds": round(seconds, 1), "lines": lines}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", type=Path, default=Path("/tmp/hybrid-nmt-nodes"))
    p.add_argument("--own-hostnames", action="store_true", help="each node in its own UTS namespace (root)")
    p.add_argument("--cases", default="node-b dies,node-a dies,rank-b dies,node-b stops,unshared run.dir")
    args = p.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    data = prepare_tiny(args.work)
    results = [run_case(args.work, case, data, args.own_hostnames) for case in args.cases.split(",")]
    for r in results:
        print(f"=== {r['case']}: {r['survivor']}'s launcher exited {r['exit']} after {r['seconds']} s")
        print("\n".join(line[:400] for line in r["lines"]))
    (args.work / "node_failures.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
