"""Files a run leaves and others read: the run directory's names and its one safe writer, the exported model
format (checkpoints: trainer.checkpoint). May import trainer.config, trainer.data, trainer.model.seq2seq."""
