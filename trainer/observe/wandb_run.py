"""The run's wandb side (rank 0): a service process no launcher's kill reaches, and one wandb run across
resumes.

wandb logs through a service process (wandb-core) that it starts as a child of the calling process.
When DeepSpeed's launcher is signalled (Ctrl-C, a scheduler's SIGTERM) it SIGTERMs every rank and every
process below the ranks, so the service died while rank 0 was still saving: rank 0 failed in wandb with
a ConnectionResetError, and the offline run kept only the rows of the service's last flush. Here the
service is started by a short-lived helper process, in wandb's detached mode and a session of its own,
so that its parent is init, not the rank; rank 0 connects to it (WANDB_SERVICE) and finishes the run
through it. The service closes the run's files once it has the finish (killing it right after
`finish()` returns would lose them), and ends itself when no client has been connected for
IDLE_TIMEOUT: after rank 0 is gone, however it went.

The wandb run id is kept in RUN_DIR/wandb_run_id; a resumed run continues that wandb run (offline: a new
`offline-run-*-ID` folder per segment, which `wandb sync` uploads into the one run, in order).
"""
from __future__ import annotations

import os
import re
import secrets
import string
import subprocess
import sys

from data_prep.dataformat import files
from trainer.artifacts import run_files
from trainer.config import WANDB_OFF
from trainer.artifacts.run_dir import WANDB_RUN_ID as ID_FILE
IDLE_TIMEOUT = "30s"  # also the longest wait between the service's start and rank 0's connection
_ID = re.compile(r"^[a-z0-9]{1,64}$")
# The helper: wandb's own detached start (wandb.sdk.lib.service.service_process.start_detached, wandb 0.31);
# prints the connection token and the service's pid, then exits, so the service is left to init.
_HELPER = ("import psutil\n"
           "from wandb.sdk.lib.service import service_process\n"
           "from wandb.sdk.wandb_settings import Settings\n"
           f"service = service_process.start_detached(Settings(), idle_timeout={IDLE_TIMEOUT!r})\n"
           "print(service.token.env_value, psutil.Process().children()[0].pid, flush=True)\n")


class Service:
    """A wandb-core process outside this process's tree (it ends itself, see IDLE_TIMEOUT)."""

    def __init__(self, token: str, pid: int):
        self.token, self.pid = token, pid

    @classmethod
    def start(cls) -> "Service | None":
        """None when the helper fails (said on stderr; wandb then starts its own service, as a child)."""
        out = None
        try:
            out = subprocess.run([sys.executable, "-c", _HELPER], capture_output=True, text=True, timeout=120,
                                 stdin=subprocess.DEVNULL, start_new_session=True)
            token, pid = out.stdout.split()
            return cls(token, int(pid))
        except (OSError, ValueError, subprocess.SubprocessError) as e:
            why = (out.stderr.strip().splitlines() or [""])[-1] if out is not None else str(e)
            print(f"wandb: its service could not be started outside the job ({why[:200]}); wandb starts its own, "
                  f"which a signal to the job can end before the run's last rows", file=sys.stderr, flush=True)
            return None


def run_id(run_dir: str, resumed: bool) -> str:
    """The wandb run id of this run: the one in RUN_DIR/wandb_run_id when resuming (a new one for a run
    that has none), a new one for a new run; written back to the file."""
    path = os.path.join(run_dir, ID_FILE)
    found = None
    if resumed and os.path.lexists(path):
        text = files.read_bytes(path, 256, "the wandb run id").decode("utf-8", "replace").strip()
        found = text if _ID.match(text) else None
    rid = found or "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(8))
    if rid != found:
        run_files.write_text(run_dir, ID_FILE, rid + "\n")
    return rid


def start(run_dir: str, cfg, extra_config: dict, resumed: bool):
    """wandb in the configured mode ('online' without an API key falls back to offline, never asks), on a
    detached service; returns (run, service) or (None, None) when disabled."""
    mode = cfg.logging.wandb_mode
    if mode in WANDB_OFF:
        return None, None
    if mode == "online" and not os.environ.get("WANDB_API_KEY"):
        mode = "offline"
    os.environ.setdefault("WANDB_SILENT", "true")
    import wandb
    from omegaconf import OmegaConf

    service = None if os.environ.get("WANDB_SERVICE") else Service.start()
    if service is not None:
        os.environ["WANDB_SERVICE"] = service.token
    config = {**OmegaConf.to_container(cfg, resolve=True), **extra_config}
    run = wandb.init(project=cfg.logging.wandb_project, name=cfg.run.name or os.path.basename(run_dir),
                     dir=run_dir, mode=mode, config=config, id=run_id(run_dir, resumed), resume="allow")
    return run, service


def finish(run, service) -> str | None:
    """Finish the run (every row written); returns the `wandb sync` command of an offline run (every
    segment of it: a resumed run has one folder per segment)."""
    offline = run.settings.mode == "offline"
    files_dir, rid = run.dir, run.id
    run.finish()
    if service is not None:
        os.environ.pop("WANDB_SERVICE", None)
    if not offline:
        return None
    import glob

    runs = os.path.dirname(os.path.dirname(files_dir))  # RUN_DIR/wandb/offline-run-*-ID/files -> RUN_DIR/wandb
    segments = sorted(glob.glob(os.path.join(glob.escape(runs), f"offline-run-*-{rid}")))
    return "wandb sync " + " ".join(segments or [os.path.dirname(files_dir)])
