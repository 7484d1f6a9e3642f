"""A training run: the session built once, the loop, its state, checkpoints written and resumed, dev
validation, faults, job control and the train CLI. May import everything but launch/ and benchmarks/."""
