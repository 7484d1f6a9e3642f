"""What one rank holds: its slice of the pair layers (a deepspeed.pipe PipelineModule built from
LayerSpecs, partitioned by the layout, each layer seeded by its global index) plus, where the layout
puts one, a replica of the attention-softmax head.

The head's weights are owned by the last stage: only there are they DeepSpeed parameters (in the
optimizer, in the gradient norm). In hybrid mode the other stages hold replicas outside the
optimizer: their gradients are summed into the owner over the pipe group before DeepSpeed's replica
all-reduce, and the owner broadcasts the updated weights after the step. The same traffic as an
all-reduce, one optimizer update instead of num_pp, and DeepSpeed's norm counts every weight once in
fp32, bf16 and fp16 alike (its bf16/fp16 norm ignores `ds_pipe_replicated` tags on gradients).
"""
from __future__ import annotations

import torch
import torch.nn as nn

from trainer.model.lstm_stack import cudnn_weight_groups, flatten_for_cudnn
from trainer.model.seq2seq import HEAD_SEED_OFFSET, EncoderDecoderLayer, build_head, layer_builders
from trainer.parallel import deepspeed_adapter as dsa
from trainer.parallel.layout import LayoutError, LayoutSpec


class RankModule(nn.Module):
    """This rank's layers (`stages`) and its head (or None). `owns_head`: the head's weights here are
    the trained ones (last stage); elsewhere the head is a replica."""

    def __init__(self, stages: nn.Module, head: nn.Module | None, owns_head: bool):
        super().__init__()
        self.stages = stages
        self.head = head
        self.owns_head = owns_head
        self.first_layer = dsa.local_start(stages)  # global index of layers[0]
        self.layers = dsa.local_layers(stages)

    def pack_lstm_weights(self, stacked: bool) -> str:
        """On CUDA, each group of LSTM weights its calls read together in one buffer of cuDNN's layout
        (trainer.model.lstm_stack.flatten_for_cudnn): `stacked` when the layers of a side are called as one stack
        (no dropout between them). Call once the engine has cast and placed the weights, and not under ZeRO
        (its own flat buffer holds them). Returns a line for the log."""
        groups = cudnn_weight_groups([m for m in self.layers if isinstance(m, EncoderDecoderLayer)], stacked)
        done = [len(g) for g in groups if flatten_for_cudnn(g)]
        if not done:
            return "weights as built (no cuDNN buffer: not on CUDA, or cuDNN refused the dtype)"
        return f"weights in {len(done)} cuDNN buffer(s) of {'/'.join(map(str, done))} layer(s), read in place"

    def optimizer_parameters(self) -> list[nn.Parameter]:
        """What DeepSpeed's optimizer updates: everything but a head replica."""
        if self.owns_head or self.head is None:
            return list(self.parameters())
        replica = {id(p) for p in self.head.parameters()}
        return [p for p in self.parameters() if id(p) not in replica]


def build_rank_module(model_cfg, spec: LayoutSpec, stage: int, src_vocab: int, tgt_vocab: int,
                      seed: int) -> RankModule:
    try:
        builders = layer_builders(model_cfg, src_vocab, tgt_vocab, time_chunked=spec.time_chunks > 1)
        stages = dsa.build_stages(builders, num_pp=spec.num_pp, num_dp=spec.num_dp,
                                  partition_method=spec.partition_method, seed=seed, seed_fn=_seed_layer,
                                  must_hold=EncoderDecoderLayer)
    except dsa.StageError as e:
        raise LayoutError(str(e)) from None
    if dsa.stage_id(stages) != stage:
        raise RuntimeError(f"PipelineModule placed this rank at stage {dsa.stage_id(stages)}, the layout at {stage}")
    head = None
    if spec.head_parallel or stage == spec.num_pp - 1:
        torch.manual_seed(seed + HEAD_SEED_OFFSET)
        head = build_head(model_cfg, tgt_vocab)
        if model_cfg.tie_embeddings:
            head.proj.weight = dsa.local_layers(stages)[0].tgt.weight
    owns_head = stage == spec.num_pp - 1
    if spec.num_pp > 1:
        # The global gradient norm sums over the pipeline's stages; DeepSpeed's fp32 clip_grad_norm_
        # counts a parameter on stage 0 only unless it is tagged `model_parallel`. Stage layers and
        # the owned head are distinct per stage; head replicas have no gradient at the step.
        for p in stages.parameters():
            p.model_parallel = True
        if owns_head:
            for p in head.parameters():
                p.model_parallel = True
    return RankModule(stages, head, owns_head)


def _seed_layer(seed) -> None:
    """Layer k is built after manual_seed(seed + k) in every layout (partitioners hand numpy ints)."""
    torch.manual_seed(int(seed))
