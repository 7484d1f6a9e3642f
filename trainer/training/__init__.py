"""A training run: its parts built once (build.py) and handed by name to the loop (loop.py): step, validate, save,
stop; run.dir opened (start.py), stop checks (stopping.py), what a run measures (watch.py), dev validation, faults,
job control and the train CLI. Checkpoints are trainer.checkpoint's: the loop asks its Checkpointer to save and
restore and knows no checkpoint file. May import everything but launch/ and benchmarks/."""
