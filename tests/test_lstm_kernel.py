"""model.lstm_kernel=stepwise (trainer/model/lstm.py) against torch's LSTM: outputs, final states and
every gradient, in float64 (where both must agree to rounding), for full, ragged, unsorted and empty
rows, and cut into time chunks with the state carried (the pipeline's wavefront)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from trainer.config import ConfigError, load_config
from trainer.model.lstm import run_stepwise
from trainer.model.lstm_stack import run_packed
from trainer.model.seq2seq import EncoderDecoderLayer


def _lstm(dtype=torch.float64, inp=5, hidden=7):
    torch.manual_seed(0)
    return torch.nn.LSTM(inp, hidden, batch_first=True).to(dtype)


def _grads(lstm, run, x, state):
    """Outputs, final state and the gradients of a random weighting of all three wrt x, state, weights."""
    leaves = [x, *state, *lstm.parameters()]
    for t in leaves:
        t.grad = None
    out, (h, c) = run(x, state)
    gen = torch.Generator().manual_seed(1)
    loss = sum((t * torch.randn(t.shape, generator=gen, dtype=t.dtype)).sum() for t in (out, h, c))
    loss.backward()
    return [out.detach(), h.detach(), c.detach()] + [t.grad.clone() if t.grad is not None else torch.zeros_like(t) for t in leaves]


def _inputs(batch=4, time=6, dtype=torch.float64):
    torch.manual_seed(2)
    x = torch.randn(batch, time, 5, dtype=dtype, requires_grad=True)
    state = tuple(torch.randn(1, batch, 7, dtype=dtype, requires_grad=True) for _ in range(2))
    return x, state


@pytest.mark.parametrize("lengths", [None, [6, 4, 4, 1], [3, 6, 0, 2], [0, 0, 0, 0], [2, 2, 2, 2]])
def test_stepwise_equals_torch_lstm_in_float64(lengths):
    lstm = _lstm()
    x, state = _inputs()
    lens = None if lengths is None else np.array(lengths)
    full = np.full(4, 6) if lens is None else lens
    got = _grads(lstm, lambda x, s: run_stepwise(lstm, x, lens, s), x, state)
    ref = _grads(lstm, lambda x, s: run_packed(lstm, x, full, s), x, state)
    for g, r in zip(got, ref):
        assert torch.allclose(g, r, rtol=0, atol=1e-12)
    if lens is not None:  # outputs past a row's end are zero
        for b, n in enumerate(lens):
            assert not got[0][b, n:].any()


def test_time_chunks_with_carried_state_equal_one_call():
    """Three chunks, each a separate call whose state is carried in, give one call's outputs and gradients."""
    lstm = _lstm()
    x, state = _inputs(time=7)
    lens = np.array([7, 5, 3, 1])

    def chunked(x, s):
        outs = []
        for a, b in ((0, 2), (2, 5), (5, 7)):
            o, s = run_stepwise(lstm, x[:, a:b], np.clip(lens - a, 0, b - a), s)
            outs.append(o)
        return torch.cat(outs, 1), s

    got = _grads(lstm, chunked, x, state)
    ref = _grads(lstm, lambda x, s: run_stepwise(lstm, x, lens, s), x, state)
    for g, r in zip(got, ref):
        assert torch.allclose(g, r, rtol=0, atol=1e-12)


def test_an_empty_time_chunk_passes_the_state_on():
    lstm = _lstm()
    x, state = _inputs(time=0)
    out, (h, c) = run_stepwise(lstm, x, np.zeros(4, dtype=np.int64), state)
    assert out.shape == (4, 0, 7) and torch.equal(h, state[0]) and torch.equal(c, state[1])


@pytest.mark.parametrize("kernel", ["fused", "stepwise"])
def test_an_empty_decoder_chunk_passes_the_state_on(kernel):
    pair = EncoderDecoderLayer(index=1, emb_dim=6, hidden=6, dropout=0.0, kernel=kernel)
    state = (torch.randn(1, 3, 6), torch.randn(1, 3, 6))
    out, (h, c) = pair.decode(torch.zeros(3, 0, 6), state)
    assert out.shape == (3, 0, 6) and torch.equal(h, state[0]) and torch.equal(c, state[1])


def test_bf16_stays_close_to_torch_lstm():
    lstm = _lstm(torch.bfloat16, 32, 32)
    torch.manual_seed(3)
    x = torch.randn(8, 12, 32, dtype=torch.bfloat16)
    with torch.no_grad():
        got, (h, c) = run_stepwise(lstm, x, None, None)
        ref, (rh, rc) = lstm(x)
    assert got.dtype == h.dtype == c.dtype == torch.bfloat16
    assert float((got.float() - ref.float()).abs().max()) < 0.02
    assert float((c.float() - rc.float()).abs().max()) < 0.05


def test_the_kernel_is_a_checked_config_key(tmp_path):
    assert load_config(None, ["model.lstm_kernel=stepwise"]).model.lstm_kernel == "stepwise"
    with pytest.raises(ConfigError, match="model.lstm_kernel"):
        load_config(None, ["model.lstm_kernel=cudnn"])


def test_a_stepwise_model_decodes_as_the_fused_one():
    """Inference builds the model from the run's config: beam search over a stepwise model (one step per
    call, no gradients) gives the fused model's hypotheses."""
    from trainer.model.search import beam_search
    from trainer.model.seq2seq import build_model

    src = torch.randint(4, 50, (3, 7))
    src[1, 5:] = 0
    src[2, 3:] = 0
    hyps = []
    for kernel in ("fused", "stepwise"):
        cfg = load_config(None, ["model.emb_dim=16", "model.hidden=16", "model.dropout=0",
                                 f"model.lstm_kernel={kernel}"])
        model = build_model(cfg.model, 50, 60, seed=1).eval()
        with torch.no_grad():
            hyps.append(beam_search(model, src, torch.tensor([7, 5, 3]), beam=3, max_len=10))
    assert hyps[0] == hyps[1]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_deferred_weight_gradients_equal_the_immediate_ones(dtype):
    """Under deferred_weight_grads the backward gives the same input and state gradients at once (bit for
    bit), no weight gradient, and queue.run() then adds the immediate backward's weight gradients, also
    on top of a gradient already there. Equal to rounding: one backward call sums the chunks' weight
    gradients before adding them, the queue adds them one by one (as the pipeline's one backward call
    per chunk does)."""
    from trainer.model.weight_grads import WeightGradQueue, deferred_weight_grads

    lstm = _lstm(dtype)
    lens = np.array([7, 5, 3, 1])

    def backward(defer: WeightGradQueue | None):
        x, state = _inputs(time=7, dtype=dtype)
        for p in lstm.parameters():
            p.grad = torch.ones_like(p)  # an earlier micro-batch's
        s, outs = state, []
        for a, b in ((0, 3), (3, 5), (5, 7)):
            out, s = run_stepwise(lstm, x[:, a:b], np.clip(lens - a, 0, b - a), s)
            outs.append(out)
        gen = torch.Generator().manual_seed(1)
        loss = sum((t * torch.randn(t.shape, generator=gen).to(dtype)).sum() for t in (*outs, *s))
        with deferred_weight_grads(defer):
            loss.backward()
        early = [x.grad.clone(), state[0].grad.clone(), state[1].grad.clone()]
        return early, [p.grad.clone() for p in lstm.parameters()]

    early_now, weights_now = backward(None)
    queue = WeightGradQueue()
    early_later, weights_before = backward(queue)
    assert len(queue) == 3 and all(torch.equal(w, torch.ones_like(w)) for w in weights_before)
    for a, b in zip(early_now, early_later):
        assert torch.equal(a, b)
    queue.run()
    assert len(queue) == 0
    for a, p in zip(weights_now, lstm.parameters()):
        assert p.grad.grad_fn is None
        assert torch.allclose(a, p.grad, rtol=0, atol=1e-12 if dtype == torch.float64 else 1e-6)


@pytest.mark.parametrize("dtype,hidden,chunked,stepwise", [
    (torch.bfloat16, 1024, False, True), (torch.float32, 1024, False, False), (torch.float32, 1024, True, True),
    (torch.bfloat16, 256, False, False), (torch.float32, 256, True, False), (torch.float64, 1024, False, False)])
def test_auto_runs_stepwise_only_where_it_was_measured_faster(monkeypatch, dtype, hidden, chunked, stepwise):
    """model.lstm_kernel=auto: stepwise on a CPU at hidden >= 1024 in bf16, or in fp32 when the layer is called
    in time chunks (docs/BENCHMARKS.md, the LSTM kernel chunk by chunk), torch's fused LSTM otherwise; decided
    per call from the input, so the same model runs either."""
    import trainer.model.seq2seq as seq2seq

    calls = []
    real = seq2seq.run_stepwise
    monkeypatch.setattr(seq2seq, "run_stepwise", lambda *a: calls.append(1) or real(*a))
    layer = EncoderDecoderLayer(index=1, emb_dim=8, hidden=hidden, dropout=0.0, kernel="auto",
                                time_chunked=chunked).to(dtype)
    x = torch.randn(2, 3, hidden, dtype=dtype)
    out, state = layer.encode(x, np.array([3, 2]))
    layer.decode(x, state)
    assert len(calls) == (2 if stepwise else 0)
    assert load_config(None, ["model.lstm_kernel=auto"]).model.lstm_kernel == "auto"


@pytest.mark.parametrize("time_chunks", [1, 2])
def test_a_time_chunked_layout_tells_its_layers_so(workers, tiny_data, tmp_path, time_chunks):
    """The rank module builds its LSTM layers knowing whether the layout calls them in time chunks, for
    model.lstm_kernel=auto; the model itself knows nothing of the layout. A real 2-rank hybrid job."""
    from tests.parallel_jobs import layers_time_chunked
    from tests.test_parallel_parity import MODEL, _ds

    layout = {"mode": "hybrid", "num_pp": 2, "num_dp": 1, "micro_batches": 1, "time_chunks": time_chunks}
    out = workers.run(2, layers_time_chunked, [f"data.dir={tiny_data}", *MODEL, "model.lstm_kernel=auto"],
                      _ds(13, layout), str(tmp_path / "run"))
    assert [len(flags) for flags in out] == [2, 2]
    assert all(flag == (time_chunks > 1) for flags in out for flag in flags)
