"""Files a run leaves and others read: checkpoints and their checksums, the run directory's names and its
one safe writer, the exported model format. May import trainer.config, trainer.data, trainer.model.seq2seq."""
