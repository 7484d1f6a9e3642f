"""A checkpoint that verifies but does not fit is refused before anything is copied (issue 30 part A item 5).

Each variant alters one file of a real checkpoint (written by the trainer on one rank of the in-process harness)
and rewrites its manifest so that the checksums pass, as a buggy tool or a careless hand would; the Checkpointer's
restore must then fail with one line naming the file and the tensor or key, and leave the model's weights as
they were. The classes: a tensor of another shape, another dtype, a missing key, a value of the wrong type (a
non-dict where a dict is expected, a string for a number). A clean copy of the same checkpoint restores."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from tests.conftest import REPO, launch_main
from tests.test_run_faults import ds_single, train  # noqa: F401 (ds_single: a fixture of the CLI test below)

OPTIM, RNG, WEIGHTS, STATE = "layer_01-optim_states.pt", "rng-rank_00.pt", "layer_01-model_states.pt", "train_state.json"
MODEL = ["model.layers=2", "model.emb_dim=16", "model.hidden=16", "model.dropout=0.1", "train.seed=7",
         "data.min_batch_sentences=8"]


def _edit_torch(ckpt: str, name: str, change) -> None:
    path = os.path.join(ckpt, name)
    obj = torch.load(path, weights_only=True)
    obj = change(obj)
    torch.save(obj, path)


def _first(entries: dict) -> dict:
    return entries[sorted(entries)[0]]


def _edit_entry(change):
    def edit(parts):
        change(_first(parts))
        return parts
    return edit


def _edit_json(ckpt: str, change) -> None:
    path = os.path.join(ckpt, STATE)
    with open(path) as f:
        data = json.load(f)
    with open(path, "w") as f:
        json.dump(change(data), f)


def _set(key, value):
    def change(d):
        d[key] = value
        return d
    return change


def _drop(key):
    def change(d):
        del d[key]
        return d
    return change


# name -> (how the checkpoint is altered, the file the error names, what else the error says)
VARIANTS = {
    "exp_avg of one element": (lambda c: _edit_torch(c, OPTIM, _edit_entry(_set("exp_avg", torch.zeros(1)))),
                               OPTIM, "exp_avg has shape (1,), the parameter has"),
    "optimizer key missing": (lambda c: _edit_torch(c, OPTIM, _edit_entry(_drop("exp_avg_sq"))),
                              OPTIM, "has no 'exp_avg_sq'"),
    "optimizer state in another dtype": (lambda c: _edit_torch(c, OPTIM, _edit_entry(
        lambda e: e.update(exp_avg=e["exp_avg"].double()))), OPTIM, "exp_avg has dtype torch.float64"),
    "optimizer entry not a dict": (lambda c: _edit_torch(c, OPTIM, lambda parts: {
        k: (torch.zeros(2) if k == sorted(parts)[0] else v) for k, v in parts.items()}), OPTIM,
        "is a Tensor, expected {state key: tensor}"),
    "optimizer file not a dict": (lambda c: _edit_torch(c, OPTIM, lambda parts: list(parts)), OPTIM,
                                  "expected {parameter name: optimizer state}, found list"),
    "optimizer parameter missing": (lambda c: _edit_torch(c, OPTIM, lambda parts: {
        k: v for k, v in parts.items() if k != sorted(parts)[0]}), OPTIM, "no optimizer state for layer_01."),
    "rng key missing": (lambda c: _edit_torch(c, RNG, _drop("numpy")), RNG, "no 'numpy' RNG state"),
    "rng not a dict": (lambda c: _edit_torch(c, RNG, lambda s: [1, 2, 3]), RNG, "expected {generator: state}"),
    "rng of another dtype": (lambda c: _edit_torch(c, RNG, _set("torch", torch.zeros(3))), RNG,
                             "torch has dtype torch.float32, expected a 1-D torch.uint8 tensor"),
    "weights of an integer dtype": (lambda c: _edit_torch(c, WEIGHTS, lambda s: {
        k: (v.long() if k == sorted(s)[0] else v) for k, v in s.items()}), WEIGHTS, "has dtype torch.int64"),
    "weights not a tensor": (lambda c: _edit_torch(c, WEIGHTS, lambda s: {
        k: ([1.0] if k == sorted(s)[0] else v) for k, v in s.items()}), WEIGHTS, "is a list, expected a tensor"),
    "step is a string": (lambda c: _edit_json(c, _set("step", "1")), STATE, "'step' is '1', expected an integer"),
    "train state key missing": (lambda c: _edit_json(c, _drop("optimizer")), STATE, "no 'optimizer'"),
    "stream not a dict": (lambda c: _edit_json(c, _set("stream", [0, 1])), STATE,
                          "'stream' is [0, 1], expected an object"),
    "train state not an object": (lambda c: _edit_json(c, lambda d: [d]), STATE, "expected a JSON object"),
    "state keys not a list": (lambda c: _edit_json(c, lambda d: {**d, "optimizer": {**d["optimizer"],
                                                                                    "state_keys": "exp_avg"}}),
                              STATE, "optimizer.state_keys is 'exp_avg', expected a list of names"),
    "lr scheduler of another kind": (lambda c: _edit_json(c, _set("lr_scheduler", {})), STATE,
                                     "lr_scheduler has no 'last_batch_iteration'"),
    "a layer beyond the model": (lambda c: shutil.copy(os.path.join(c, WEIGHTS), os.path.join(c, "layer_03-model_states.pt")),
                                 "layer_03-model_states.pt", "a layer this run's model does not have (it has model.layers=2"),
}


def rewrite_manifest(ckpt: str) -> None:
    """Checksums that pass again: what a tool that rewrites files and their manifest leaves."""
    files = {}
    for name in sorted(os.listdir(ckpt)):
        if name != "manifest.json":
            data = open(os.path.join(ckpt, name), "rb").read()
            files[name] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    manifest = os.path.join(ckpt, "manifest.json")
    with open(manifest) as f:
        head = json.load(f)
    with open(manifest, "w") as f:
        json.dump({**head, "files": files}, f)


def restore_variants(overrides: list[str], ds: dict, work: str, names: list[str]) -> dict:
    """Harness job (one rank): save step 1, take step 2, then restore each altered copy of step 1; every
    restore's error (None if it loaded), whether the copy verified, whether step 2's weights were left alone,
    and whether a clean copy restores step 1's weights."""
    from tests.parallel_jobs import _trainer
    from trainer.checkpoint import files
    from trainer.checkpoint.checkpointer import CheckpointError

    trainer = _trainer(overrides, ds, work)
    trainer.train_step()
    trainer.save()
    saved = [p.detach().clone() for p in trainer.module.parameters()]
    trainer.train_step()
    now = [p.detach().clone() for p in trainer.module.parameters()]
    ckpt = os.path.join(work, "run", "checkpoints", "step_00000001")
    out = {"errors": {}, "verified": {}}
    for i, name in enumerate(names):
        copy = os.path.join(work, f"variant_{i}")
        shutil.copytree(ckpt, copy)
        VARIANTS[name][0](copy)
        rewrite_manifest(copy)
        out["verified"][name] = files.verify(copy) == []
        try:
            trainer.checkpointer.restore(copy)
            out["errors"][name] = None
        except CheckpointError as e:
            out["errors"][name] = str(e)
    params = list(trainer.module.parameters())
    out["untouched"] = all(torch.equal(a, p.detach()) for a, p in zip(now, params))
    state, _ = trainer.checkpointer.restore(ckpt)
    out["clean_step"] = state.step
    out["clean_restored"] = all(torch.equal(a, p.detach()) for a, p in zip(saved, params))
    trainer.runner.sync_head()
    trainer.log.close()
    trainer.rt.close()
    return out


def _ds() -> dict:
    ds = json.loads((REPO / "ds_configs" / "single.json").read_text())
    ds.update(train_micro_batch_size_per_gpu=13, parallel_layout={"mode": "single"})
    return ds


@pytest.fixture(scope="module")
def restored(workers, tiny_data, tmp_path_factory):
    work = tmp_path_factory.mktemp("structure")
    return workers.run(1, restore_variants, [f"data.dir={tiny_data}", *MODEL, "logging.wandb_mode=disabled"],
                       _ds(), str(work), sorted(VARIANTS))[0]


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_a_checkpoint_that_verifies_but_does_not_fit_is_one_line_naming_the_file(restored, name):
    _, file, said = VARIANTS[name]
    assert restored["verified"][name], "the altered copy must pass its checksums for this test to mean something"
    error = restored["errors"][name]
    assert error is not None, f"{name}: restored without complaint"
    assert "\n" not in error and f"/{file}: " in error and said in error, error


def test_nothing_was_copied_from_a_refused_checkpoint_and_a_clean_one_restores(restored):
    assert restored["untouched"]
    assert restored["clean_step"] == 1 and restored["clean_restored"]


@pytest.mark.slow
def test_the_trainer_refuses_an_exp_avg_of_one_element_in_one_line(tiny_data, tmp_path, ds_single):
    """Through the CLI: the probe that once trained on silently (copy_ broadcast the element into every shape)."""
    run = tmp_path / "run"
    train(tiny_data, run, ds_single, "train.max_steps=2")
    ckpt = str(run / "checkpoints" / "step_00000002")
    VARIANTS["exp_avg of one element"][0](ckpt)
    rewrite_manifest(ckpt)
    proc = train(tiny_data, run, ds_single, "train.max_steps=4", "train.resume=auto", check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    error = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(error) == 1 and f"/{OPTIM}: " in error[0] and "exp_avg has shape (1,)" in error[0], error


# ---- issue 42, item 7: every entry point that loads a checkpoint checks its structure the same way ---------------

def _deeper_checkpoint_into(run: Path, tmp_path: Path) -> str:
    """`run`'s checkpoint replaced by one of a model with one more pair layer (same vocabularies, sizes and
    manifest format): it verifies, and every layer the run's model reads fits."""
    from tests.test_hostile import fake_run, step_dir

    deep = fake_run(tmp_path / "deep", layers=2)
    shutil.rmtree(step_dir(run))
    shutil.copytree(step_dir(deep), step_dir(run))
    return str(step_dir(run) / "layer_02-model_states.pt")


def _entry_points(run: Path, tmp_path: Path) -> dict:
    text = tmp_path / "in.txt"
    text.write_text("the cat sees the tree\n")
    out = tmp_path / "out"
    return {"translate": ["--run", run, "--input", text, "--output", out],
            "evaluate": ["--run", run, "--src", text, "--ref", text],
            "score": ["--run", run, "--src", text, "--ref", text, "--output", out],
            "export": ["--run", run, "--out", tmp_path / "model.pt"],
            "average": ["--run", run, "--checkpoints", "best", "--out", tmp_path / "model.pt"]}


def _refused_everywhere(run: Path, tmp_path: Path, capsys, said: str) -> None:
    for script, argv in _entry_points(run, tmp_path).items():
        code, _, err = launch_main(script, argv, capsys)
        assert code == 2 and err.count("\n") == 1 and said in err, (script, err)
        assert not (tmp_path / "out").exists() and not (tmp_path / "model.pt").exists(), script


def test_a_checkpoint_of_a_deeper_model_is_refused_by_every_entry_point(tmp_path, capsys):
    """A verifying checkpoint of a 2-pair-layer model given to a 1-layer run: translate, evaluate, score, export
    and average dropped layer_02 without a word (resume refused it); now each names the file (the resume's side:
    VARIANTS["a layer beyond the model"])."""
    from tests.test_hostile import fake_run

    run = fake_run(tmp_path / "run")
    for script, argv in _entry_points(run, tmp_path).items():  # the same commands load the run's own checkpoint
        assert launch_main(script, argv, capsys)[0] == 0, script
        for name in ("out", "model.pt"):
            (tmp_path / name).unlink(missing_ok=True)
    extra = _deeper_checkpoint_into(run, tmp_path)
    _refused_everywhere(run, tmp_path, capsys, f"{extra}: a layer the run's config (model.emb_dim=8, model.hidden=8, "
                                               f"model.layers=1,")


@pytest.mark.parametrize("change,said", [
    (lambda s: {k: (v.long() if i == 0 else v) for i, (k, v) in enumerate(s.items())}, "has dtype torch.int64, the "
                                                                                         "run's config"),
    (lambda s: {k: v for i, (k, v) in enumerate(s.items()) if i}, ", which the run's config (model.emb_dim=8"),
    (lambda s: {**s, "extra.weight": torch.zeros(2)}, "holds extra.weight, which the run's config"),
])
def test_a_layer_file_that_does_not_fit_is_refused_by_every_entry_point(tmp_path, capsys, change, said):
    from tests.test_hostile import fake_run, step_dir

    run = fake_run(tmp_path / "run")
    path = step_dir(run) / "layer_01-model_states.pt"
    torch.save(change(torch.load(path, weights_only=True)), path)
    rewrite_manifest(str(step_dir(run)))
    _refused_everywhere(run, tmp_path, capsys, f"{path}: ")
    _refused_everywhere(run, tmp_path, capsys, said)


def test_weights_of_another_floating_dtype_load(tmp_path):
    """fp64 (or bf16) weights load into the fp32 model: a run may change its precision, and the values fit."""
    from tests.test_hostile import fake_run, step_dir
    from trainer.inference.loading import load_run

    run = fake_run(tmp_path / "run")
    path = step_dir(run) / "layer_01-model_states.pt"
    torch.save({k: v.double() for k, v in torch.load(path, weights_only=True).items()}, path)
    rewrite_manifest(str(step_dir(run)))
    assert load_run(str(run)).translate(["the cat"], beam=1)
