"""The file layer (issue 30, part A items 1-3, by class): data_prep.files is how every CLI and the trainer open,
read and write the files a user hands them or names. Reads take regular files only (no FIFO, device, socket or
directory, whatever the link), bounded; writes go to a temporary file renamed in place, never through a link, never
onto a file the same command reads (by device and inode), never into what the command protects or over a file it
did not write; every OSError is one line naming the path and what was being done.

Each class is tried with the failures the issue found and with more variants of it, through the real entry points
(in this process where that is what the process does, and once each through a real process); a walk of the code
fails on a file opened, read or written outside the layer."""
from __future__ import annotations

import ast
import errno
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from data_prep import files
from data_prep.files import FileError
from tests.conftest import REPO, launch_main, run_cli
from tests.test_hostile import fake_run, good_pairs, moses, prepare, step_dir
from trainer.checkpoint import files as ck
from trainer.inference.loading import load_run


@pytest.fixture(autouse=True)
def one_command():
    """Each test is its own command: what an earlier test read is not what this one reads."""
    with files.command():
        yield


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err[-3000:]
    return lines[0]


# ---- reads: regular files only, whatever the link; bounded ----------------------------------------------------

def _special(tmp_path: Path, kind: str) -> Path:
    path = tmp_path / kind
    if kind == "fifo":
        os.mkfifo(path)  # nobody writes it: a blocking open or read would hang the test
    elif kind == "link-to-fifo":
        os.mkfifo(tmp_path / "the-fifo")
        path.symlink_to(tmp_path / "the-fifo")
    elif kind == "device":
        path.symlink_to("/dev/zero")  # never ends
    elif kind == "socket":
        s = socket.socket(socket.AF_UNIX)
        s.bind(str(path))
        s.close()
    else:
        path.mkdir()
    return path


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind,expected", [("fifo", "a FIFO"), ("link-to-fifo", r"a FIFO \(a link to .*the-fifo\)"),
                                           ("device", r"a character device \(a link to /dev/zero\)"),
                                           ("socket", "a socket"), ("directory", "a directory")])
def test_a_read_takes_a_regular_file_only_whatever_the_link(tmp_path, kind, expected):
    path = _special(tmp_path, kind)
    with pytest.raises(FileError, match=rf"^{path}: the thing must be a regular file, not {expected}; refused$") as e:
        files.read_bytes(str(path), 1 << 20, "the thing")
    assert "\n" not in str(e.value)


def test_a_whole_read_is_bounded_and_a_missing_file_is_one_line(tmp_path):
    big = tmp_path / "big"
    big.write_bytes(b"x" * 1001)
    with pytest.raises(FileError, match="big: the thing: 1001 bytes, more than the 1000"):
        files.read_bytes(str(big), 1000, "the thing")
    with pytest.raises(FileNotFoundError) as e:
        files.read_bytes(str(tmp_path / "none"), 10, "the thing")
    assert str(e.value) == f"{tmp_path / 'none'}: cannot open the thing: No such file or directory"


# ---- writes: renamed into place; never through a link, onto a file read, into what is protected ------------------

def _temporaries(directory: Path) -> list[str]:
    return sorted(n for n in os.listdir(directory) if n.endswith(".tmp"))


def test_a_write_goes_to_a_temporary_file_renamed_in_place(tmp_path):
    out = tmp_path / "out.txt"
    out.write_text("old\n")
    inode = out.stat().st_ino
    with files.replace(str(out), "the output") as f:
        f.write("new\n")
        assert out.read_text() == "old\n" and len(_temporaries(tmp_path)) == 1  # not visible until the end
    assert out.read_text() == "new\n" and out.stat().st_ino != inode and _temporaries(tmp_path) == []
    with pytest.raises(RuntimeError):
        with files.replace(str(out), "the output") as f:
            f.write("half")
            raise RuntimeError("a failure half-way")
    assert out.read_text() == "new\n" and _temporaries(tmp_path) == []  # the old file, no temporary


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind,expected", [
    ("link", r"a symbolic link \(to .*theirs.txt\); the output may not be written through a link"),
    ("fifo", "a FIFO; the output may replace only a regular file"),
    ("directory", "a directory; the output may replace only a regular file"),
])
def test_a_write_never_goes_through_a_link_or_onto_a_special_file(tmp_path, kind, expected):
    theirs = tmp_path / "theirs.txt"
    theirs.write_text("someone else's file\n")
    out = tmp_path / "out"
    if kind == "link":
        out.symlink_to(theirs)
    elif kind == "fifo":
        os.mkfifo(out)
    else:
        out.mkdir()
    with pytest.raises(FileError, match=rf"^--output {out}: refused: {expected}"):
        with files.replace(str(out), "the output", flag="--output") as f:
            f.write("x")
    assert theirs.read_text() == "someone else's file\n" and _temporaries(tmp_path) == []


@pytest.mark.parametrize("name", ["in.txt", "hard-link", "sub/../in.txt", "link-dir/in.txt"])
def test_a_write_never_lands_on_a_file_the_command_read_by_device_and_inode(tmp_path, name):
    source = tmp_path / "in.txt"
    source.write_text("precious\n")
    (tmp_path / "sub").mkdir()
    os.link(source, tmp_path / "hard-link")
    (tmp_path / "link-dir").symlink_to(tmp_path)
    with files.open_read(str(source), "the input"):
        pass
    target = tmp_path / name
    with pytest.raises(FileError, match=rf"^{target}: refused: a file this command reads"):
        with files.replace(str(target), "the output") as f:
            f.write("x")
    assert source.read_text() == "precious\n"
    with files.command():  # another command did not read it
        with files.replace(str(target), "the output") as f:
            f.write("written\n")
    assert target.read_text() == "written\n"


def test_a_write_never_lands_in_what_the_command_protects_nor_over_a_file_it_did_not_write(tmp_path):
    kept = tmp_path / "kept"
    kept.mkdir()
    files.protect(str(kept), "the run's checkpoints/, which only the trainer writes")
    files.protect(str(tmp_path / "config.yaml"), "a file of the run, which only the trainer writes")
    for target, expected in ((kept / "new.txt", f"inside {kept}, the run's checkpoints/"),
                             (tmp_path / "config.yaml", "a file of the run")):  # not there yet: protected by name
        with pytest.raises(FileError, match=rf"refused: {expected}"):
            with files.replace(str(target), "the output"):
                pass
        assert not target.exists()
    other = tmp_path / "notes.txt"
    other.write_text("mine\n")
    with pytest.raises(FileError, match="refused: exists and is not the plot written by this program"):
        with files.replace(str(other), "the plot", ours=lambda p: False):
            pass
    assert other.read_text() == "mine\n"


def test_every_failure_of_the_layer_is_one_line_naming_the_path_and_what_was_done(tmp_path, monkeypatch):
    below = tmp_path / "a-file"
    below.write_text("x")
    with pytest.raises(FileError) as e:
        files.make_dirs(str(below / "run"), "run.dir")
    assert str(e.value) == f"{below / 'run'}: cannot create run.dir: {below} is a regular file, not a directory"
    with pytest.raises(FileError) as e:
        with files.replace(str(tmp_path / "none" / "out.txt"), "the output", flag="--out"):
            pass
    assert str(e.value) == (f"--out {tmp_path / 'none'}: cannot open the directory of the output: No such file or "
                            f"directory")

    def read_only(path, *args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system", path)
    monkeypatch.setattr(os, "makedirs", read_only)
    with pytest.raises(FileError) as e:
        files.make_dirs(str(tmp_path / "ro" / "run"), "run.dir")
    assert str(e.value) == f"{tmp_path / 'ro' / 'run'}: cannot create run.dir: Read-only file system"


FULL_DISK = """
import resource, sys, torch
from data_prep import files
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.RLIM_INFINITY))  # a write past 4 KiB fails: EFBIG
try:
    with files.replace(sys.argv[1], "the output", binary=True) as f:
        torch.save({"w": torch.zeros(100_000)}, f) if sys.argv[2] == "torch" else f.write(b"x" * 100_000)
except files.FileError as e:
    print(e)
"""


@pytest.mark.parametrize("writer", ["torch", "bytes"])
def test_a_full_disk_is_one_line_naming_the_file_and_leaves_the_old_file_and_no_temporary(tmp_path, writer):
    """A file size limit (RLIMIT_FSIZE) fails the write as a full disk does, for any user; torch.save's own error
    for it (a RuntimeError from inline_container.cc) is the layer's one line too."""
    out = tmp_path / "model.pt"
    out.write_bytes(b"old")
    r = subprocess.run([sys.executable, "-c", FULL_DISK, str(out), writer], cwd=REPO, capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)
    assert r.stdout.strip() == f"{out}: cannot write: File too large" and "Traceback" not in r.stderr, r.stderr
    assert out.read_bytes() == b"old" and _temporaries(tmp_path) == []


# ---- A1: outputs onto inputs, through the commands ---------------------------------------------------------------

@pytest.fixture
def run_and_input(tmp_path):
    run = fake_run(tmp_path / "run")
    source = tmp_path / "in.txt"
    source.write_text("the cat sees the tree\nthe dog sees the car\n")
    return run, source


def _refused(script: str, argv: list, capsys, expected: str, untouched: dict[Path, bytes]) -> None:
    code, _, err = launch_main(script, argv, capsys)
    assert code == 2 and expected in _one_line(err), err
    assert {p: p.read_bytes() for p in untouched} == untouched


def test_translate_never_writes_its_output_onto_its_input(run_and_input, tmp_path, capsys):
    """The issue's: --output equal to --input emptied the input and exited 0 ("translated 0 sentences"). Variants:
    the same file by another name (a hard link, a path through `..`)."""
    run, source = run_and_input
    os.link(source, tmp_path / "same.txt")
    (tmp_path / "sub").mkdir()
    for out in (source, tmp_path / "same.txt", tmp_path / "sub" / ".." / "in.txt"):
        _refused("translate", ["--run", run, "--input", source, "--output", out], capsys,
                 f"--output {out}: refused: a file this command reads", {source: source.read_bytes()})
    code, _, err = launch_main("translate", ["--run", run, "--input", source, "--output", tmp_path / "out.txt"],
                               capsys)
    assert code == 0 and len((tmp_path / "out.txt").read_text().splitlines()) == 2, err


@pytest.mark.parametrize("target", ["checkpoints/step_00000005/layer_00-model_states.pt", "checkpoints/best",
                                    "checkpoints/step_00000005/notes.txt", "config.yaml", "metrics.jsonl",
                                    "timing/rank0.json"])
def test_translate_never_writes_into_the_run_it_translates_with(run_and_input, capsys, target):
    """The issue's: --output naming a checkpoint file of the run overwrote it (the checkpoint no longer verified).
    Variants: a pointer, a new file in a checkpoint, the trainer's own files and directories."""
    run, source = run_and_input
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    _refused("translate", ["--run", run, "--input", source, "--output", run / target], capsys,
             f"--output {run / target}: refused: ", before)
    assert ck.verify(str(step_dir(run))) == [] and not (run / target).is_symlink()


def test_evaluate_and_score_never_write_onto_their_reference_source_or_baseline(run_and_input, tmp_path, capsys):
    """The issue's: evaluate --output equal to --ref overwrote the reference. Variants: --src, --baseline, and score's
    --output on its --ref."""
    run, source = run_and_input
    ref = tmp_path / "ref.txt"
    ref.write_text("猫は木を見る。\n犬は車を見る。\n")
    base = tmp_path / "base.txt"
    base.write_text("猫\n犬\n")
    kept = {p: p.read_bytes() for p in (source, ref, base)}
    for out in (ref, source, base):
        _refused("evaluate", ["--run", run, "--src", source, "--ref", ref, "--baseline", base, "--output", out],
                 capsys, f"--output {out}: refused: a file this command reads", kept)
    _refused("score", ["--run", run, "--src", source, "--ref", ref, "--output", ref], capsys,
             f"--output {ref}: refused: a file this command reads", kept)


def test_a_model_file_is_never_written_over_by_what_reads_it_nor_by_an_export_over_a_foreign_file(
        run_and_input, tmp_path, capsys):
    run, source = run_and_input
    model = tmp_path / "model.pt"
    assert launch_main("export", ["--run", run, "--out", model], capsys)[0] == 0
    _refused("translate", ["--model", model, "--input", source, "--output", model], capsys,
             f"--output {model}: refused: a file this command reads", {model: model.read_bytes()})
    notes = tmp_path / "notes.txt"
    notes.write_text("mine\n")
    _refused("export", ["--run", run, "--out", notes], capsys,
             f"--out {notes}: refused: exists and is not the model file written by this program", {notes: b"mine\n"})
    assert launch_main("export", ["--run", run, "--out", model], capsys)[0] == 0  # over its own earlier export: fine


def test_plot_never_writes_onto_its_metrics_nor_through_a_link(tmp_path, capsys):
    """The issue's: plot wrote training.png through a link to a file outside run.dir. Variants: --out on the
    metrics it reads, --out over a file that is not a plot; and it reads metrics.jsonl that is a FIFO (it blocked
    forever) or a link to /dev/zero only to refuse them."""
    run = tmp_path / "run"
    run.mkdir()
    metrics = run / "metrics.jsonl"
    metrics.write_text('{"step": 1, "loss": 2.0, "tokens_per_s": 5.0}\n')
    theirs = tmp_path / "theirs.txt"
    theirs.write_text("someone else's file\n")
    (run / "training.png").symlink_to(theirs)
    kept = {theirs: theirs.read_bytes(), metrics: metrics.read_bytes()}
    _refused("plot", [run], capsys, f"{run / 'training.png'}: refused: a symbolic link (to {theirs})", kept)
    _refused("plot", [run, "--out", metrics], capsys, f"--out {metrics}: refused: a file this command reads", kept)
    _refused("plot", [run, "--out", theirs], capsys, f"--out {theirs}: refused: exists and is not the plot", kept)
    (run / "training.png").unlink()
    assert launch_main("plot", [run], capsys)[0] == 0 and launch_main("plot", [run], capsys)[0] == 0  # replaces its own
    for make, kind in ((os.mkfifo, "a FIFO"), (lambda p: os.symlink("/dev/zero", p), "a character device")):
        metrics.unlink()
        make(metrics)
        _refused("plot", [run], capsys, f"{metrics}: metrics.jsonl must be a regular file, not {kind}", {})


def test_prepare_never_publishes_over_one_of_its_inputs(tmp_path, capsys):
    """A variant of the class for prepare: an input that is one of the files it writes into --out (its earlier
    dev text, given as this run's training input) would be replaced by the new output."""
    train = moses(tmp_path, "train", good_pairs(40))
    dev = moses(tmp_path, "dev", good_pairs(40)[:8])
    out = tmp_path / "data"
    assert prepare("--format", "moses", "--train-src", train[0], "--train-tgt", train[1], "--dev-src", dev[0],
                   "--dev-tgt", dev[1], "--out", out) == 0
    capsys.readouterr()
    kept = {p: p.read_bytes() for p in out.iterdir() if p.is_file()}
    assert prepare("--format", "moses", "--train-src", out / "dev.src.txt", "--train-tgt", out / "dev.tgt.txt",
                   "--out", out) == 2
    assert "holds dev.src.txt, which is also an input of this run" in _one_line(capsys.readouterr().err)
    assert {p: p.read_bytes() for p in out.iterdir() if p.is_file()} == kept


# ---- identity, not spelling (issue 42 item 7): a path is what the kernel resolves it to ------------------------

@pytest.fixture
def linked(tmp_path):
    """D/in.txt (the input) and D/lnk, a link to a directory elsewhere (other/inner): D/lnk/.. is other/, not D/."""
    (tmp_path / "D").mkdir()
    (tmp_path / "other" / "inner").mkdir(parents=True)
    (tmp_path / "D" / "lnk").symlink_to(tmp_path / "other" / "inner")
    source = tmp_path / "D" / "in.txt"
    source.write_text("the cat sees the tree\nthe dog sees the car\n")
    return source


def test_a_write_lands_where_the_kernel_resolves_its_path_not_where_its_spelling_points(linked, tmp_path):
    """The issue's: the checks followed the link, the writer undid `lnk/..` by spelling (abspath) and replaced the
    input. Now both use the one directory the kernel opens: D/lnk/../in.txt is other/in.txt, a new file; a spelling
    that does reach the input, through the link and back (or through two links), is refused as the input."""
    with files.open_read(str(linked), "the input"):
        pass
    with files.replace(f"{tmp_path}/D/lnk/../in.txt", "the output") as f:
        f.write("new\n")
    assert (tmp_path / "other" / "in.txt").read_text() == "new\n" and linked.read_text().startswith("the cat")
    (tmp_path / "other" / "inner" / "back").symlink_to(tmp_path / "D" / "lnk")  # a second link on the way
    for spelled in (f"{tmp_path}/D/lnk/../../D/in.txt", f"{tmp_path}/D/lnk/back/../../D/in.txt"):
        with pytest.raises(FileError, match="refused: a file this command reads"):
            with files.replace(spelled, "the output") as f:
                f.write("x")
    assert linked.read_text().startswith("the cat") and _temporaries(tmp_path / "D") == []


def test_translate_and_export_reach_into_neither_their_input_nor_their_run_by_a_spelling(linked, tmp_path, capsys):
    """The issue's three: translate --output D/lnk/../in.txt (the input replaced by its translation, exit 0),
    translate --output LNK/../run/config.yaml and export --out LNK/../run/checkpoints/step_N/new.pt (both wrote into
    the run they read). Each now writes where the kernel resolves the path (other/...), or cannot, and the input and
    the run are untouched (the checkpoint still verifies)."""
    run = fake_run(tmp_path / "run")
    (tmp_path / "lnk").symlink_to(tmp_path / "other" / "inner")
    (tmp_path / "other" / "run").mkdir()
    before = {p: p.read_bytes() for p in [linked, *run.rglob("*")] if p.is_file()}
    code, _, err = launch_main("translate", ["--run", run, "--input", linked, "--output",
                                             f"{tmp_path}/D/lnk/../in.txt"], capsys)
    assert code == 0 and len((tmp_path / "other" / "in.txt").read_text().splitlines()) == 2, err
    code, _, err = launch_main("translate", ["--run", run, "--input", linked, "--output",
                                             f"{tmp_path}/lnk/../run/config.yaml"], capsys)
    assert code == 0 and (tmp_path / "other" / "run" / "config.yaml").exists(), err
    out = f"{tmp_path}/lnk/../run/checkpoints/step_00000005/new.pt"
    _refused("export", ["--run", run, "--out", out], capsys,
             f"--out {tmp_path}/lnk/../run/checkpoints/step_00000005: cannot open the directory of the model file: "
             f"No such file or directory", {})
    assert {p: p.read_bytes() for p in [linked, *run.rglob("*")] if p.is_file()} == before
    assert ck.verify(str(step_dir(run))) == []


def test_the_runs_own_unfinished_save_is_told_by_identity_not_by_spelling(tmp_path):
    """A step_N.tmp (loaded without a manifest, as the trainer's dev decode does) is the run's own only if its
    directory is the run's checkpoints/: `LNK/../run/checkpoints/step_N.tmp` names another run's, elsewhere."""
    run = fake_run(tmp_path / "run")
    theirs = tmp_path / "other" / "run" / "checkpoints" / "step_00000007.tmp"
    shutil.copytree(step_dir(run), theirs)
    (theirs / ck.MANIFEST).unlink()
    (tmp_path / "other" / "inner").mkdir()
    (tmp_path / "lnk").symlink_to(tmp_path / "other" / "inner")
    spelled = f"{tmp_path}/lnk/../run/checkpoints/step_00000007.tmp"
    assert not ck.is_unfinished_save(str(run), spelled) and not ck.is_unfinished_save(str(run), spelled + "/")
    with pytest.raises(ck.CheckpointError, match="missing"):
        load_run(str(run), spelled)
    ours = run / "checkpoints" / "step_00000007.tmp"
    shutil.copytree(theirs, ours)
    assert ck.is_unfinished_save(str(run), f"{tmp_path}/lnk/../../run/checkpoints/step_00000007.tmp/")


@contextmanager
def _stream_onto(fd: int, path: Path):
    """fd 1 or 2 of this process appended to `path` for the block (what `>> path` gives a command)."""
    saved, target = os.dup(fd), os.open(path, os.O_WRONLY | os.O_APPEND)
    os.dup2(target, fd)
    os.close(target)
    try:
        yield
    finally:
        os.dup2(saved, fd)
        os.close(saved)


@pytest.mark.parametrize("case", ["input", "output-dev-stdout", "stderr", "run-config", "inside-checkpoint"])
def test_stdout_onto_what_the_command_reads_or_protects_is_refused(run_and_input, tmp_path, capsys, case):
    """The issue's: `translate --input IN >> IN` translated its own output until killed. Variants: --output
    /dev/stdout, stderr onto the input, and an export's stdout onto the run's config.yaml or into a checkpoint.
    Compared by identity (fstat of the descriptor), when the file is read or protected."""
    run, source = run_and_input
    stream, target = 1, source
    argv = ["translate", ["--run", run, "--input", source, "--buffer-size", 1]]
    if case == "output-dev-stdout":
        argv[1] += ["--output", "/dev/stdout"]
    elif case == "stderr":
        stream = 2
    elif case in ("run-config", "inside-checkpoint"):
        argv = ["export", ["--run", run, "--out", tmp_path / "m.pt"]]
        target = run / "config.yaml" if case == "run-config" else step_dir(run) / "notes.txt"
        target.touch()
    kept = {target: target.read_bytes()}
    with _stream_onto(stream, target):
        code, _, err = launch_main(*argv, capsys)
    expected = {"input": f"redirected onto {source}, a file this command reads",
                "run-config": f"redirected onto {run / 'config.yaml'}, a file of the run",
                "inside-checkpoint": f"redirected inside {run / 'checkpoints'}, the run's checkpoints/"}
    line = _one_line(err)
    assert code == 2 and line.startswith(f"error: {'stderr' if stream == 2 else 'stdout'}: refused: "), err
    assert expected.get(case, expected["input"]) in line
    assert {p: p.read_bytes() for p in kept} == kept and not (tmp_path / "m.pt").exists()


@pytest.mark.parametrize("redirect", [">> IN", "< IN >> IN", "2>> IN", ">> IN 2>&1"])
def test_translate_never_reads_its_own_output_through_a_redirection(run_and_input, redirect):
    """The issue's, as a shell runs it: a translate reading IN with its stdout appended to IN ran until killed.
    Variants: stdin from IN; stderr onto IN (the refusal's own line then goes to stdout), and both (to nowhere: the
    exit status says it)."""
    run, source = run_and_input
    before = source.read_bytes()
    with open(source, "ab") as appended, open(source, "rb") as stdin:
        args = [] if redirect.startswith("<") else ["--input", source]
        r = subprocess.run([sys.executable, "launch/translate.py", "--run", run, "--buffer-size", "1", *args],
                           cwd=REPO, stdin=stdin, stdout=subprocess.PIPE if redirect == "2>> IN" else appended,
                           stderr=subprocess.STDOUT if redirect.endswith("2>&1") else
                           appended if redirect == "2>> IN" else subprocess.PIPE,
                           text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert r.returncode == 2 and source.read_bytes() == before, (r.stdout, r.stderr)
    said = r.stdout if redirect == "2>> IN" else r.stderr
    if said is not None:
        stream = "stderr" if redirect == "2>> IN" else "stdout"
        assert _one_line(said).startswith(f"error: {stream}: refused: redirected onto "), said


# ---- stop signals (issue 42 item 7): the temporary removed, one line, 128 + the signal ---------------------------

def test_a_stop_signal_inside_a_command_removes_the_temporary_and_says_one_line(tmp_path, capsys):
    """The issue's: Ctrl-C gave a KeyboardInterrupt traceback (SIGTERM left `.out.txt.<hex>.tmp`, test below)."""
    out = tmp_path / "out.txt"
    out.write_text("an earlier translation\n")
    with pytest.raises(SystemExit) as e:
        with files.command():
            with files.replace(str(out), "the translations", flag="--output") as f:
                f.write("half\n")
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(5)  # the handler runs in this thread at the next bytecode
    assert e.value.code == 130 and out.read_text() == "an earlier translation\n" and _temporaries(tmp_path) == []
    assert _one_line(capsys.readouterr().err) == (f"stopped by SIGINT: --output {out} not written (its temporary file "
                                                  f"removed; a file there before is unchanged)")
    before, outside = signal.signal(signal.SIGHUP, signal.SIG_IGN), signal.getsignal(signal.SIGTERM)  # as nohup
    try:
        with files.command():
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN  # a closed terminal does not stop it
        assert signal.getsignal(signal.SIGTERM) is outside and signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, before)


@pytest.mark.slow
@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT", "SIGHUP"])
def test_a_stopped_translate_leaves_no_temporary_and_no_traceback(run_and_input, tmp_path, sig):
    """The issue's: SIGTERM left `.out.txt.<hex>.tmp` beside the output, SIGINT printed a traceback, SIGHUP (a
    closed terminal) killed it without a word. Sent while the output's temporary file is being written."""
    run, source = run_and_input
    source.write_text("the cat sees the tree\n" * 400)
    out = tmp_path / "out.txt"
    proc = subprocess.Popen([sys.executable, "launch/translate.py", "--run", run, "--input", source, "--output", out,
                             "--buffer-size", "1"], cwd=REPO, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        deadline = time.time() + 120
        while not _temporaries(tmp_path) and proc.poll() is None and time.time() < deadline:
            time.sleep(0.05)
        assert _temporaries(tmp_path), "translate never began its output"
        proc.send_signal(getattr(signal, sig))
        err = proc.communicate(timeout=60)[1]
    finally:
        proc.kill()
    assert proc.returncode == 128 + getattr(signal, sig), err
    assert _one_line(err.replace("\r", "\n").splitlines()[-1]) == (
        f"stopped by {sig}: --output {out} not written (its temporary file removed; a file there before is "
        f"unchanged)"), err
    assert "Traceback" not in err and _temporaries(tmp_path) == [] and not out.exists()


# ---- A2: errors that were tracebacks or named no file ------------------------------------------------------------

class _Rank0:
    is_rank0 = True

    @staticmethod
    def broadcast_object(obj, src=0):
        return obj


class _NoCheckpoint:
    @staticmethod
    def choose(which, log=print):
        return None


@pytest.mark.parametrize("case", ["below-a-file", "read-only"])
def test_a_run_dir_that_cannot_be_made_is_one_line_naming_it(tmp_path, monkeypatch, case):
    """The issue's: a read-only run.dir (OSError: [Errno 30] ... 'train.lock', a traceback) and a run.dir below a
    regular file (a NotADirectoryError traceback): the trainer's first touch of run.dir (trainer.training.start)."""
    from types import SimpleNamespace

    from trainer.checkpoint.checkpointer import CheckpointError
    from trainer.training.start import open_run_dir

    (tmp_path / "a-file").write_text("x")
    run_dir = tmp_path / "a-file" / "run"
    expected = f"{run_dir}: cannot create run.dir: {tmp_path / 'a-file'} is a regular file, not a directory"
    if case == "read-only":
        run_dir = tmp_path / "ro" / "run"
        expected = f"{run_dir}: cannot create run.dir: Read-only file system"
        monkeypatch.setattr(os, "makedirs", lambda p, *a, **k: (_ for _ in ()).throw(OSError(errno.EROFS,
                                                                                              "Read-only file system")))
    with pytest.raises(CheckpointError) as e:
        open_run_dir(_Rank0(), SimpleNamespace(dir=str(run_dir), overwrite=False), "auto", _NoCheckpoint())
    assert str(e.value) == expected


LIMITED = textwrap.dedent("""
    import resource, runpy, sys
    resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[1]), resource.RLIM_INFINITY))  # a full disk, for anyone
    sys.argv = sys.argv[2:]
    runpy.run_path(sys.argv[0], run_name="__main__") if sys.argv[0].endswith(".py") else \\
        runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
""")


def _on_a_full_disk(limit: int, *argv) -> subprocess.CompletedProcess:
    return run_cli([sys.executable, "-c", LIMITED, str(limit), *argv], check=False, timeout=300)


@pytest.mark.slow
def test_translate_export_and_prepare_on_a_full_disk_name_the_file_in_one_line(run_and_input, tmp_path):
    """The issue's: prepare said 'prepare: error: : No space left on device'; translate named no file; export gave
    torch.save's RuntimeError (inline_container.cc) traceback and left model.pt.tmp behind."""
    run, source = run_and_input
    source.write_text("the cat sees the tree\n" * 40)
    out = tmp_path / "out.txt"
    out.write_text("an earlier translation\n")
    r = _on_a_full_disk(64, "launch/translate.py", "--run", run, "--input", source, "--output", out)
    assert r.returncode == 2 and _one_line(r.stderr) == f"error: --output {out}: cannot write: File too large"
    assert out.read_text() == "an earlier translation\n" and _temporaries(tmp_path) == []
    r = _on_a_full_disk(4096, "launch/export.py", "--run", run, "--out", tmp_path / "model.pt")
    assert r.returncode == 2 and _one_line(r.stderr) == f"error: --out {tmp_path / 'model.pt'}: cannot write: File " \
                                                        f"too large"
    assert not (tmp_path / "model.pt").exists() and _temporaries(tmp_path) == []
    train = moses(tmp_path, "train", good_pairs(400))
    r = _on_a_full_disk(8192, "data_prep.prepare", "--format", "moses", "--train-src", train[0], "--train-tgt",
                        train[1], "--out", tmp_path / "data", "--vocab-size", "60", "--workers", "1")
    assert r.returncode == 2 and "cannot write: File too large" in r.stderr.strip().splitlines()[-1], r.stderr
    assert f"prepare: error: {tmp_path / 'data'}/" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "data").exists()


@pytest.mark.slow
def test_the_train_cli_says_one_line_for_a_run_dir_below_a_regular_file(tiny_data, tmp_path):
    from tests.test_run_dir import _small_run_cmd

    (tmp_path / "a-file").write_text("x")
    r = run_cli(_small_run_cmd(tiny_data, tmp_path / "a-file" / "run", "train.max_steps=1"), check=False,
                timeout=300)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert (f"error: {tmp_path / 'a-file' / 'run'}: cannot create run.dir: {tmp_path / 'a-file'} is a regular "
            f"file, not a directory") in r.stderr


# ---- A3: special files read by the commands ----------------------------------------------------------------------

@pytest.mark.timeout(60)
@pytest.mark.parametrize("flag", ["--input", "--ref"])
def test_the_commands_refuse_a_fifo_or_a_device_as_input_unread(run_and_input, tmp_path, capsys, flag):
    run, source = run_and_input
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    argv = (["translate", ["--run", run, "--input", fifo, "--output", tmp_path / "o"]] if flag == "--input" else
            ["evaluate", ["--run", run, "--src", source, "--ref", fifo]])
    _refused(*argv[:2], capsys, f"{flag} {fifo}: ", {})
    assert not (tmp_path / "o").exists()


# ---- no file access outside the layer ----------------------------------------------------------------------------

MODULE_CALLS = {("io", "open"), ("os", "open"), ("os", "fdopen"), ("codecs", "open"), ("gzip", "open"),
                ("gzip", "GzipFile"), ("bz2", "open"), ("lzma", "open"), ("zipfile", "ZipFile"), ("tarfile", "open"),
                ("np", "fromfile"), ("np", "memmap"), ("np", "load"), ("np", "save"), ("np", "savez"),
                ("np", "loadtxt"), ("np", "savetxt"), ("numpy", "fromfile"), ("numpy", "memmap"), ("torch", "load"),
                ("torch", "save"), ("json", "load"), ("json", "dump"), ("pickle", "load"), ("pickle", "dump"),
                ("yaml", "dump"), ("yaml", "safe_dump"), ("OmegaConf", "save"), ("shutil", "copyfile"),
                ("shutil", "copy"), ("shutil", "copy2"), ("shutil", "copytree"), ("shutil", "move"),
                ("shutil", "copyfileobj"), ("os", "replace"), ("os", "rename"), ("os", "truncate"),
                ("tempfile", "mkstemp"), ("tempfile", "NamedTemporaryFile"), ("tempfile", "TemporaryFile"),
                ("tempfile", "TemporaryDirectory"), ("tempfile", "mkdtemp")}
METHODS = {"open", "read_text", "read_bytes", "write_text", "write_bytes", "savefig", "tofile", "touch"}
LAYER = {"files", "run_files", "ck", "checkpoint"}  # the layer and what is built on it (run.dir, checkpoints)
ALLOWED = {  # (file, access): (how many, why)
    ("data_prep/binary.py", "np.fromfile"): (1, "on a data file opened by the layer (open_data)"),
    ("data_prep/binary.py", "np.memmap"): (1, "on a data file opened by the layer (open_data)"),
    ("data_prep/binary.py", "os.replace"): (1, "a token file prepare wrote in its staging directory, into place"),
    ("data_prep/prepare.py", "os.replace"): (1, "publish: prepare's staged files over its own earlier output "
                                                "(check_out, check_inputs_kept)"),
    ("data_prep/readers/opus.py", "zipfile.ZipFile"): (3, "on a zip opened by the layer (open_zip), and annotations"),
    ("data_prep/readers/opus.py", ".open"): (1, "a member of that zip"),
    ("data_prep/readers/tmx.py", "gzip.GzipFile"): (2, "around a file opened (or written) by the layer"),
    ("launch/translate.py", "os.open"): (1, "/dev/null over stdout once its reader left (BrokenPipeError)"),
    ("trainer/artifacts/torch_files.py", "torch.load"): (1, "the one weights-only loader, on a file the layer opened "
                                                            "(a checkpoint's, an exported model)"),
    ("trainer/artifacts/model_files.py", "zipfile.ZipFile"): (1, "on a model file opened by the layer (is_export)"),
    ("trainer/checkpoint/files.py", "os.replace"): (1, "a checkpoint directory (not a file) renamed into place"),
    ("trainer/checkpoint/files.py", "torch.save"): (1, "into memory; the bytes are written by run_files"),
    ("trainer/inference/cli.py", "open"): (1, "stdout (--output -), a stream the user chose"),
    ("trainer/inference/loading.py", "torch.save"): (1, "into the layer's replacement of --out"),
    ("trainer/observe/cpu_threads.py", "open"): (3, "the kernel's /proc, not a user's file"),
    ("trainer/observe/plots.py", ".savefig"): (1, "into the layer's replacement of the PNG"),
    ("trainer/observe/profiling.py", "tempfile.TemporaryDirectory"): (1, "torch writes its trace to a path: a "
                                                                         "directory of its own, removed after"),
    ("trainer/observe/profiling.py", "open"): (1, "that trace, in that directory"),
    ("trainer/observe/profiling.py", "gzip.GzipFile"): (1, "around a file run_files opened in run.dir"),
    ("trainer/observe/profiling.py", "shutil.copyfileobj"): (1, "from that trace into that file"),
    ("trainer/observe/timeline.py", ".savefig"): (1, "into a file run_files opened in run.dir"),
    ("trainer/observe/timeline.py", "open"): (1, "the kernel's /proc/self/statm"),
    ("trainer/parallel/shm_sum.py", "os.open"): (1, "its own new file in /dev/shm (O_EXCL, 0600), unlinked once mapped"),
    ("trainer/training/job_control.py", "open"): (1, "the kernel's /proc/PID/cmdline"),
    ("trainer/training/job_control.py", "os.open"): (2, "the controlling terminal, /dev/tty; /dev/null over the "
                                                        "streams of a terminal that hung up (SIGHUP)"),
    ("trainer/training/tuning.py", "open"): (1, "the kernel's /proc/cpuinfo"),
    ("trainer/training/cli.py", "tempfile.TemporaryDirectory"): (1, "its cleanup, named to find the process's own "
                                                                     "temporary directories and remove them at exit"),
    ("trainer/training/memory.py", "open"): (1, "the kernel's /proc/self/maps"),
    ("trainer/parallel/ports.py", "open"): (1, "the kernel's /proc/sys/net/ipv4/ip_local_port_range"),
}


def file_access(path: Path) -> list[str]:
    """Every way `path` opens, reads or writes a file by itself: open(), module functions (`np.fromfile`,
    `torch.save`, `os.replace`, ...; imported by name too), Path-like methods (`.read_text()`, `.savefig()`, ...)
    on anything but the layer's modules."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module:
            found += [f"{node.module}.{a.name}" for a in node.names
                      if (node.module.split(".")[-1], a.name) in MODULE_CALLS]
        elif isinstance(node, ast.Name) and node.id == "open" and isinstance(node.ctx, ast.Load):
            found.append("open")
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and \
                (node.value.id, node.attr) in MODULE_CALLS:
            found.append(f"{node.value.id}.{node.attr}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in METHODS and \
                not (isinstance(node.func.value, ast.Name) and (node.func.value.id in LAYER or
                                                                 (node.func.value.id, node.func.attr) in MODULE_CALLS)):
            found.append(f".{node.func.attr}")
        elif isinstance(node, ast.keyword) and node.arg == "model_file":  # SentencePiece opening a path itself
            found.append("model_file=")
    return found


def test_no_file_is_opened_read_or_written_outside_the_file_layer():
    """trainer/, data_prep/ and launch/ (benchmarks/ and tests/ write only what they made themselves)."""
    counts: dict[tuple[str, str], int] = {}
    for top in ("trainer", "data_prep", "launch"):
        for path in sorted((REPO / top).rglob("*.py")):
            rel = str(path.relative_to(REPO))
            if rel != "data_prep/files.py":
                for access in file_access(path):
                    counts[(rel, access)] = counts.get((rel, access), 0) + 1
    new = {k: n for k, n in counts.items() if n > ALLOWED.get(k, (0, ""))[0]}
    assert new == {}, "open, read or write these through data_prep.files (or add a reason to ALLOWED)"
    assert {k: n for k, n in counts.items() if k in ALLOWED} == {k: n for k, (n, _) in ALLOWED.items()}  # none gone


def test_the_walk_finds_each_kind_of_access(tmp_path):
    path = tmp_path / "x.py"
    path.write_text("import numpy as np\nfrom json import dump\nfrom pathlib import Path\n\n"
                    "def f(p, fig, files):\n    a = np.fromfile(p)\n    open(p).read()\n    Path(p).write_text('x')\n"
                    "    fig.savefig(p)\n    opener = gzip.open\n    files.read_bytes(p, 1)\n"
                    "    return spm.SentencePieceProcessor(model_file=p)\n")
    assert sorted(file_access(path)) == [".savefig", ".write_text", "gzip.open", "json.dump", "model_file=",
                                         "np.fromfile", "open"]
