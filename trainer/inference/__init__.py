"""Text in, text out on one process: the translator, ensembles, averaging, export, forced scoring and the
translate/evaluate/score/export/average CLIs. Never imports trainer.training, trainer.parallel or
trainer.planner."""
