"""Issue 22, items 2, 5, 6 and 18: the two config files agree on one schedule length, a dry run checks what a run
checks, overrides stand anywhere on the command line, every key can be listed with its help, and values the
checks used to let through (an empty or a bare-string layout, an unknown optimizer, an infinite learning rate,
100000 threads, a negative seed or time budget, NaN lengths) are one line naming the key, exit code 2."""
from __future__ import annotations

import json
import logging
import sys

import pytest

from tests.conftest import REPO, launch_main, launch_module, run_cli
from trainer.config import ConfigError, check_threads, load_config
from trainer.ds_config import DSConfigError
from trainer.parallel.deepspeed_json import load_ds_config
from trainer.parallel.layout import LayoutError, LayoutSpec


def _train_cli():
    """launch/train.py's main, imported without running it (its __main__ block re-executes the process)."""
    return launch_module("train").main


def _ds(tmp_path, change=None, name="ds.json") -> str:
    ds = json.loads((REPO / "ds_configs" / "hybrid_2.json").read_text())
    if change:
        change(ds)
    path = tmp_path / name
    path.write_text(json.dumps(ds))
    return str(path)


# ---- item 2: one schedule length ---------------------------------------------------------------------------

def test_the_schedule_length_comes_from_the_yaml_and_a_different_one_in_the_json_is_refused(tmp_path):
    plain = _ds(tmp_path, name="plain.json")
    assert load_ds_config(plain, 200)["scheduler"]["params"]["total_num_steps"] == 200
    stated = _ds(tmp_path, lambda d: d["scheduler"]["params"].update(total_num_steps=3000), "stated.json")
    with pytest.raises(DSConfigError, match=r"total_num_steps=3000 but train.max_steps=200: .*drop total_num_steps"):
        load_ds_config(stated, 200)
    assert load_ds_config(stated, 3000)["scheduler"]["params"]["total_num_steps"] == 3000  # the same number: fine
    # a run that stops early and continues later names its schedule in the YAML
    from trainer.training.build import plan

    cfg = load_config(None, ["train.max_steps=20", "train.schedule_steps=30"])
    ds, _ = plan(cfg, plain, world=2)
    assert ds["scheduler"]["params"]["total_num_steps"] == 30
    with pytest.raises(DSConfigError, match="total_num_steps=3000 but train.schedule_steps=30"):
        plan(cfg, stated, world=2)
    with pytest.raises(ConfigError, match="train.schedule_steps=10 < train.max_steps=20"):
        load_config(None, ["train.max_steps=20", "train.schedule_steps=10"])


def test_the_planners_written_config_states_no_schedule_length(tmp_path):
    from trainer.planner.candidates import Candidate
    from trainer.planner.plan import winner_config, write_config

    base = load_ds_config(_ds(tmp_path), 3000)  # as the planner held it: completed from the YAML at plan time
    winner = Candidate(LayoutSpec("hybrid", 2, 1), 2, 1)
    out = tmp_path / "best.json"
    write_config(str(out), winner_config(base, winner, 64), 2)
    written = json.loads(out.read_text())
    assert "total_num_steps" not in written["scheduler"]["params"]
    assert load_ds_config(str(out), 200)["scheduler"]["params"]["total_num_steps"] == 200  # decays over the run


@pytest.mark.slow
def test_a_written_config_trained_to_its_end_decays(tiny_data, tmp_path):
    """plan --write-config, then train the file with another train.max_steps: the learning rate ends decayed."""
    from tests.test_planner import _tiny_cfg, _tiny_profile
    from trainer.planner.cli import main

    base = json.loads((REPO / "ds_configs" / "single.json").read_text())
    base["scheduler"]["params"]["warmup_num_steps"] = 2  # past the warm-up within the run
    (tmp_path / "base.json").write_text(json.dumps(base))
    out = tmp_path / "best.json"
    main(["--devices", "1", "--profile", str(_tiny_profile(tmp_path, tiny_data)), "--steps", "1",
          "--deepspeed_config", str(tmp_path / "base.json"), "--write-config", str(out),
          *_tiny_cfg(tiny_data), "train.max_steps=3000"])
    run = tmp_path / "run"
    run_cli([sys.executable, "launch/train.py", "--deepspeed_config", out, *_tiny_cfg(tiny_data), f"run.dir={run}",
             "train.max_steps=6", "train.log_every=1", "train.eval_every=100", "train.threads=1",
             "decode.dev_max_sentences=4", "logging.wandb_mode=disabled", "logging.progress=false"], timeout=300)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    peak = json.loads(out.read_text())["scheduler"]["params"]["warmup_max_lr"]
    print(f"written config, train.max_steps=6: lr {[r['lr'] for r in rows]} (peak {peak})")
    # warm-up over 2 steps, then linear decay that reaches 0 at step 6 (with the copied 3000 it stayed at the peak)
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]
    assert [r["lr"] for r in rows] == pytest.approx([0, peak / 2, peak, 0.75 * peak, 0.5 * peak, 0.25 * peak])


# ---- item 5: a dry run checks what a run checks; DeepSpeed's warning once, in our words -------------------

def test_dry_run_refuses_what_the_real_run_refuses():
    from trainer.training.cli import run_dry

    with pytest.raises(LayoutError, match=r"num_pp=4: more pipeline stages than model.layers=2"):
        run_dry(None, [], str(REPO / "ds_configs" / "hybrid_4.json"))  # the default YAML: 2 pair layers
    assert run_dry(None, ["model.layers=4"], str(REPO / "ds_configs" / "hybrid_4.json")) == 0
    with pytest.raises(LayoutError, match="data.min_batch_sentences=8: the layout needs at least 16"):
        run_dry(None, ["model.layers=4"], _ds_micro(16))


def _ds_micro(units: int) -> str:
    import tempfile

    ds = json.loads((REPO / "ds_configs" / "hybrid_2.json").read_text())
    ds["parallel_layout"]["micro_batches"] = units
    path = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False)
    path.write(json.dumps(ds))
    path.close()
    return path.name


def test_deepspeeds_per_rank_schedule_warning_is_dropped():
    from trainer.parallel import deepspeed_adapter as dsa

    dsa.set_verbose(False)
    seen = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())
    logger = logging.getLogger("DeepSpeed")
    logger.addHandler(handler)
    try:
        logger.warning("total_num_steps 20 is less than warmup_num_steps 100")
        logger.warning("something that matters")
    finally:
        logger.removeHandler(handler)
    assert seen == ["something that matters"]


def test_the_readme_says_how_to_keep_deepspeeds_launcher_from_probing_for_a_gpu():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert "DS_ACCELERATOR=cpu" in readme


# ---- item 6: overrides anywhere, text keys, --print-config, errors that name the fix ----------------------

def test_overrides_may_stand_anywhere_on_the_command_line(capsys):
    main = _train_cli()
    code = main(["--deepspeed_config", str(REPO / "ds_configs" / "hybrid_2.json"), "train.max_steps=7",
                 "--config", str(REPO / "trainer" / "configs" / "demo.yaml"), "model.layers=2", "--dry-run"])
    assert code == 0 and "mode=hybrid num_pp=2" in capsys.readouterr().out
    main(["model.hidden=96", "--print-config", "--config", str(REPO / "trainer" / "configs" / "demo.yaml"),
          "train.max_steps=7"])
    out = capsys.readouterr().out
    assert "hidden: 96" in out and "max_steps: 7" in out


def test_print_config_lists_every_key_with_its_help(capsys):
    from trainer.config import Config, describe

    cfg = load_config(None, ["logging.wandb_mode=off"])
    text = describe(cfg)
    import dataclasses

    for section in dataclasses.fields(Config):
        assert f"\n{section.name}:\n" in f"\n{text}"
        for f in dataclasses.fields(section.default_factory):
            line = next(x for x in text.splitlines() if x.startswith(f"  {f.name}:"))
            assert "#" in line and len(line.split("#", 1)[1].strip()) > 5, line  # every key explains itself
    assert "wandb_mode: 'off'" in text
    # it is a loadable config: the same values come back
    import io

    from omegaconf import OmegaConf

    loaded = OmegaConf.to_container(OmegaConf.load(io.StringIO(text)))
    assert loaded == OmegaConf.to_container(cfg) and loaded["train"]["max_steps"] == 1500  # demo.yaml's


def test_text_keys_take_the_word_typed(tmp_path):
    cfg = load_config(None, ["logging.wandb_mode=off", "run.name=no", "train.resume=''"])
    assert (cfg.logging.wandb_mode, cfg.run.name, cfg.train.resume) == ("off", "no", "")
    assert load_config(None, ["logging.progress=off"]).logging.progress is False  # a boolean key stays one
    yaml = tmp_path / "c.yaml"
    yaml.write_text("logging:\n  wandb_mode: off\n")
    with pytest.raises(ConfigError, match=r"logging.wandb_mode: YAML reads this value as false .* quote it"):
        load_config(str(yaml))
    yaml.write_text("logging:\n  wandb_mode: \"off\"\n")
    assert load_config(str(yaml)).logging.wandb_mode == "off"


def test_wandb_off_starts_no_wandb(tmp_path):
    from trainer.observe import wandb_run

    assert wandb_run.start(str(tmp_path), load_config(None, ["logging.wandb_mode=off"]), {}, False) == (None, None)


def test_the_environments_wandb_mode_is_the_default_a_config_or_override_decides_over(tmp_path, monkeypatch):
    """A wandb user's WANDB_MODE is obeyed (it was ignored: the key's default, offline, always won), below a
    config file and an override; a value wandb does not know is refused naming the variable, where wandb would
    start."""
    from trainer.config import check_wandb_environment
    monkeypatch.delenv("WANDB_MODE", raising=False)
    assert load_config(None).logging.wandb_mode == "offline"
    for env, mode in (("disabled", "disabled"), ("online", "online"), ("dryrun", "offline"), (" Offline ", "offline")):
        monkeypatch.setenv("WANDB_MODE", env)
        assert load_config(None).logging.wandb_mode == mode, env
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert load_config(None, ["logging.wandb_mode=offline"]).logging.wandb_mode == "offline"
    yaml = tmp_path / "c.yaml"
    yaml.write_text("logging:\n  wandb_mode: online\n")
    assert load_config(str(yaml)).logging.wandb_mode == "online"
    monkeypatch.setenv("WANDB_MODE", "sometimes")  # wandb's own refusal is a traceback once the job runs
    cfg = load_config(None)
    assert cfg.logging.wandb_mode == "offline"  # (a run's saved config loads for translate whatever the variable)
    with pytest.raises(ConfigError, match=r"^environment variable WANDB_MODE='sometimes': must be online, offline or "
                                          r"disabled \(or unset; logging.wandb_mode=disabled leaves wandb out\)$"):
        check_wandb_environment(cfg)
    check_wandb_environment(load_config(None, ["logging.wandb_mode=disabled"]))


def test_too_few_pairs_for_a_batch_names_data_min_batch_sentences(tiny_data):
    from trainer.data import BatchStream, ParallelData

    data = ParallelData(str(tiny_data), "dev")
    stream = BatchStream(data, max_sentences=64, max_tokens=0, seed=1, bucket_batches=10, min_batch=len(data) + 1)
    with pytest.raises(ValueError, match=rf"data.min_batch_sentences={len(data) + 1}; the dev split holds "
                                         rf"{len(data)} pairs\): lower data.min_batch_sentences"):
        stream.next()


def test_a_parapat_file_of_another_pair_says_to_name_the_languages(tmp_path, capsys):
    from data_prep.prepare import main

    cs_en = REPO.parent / "shared" / "data" / "parapat_samples" / "cs-en.type1.tsv"
    if not cs_en.exists():
        pytest.skip(f"{cs_en}: the shared data is not beside the checkout")
    assert main(["--train-src", str(cs_en), "--out", str(tmp_path / "d")]) != 0
    err = capsys.readouterr().err
    assert "other_pair: 4" in err and "--src-lang cs --tgt-lang en" in err and "(the defaults are en, ja)" in err


# ---- item 18: values the checks let through ----------------------------------------------------------------

@pytest.mark.parametrize("section,expected", [
    ([], r"parallel_layout=\[\]: must be an object"),
    ("hybrid", r'parallel_layout="hybrid": must be an object'),
    ({"mode": "hybrid", "num_dp": 0}, "parallel_layout.num_dp=0: must be an integer >= 1"),
    ({"mode": "hybrid", "num_pp": "2"}, r'parallel_layout.num_pp="2": must be an integer >= 1'),
    ({"mode": ["hybrid"]}, "parallel_layout.mode=.*unknown mode"),
])
def test_a_layout_of_the_wrong_shape_names_the_key(tmp_path, section, expected):
    with pytest.raises(LayoutError, match=expected):
        LayoutSpec.from_ds_config({"parallel_layout": section}, 2)
    from trainer.training.cli import run_dry

    path = _ds(tmp_path, lambda d: d.__setitem__("parallel_layout", section))
    with pytest.raises(LayoutError, match=expected.split(":")[0]):  # the dry run (world from the JSON) too
        run_dry(None, [], path)


@pytest.mark.parametrize("change,expected", [
    (lambda d: d["optimizer"].__setitem__("type", "Adamm"), 'optimizer.type="Adamm": not an optimizer DeepSpeed knows'),
    (lambda d: d["scheduler"].__setitem__("type", "Cosine"), 'scheduler.type="Cosine": not a scheduler DeepSpeed knows'),
    (lambda d: d["optimizer"]["params"].__setitem__("lr", float("inf")), "optimizer.params.lr=Infinity: must be a finite"),
    (lambda d: d.__setitem__("gradient_clipping", float("nan")), "gradient_clipping=NaN: must be a finite"),
])
def test_the_deepspeed_json_is_refused_before_the_model_is_built(tmp_path, change, expected):
    with pytest.raises(DSConfigError, match=expected):
        load_ds_config(_ds(tmp_path, change), 100)
    # names DeepSpeed accepts still pass: its own (any case) and torch's
    cosine = {"type": "WarmupCosineLR", "params": {"warmup_num_steps": 10, "warmup_min_ratio": 0.0}}  # its own params
    ok = _ds(tmp_path, lambda d: (d["optimizer"].__setitem__("type", "adamw"), d.__setitem__("scheduler", cosine)),
             "ok.json")
    assert load_ds_config(ok, 100)["scheduler"]["params"]["total_num_steps"] == 100


@pytest.mark.parametrize("override,expected", [
    ("train.max_time_min=-5", r"train.max_time_min=-5.0: must be >= 0 \(minutes of training; 0 = no limit\)"),
    ("train.seed=-1", r"train.seed=-1: must be in 0 .. 4294967295"),
    ("train.seed=99999999999999999999", "train.seed"),
    ("decode.max_len_ratio=nan", "decode.max_len_ratio=nan: must be a finite number"),
    ("decode.max_len_ratio=-3", "decode.max_len_ratio=-3.0: must be > 0"),
    ("decode.length_penalty=inf", "decode.length_penalty=inf: must be a finite number"),
    ("train.max_time_min=inf", "train.max_time_min=inf: must be a finite number"),
    ("model.residual=maybe", r"model.residual': Value 'maybe' is not a valid bool"),
])
def test_config_values_name_the_key_and_the_problem(override, expected):
    with pytest.raises(ConfigError, match=expected):
        load_config(None, [override])


def test_residual_layers_refuse_to_be_stacked_into_one_lstm_call_and_auto_runs_them_by_layer():
    """model.residual adds a layer's input to its output, between every two layers: train.stack_layers=on (one
    multi-layer call) is refused naming both keys; auto and off load, and auto resolves to a call per layer even
    where it would stack (fp32 on CUDA)."""
    import torch

    from trainer.training.tuning import stack_layers

    with pytest.raises(ConfigError, match=r"train.stack_layers=on with model.residual=true: .* use auto or off"):
        load_config(None, ["model.residual=true", "train.stack_layers=on"])
    for mode in ("auto", "off"):
        assert load_config(None, ["model.residual=true", f"train.stack_layers={mode}"]).model.residual is True
    assert stack_layers("auto", torch.device("cuda"), "fp32") == (True, "train.stack_layers=auto: stacked for fp32 "
                                                                         "on cuda")
    stacked, why = stack_layers("auto", torch.device("cuda"), "fp32", residual=True)
    assert not stacked and "by layer (model.residual" in why


BOMB = ("[&a [x, x, x, x, x, x, x, x, x, x], &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a], "
        "&c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b], [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c]]")


@pytest.mark.parametrize("overrides,expected", [  # issue 42 item 7: an override is read as strictly as a file
    (["train.max_steps=1", "train.max_steps=100000"],
     r"override 'train.max_steps=100000': train.max_steps is already given \(train.max_steps=1\); state each key once"),
    (["train.seed=3", " train.seed =4"], "train.seed is already given"),
    (["train={max_steps: 3}", "train.max_steps=4"], r"train.max_steps is already given \(train=\{max_steps: 3\}\)"),
    (["model.layers=1", "model={layers: 2}"], r"model is already given \(model.layers=1\)"),
    (["model={layers: 3, layers: 4}"], "found duplicate key 'layers'"),
    ([f"train.max_steps={BOMB}"], r"YAML aliases expand to too many nodes \(node expansion exceeds"),
    (["train.max_steps=[1"], "YAML syntax error: did not find expected ',' or ']'"),
    (["train.max_steps=!!python/name:os.system"], "YAML tags are not allowed in a config"),
    (["train.max_steps=\udcff"], r"not UTF-8 text \(character 16\)"),
])
def test_an_override_is_refused_like_a_file_in_one_line_naming_it(overrides, expected, capsys):
    with pytest.raises(ConfigError, match=expected) as e:
        load_config(None, overrides)
    assert str(e.value).startswith("override '") and "\n" not in str(e.value)
    code, _, err = launch_main("train", ["--print-config", *overrides], capsys)  # the CLI: one line, exit 2
    assert code == 2 and err.count("\n") == 1 and err.startswith("error: override '"), err


def test_a_program_that_builds_a_command_replaces_a_key_rather_than_stating_it_twice():
    from trainer.config import merge_overrides

    base = ["launch/train.py", "--deepspeed_config", "x.json", "model.layers=2", "train.seed=7", "--num_gpus", "1"]
    assert merge_overrides(base, ["model.layers=3", "train={seed: 2}", "1"]) == [
        "launch/train.py", "--deepspeed_config", "x.json", "--num_gpus", "1", "model.layers=3", "train={seed: 2}", "1"]
    assert load_config(None, merge_overrides(["train.max_steps=1"], ["train.max_steps=9"])).train.max_steps == 9


def test_an_override_of_a_key_of_the_config_file_is_what_overrides_are_for(tmp_path):
    yaml = tmp_path / "c.yaml"
    yaml.write_text("train:\n  max_steps: 5\n")
    assert load_config(str(yaml), ["train.max_steps=6", "train.seed=2"]).train.max_steps == 6
    assert load_config(None, [f"run.name={BOMB}"]).run.name == BOMB  # a text key takes the text typed, unparsed


def test_more_threads_than_cores_is_refused_before_anything_starts():
    import os

    with pytest.raises(ConfigError, match=rf"train.threads=100000: more than the {os.cpu_count()} cores of this host"):
        check_threads(100000)
    check_threads(1)
    from trainer.training.cli import train_main

    with pytest.raises(ConfigError, match="train.threads=100000"):
        train_main(None, ["train.threads=100000"], str(REPO / "ds_configs" / "single.json"))


@pytest.mark.slow
def test_train_cli_errors_are_one_line_with_exit_code_2(tmp_path):
    bad = _ds(tmp_path, lambda d: d.__setitem__("parallel_layout", "hybrid"))
    proc = run_cli([sys.executable, "launch/train.py", "--deepspeed_config", bad, "--dry-run"], check=False, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == ['error: parallel_layout="hybrid": must be an object, e.g. {"mode": '
                                                '"hybrid", "num_pp": 2, "num_dp": 1}']


# ---- item 3: the planner on a fresh clone and on a busy machine's profile ----------------------------------------

def test_planning_with_a_busy_machines_profile_prints_its_warning(tiny_data, tmp_path, capsys):
    from tests.test_planner import _tiny_cfg, _tiny_profile
    from trainer.planner.cli import main

    path = _tiny_profile(tmp_path, tiny_data)
    profile = json.loads(path.read_text())
    warning = "load average 3.4 > 1.5: measured on a busy machine, the numbers are not worth planning with"
    profile["conditions"] = {"quiet": False, "warning": warning}
    path.write_text(json.dumps(profile))
    main(["--devices", "2", "--profile", str(path), "--steps", "1", *_tiny_cfg(tiny_data)])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"WARNING: {path}: {warning}; measure again on a quiet machine (--calibrate)"
    assert lines[-1].startswith("WARNING: planned with a profile measured on a busy machine (load average 3.4")


def test_planning_on_data_that_was_never_prepared_says_how_to_prepare_it(tmp_path):
    from trainer.planner.cli import main

    with pytest.raises(FileNotFoundError, match=r"data.dir=data/enja32k_joint: not prepared \(no manifest.json\); "
                                                r".*python -m data_prep.prepare"):
        main(["--config", str(REPO / "trainer" / "configs" / "paper_size.yaml"), "--devices", "2", "--profile",
              "h200", "data.dir=data/enja32k_joint"])
    section = (REPO / "docs" / "planner.md").read_text(encoding="utf-8")  # the README's planner section moved there
    assert "--out data/enja32k_joint --vocab-size 32000 --model-type bpe --joint-vocab" in section
    yaml = (REPO / "trainer" / "configs" / "paper_size.yaml").read_text()
    assert "python -m data_prep.prepare" in yaml and "--out data/enja32k_joint" in yaml
