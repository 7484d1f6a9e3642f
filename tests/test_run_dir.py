"""What the trainer writes into run.dir and reads from the files a run is made of (issue 22, items 9-12):
links, FIFOs, devices and hard links where it expects its own files, two trainers on one run.dir, and
exports aimed at the run's own checkpoints. Each case is a one-line refusal naming the file; nothing
outside run.dir is written, nothing is read without bound. docs/RELIABILITY.md ("Hostile input") lists
them with their tests."""
from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from data_prep import files
from data_prep.files import FileError
from tests.conftest import REPO, launch_main, read_metrics, run_cli
from trainer.config import merge_overrides
from tests.test_hostile import fake_run, step_dir
from trainer.checkpoint import files as ck


@pytest.fixture(scope="module")
def run_files():
    from trainer.artifacts import run_files

    return run_files


@pytest.fixture(scope="module")
def owned():
    """What the trainer writes into run.dir: (files, directories -> names inside)."""
    from trainer.artifacts.run_dir import RUN_DIR_DIRS, RUN_DIR_FILES

    return RUN_DIR_FILES, RUN_DIR_DIRS


def outside(tmp_path: Path, name: str = "theirs.txt") -> Path:
    path = tmp_path / name
    path.write_text("someone else's file\n")
    return path


# --- item 9: the one writer ----------------------------------------------------------------------------------

def test_open_write_refuses_links_fifos_and_hard_links_and_never_writes_through(tmp_path, run_files):
    run = tmp_path / "run"
    run.mkdir()
    theirs = outside(tmp_path)
    (run / "metrics.jsonl").symlink_to(theirs)
    with pytest.raises(FileError, match=r"metrics.jsonl: a symbolic link \(to .*theirs.txt\) where the "
                                                     r"trainer writes its own file; refused"):
        run_files.open_write(str(run), "metrics.jsonl", append=True)
    (tmp_path / "elsewhere").mkdir()
    (run / "timing").symlink_to(tmp_path / "elsewhere")  # a directory on the way
    with pytest.raises(FileError, match="timing: a symbolic link"):
        run_files.write_text(str(run), "timing/rank0.json", "{}")
    os.mkfifo(run / "config.yaml")  # nobody reads it: a blocking open would hang
    with pytest.raises(FileError, match="config.yaml: a FIFO"):
        run_files.write_text(str(run), "config.yaml", "x")
    os.link(theirs, run / "ds_config.json")
    with pytest.raises(FileError, match="ds_config.json: a file with 2 names"):
        run_files.write_text(str(run), "ds_config.json", "{}")
    assert theirs.read_text() == "someone else's file\n" and not list((tmp_path / "elsewhere").iterdir())
    run_files.write_text(str(run), "profile/rank0.json", "{}")  # directories the trainer makes are fine
    run_files.write_text(str(run), "profile/rank0.json", "{}\n")  # and so is rewriting its own file
    assert (run / "profile" / "rank0.json").read_text() == "{}\n"


def test_checkpoint_writes_and_pointers_refuse_links(tmp_path, run_files):
    """A pointer is written to a temporary file of a new name (the file layer's: O_EXCL, never a link) renamed over
    the pointer; a link at the pointer itself is refused, and nothing is written through either."""
    run = fake_run(tmp_path / "run")
    theirs = outside(tmp_path)
    (run / "checkpoints" / "latest.tmp").symlink_to(theirs)  # the pointer's former temporary name: not used
    ck.write_pointer(str(run), "latest", "step_00000005")
    (run / "checkpoints" / "latest").unlink()
    (run / "checkpoints" / "latest").symlink_to(theirs)
    with pytest.raises(FileError, match=r"latest: refused: a symbolic link \(to .*theirs.txt\)"):
        ck.write_pointer(str(run), "latest", "step_00000005")
    assert theirs.read_text() == "someone else's file\n"


@pytest.mark.parametrize("name", ["config.yaml", "metrics.jsonl", "spm.src.model", "wandb_run_id", "train.lock",
                                  "timing/rank1.json", "timeline/trace.json.tmp", "checkpoints/latest.tmp",
                                  "checkpoints/step_00000007.tmp", "wandb"])
def test_a_link_where_the_trainer_writes_is_refused_before_anything_is_written(tmp_path, name, run_files, owned):
    run = fake_run(tmp_path / "run")
    theirs = outside(tmp_path)
    path = run / name
    path.parent.mkdir(exist_ok=True)
    if path.exists():
        path.unlink()
    path.symlink_to(theirs)
    with pytest.raises(FileError, match=f"{path}: a symbolic link"):
        run_files.check_run_dir(str(run), *owned)


def test_a_run_dir_of_regular_files_passes_the_check(tmp_path, run_files, owned):
    run = fake_run(tmp_path / "run")
    (run / "checkpoints" / "step_00000007.tmp").mkdir()  # an interrupted save: a real directory
    (run / "checkpoints" / "step_00000003").symlink_to(step_dir(run))  # a step link: never used, not written
    run_files.check_run_dir(str(run), *owned)


def _small_run_cmd(data, run, *overrides) -> list:
    return merge_overrides([sys.executable, "launch/train.py", "--deepspeed_config", "ds_configs/single.json", f"data.dir={data}",
            f"run.dir={run}", "model.layers=2", "model.emb_dim=16", "model.hidden=16", "data.min_batch_sentences=8",
            "decode.dev_max_sentences=8", "train.eval_every=100000", "train.save_every=2", "train.log_every=1",
            "logging.wandb_mode=disabled", "logging.progress=false"], overrides)


@pytest.fixture(scope="module")
def trained(tiny_data, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("trained")
    run_cli(_small_run_cmd(tiny_data, root / "run", "train.max_steps=2"), timeout=300)
    return root / "run"


@pytest.mark.slow
def test_a_resume_refuses_links_in_the_run_dir_and_writes_through_none(tiny_data, trained, tmp_path):
    """Issue 22, item 9: a resumed run whose files are links to files elsewhere wrote through every one of them
    (config, DeepSpeed JSON, SentencePiece models, metrics), and appended its metrics to the other file."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(trained, run)
    theirs = {}
    for name in ("config.yaml", "metrics.jsonl", "spm.src.model"):
        theirs[name] = outside(tmp_path, f"theirs-{name}")
        (run / name).unlink()
        (run / name).symlink_to(theirs[name])
    r = run_cli(_small_run_cmd(tiny_data, run, "train.max_steps=4", "train.resume=auto"), check=False, timeout=300)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert "config.yaml: a symbolic link" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert all(p.read_text() == "someone else's file\n" for p in theirs.values())
    assert ck.complete_checkpoints(str(run)) == ["step_00000002"]


# --- item 10: one trainer per run.dir -------------------------------------------------------------------------

@pytest.mark.slow
def test_a_second_trainer_on_a_run_dir_is_refused_and_a_killed_ones_lock_is_stale(tiny_data, tmp_path):
    run, log = tmp_path / "run", tmp_path / "first.log"
    env = dict(os.environ, PYTHONUNBUFFERED="1", WANDB_MODE="disabled", PYTHONPATH=str(REPO))
    first = subprocess.Popen(_small_run_cmd(tiny_data, run, "train.max_steps=100000"), cwd=REPO, env=env,
                             stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.time() + 240
        while not ((run / "metrics.jsonl").exists() and read_metrics(run)):
            assert first.poll() is None and time.time() < deadline, log.read_text()[-2000:]
            time.sleep(0.2)
        second = run_cli(_small_run_cmd(tiny_data, run, "train.max_steps=4", "train.resume=auto"), check=False)
        assert second.returncode == 2 and "Traceback" not in second.stderr, second.stderr[-2000:]
        line = second.stderr.strip().splitlines()[-1]
        assert f"is in use by another trainer (pid {first.pid} on " in line and "choose another run.dir" in line
        assert first.poll() is None, "the first trainer must go on"
        os.killpg(first.pid, signal.SIGKILL)  # a killed trainer leaves its lock file behind, naming itself
        first.wait()
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
    assert str(first.pid) in (run / "train.lock").read_text()
    third = run_cli(_small_run_cmd(tiny_data, run, "train.max_steps=4", "train.resume=auto"), timeout=300)
    assert f"the lock of an earlier trainer (pid {first.pid} on" in third.stdout and "was stale" in third.stdout
    assert (run / "train.lock").read_text() == ""  # emptied at the trainer's own end


def test_the_lock_is_held_and_released_in_process(tmp_path, run_files):
    run = tmp_path / "run"
    assert run_files.lock_run_dir(str(run)) is None
    holder = json.loads((run / "train.lock").read_text())
    assert holder["pid"] == os.getpid()
    # another process: refused while this one holds it
    probe = ("import sys; from trainer.artifacts import run_files\n"
             "try:\n    run_files.lock_run_dir(sys.argv[1])\nexcept run_files.RunDirBusy as e:\n    print(e)")
    r = run_cli([sys.executable, "-c", probe, str(run)])
    assert f"is in use by another trainer (pid {os.getpid()} on " in r.stdout
    run_files.release_run_dir()
    assert (run / "train.lock").read_text() == ""
    r = run_cli([sys.executable, "-c", probe, str(run)])
    assert r.stdout == ""


# --- item 11: devices and special files where a file is expected -----------------------------------------------

def _limits():  # what a test of today's code may cost if it reads or copies /dev/zero: bounded, not the machine's
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 20, 64 << 20))


def _bounded(args: list, timeout: int = 120) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONUNBUFFERED="1", WANDB_MODE="disabled", PYTHONPATH=str(REPO))
    try:
        return subprocess.run([str(a) for a in args], cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=timeout, preexec_fn=_limits, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        pytest.fail(f"no answer within {timeout}s (reading a FIFO or a device?)")


@pytest.mark.parametrize("kind", ["/dev/zero", "fifo"])
def test_translate_refuses_a_run_whose_sentencepiece_model_is_a_device_or_fifo(tmp_path, kind):
    run = fake_run(tmp_path / "run")
    model = run / "spm.src.model"
    model.unlink()
    if kind == "fifo":
        os.mkfifo(model)
    else:
        model.symlink_to(kind)
    (tmp_path / "in.txt").write_text("the cat\n")
    r = _bounded([sys.executable, "launch/translate.py", "--run", run, "--input", tmp_path / "in.txt", "--output",
                  tmp_path / "out.txt"])
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert f"{model}: a SentencePiece model must be a regular file, not " in r.stderr  # the file layer's words


def test_read_capped_refuses_large_files(tmp_path):
    big = tmp_path / "big"
    big.write_bytes(b"x" * 1001)
    with pytest.raises(FileError, match="big: the thing: 1001 bytes, more than the 1000"):
        files.read_bytes(str(big), 1000, "the thing")
    assert files.read_bytes(str(big), 1001, "the thing") == b"x" * 1001


@pytest.mark.slow
def test_training_refuses_a_data_dir_whose_sentencepiece_model_is_a_device(tiny_data, tmp_path):
    """It was copied into run.dir until the disk was full (here: until the test's 64 MB file size limit)."""
    import shutil

    data = tmp_path / "data"
    shutil.copytree(tiny_data, data)
    (data / "spm.tgt.model").unlink()
    (data / "spm.tgt.model").symlink_to("/dev/zero")
    r = _bounded(_small_run_cmd(data, tmp_path / "run", "train.max_steps=2"), timeout=300)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert (f"{data}/spm.tgt.model: a SentencePiece model of data.dir must be a regular file, not a character device"
            in r.stderr)
    assert not (tmp_path / "run" / "spm.tgt.model").exists()


# --- item 12: export never writes into the run's checkpoints ---------------------------------------------------

@pytest.mark.parametrize("target", ["checkpoints/step_00000005/layer_00-model_states.pt", "checkpoints/model.pt",
                                    "checkpoints/latest", "spm.src.model"])
def test_export_refuses_an_output_inside_the_runs_checkpoints_or_on_its_files(tmp_path, target, capsys):
    run = fake_run(tmp_path / "run")
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    code, _, err = launch_main("export", ["--run", run, "--checkpoint", "last", "--out", run / target], capsys)
    assert code == 2 and "Traceback" not in err, err[-2000:]
    assert f"--out {run / target}: " in err and len(err.strip().splitlines()) == 1
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before
    assert ck.verify(str(step_dir(run))) == []
    assert launch_main("export", ["--run", run, "--checkpoint", "last", "--out", tmp_path / "model.pt"], capsys)[0] == 0
    assert (tmp_path / "model.pt").stat().st_size > 0


# ---- names once: every run-directory name is typed only in the module that owns it -----------------------------

def owners() -> dict[str, str]:
    """Run-directory and checkpoint names -> the one module of trainer/ or launch/ that may type each. ('best' and
    'latest' are also the words --checkpoint takes, so they are not searched for.)"""
    from trainer.artifacts import run_dir
    from trainer.checkpoint import files

    names = {n for n in (*run_dir.RUN_DIR_FILES, *run_dir.RUN_DIR_DIRS, run_dir.PLOT, run_dir.TEST_HYP)
             if not n.endswith(".tmp")}
    out = {n: "trainer/artifacts/run_dir.py" for n in names - set(run_dir.RUN_FILES)}
    out.update({n: "data_prep/dataformat.py" for n in run_dir.RUN_FILES})  # the SentencePiece models: DATA_DIR's
    out.update({n: "trainer/checkpoint/files.py" for n in (files.MANIFEST, files.TRAIN_STATE, files.META)})
    return out


def _types(text: str, name: str, joined: bool) -> bool:
    """`text` holds `name` as a file name (one with a dot or underscore: no English word), or as a directory of a
    path (the directories' names are words: timing, profile, ...): beside a slash, or alone as an argument of a
    path join (`joined`)."""
    import re

    if "." in name or "_" in name:
        return re.search(rf"(?<![\w.-]){re.escape(name)}(?![\w-])", text) is not None
    return re.search(rf"(^|/){re.escape(name)}/|/{re.escape(name)}$", text) is not None or (joined and text == name)


def _documentation(tree) -> set[int]:
    """ids of the strings that document rather than name a path: docstrings, `help=` texts, the config's key
    help (`_key(default, help)`)."""
    import ast

    docs = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Expr) and isinstance(n.value, (ast.Constant, ast.JoinedStr)):
            docs |= {id(x) for x in ast.walk(n.value)}
        elif isinstance(n, ast.keyword) and n.arg == "help":
            docs |= {id(x) for x in ast.walk(n.value)}
        elif isinstance(n, ast.Call) and getattr(n.func, "id", None) == "_key":
            docs |= {id(x) for a in n.args[1:] for x in ast.walk(a)}
    return docs


def typed_names(path: Path, names) -> list[str]:
    """'file:line name' for every string of `path` (f-string pieces included, documentation aside) typing one of
    `names`."""
    import ast

    tree = ast.parse(path.read_text(), str(path))
    docs = _documentation(tree)
    joined = {id(a) for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "attr", None) == "join"
              for a in n.args}
    joined |= {id(n.right) for n in ast.walk(tree) if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Div)}  # a / "x"
    return [f"{path.relative_to(REPO)}:{n.lineno} {name}" for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs
            for name in names if _types(n.value, name, id(n) in joined)]


def test_every_run_directory_name_is_typed_only_where_it_is_owned():
    names = owners()
    found = [hit for top in ("trainer", "launch", "benchmarks") for path in sorted((REPO / top).rglob("*.py"))
             for hit in typed_names(path, names) if str(path.relative_to(REPO)) != names[hit.split()[-1]]]
    assert found == []


def test_the_name_check_sees_a_name_typed_elsewhere(tmp_path):
    fake = REPO / "tests" / "_fake_names.py"  # inside the repository, as the checked files are
    try:
        fake.write_text('"""RUN_DIR/metrics.jsonl and RUN_DIR/timing/ in a docstring are fine."""\n'
                        'a = os.path.join(run_dir, "metrics.jsonl")\n'
                        'b = f"{run_dir}/checkpoints/{name}"\n'
                        'c = open(os.path.join(run, "timing"))\n'
                        'd = "the timing of a step", profile.get("_path", "profile")\n'
                        'p.add_argument("--out", help="default RUN_DIR/training.png")\n'
                        'e = Path(run) / "timeline" / "x.png"\n')
        hits = typed_names(fake, owners())
    finally:
        fake.unlink()
    assert sorted(hits) == ["tests/_fake_names.py:2 metrics.jsonl", "tests/_fake_names.py:3 checkpoints",
                            "tests/_fake_names.py:4 timing", "tests/_fake_names.py:7 timeline"]  # (a / "x": joined)
    names = owners()
    in_owners = {hit.split()[-1] for path in {REPO / owner for owner in names.values()}
                 for hit in typed_names(path, names)}
    files = {n for n in names if "." in n or "_" in n}  # (a directory's bare name is only seen in a path)
    assert len(names) >= 15 and len(files) >= 10 and in_owners >= files  # each file name found where it is defined


def test_the_export_process_refuses_an_output_on_the_runs_files_in_one_line(tmp_path):
    """The same through the real process (its exit code, no traceback), once."""
    run = fake_run(tmp_path / "run")
    target = run / "checkpoints" / "model.pt"
    r = run_cli([sys.executable, "launch/export.py", "--run", run, "--checkpoint", "last", "--out", target],
                check=False, timeout=120)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [r.stderr.strip()], r.stderr[-2000:]
    assert r.stderr.startswith(f"error: --out {target}: ") and not target.exists()
