"""Issue 22, items 17 and 18 (inference): one enormous input line no longer holds up the rest, and decoding
options or files the checks let through (a NaN or negative length ratio, a negative beam, empty files, a
reference that is not UTF-8) are one line naming the flag or the file, exit code 2."""
from __future__ import annotations

import time

import pytest

from tests.test_hostile import fake_run
from trainer.inference.cli import add_decode_arguments, add_model_arguments  # noqa: F401 (the flags under test)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return fake_run(tmp_path_factory.mktemp("limits") / "run")


def _cli(name: str):
    import importlib.util

    from tests.conftest import REPO

    spec = importlib.util.spec_from_file_location(f"launch_{name}", REPO / "launch" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


def _fails(main, argv, capsys) -> str:
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err.strip()


@pytest.mark.timeout(120)
def test_an_enormous_line_is_left_out_counted_and_the_others_translated(run, tmp_path, capsys):
    src = tmp_path / "in.txt"
    lines = ["the cat sees the dog", "x" * 2_000_000, "the bird sees the tree", "y" * 70_000, ""]
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "out.txt"
    start = time.time()
    assert _cli("translate")(["--run", str(run), "--input", str(src), "--output", str(out), "--beam", "2"]) == 0
    assert time.time() - start < 60  # it used to decode 16k segments of the 2 MB line to their maximum length
    got = out.read_text(encoding="utf-8").split("\n")
    assert len(got) == len(lines) + 1 and got[-1] == ""  # one output line per input line
    assert got[1] == "" and got[3] == "" and got[4] == ""
    err = capsys.readouterr().err
    assert (f"warning: 2 line(s) of {src} longer than --max-line-bytes 65536 were not translated (their output "
            f"lines are empty): line 2, 4") in err
    assert "translated 5 sentences" in err
    # the cap is in UTF-8 bytes, and can be lowered ("the cat sees the dog" is 20 bytes, the bird line 22)
    assert _cli("translate")(["--run", str(run), "--input", str(src), "--output", str(out), "--beam", "1",
                              "--max-line-bytes", "21"]) == 0
    assert "3 line(s)" in capsys.readouterr().err and out.read_text(encoding="utf-8").split("\n")[0]


@pytest.mark.parametrize("flag,value,expected", [
    ("--max-len-ratio", "inf", "--max-len-ratio inf: must be a finite number > 0"),
    ("--max-len-ratio", "nan", "--max-len-ratio nan: must be a finite number > 0"),
    ("--max-len-ratio", "-3", "--max-len-ratio -3.0: must be a finite number > 0"),
    ("--beam", "-1", "--beam -1: the beam size must be >= 1"),
    ("--beam", "0", "--beam 0: the beam size must be >= 1"),
    ("--length-penalty", "nan", "--length-penalty nan: must be a finite number"),
    ("--max-line-bytes", "-1", "--max-line-bytes -1: must be >= 0"),
    ("--beam", "100000000", "--beam 100000000: at most 1000 (larger sizes only ask for memory"),  # 48 GB asked for
    ("--max-len-ratio", "1e9", "--max-len-ratio 1000000000.0: at most 10.0"),  # 720 GB asked for
    ("--batch-size", "1000000000", "--batch-size 1000000000: at most 10000"),
    ("--max-tokens", "9999999999", "--max-tokens 9999999999: at most 1000000"),
])
def test_decoding_flags_are_checked_before_any_line(run, tmp_path, capsys, flag, value, expected):
    src = tmp_path / "in.txt"
    src.write_text("the cat\n")
    err = _fails(_cli("translate"), ["--run", str(run), "--input", str(src), "--output", str(tmp_path / "o"),
                                     flag, value], capsys)
    assert err == f"error: {expected}" or err.startswith(f"error: {expected}")
    err = _fails(_cli("evaluate"), ["--run", str(run), "--src", str(src), "--ref", str(src), flag, value], capsys)
    assert err.startswith(f"error: {expected}")


def test_evaluate_refuses_empty_files_and_names_a_reference_that_is_not_utf8(run, tmp_path, capsys):
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    err = _fails(_cli("evaluate"), ["--run", str(run), "--src", str(empty), "--ref", str(empty)], capsys)
    assert err == f"error: --src {empty} and --ref {empty} are empty: no sentence to evaluate"
    src, ref = tmp_path / "src.txt", tmp_path / "ref.txt"
    src.write_text("the cat\nthe dog\n")
    ref.write_bytes("猫\n".encode("utf-8") + b"\xff\xfe dog\n")
    err = _fails(_cli("evaluate"), ["--run", str(run), "--src", str(src), "--ref", str(ref)], capsys)
    assert err.startswith(f"error: --ref {ref}:2: not UTF-8 (invalid start byte")


def test_an_oversized_line_is_read_past_without_being_held_whole():
    import io
    import tracemalloc

    from trainer.inference.cli import read_chunks

    stream = io.BytesIO(b"first\n" + b"z" * (20 << 20) + b"\nlast\n" + b"x" * 65536 + b"\n" + b"y" * 65537)
    tracemalloc.start()
    chunks = list(read_chunks(stream, "in", 2, cap=65536))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert chunks == [(["first", ""], [1]), (["last", "x" * 65536], []), ([""], [0])]  # exactly the cap is kept
    assert peak < 2 << 20, peak  # the 20 MB line was never held (the test's bound, as prepare's)


def test_size_flags_of_score_and_translate_and_the_configs_decode_keys_are_bounded(run, tmp_path, capsys):
    src = tmp_path / "in.txt"
    src.write_text("the cat\n")
    err = _fails(_cli("score"), ["--run", str(run), "--src", str(src), "--ref", str(src), "--batch-size", "1000000000"],
                 capsys)
    assert err.startswith("error: --batch-size 1000000000: at most 10000")
    for argv, expected in ((["--buffer-size", "-1"], "--buffer-size -1: must be in 1 .. 1000000"),
                           (["--n-best", "6"], "--n-best 6 must be <= the beam size (5)")):
        err = _fails(_cli("translate"), ["--run", str(run), "--input", str(src), *argv], capsys)
        assert err.startswith(f"error: {expected}"), err
    from trainer.config import ConfigError, load_config

    for key, value in (("decode.beam", 100000000), ("decode.dev_beam", 5000), ("decode.max_len_add", 10 ** 9)):
        with pytest.raises(ConfigError, match=rf"{key}={value}: at most"):
            load_config(None, [f"{key}={value}"])  # a run's (or a model file's) config is checked the same way


def test_a_beam_search_batch_holds_at_most_max_hypotheses(run, monkeypatch):
    from trainer.inference import translator as module
    from trainer.inference.loading import load_run

    rows = []
    monkeypatch.setattr(module, "beam_search_nbest", lambda models, src, lengths, beam, **kw: (
        rows.append(src.shape[0] * beam) or [[module.Hypothesis([], 0.0, 0.0)]] * src.shape[0]))
    load_run(str(run)).translate(["the cat"] * 100, beam=1000, batch_size=64, max_tokens=0)
    assert max(rows) <= module.MAX_HYPOTHESES and sum(rows) == 100 * 1000


def test_running_out_of_memory_while_decoding_is_one_line(run, tmp_path, capsys, monkeypatch):
    from trainer.inference.translator import Translator

    def out_of_memory(*args, **kwargs):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: "
                           "you tried to allocate 48000000000 bytes. Error code 12 (Cannot allocate memory)")

    monkeypatch.setattr(Translator, "translate_nbest", out_of_memory)
    src = tmp_path / "in.txt"
    src.write_text("the cat\n")
    err = _fails(_cli("translate"), ["--run", str(run), "--input", str(src), "--output", str(tmp_path / "o")], capsys)
    assert err.startswith("error: out of memory (") and err.endswith("lower --batch-size, --max-tokens or --beam")


def test_a_runs_config_asking_for_an_oversized_beam_is_refused_naming_the_file(tmp_path, capsys):
    run = fake_run(tmp_path / "run")
    config = run / "config.yaml"
    config.write_text(config.read_text().replace("beam: 5", "beam: 100000000"))
    src = tmp_path / "in.txt"
    src.write_text("the cat\n")
    err = _fails(_cli("translate"), ["--run", str(run), "--input", str(src)], capsys)
    assert err == f"error: {config}: decode.beam=100000000: at most 1000"
