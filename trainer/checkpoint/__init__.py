"""Checkpointing as one component: the file format (`files`: names, checksums, pointers, verify), the TrainState and
RNG (`state`), optimizer state by global layer and parameter name (`optimizer`), the collective write and the ranks'
agreement (`collective`), structure checks before anything is loaded (`structure`), which checkpoint a run resumes
from and whether it fits (`resume`), and the `Checkpointer` the training loop asks to save and restore.

Exported models (trainer.artifacts.model_files, trainer.inference.loading) read the same format through `files`,
which imports nothing but trainer.artifacts: importing it never reaches the runtime. This package may import
trainer.artifacts and trainer.parallel.layout (the layout a checkpoint was written in); the ranks' verbs come with
the runtime object it is given."""
