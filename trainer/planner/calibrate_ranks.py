"""The parts of the calibration that need more than the bare layers: DeepSpeed's optimizer step and the
schedule's interpreter (a world of one in this process, built by trainer.training.build.Build as a run is:
`world_of_one`, closed by the caller), the slowdown of a component while a second process computes (a
spawned background process), and gloo transfers between two ranks (two spawned processes talking
through ParallelRuntime's verbs, as the trainer does)."""
from __future__ import annotations

import multiprocessing as mp
import os
import statistics
import time

import torch

from trainer.parallel.ports import free_port
from trainer.planner.timing import dtype_of, timed_ms

COMPONENTS = ("lstm", "head", "embedding", "mask", "copy", "optimizer", "step")
PHASES = 3  # contention: alone, then beside a second process, in turn this many times
STEP_ROWS, STEP_LEN = 64, 12  # "step": a whole training step of the model on a batch of this many pairs and tokens


def world_of_one(cfg):
    """This process as a world of one, its runtime started by a trainer.training.build.Build (the one place runs
    are built): `optimizer_points` and `interpreter_runs` take their engines and runners from it. Close it
    (`Build.close`) once they are done."""
    from trainer.parallel.layout import LayoutSpec
    from trainer.training.build import Build

    build = Build(cfg, _ds_config("bf16"), LayoutSpec("single", 1, 1))
    build.start_runtime()
    return build


def _ds_config(precision: str) -> dict:
    from trainer.config import REPO_ROOT
    from trainer.parallel.deepspeed_json import load_ds_config

    ds = load_ds_config(os.path.join(REPO_ROOT, "ds_configs", "single.json"), max_steps=1000)
    ds["bf16"] = {"enabled": precision == "bf16"}
    ds.pop("parallel_layout", None)
    return ds


def optimizer_points(build, cfg, dims, precision: str, threads: int, quick: bool) -> dict:
    """DeepSpeed's step (the trainer's engine, clipping on, from `build`: world_of_one) for modules of several
    sizes: [[params, tensors, ms]]; and the cost of engine.backward around a trivial autograd call."""
    from trainer.model.seq2seq import build_model

    torch.set_num_threads(threads)
    model = build_model(cfg.model, dims.src_vocab, dims.tgt_vocab)
    sets = [model, model.head, model.pairs, model.pairs[0]] if not quick else [model]
    points, backward_ms = [], 0.0
    reps = 2 if quick else 5
    for module in sets:
        module = module if isinstance(module, torch.nn.Module) else torch.nn.ModuleList(module)
        params = [p for p in module.parameters()]
        engine = build.engine_for(module, params, _ds_config(precision))

        def grads():
            for p in engine.module.parameters():
                p.grad = torch.randn_like(p) * 1e-3
        points.append([sum(p.numel() for p in params), len(params), timed_ms(lambda _: engine.step(boundary=True), reps, setup=grads)])
        if module is model:
            x = torch.zeros(4, requires_grad=True, dtype=next(engine.module.parameters()).dtype)
            plain = timed_ms(lambda: (x * 2).sum().backward(), reps * 4)
            wrapped = timed_ms(lambda: engine.backward((x * 2).sum()), reps * 4)
            backward_ms = round(max(0.0, wrapped - plain), 5)
    return {"points": points, "backward_ms": backward_ms}


# ---- contention: the same component in a second process ----
def component(name: str, model_cfg: dict, src_vocab: int, tgt_vocab: int, precision: str):
    """A zero-argument callable running one representative piece of `name`."""
    from omegaconf import OmegaConf

    from trainer.model.dropout import keep_mask
    from trainer.model.seq2seq import build_head
    from trainer.planner.shapes import ModelDims

    cfg = OmegaConf.create(model_cfg)
    dims = ModelDims.build(cfg, src_vocab, tgt_vocab)
    dtype = dtype_of(precision)
    torch.manual_seed(0)
    rows, steps = 32, 16
    if name == "lstm":
        lstm = torch.nn.LSTM(dims.hidden, dims.hidden, batch_first=True).to(dtype)
        x = torch.randn(rows, steps, dims.hidden, dtype=dtype, requires_grad=True)
        return lambda: lstm(x)[0].sum().backward()
    if name == "head":
        head = build_head(cfg, tgt_vocab).to(dtype)
        enc = torch.randn(rows, steps, dims.hidden, dtype=dtype, requires_grad=True)
        dec = torch.randn(rows, steps, dims.hidden, dtype=dtype, requires_grad=True)
        mask, target = torch.ones(rows, steps, dtype=torch.bool), torch.randint(4, tgt_vocab, (rows, steps))
        return lambda: head(enc, mask, dec, target)[0].backward()
    if name == "embedding":
        table = torch.nn.Embedding(src_vocab, dims.emb).to(dtype)
        ids = torch.randint(4, src_vocab, (rows, steps))
        return lambda: table(ids).sum().backward()
    if name == "mask":
        return lambda: keep_mask((rows, steps, dims.hidden * 4), 0.8, 7).to(dtype)
    if name == "copy":
        src, dst = torch.randn(1 << 21), torch.empty(1 << 21)
        return lambda: dst.copy_(src)
    if name == "step":
        return _model_step(cfg, src_vocab, tgt_vocab, dtype)
    params = [torch.nn.Parameter(torch.randn(n)) for n in (1 << 20, 1 << 20, 1 << 18)]
    for p in params:
        p.grad = torch.randn_like(p)
    opt = torch.optim.Adam(params, fused=True)
    return opt.step


def _model_step(cfg, src_vocab: int, tgt_vocab: int, dtype):
    """One training step of the whole model in one process (forward, the head's loss, backward, Adam): what the
    ceiling of `python -m benchmarks.scaling --goals` runs twice at once, here without the trainer around it."""
    from trainer.model.seq2seq import build_model

    model = build_model(cfg, src_vocab, tgt_vocab).to(dtype)
    opt = torch.optim.Adam(model.parameters(), fused=True)
    src = torch.randint(4, src_vocab, (STEP_ROWS, STEP_LEN))
    tgt = torch.randint(4, tgt_vocab, (STEP_ROWS, STEP_LEN))
    lengths = torch.full((STEP_ROWS,), STEP_LEN)

    def step():
        loss, _ = model(src, lengths, tgt, tgt)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step


def _burner(conn, model_cfg, src_vocab, tgt_vocab, precision, running) -> None:
    """The background process: runs each component it is sent while `running` is set."""
    torch.set_num_threads(1)
    while True:
        name = conn.recv()
        if name is None:
            return
        fn = component(name, model_cfg, src_vocab, tgt_vocab, precision)
        fn()
        conn.send("ready")
        while running.is_set():
            fn()
        conn.send("stopped")


def contention(cfg, dims, precision: str, quick: bool) -> dict:
    """{component: time while a second process runs the same component / time alone} (1 thread each); "step": a
    whole training step of the model, the ceiling's measurement (two single-process runs at once)."""
    from omegaconf import OmegaConf

    model_cfg = OmegaConf.to_container(cfg.model)
    ctx = mp.get_context("spawn")
    torch.set_num_threads(1)
    reps = 2 if quick else 5
    parent, child = ctx.Pipe()
    running = ctx.Event()
    proc = ctx.Process(target=_burner, args=(child, model_cfg, dims.src_vocab, dims.tgt_vocab, precision, running),
                       daemon=True)
    proc.start()
    out = {}
    try:
        for name in COMPONENTS:
            fn = component(name, model_cfg, dims.src_vocab, dims.tgt_vocab, precision)
            # alone and shared in turn, PHASES times each, the median of each phase's medians: a machine
            # whose speed drifts (a shared VM) moves both sides alike instead of one
            alone, shared = [], []
            for _ in range(PHASES):
                alone.append(timed_ms(fn, reps, warmup=3))
                running.set()
                parent.send(name)
                if not parent.poll(600) or parent.recv() != "ready":
                    raise RuntimeError(f"calibration: the background process did not start {name}")
                shared.append(timed_ms(fn, reps, warmup=3))
                running.clear()
                parent.recv()
            out[name] = round(max(1.0, statistics.median(shared) / statistics.median(alone)), 4)
        parent.send(None)
    finally:
        running.clear()
        proc.join(30)
        if proc.is_alive():
            proc.kill()
    return out


# ---- gloo between two ranks ----
def _transfer_rank(rank: int, port: int, config: dict, sizes: list, reps: int, results) -> None:
    """One of the two ranks: a runtime started by a Build (the one place runs are built) from the run's `config`."""
    os.environ.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), LOCAL_SIZE="2",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    from omegaconf import OmegaConf

    from trainer.parallel.layout import LayoutSpec
    from trainer.training.build import Build

    try:
        build = Build(OmegaConf.create(config), {}, LayoutSpec("hybrid", 2, 1))
        rt = build.start_runtime()
        comm = rt.stage_comm(torch.float32)
        peer = 1 - rank
        out = {"p2p": [], "all_reduce": [], "all_reduce_bf16": [], "reduce": [], "broadcast": []}
        for nbytes in sizes:
            t, t16 = torch.ones(nbytes // 4), torch.ones(nbytes // 2, dtype=torch.bfloat16)
            post, rtt = [], []
            for i in range(reps + 2):
                rt.barrier()
                start = time.perf_counter()
                if rank == 0:
                    comm.send_forward(t, peer)
                    posted = time.perf_counter()
                    comm.recv_backward(t.shape, peer)
                else:
                    comm.recv_forward(t.shape, peer)
                    comm.send_backward(t, peer)
                end = time.perf_counter()
                comm.flush()
                if i >= 2:
                    rtt.append(end - start)
                    post.append(posted - start if rank == 0 else 0.0)
            out["p2p"].append([nbytes, 1000 * sorted(rtt)[len(rtt) // 2] / 2, 1000 * sorted(post)[len(post) // 2]])
            # all_reduce: the verb of the replicas' gradient sums (shared memory on one CPU host, else gloo), in
            # both precisions' gradient dtype (the same bytes: a bf16 sum adds twice the elements, each slower)
            for name, run in (("all_reduce", lambda: rt.all_reduce_async([t.clone()], group="world").wait()),
                              ("all_reduce_bf16", lambda: rt.all_reduce_async([t16.clone()], group="world").wait()),
                              ("reduce", lambda: rt.reduce_async([t.clone()], dst=1, group="pipe").wait()),
                              ("broadcast", lambda: rt.broadcast_async([t.clone()], src=1, group="pipe").wait())):
                times, cpu = [], []  # wall, and this process's CPU time (every thread: gloo's does the work)
                for i in range(reps + 2):
                    rt.barrier()
                    start, start_cpu = time.perf_counter(), time.process_time()
                    run()
                    if i >= 2:
                        times.append(time.perf_counter() - start)
                        cpu.append(time.process_time() - start_cpu)
                out[name].append([nbytes, 1000 * sorted(times)[len(times) // 2], 1000 * sorted(cpu)[len(cpu) // 2]])
        if rank == 0:
            results.put(("ok", out))
        build.close()
    except BaseException as e:  # noqa: BLE001 - reported to the parent, which fails with it
        results.put(("error", f"rank {rank}: {type(e).__name__}: {e}"))


def transfers(cfg, quick: bool) -> dict:
    """p2p [[bytes, one-way ms, sender's posting ms]], all_reduce (fp32) / all_reduce_bf16 / reduce / broadcast
    [[bytes, ms, rank 0's CPU ms]], between two ranks started as `cfg`'s run starts them."""
    from omegaconf import OmegaConf

    config = OmegaConf.to_container(cfg)
    sizes = [1 << 10, 1 << 16] if quick else [1 << 10, 1 << 14, 1 << 17, 1 << 20, 1 << 23]
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_transfer_rank, args=(r, port, config, sizes, 3 if quick else 15, results), daemon=True)
             for r in range(2)]
    for p in procs:
        p.start()
    try:
        status, value = results.get(timeout=600)
    finally:
        for p in procs:
            p.join(60)
            if p.is_alive():
                p.kill()
    if status != "ok":
        raise RuntimeError(f"calibration: gloo transfers failed: {value}")
    return value


# ---- the interpreter itself, one rank ----
def interpreter_runs(build, cfg, dims, precision: str, threads: int, batches: list, settings: list) -> list:
    """Real micro-steps of the trainer's StepRunner on this process's world of one (`build`: world_of_one), each
    (micro_batches, time_chunks) of `settings`: [{"units", "chunks", "ops": {op: [seconds, count]}}]
    over `batches` (after one warm-up batch). What the interpreter adds to the layers is read off
    these against the layer tables (calibrate.interpreter_overhead)."""
    from trainer.parallel.layout import LayoutSpec

    torch.set_num_threads(threads)
    module, engine, _ = build.model_parts({"src_size": dims.src_vocab, "tgt_size": dims.tgt_vocab},
                                          _ds_config(precision))
    if module.head is not None:  # as the layer tables' head (calibrate.head_points), in the engine's dtype
        from trainer.training import tuning

        tuning.configure_head(module.head, cfg.train, torch.device("cpu"))
    out = []
    for units, chunks in settings:
        spec = LayoutSpec("single", 1, 1, micro_batches=units, time_chunks=chunks)
        runner = build.runner_for(module, engine, spec)
        ops: dict = {}
        for i, batch in enumerate([batches[0], *batches]):
            runner.restart_op_seconds()
            runner.step([batch], key=(cfg.train.seed, i + 1))
            if i == 0:
                continue
            for ins in runner.programs[True]:
                ops.setdefault(ins.op, [0.0, 0])[1] += 1
            for op, seconds in runner.op_seconds.items():
                ops[op][0] += seconds
        out.append({"units": units, "chunks": chunks, "ops": ops})
    return out
