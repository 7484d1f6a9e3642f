"""The fast tier's list of heavy tests (tests/tiers.py) cannot go stale, and what it names leaves the fast tier."""
from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import REPO, stale_heavy
from tests.tiers import HEAVY


def test_a_name_whose_file_was_collected_whole_but_names_no_test_is_stale():
    heavy = {"tests/test_a.py::test_gone": 1.0, "tests/test_a.py::test_here": 1.0, "tests/test_b.py::test_x": 1.0}
    collected = {"tests/test_a.py::test_here"}
    assert stale_heavy(heavy, collected, ["tests"], REPO) == ["tests/test_a.py::test_gone", "tests/test_b.py::test_x"]
    assert stale_heavy(heavy, collected, ["tests/test_a.py"], REPO) == ["tests/test_a.py::test_gone"]
    assert stale_heavy(heavy, collected, ["tests/test_a.py::test_here"], REPO) == []  # one test asked for


@pytest.mark.slow  # two pytest processes
def test_what_tiers_names_leaves_the_fast_tier_and_stays_in_the_whole_suite():
    name = next(n for n in HEAVY if n.startswith("tests/test_zero.py::"))
    def collect(*marks):
        out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", *marks, "tests/test_zero.py"],
                             cwd=REPO, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stdout + out.stderr
        return out.stdout.splitlines()
    assert name in collect() and name not in collect("-m", "not slow")
