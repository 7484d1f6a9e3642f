"""Rank 0 writes metrics.jsonl, wandb and the console progress bar; every other rank gets a no-op."""
from __future__ import annotations

import json
import math
import os


class NullLogger:
    def log(self, row: dict) -> None:
        pass

    def progress(self, step: int, row: dict) -> None:
        pass

    def message(self, text: str) -> None:
        pass

    def close(self) -> None:
        pass


class RunLogger(NullLogger):
    def __init__(self, run_dir: str, cfg, total_steps: int, start_step: int = 0):
        self.path = os.path.join(run_dir, "metrics.jsonl")
        self._file = open(self.path, "a", encoding="utf-8")
        self._wandb = _start_wandb(run_dir, cfg)
        self._bar = None
        if cfg.logging.progress:
            from tqdm import tqdm

            # disable=None: no bar when the console is not a terminal (logs stay readable)
            self._bar = tqdm(total=total_steps, initial=start_step, unit="step", dynamic_ncols=True, disable=None,
                             mininterval=1.0)

    def log(self, row: dict) -> None:
        # strict JSON: a non-finite value (a skipped step's loss) is written as null
        row = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()}
        self._file.write(json.dumps(row) + "\n")
        self._file.flush()
        if self._wandb is not None:
            self._wandb.log({k: v for k, v in row.items() if k != "step"}, step=row["step"])

    def progress(self, step: int, row: dict) -> None:
        if self._bar is not None:
            self._bar.n = step
            self._bar.set_postfix(loss=f"{row['loss']:.3f}", tok_s=f"{row['tokens_per_s']:.0f}", refresh=False)
            self._bar.refresh()

    def message(self, text: str) -> None:
        if self._bar is not None and not self._bar.disable:
            self._bar.write(text)
        else:
            print(text, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        self._file.close()
        if self._wandb is not None:
            self._wandb.finish()


def _start_wandb(run_dir: str, cfg):
    """wandb in the configured mode; 'online' without an API key falls back to offline (never asks)."""
    mode = cfg.logging.wandb_mode
    if mode == "disabled":
        return None
    if mode == "online" and not os.environ.get("WANDB_API_KEY"):
        mode = "offline"
    os.environ.setdefault("WANDB_SILENT", "true")
    import wandb
    from omegaconf import OmegaConf

    return wandb.init(project=cfg.logging.wandb_project, name=cfg.run.name or os.path.basename(run_dir),
                      dir=run_dir, mode=mode, config=OmegaConf.to_container(cfg, resolve=True))
