"""Watching a run: the metrics log and wandb, the timeline, the step profiler, op/sync counting, plots.
May import trainer.artifacts (to write into run.dir) and trainer.parallel.schedule (op kinds), not training."""
