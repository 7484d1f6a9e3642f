"""The model as plain torch: the layers and the head (seq2seq), keyed dropout, decoding search, model FLOPs,
and the two tensor helpers the step needs (tensors). Knows nothing of ranks, files or runs; imports nothing of
the project but data_prep.dataformat."""
