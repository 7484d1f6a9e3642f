"""`prepare` at scale: output independent of --workers, compact duplicate tables, streaming samples, bounded chunks."""
from __future__ import annotations

import json
import random
import re
from pathlib import Path

import numpy as np
import pytest

from data_prep import pipeline
from data_prep.binary import TokenArrayWriter
from data_prep.dedup import Deduplicator, UInt64Set, hash64
from data_prep.demo_corpus import generate
from data_prep.filters import pair_key
from data_prep.prepare import escape, main, unescape
from data_prep.vocab import sample_flags


def write_corpus(tmp_path: Path) -> list[str]:
    """~1,300 demo pairs with every kind of reject: exact and near duplicates (also within one chunk), copies,
    empty sides, a too-long pair, invalid UTF-8; and a dev / test split. Returns the prepare arguments."""
    corpus = generate(pairs=1100, dev=60, test=60, seed=5)
    rng = random.Random(5)
    train: list[tuple[bytes, bytes]] = [(en.encode(), ja.encode()) for en, ja in corpus["train"]]
    for _ in range(120):
        en, ja = rng.choice(train[:1000])
        if rng.random() < 0.5:  # near: case and punctuation differ
            en = en.upper().replace(b" .", b" !")
        train.insert(rng.randrange(len(train)), (en, ja))
    train += [(b"same text", b"same text"), (b"a pump .", b"\xe3\x80\x80"), (b"the lid \xff .", b"\xe8\x93\x8b"),
              (b"a lid . " * 300, "蓋 。".encode() * 300)]
    args = []
    for split, rows in (("train", train), ("dev", corpus["dev"]), ("test", corpus["test"])):
        for k, lang in enumerate(("en", "ja")):
            path = tmp_path / f"{split}.{lang}"
            path.write_bytes(b"".join((r[k] if isinstance(r[k], bytes) else r[k].encode()) + b"\n" for r in rows))
            args += [f"--{split}-{'src' if k == 0 else 'tgt'}", path]
    # (600: byte fallback takes 256 pieces; with 300 the English side is nearly characters and long claims go)
    return [*map(str, args), "--format", "moses", "--on-error", "skip", "--vocab-size", "600", "--spm-sample", "700"]


def assert_same_output(outs: dict) -> dict:
    """Two prepared dirs {workers: out} hold the same files, byte for byte, and manifests that differ only in
    --workers, --out and the date; returns the manifest."""
    (w1, out1), (w2, out2) = outs.items()
    names = sorted(p.name for p in out1.iterdir())
    assert names == sorted(p.name for p in out2.iterdir())
    assert {"train.src.bin", "train.tgt.idx", "test.src.bin", "rejects.tsv", "spm.src.model"} <= set(names)
    for name in names:
        if name != "manifest.json":
            assert (out1 / name).read_bytes() == (out2 / name).read_bytes(), name
    m1, m2 = (json.loads((out / "manifest.json").read_text()) for out in (out1, out2))
    for m, w, out in ((m1, w1, out1), (m2, w2, out2)):
        assert m["options"].pop("workers") == w and m["options"].pop("out") == str(out)
        m.pop("created")
    assert m1 == m2
    return m1


def test_output_does_not_depend_on_workers(tmp_path, monkeypatch):
    monkeypatch.setattr(pipeline, "CHUNK", 97)  # many chunks, so that two workers really share the work
    args = write_corpus(tmp_path)
    outs = {w: tmp_path / f"out{w}" for w in (1, 2)}
    for w, out in outs.items():
        assert main([*args, "--out", str(out), "--workers", str(w)]) == 0
    m1 = assert_same_output(outs)
    rejected = m1["splits"]["train"]["rejected"]
    for reason in ("duplicate", "near_duplicate", "copy", "empty", "too_long_text", "invalid_utf8"):
        assert rejected[reason] > 0, reason
    assert m1["splits"]["train"]["pairs_kept"] > 900


def dying(task_class, marker: Path | None, end):
    """task_class's __call__, ending its worker process with `end()` the first time any worker runs it (the
    marker file taken), or every time (no marker); never in this process (a split of one chunk runs here)."""
    import os
    original, this = task_class.__call__, os.getpid()

    def call(self, payload):
        if os.getpid() == this:
            return original(self, payload)
        if marker is None:
            end()
        try:
            os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return original(self, payload)
        end()
    return call


def test_a_worker_killed_mid_run_costs_a_new_pool_not_the_output(tmp_path, monkeypatch, capsys):
    """A worker that dies (the OOM killer's SIGKILL; seen once in CI, cause unknown) in pass 1 and in pass 2: its
    chunks go to a new pool, said on stderr, and the output is the one an undisturbed run writes."""
    import os
    import signal
    monkeypatch.setattr(pipeline, "CHUNK", 97)
    args = write_corpus(tmp_path)
    assert main([*args, "--out", str(tmp_path / "out1"), "--workers", "1"]) == 0
    capsys.readouterr()
    kill = lambda: os.kill(os.getpid(), signal.SIGKILL)  # noqa: E731
    monkeypatch.setattr(pipeline.CleanTask, "__call__", dying(pipeline.CleanTask, tmp_path / "clean", kill))
    monkeypatch.setattr(pipeline.EncodeTask, "__call__", dying(pipeline.EncodeTask, tmp_path / "encode", kill))
    assert main([*args, "--out", str(tmp_path / "out2"), "--workers", "2"]) == 0
    lines = capsys.readouterr().err.strip().splitlines()
    restarts = [line for line in lines if "go to a new pool of workers" in line]
    assert len(restarts) == 2 and all(re.fullmatch(
        r"prepare: a worker process \(pid \d+\) ended by SIGKILL; its \d+ chunk\(s\) in flight go to a new pool "
        r"of workers \(restart 1 of at most 2\)", line) for line in restarts), lines
    assert_same_output({1: tmp_path / "out1", 2: tmp_path / "out2"})


def test_a_worker_that_always_dies_ends_prepare_in_one_line(tmp_path, monkeypatch, capsys):
    import os
    monkeypatch.setattr(pipeline, "CHUNK", 97)
    args = write_corpus(tmp_path)
    monkeypatch.setattr(pipeline.CleanTask, "__call__", dying(pipeline.CleanTask, None, lambda: os._exit(3)))
    assert main([*args, "--out", str(tmp_path / "out"), "--workers", "2"]) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 3 and all("ended with exit code 3" in line for line in lines), lines
    assert "restart 2 of at most 2" in lines[1]
    assert re.fullmatch(
        rf"prepare: error: a worker process \(pid \d+\) ended with exit code 3 \(3 pools broken in this pass; the "
        rf"kernel's OOM killer sends SIGKILL: lower --workers, or see `dmesg`\), while reading train, after "
        rf"{re.escape(str(tmp_path / 'train.en'))}:\d+; {re.escape(str(tmp_path / 'out'))} is as it was before",
        lines[2]), lines[2]
    assert not (tmp_path / "out").exists()


def test_fatal_record_stops_every_worker_count_alike(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(pipeline, "CHUNK", 97)
    args = write_corpus(tmp_path)
    args = args[:args.index("--on-error")] + args[args.index("--on-error") + 2:]
    errors = []
    for w in (1, 2):
        assert main([*args, "--out", str(tmp_path / f"out{w}"), "--workers", str(w)]) == 2
        errors.append(capsys.readouterr().err.strip().splitlines()[-1])
        assert not (tmp_path / f"out{w}").exists()
    line = (tmp_path / "train.en").read_bytes().split(b"\n").index(b"the lid \xff .") + 1
    assert errors[0] == errors[1] == f"prepare: error: {tmp_path / 'train.en'}:{line}: invalid UTF-8"


def brute_force(exact: list[int], near: list[int], use_exact: bool, use_near: bool) -> list:
    """The duplicate rules with two Python sets, the reference semantics."""
    seen_exact, seen_near, out = set(), set(), []
    for e, k in zip(exact, near):
        if use_exact and e in seen_exact:
            out.append("duplicate")
        elif use_near and k in seen_near:
            out.append("near_duplicate")
        else:
            out.append(None)
            seen_exact.add(e)
            seen_near.add(k)
    return out


@pytest.mark.parametrize("use_exact,use_near", [(True, True), (True, False), (False, True)])
def test_deduplicator_equals_python_sets(use_exact, use_near):
    rng = random.Random(7)
    for trial in range(60):
        n, pool = rng.randint(1, 400), rng.randint(1, 80)
        # small key pools: repeats within and across chunks; a near key usually follows the exact key but is
        # sometimes shared by different pairs, and key 0 (the table's empty mark) occurs
        exact = [rng.randrange(pool) for _ in range(n)]
        near = [e // rng.choice((1, 1, 1, 2, 3)) for e in exact]
        dedup, got, chunk = Deduplicator(use_exact, use_near), [], rng.randint(1, 60)
        for a in range(0, n, chunk):
            got += dedup.reasons(np.array(exact[a:a + chunk], np.uint64), np.array(near[a:a + chunk], np.uint64))
        assert got == brute_force(exact, near, use_exact, use_near), trial


def test_uint64_set_with_colliding_slots_and_compact_memory():
    rng = random.Random(3)
    keys = [rng.getrandbits(64) for _ in range(3000)] + [i << 40 for i in range(1, 1000)] + [0, 1, 2**64 - 1]
    table, reference = UInt64Set(capacity=8), set()
    for a in range(0, len(keys), 500):  # chunks repeat half of the keys seen so far
        batch = keys[a:a + 500] + rng.sample(keys[:a + 1], min(a, 250))
        want = [k in reference for k in batch]
        assert table.contains(np.array(batch, np.uint64)).tolist() == want
        table.add(np.array(batch, np.uint64))
        reference.update(batch)
        assert len(table) == len(reference)
    probes = np.array(keys, np.uint64)
    assert table.contains(probes).all()
    assert not table.contains(probes ^ np.uint64(1 << 63)).any()  # none of these were added
    slots = table._slots(probes[probes != 0])
    assert (table._table[slots] != probes[probes != 0]).sum() > 100  # many keys live off their home slot
    assert table.nbytes <= 24 * len(table)
    big = UInt64Set()
    big.add(np.arange(1, 200_001, dtype=np.uint64))
    assert len(big) == 200_000 and big.nbytes <= 24 * 200_000


def test_hash64_is_pair_key():
    pairs = [("the lid .", "蓋 。"), ("", ""), ("a\\b", "c")]
    assert hash64(f"{s}\t{t}" for s, t in pairs).tolist() == [pair_key(s, t) for s, t in pairs]


def test_sample_flags_streaming_exact_and_seeded():
    for n, k in ((1000, 100), (1000, 999), (50, 50), (50, 80), (0, 5), (7, 0)):
        flags = list(sample_flags(n, k, 1))
        assert len(flags) == n and sum(flags) == min(n, k)
    assert list(sample_flags(1000, 100, 1)) == list(sample_flags(1000, 100, 1)) != list(sample_flags(1000, 100, 2))
    hits = np.zeros(10)  # uniform: each tenth of the items gets about a tenth of the sample
    for seed in range(200):
        hits += np.add.reduceat(np.fromiter(sample_flags(1000, 50, seed), bool), np.arange(0, 1000, 100))
    assert np.all(np.abs(hits / hits.sum() - 0.1) < 0.02)


def test_parallel_map_keeps_order_and_bounds_what_is_in_flight():
    pulled = []

    def items():
        for i in range(40):
            pulled.append(i)
            yield i, i

    results = pipeline.parallel_map(abs, items(), workers=2)
    assert next(results) == (0, 0)
    assert len(pulled) <= 2 * 2 + 2  # the input is read ahead by a few chunks, never to the end
    assert list(results) == [(i, i) for i in range(1, 40)]


def test_append_many_writes_the_bytes_of_append(tmp_path):
    sentences = [[5, 6, 7], [], [8], [9, 10]]
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    one, many = (TokenArrayWriter(str(tmp_path / d), "train", "src") for d in ("a", "b"))
    for ids in sentences:
        one.append(ids)
    many.append_many(np.array([5, 6, 7], np.int32), np.array([3, 0]))
    many.append_many(np.array([], np.int32), np.array([], np.int64))
    many.append_many(np.array([8, 9, 10], np.int32), np.array([1, 2]))
    one.close(), many.close()
    for ext in ("bin", "idx"):
        assert (tmp_path / "a" / f"train.src.{ext}").read_bytes() == (tmp_path / "b" / f"train.src.{ext}").read_bytes()


def test_unescape_inverts_escape():
    for text in ["a\tb\nc\rd\\e", "\\t", "\\\\n", "", "plain", "end\\"]:
        assert unescape(escape(text)) == text
