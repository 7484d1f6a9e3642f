"""Attentional LSTM encoder-decoder as a list of placeable layers plus a head.

Global layer indices (the unit of placement and of checkpoint files):

    0        Embeddings            token ids -> source/target embeddings
    1 .. L   EncoderDecoderLayer   encoder layer k and decoder layer k (k = index - 1); decoder k starts
                                   from encoder k's final state, so that hand-off never crosses ranks
    head     AttentionSoftmaxHead  Luong attention of the top decoder states over the top encoder
                                   states, tanh(W[c;h]), output projection, label-smoothed CE

There is no input feeding: the decoder runs over the whole target before the head, which sees all
target positions at once. That is what lets decoder layers be pipeline stages. Nothing here knows
about ranks; `trainer.parallel` places these modules and moves tensors between them.
"""
from __future__ import annotations

import functools

import torch
import torch.nn as nn

from data_prep.dataformat import PAD_ID
from trainer.model.tensors import round_count, to_device
from trainer.model.dropout import DropoutSlice, KeyedDropout
from trainer.model.lstm import auto_stepwise, run_stepwise
from trainer.model.lstm_stack import decode_stack, encode_stack, host_lengths, run_bulk_then_packed
from trainer.model.weight_grads import deferring

State = tuple[torch.Tensor, torch.Tensor]  # (h, c), each (1, batch, hidden)


class Embeddings(nn.Module):
    def __init__(self, *, src_vocab: int, tgt_vocab: int, emb_dim: int, dropout: float):
        super().__init__()
        self.src = nn.Embedding(src_vocab, emb_dim, padding_idx=PAD_ID)
        self.tgt = nn.Embedding(tgt_vocab, emb_dim, padding_idx=PAD_ID)
        self.src_dropout = KeyedDropout(dropout, site=SITE_EMB_SRC, side="src")
        self.tgt_dropout = KeyedDropout(dropout, site=SITE_EMB_TGT, side="tgt")
        for emb in (self.src, self.tgt):
            nn.init.normal_(emb.weight, std=emb_dim ** -0.5)
            with torch.no_grad():
                emb.weight[PAD_ID].zero_()

    def embed_src(self, src: torch.Tensor, masks: DropoutSlice | None = None) -> torch.Tensor:
        """(batch, src_len) ids -> (batch, src_len, emb). `masks`: where the batch sits in the global micro-batch
        (trainer.model.dropout; None: ordinary dropout), here and in every forward below."""
        return self.src_dropout(self.src(src), masks)

    def embed_tgt(self, tgt_in: torch.Tensor, masks: DropoutSlice | None = None) -> torch.Tensor:
        """(batch, tgt_len) ids -> (batch, tgt_len, emb)."""
        return self.tgt_dropout(self.tgt(tgt_in), masks)


class EncoderDecoderLayer(nn.Module):
    """Encoder LSTM layer k and decoder LSTM layer k (one placeable pair).

    The bottom layer (k = 0) may have a bidirectional encoder: each direction has hidden/2 units and
    their final states are concatenated to initialise the decoder.

    `residual`: each side's output is its input plus the LSTM's (dropped-out) output, in layers above the bottom
    one, whose input is as wide as their output (hidden). The add reads only this layer's own input, at the same
    rows and positions, so it holds in any placement and any cut of time. No parameters: checkpoints do not
    change. Such a layer is never one layer of a multi-layer LSTM call (`stackable`): the add sits between it
    and the layer below.
    """

    def __init__(self, *, index: int, emb_dim: int, hidden: int, dropout: float, bidirectional: bool = False,
                 kernel: str = "fused", time_chunked: bool = False, residual: bool = False):
        super().__init__()
        # model.lstm_kernel: "stepwise" runs unidirectional layers with trainer.model.lstm; "auto" decides
        # per call from the input's device and dtype and whether the layer is called in time chunks
        # (trainer.model.lstm.auto_stepwise)
        self.kernel = kernel
        self.time_chunked = time_chunked
        self.stack = True  # may be one layer of a multi-layer call (trainer.model.lstm_stack; train.stack_layers)
        in_dim = emb_dim if index == 0 else hidden
        if bidirectional and hidden % 2:
            raise ValueError(f"model.hidden={hidden} must be even for a bidirectional bottom layer")
        self.index = index
        self.bidirectional = bidirectional
        self.residual = bool(residual) and in_dim == hidden and index > 0
        self.encoder = nn.LSTM(in_dim, hidden // 2 if bidirectional else hidden, batch_first=True,
                               bidirectional=bidirectional)
        self.decoder = nn.LSTM(in_dim, hidden, batch_first=True)
        self.enc_dropout = KeyedDropout(dropout, site=SITE_PAIRS + 2 * index, side="src")
        self.dec_dropout = KeyedDropout(dropout, site=SITE_PAIRS + 2 * index + 1, side="tgt")
        for lstm in (self.encoder, self.decoder):
            for name, p in lstm.named_parameters():
                nn.init.uniform_(p, -0.1, 0.1)

    def encode(self, x: torch.Tensor, lengths, state: State | None = None, masks: DropoutSlice | None = None):
        """x (batch, src_len, in), lengths (batch,) of the valid prefix of each row (0 allowed; a host
        array, or a tensor read back to the host), state: carried from the previous time chunk (None at
        the start).

        Returns out (batch, src_len, hidden), zero at padded positions (a residual layer's input is the
        layer below's output, zero there too), and the state at each row's true end, shaped for the decoder:
        (1, batch, hidden) x 2 (both directions concatenated), or, for a bidirectional encoder, the raw
        per-direction state.
        """
        if self._stepwise(x) and not self.bidirectional:
            out, state = run_stepwise(self.encoder, x, host_lengths(lengths), state)
        else:
            out, state = run_bulk_then_packed(self.encoder, x, host_lengths(lengths), state)
        out = self.enc_dropout(out, masks)
        return (x + out if self.residual else out), state

    def _stepwise(self, x: torch.Tensor) -> bool:
        return self.kernel == "stepwise" or (self.kernel == "auto" and auto_stepwise(x, self.decoder.hidden_size,
                                                                                  self.time_chunked))

    def stackable(self, side: str, x: torch.Tensor) -> bool:
        """Can this layer's `side` ('enc' | 'dec') be one layer of a multi-layer call on input like `x`
        (trainer.model.lstm_stack): the fused kernel, one direction, no residual add below it."""
        return (self.stack and not self.residual and not self._stepwise(x)
                and (side == "dec" or not self.bidirectional))

    def drops(self, side: str) -> bool:
        """Is the dropout on this layer's `side` outputs active (training with p > 0)?"""
        drop = self.enc_dropout if side == "enc" else self.dec_dropout
        return drop.training and drop.p > 0

    def decoder_init(self, enc_state: State) -> State:
        """Encoder final state -> decoder initial state (1, batch, hidden) x 2."""
        if not self.bidirectional:
            return enc_state
        h, c = enc_state  # (2, batch, hidden/2)
        return (torch.cat([h[0], h[1]], dim=-1).unsqueeze(0), torch.cat([c[0], c[1]], dim=-1).unsqueeze(0))

    def decode(self, y: torch.Tensor, state: State, masks: DropoutSlice | None = None):
        """y (batch, tgt_len, in), state (1, batch, hidden) x 2 -> out (batch, tgt_len, hidden), state.

        Teacher-forced and causal: outputs at padded target positions are computed but never used.
        """
        if y.shape[1] == 0:  # an empty time chunk (more chunks than target steps)
            out = y.new_zeros(y.shape[0], 0, self.decoder.hidden_size)
        elif self._stepwise(y):
            out, state = run_stepwise(self.decoder, y, None, state)
        else:
            out, state = self.decoder(y, state)
        out = self.dec_dropout(out, masks)
        return (y + out if self.residual else out), state

    def forward(self, x: torch.Tensor, src_lengths: torch.Tensor, y: torch.Tensor):
        enc_out, enc_state = self.encode(x, src_lengths)
        dec_out, _ = self.decode(y, self.decoder_init(enc_state))
        return enc_out, dec_out


class AttentionSoftmaxHead(nn.Module):
    """Luong global attention + attentional layer + output projection + label-smoothed CE."""

    def __init__(self, *, hidden: int, tgt_vocab: int, attention: str, dropout: float,
                 label_smoothing: float, out_dim: int | None = None):
        super().__init__()
        if attention not in ("dot", "general", "concat"):
            raise ValueError(f"model.attention must be dot, general or concat, got {attention!r}")
        self.attention = attention
        self.label_smoothing = label_smoothing
        if attention == "general":
            self.w_a = nn.Linear(hidden, hidden, bias=False)
        elif attention == "concat":
            self.w_a = nn.Linear(2 * hidden, hidden, bias=False)
            self.v_a = nn.Linear(hidden, 1, bias=False)
        out_dim = out_dim or hidden
        self.w_c = nn.Linear(2 * hidden, out_dim, bias=False)
        self.proj = nn.Linear(out_dim, tgt_vocab)
        self.dropout = KeyedDropout(dropout, site=SITE_HEAD, side="tgt")
        # rows of logits the loss works on at a time (_chunked_loss): a few, in cache, on a CPU; on an
        # accelerator as many as possible (each chunk is ~15 launches); the caller sets it for its device
        self.loss_chunk_rows = LOSS_CHUNK_ROWS["cpu"]
        self.loss_projection = "chunked"  # or "whole" (_chunked_loss); the caller sets it (train.loss_projection)
        for p in self.parameters():
            nn.init.uniform_(p, -0.1, 0.1)

    def scores(self, enc: torch.Tensor, dec: torch.Tensor) -> torch.Tensor:
        """enc (batch, src_len, hidden), dec (batch, tgt_len, hidden) -> (batch, tgt_len, src_len)."""
        if self.attention == "dot":
            return dec @ enc.transpose(1, 2)
        if self.attention == "general":
            return self.w_a(dec) @ enc.transpose(1, 2)
        # concat: v^T tanh(W [h_t; h_s]) = v^T tanh(W_1 h_t + W_2 h_s)
        w_dec, w_enc = self.w_a.weight.split(enc.shape[-1], dim=1)
        e = torch.tanh((dec @ w_dec.t()).unsqueeze(2) + (enc @ w_enc.t()).unsqueeze(1))
        return self.v_a(e).squeeze(-1)

    def attention_weights(self, enc: torch.Tensor, src_mask: torch.Tensor, dec: torch.Tensor) -> torch.Tensor:
        """enc (batch, src_len, hidden), src_mask (batch, src_len) True at real tokens,
        dec (batch, tgt_len, hidden) -> attention weights (batch, tgt_len, src_len), rows sum to 1."""
        scores = self.scores(enc, dec).masked_fill(~src_mask.unsqueeze(1), float("-inf"))
        return torch.softmax(scores, dim=-1)

    def context(self, enc: torch.Tensor, src_mask: torch.Tensor, dec: torch.Tensor) -> torch.Tensor:
        """-> attention context (batch, tgt_len, hidden), arguments as `attention_weights`."""
        return self.attention_weights(enc, src_mask, dec) @ enc

    def attentional(self, context: torch.Tensor, dec: torch.Tensor, positions: torch.Tensor | None = None,
                    width: int = 0, masks: DropoutSlice | None = None) -> torch.Tensor:
        """tanh(W_c [c; h]) with dropout: (batch, tgt_len, hidden) x 2 -> (batch, tgt_len, out_dim), or
        (tokens, hidden) x 2 -> (tokens, out_dim) for the tokens at flat `positions` of a (batch, width)
        layout."""
        return self.dropout(torch.tanh(self.w_c(torch.cat([context, dec], dim=-1))), masks, positions, width)

    def logits(self, enc, src_mask, dec) -> torch.Tensor:
        """-> (batch, tgt_len, vocab)."""
        return self.logits_and_attention(enc, src_mask, dec)[0]

    def logits_and_attention(self, enc, src_mask, dec) -> tuple[torch.Tensor, torch.Tensor]:
        """-> logits (batch, tgt_len, vocab) and attention weights (batch, tgt_len, src_len), for decoding."""
        attn = self.attention_weights(enc, src_mask, dec)
        return self.proj(self.attentional(attn @ enc, dec)), attn

    def forward(self, enc: torch.Tensor, src_mask: torch.Tensor, dec: torch.Tensor, target: torch.Tensor,
                positions: torch.Tensor | None = None, masks: DropoutSlice | None = None):
        """target (batch, tgt_len) with PAD at padded positions. positions: flat indices (row * tgt_len +
        t) of the real target tokens plus a few padded ones that round their count (what
        `trainer.data.Batch.token_positions` gives, on the device); found from `target` when None,
        which reads the count back to the host.

        Returns (loss_sum, nll_sum): label-smoothed and plain cross-entropy summed over real target
        tokens. The caller divides by the token count of the whole (global) batch. The attentional
        layer, the projection and the softmax (most of the model's work) run on the selected tokens
        only.
        """
        if positions is None:
            positions = token_positions(target)
        keep = self.dropout.keyed_mask(masks, self.w_c.out_features, self.w_c.weight.dtype, positions, target.shape[1])
        return self.token_loss(enc, src_mask, dec, target, positions, keep)

    def token_loss(self, enc: torch.Tensor, src_mask: torch.Tensor, dec: torch.Tensor, target: torch.Tensor,
                   positions: torch.Tensor, keep: torch.Tensor | None):
        """`forward` once its dropout mask is drawn: `keep` (tokens, out_dim), scaled, or None (no keyed mask: none,
        or ordinary dropout). Tensors in, tensors out, no generator made: what train.compile_head compiles."""
        context = self.context(enc, src_mask, dec).flatten(0, 1).index_select(0, positions)
        hidden = torch.tanh(self.w_c(torch.cat([context, dec.flatten(0, 1).index_select(0, positions)], dim=-1)))
        hidden = hidden * keep if keep is not None else self.dropout(hidden)
        return projected_cross_entropy(hidden, self.proj.weight, self.proj.bias,
                                       target.flatten().index_select(0, positions), self.label_smoothing,
                                       self.loss_chunk_rows, self.loss_projection == "whole")


def token_positions(target: torch.Tensor, bits: int = 4) -> torch.Tensor:
    """Flat positions of the real tokens of `target` (batch, tgt_len), plus the first padded ones
    that round their count (trainer.data.round_count), on target's device. Reads the count back:
    for ad-hoc use; the trainer takes the positions from the batcher's host lengths."""
    keep = (target != PAD_ID).flatten()
    n = int(keep.sum())
    extra = round_count(n, bits) - n
    if extra:
        free = (~keep).nonzero().squeeze(1)[:extra]
        keep = keep.index_fill(0, free, True)
    return keep.nonzero().squeeze(1)


def projected_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, target: torch.Tensor,
                            eps: float, chunk: int = 128, whole: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(label-smoothed CE, NLL) of softmax(hidden @ weight^T + bias) against `target`, summed over tokens.

    hidden (tokens, out_dim), weight (vocab, out_dim), bias (vocab,), target (tokens,). Label smoothing
    as F.cross_entropy(label_smoothing=eps): (1 - eps) * nll + eps * (lse - mean(logits)). `chunk`, `whole`:
    how the work is cut (_chunked_loss), not what it computes.
    """
    if torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad or bias.requires_grad):
        return _ProjectedCrossEntropy.apply(hidden, weight, bias, target, eps, chunk, whole)
    loss, nll, _ = _chunked_loss(hidden, weight, bias, target, eps, grads=False, chunk=chunk)
    return loss, nll


def _chunked_loss(hidden, weight, bias, target, eps: float, grads: bool, chunk: int = 128, whole: bool = False):
    """The output projection and softmax over the vocabulary are most of the model's work, and with
    autograd most of that is elementwise passes over the (tokens, vocab) logits: the fp32 cast,
    log_softmax, its backward, the smoothing mean and its backward, the gather and its backward. Here
    each chunk of logits (on a CPU 128 x vocab: 4 MB of fp32 at 8k, in cache) takes five passes: max,
    shift (which also casts to fp32), exp, sum, and the gradient written in the parameters' dtype;
    the smoothing term's mean over the vocabulary is a matrix-vector product instead of a pass.
    `whole` (with `grads`): the logits of all rows come from one GEMM, written into the buffer that then holds
    their gradient, and each chunk's passes work in place on it. A GEMM per chunk packs the projection's weight
    again at each call: in fp32 on an AMD EPYC (864 rows of width 256 into 8k logits) four GEMMs of 256 rows took
    54.0 ms where one took 39.4 (1 thread; 27.8 against 20.8 with 2), while in bf16 they are about as fast
    (`python -m benchmarks.micro.loss_projection`, docs/BENCHMARKS.md), and the chunk's logits are still in
    cache for the passes. Which is faster is measured on the machine (train.loss_projection,
    trainer/training/tuning.py). Without `grads` (evaluation) every chunk has its own GEMM and no full-size
    buffer is held.
    Returns (loss, nll, d loss / d logits or None)."""
    vocab = weight.shape[0]
    real = (target != PAD_ID).to(torch.float32)  # 0 on rows added only to round the row count
    mean_logit = hidden.float() @ weight.float().mean(0) + bias.float().mean()  # (tokens,)
    loss = torch.zeros((), dtype=torch.float32, device=hidden.device)
    nll_sum = torch.zeros((), dtype=torch.float32, device=hidden.device)
    whole = whole and grads
    if whole:
        dlogits = torch.addmm(bias, hidden, weight.t())  # the logits, then (chunk by chunk, in place) their gradient
    else:
        dlogits = torch.empty(hidden.shape[0], vocab, dtype=hidden.dtype, device=hidden.device) if grads else None
    rows, b = hidden.shape[0], 0
    while b < rows:  # (not range(): under torch.compile a range over a dynamic size fixes it to one value)
        a, b = b, min(b + chunk, rows)
        logits = dlogits[a:b] if whole else torch.addmm(bias, hidden[a:b], weight.t())  # parameters' dtype
        t = target[a:b]
        top = logits.amax(dim=-1).float()
        # bf16 - fp32 promotes to fp32: the shift is also the cast
        shifted = logits.sub_(top.unsqueeze(1)) if logits.dtype == torch.float32 else logits - top.unsqueeze(1)
        target_logit = shifted.gather(1, t.unsqueeze(1)).squeeze(1)  # minus top
        z = shifted.exp_()
        total = z.sum(dim=-1)
        lse = top + total.log()
        w = real[a:b]
        nll = (lse - (target_logit + top)) * w
        nll_sum += nll.sum()
        loss += ((1.0 - eps) * nll + eps * (lse - mean_logit[a:b]) * w).sum() if eps else nll.sum()
        if grads:  # (softmax - eps / vocab - (1 - eps) * onehot) * w
            torch.addcmul((-eps / vocab * w).unsqueeze(1), z, (total.reciprocal() * w).unsqueeze(1), out=dlogits[a:b])
            dlogits[a:b][torch.arange(b - a, device=z.device), t] -= ((1.0 - eps) * w).to(dlogits.dtype)
    return loss, nll_sum, dlogits


class _ProjectedCrossEntropy(torch.autograd.Function):
    """The gradients are computed in the forward (the head always runs its backward right after);
    the backward only scales them by the incoming gradient of the loss. Under `deferred_weight_grads`
    (trainer.model.weight_grads) the projection's weight and bias gradients, one GEMM as large as the logits', are
    left to the queue: the forward keeps the logits' gradient and the hidden rows for it."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, target, eps: float, chunk: int, whole: bool):
        loss, nll_sum, dlogits = _chunked_loss(hidden, weight, bias, target, eps, grads=True, chunk=chunk, whole=whole)
        ctx.mark_non_differentiable(nll_sum)
        ctx.deferred = deferring()
        if ctx.deferred is not None:
            ctx.save_for_backward(dlogits @ weight)
            ctx.later = (weight, bias, dlogits, hidden.detach(), whole)
            return loss, nll_sum
        ctx.save_for_backward(dlogits @ weight, *_projection_grads(dlogits, hidden, whole))
        return loss, nll_sum

    @staticmethod
    def backward(ctx, grad_loss, grad_nll):
        if ctx.deferred is not None:
            (d_hidden,) = ctx.saved_tensors
            weight, bias, dlogits, hidden, whole = ctx.later
            g = grad_loss.to(d_hidden.dtype)
            ctx.deferred.add((weight, bias), functools.partial(_scaled_projection_grads, dlogits, hidden, g, whole))
            ctx.later = None
            return d_hidden * g, None, None, None, None, None, None
        d_hidden, d_weight, d_bias = ctx.saved_tensors
        g = grad_loss.to(d_hidden.dtype)
        return d_hidden * g, d_weight * g, d_bias * g, None, None, None, None


def _projection_grads(dlogits: torch.Tensor, hidden: torch.Tensor, whole: bool = False) -> tuple:
    """The projection's weight gradient (vocab, out_dim) and bias gradient (vocab,). Chunked: one GEMM against
    the hidden rows with a column of ones appended, the bias's gradient its last column. Whole: the GEMM and
    the column sums apart, because in fp32 an inner size of out_dim + 1 falls off the GEMM's blocking (256 + 1,
    1 thread, AMD EPYC: 60.1 ms against 40.3 for the GEMM and the sums), while in bf16 the one GEMM is about as
    fast (18.9 against 19.9; `python -m benchmarks.micro.loss_projection`)."""
    if whole:
        return dlogits.t() @ hidden, dlogits.sum(0)
    ones = torch.ones(hidden.shape[0], 1, dtype=hidden.dtype, device=hidden.device)
    d = dlogits.t() @ torch.cat([hidden, ones], 1)
    return d[:, :-1], d[:, -1]


def _scaled_projection_grads(dlogits: torch.Tensor, hidden: torch.Tensor, g: torch.Tensor, whole: bool) -> tuple:
    d_weight, d_bias = _projection_grads(dlogits, hidden, whole)
    return d_weight * g, d_bias * g


class Seq2Seq(nn.Module):
    """The whole model on one device: the composition of the placeable layers and the head.

    Used for single-process inference (beam search) and as the reference in parity tests.
    `layers()` lists the modules in global layer order.
    """

    def __init__(self, embeddings: Embeddings, pairs: list[EncoderDecoderLayer], head: AttentionSoftmaxHead):
        super().__init__()
        self.embeddings = embeddings
        self.pairs = nn.ModuleList(pairs)
        self.head = head

    def layers(self) -> list[nn.Module]:
        return [self.embeddings, *self.pairs]

    def encode(self, src: torch.Tensor, src_lengths: torch.Tensor):
        """-> top encoder states (batch, src_len, hidden) and per-layer decoder initial states."""
        x, states = encode_stack(list(self.pairs), self.embeddings.embed_src(src), src_lengths,
                                 [None] * len(self.pairs))
        return x, [pair.decoder_init(state) for pair, state in zip(self.pairs, states)]

    def decode(self, tgt_in: torch.Tensor, states: list[State]):
        """tgt_in (batch, tgt_len) -> top decoder states (batch, tgt_len, hidden), new states."""
        return decode_stack(list(self.pairs), self.embeddings.embed_tgt(tgt_in), states)

    def forward(self, src, src_lengths, tgt_in, tgt_out):
        """-> (loss_sum, nll_sum) over real target tokens."""
        enc, inits = self.encode(src, src_lengths)
        dec, _ = self.decode(tgt_in, inits)
        return self.head(enc, src != PAD_ID, dec, tgt_out)


def layer_builders(cfg, src_vocab: int, tgt_vocab: int, time_chunked: bool = False):
    """(class, kwargs) per global layer index, for the engine's LayerSpecs and for `build_model`;
    `time_chunked`: the layers will be called a time chunk at a time (for model.lstm_kernel=auto)."""
    specs = [(Embeddings, dict(src_vocab=src_vocab, tgt_vocab=tgt_vocab, emb_dim=cfg.emb_dim,
                               dropout=cfg.dropout))]
    for k in range(cfg.layers):
        specs.append((EncoderDecoderLayer, dict(index=k, emb_dim=cfg.emb_dim, hidden=cfg.hidden,
                                                dropout=cfg.dropout,
                                                bidirectional=bool(cfg.bidirectional_bottom and k == 0),
                                                kernel=cfg.lstm_kernel, time_chunked=time_chunked,
                                                residual=bool(cfg.residual))))
    return specs


def build_head(cfg, tgt_vocab: int) -> AttentionSoftmaxHead:
    return AttentionSoftmaxHead(hidden=cfg.hidden, tgt_vocab=tgt_vocab, attention=cfg.attention,
                                dropout=cfg.dropout, label_smoothing=cfg.label_smoothing,
                                out_dim=cfg.emb_dim if cfg.tie_embeddings else None)


def build_model(cfg, src_vocab: int, tgt_vocab: int, seed: int = 0) -> Seq2Seq:
    """The whole model, each layer seeded as the engine seeds it (seed + global index), so a
    single-process model and any parallel layout start from identical weights."""
    layers = []
    for idx, (cls, kwargs) in enumerate(layer_builders(cfg, src_vocab, tgt_vocab)):
        torch.manual_seed(seed + idx)
        layers.append(cls(**kwargs))
    torch.manual_seed(seed + HEAD_SEED_OFFSET)
    model = Seq2Seq(layers[0], layers[1:], build_head(cfg, tgt_vocab))
    if cfg.tie_embeddings:
        model.head.proj.weight = model.embeddings.tgt.weight
    return model


HEAD_SEED_OFFSET = 10_000
LOSS_CHUNK_ROWS = {"cpu": 128, "accelerator": 8192}  # AttentionSoftmaxHead.loss_chunk_rows by device
# dropout sites (trainer.model.dropout): the same numbers in every layout
SITE_EMB_SRC, SITE_EMB_TGT, SITE_PAIRS, SITE_HEAD = 0, 1, 2, 1_000
