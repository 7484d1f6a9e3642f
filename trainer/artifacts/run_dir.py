"""The run directory's contract: the names of the files a training run writes into `run.dir` and that
translation, export, plotting and resuming read. Names users' scripts rely on; change none of them. Every module
takes them from here (tests/test_run_dir.py fails on one typed elsewhere).

    config.yaml          the resolved YAML config            ds_config.json    the DeepSpeed JSON
    data_manifest.json   DATA_DIR/manifest.json as trained   spm.src/tgt.model the SentencePiece models
    metrics.jsonl        one row per logged step             checkpoints/      step_N/, best, latest
    timing/ timeline/ profile/   per-rank timing, traces     train.lock        the running trainer
    wandb_run_id         the wandb run a resume continues    wandb/            wandb's own files
"""
from __future__ import annotations

import os

from data_prep.dataformat import SPM_MODELS, OutputDirError, check_output_dir, files, json_marker

CKPT_DIR = "checkpoints"  # step_N/ (the format: trainer.checkpoint.files) and the pointers:
LATEST, BEST = "latest", "best"  # ... the newest complete checkpoint, the best by dev BLEU
CONFIG = "config.yaml"
DS_CONFIG = "ds_config.json"
DATA_MANIFEST = "data_manifest.json"  # the data's manifest (DATA_DIR/manifest.json) as the run trained on it
METRICS = "metrics.jsonl"
RUN_FILES = (SPM_MODELS["src"], SPM_MODELS["tgt"])  # copied from DATA_DIR: the run translates on its own
WANDB_RUN_ID = "wandb_run_id"
LOCK_FILE = "train.lock"  # held by the running trainer (trainer.artifacts.run_files)
TIMING_DIR, TIMELINE_DIR, PROFILE_DIR, WANDB_DIR = "timing", "timeline", "profile", "wandb"
TIMELINE_TRACE = "trace.json"  # TIMELINE_DIR/: the sampled steps' trace (trainer.observe.timeline)
PLOT = "training.png"  # launch/plot.py
TEST_HYP = "test.hyp"  # launch/quickstart.sh's translations of the test set

def timeline_png(step: int) -> str:
    """TIMELINE_DIR/'s Gantt chart of a sampled step."""
    return f"step_{step:08d}.png"


def rank_file(rank: int) -> str:
    """TIMING_DIR/'s and PROFILE_DIR/'s file of one rank."""
    return f"rank{rank}.json"


# What the trainer writes into run.dir: files at the top, and directories -> the names it writes inside
# (fnmatch patterns); none of them may be a link or a special file (trainer.artifacts.run_files).
RUN_DIR_FILES = (CONFIG, DS_CONFIG, DATA_MANIFEST, DATA_MANIFEST + ".tmp", *RUN_FILES, METRICS, METRICS + ".tmp",
                 WANDB_RUN_ID, LOCK_FILE)
RUN_DIR_DIRS = {CKPT_DIR: (LATEST, BEST, "*.tmp"), TIMING_DIR: ("*",), TIMELINE_DIR: ("*",), PROFILE_DIR: ("*",),
                WANDB_DIR: ()}
# ... and its tools (fnmatch patterns; the file layer's temporary names, which a killed write leaves); the data
# manifest, written first, marks a directory as an earlier run's.
RUN_DIR_NAMES = (*RUN_DIR_FILES, *RUN_DIR_DIRS, PLOT, TEST_HYP, files.TEMP_PATTERN)
RUN_DIR_MARKER = DATA_MANIFEST


def check_new_run_dir(run_dir: str, overwrite: bool) -> None:
    """A new run writes only into a new or empty run.dir, or an earlier run's own (never into a directory
    holding files the trainer did not write, unless run.overwrite=true); its old metrics are dropped."""
    if os.path.exists(run_dir) and not os.path.isdir(run_dir):
        raise OutputDirError(f"run.dir={run_dir}: exists and is not a directory")
    check_output_dir(run_dir, owned=RUN_DIR_NAMES, marker=RUN_DIR_MARKER, is_marker_ours=json_marker(["checksum"]),
                     overwrite=overwrite, flag="run.overwrite=true", program="the trainer",
                     leftovers=[LOCK_FILE])
    metrics = os.path.join(run_dir, METRICS)
    if os.path.isfile(metrics) and not os.path.islink(metrics):
        os.remove(metrics)  # an earlier run's rows (it saved no checkpoint): this run starts the file anew
