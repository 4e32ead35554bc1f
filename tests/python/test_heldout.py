"""Tests of tools/heldout.py's draw (no GPU): the held-out shapes of a seed
are one fixed sequence, which --ops and --max-m only filter."""

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HELDOUT = ROOT / "tools" / "heldout.py"


@pytest.fixture(scope="module")
def heldout():
    spec = importlib.util.spec_from_file_location("normjit_heldout_under_test", HELDOUT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def m_of(shape):
    return int(re.match(r"(?:rms|ln):\w+:(\d+)x\d+", shape).group(1))


def test_a_longer_draw_extends_a_shorter_one(heldout):
    assert heldout.draw(7, 12) == heldout.draw(7, 30)[:12]


def test_max_m_keeps_the_sequence_filtered(heldout):
    full = heldout.draw(340, 400, ops=("fwd",))
    decode = heldout.draw(340, 40, ops=("fwd",), max_m=64)
    assert len(decode) == 40
    assert all(m_of(s["shape"]) <= 64 for s in decode)
    assert decode == [s for s in full if m_of(s["shape"]) <= 64][:40]
    # A quarter of the unfiltered draws are decode rows, so some are not.
    assert any(m_of(s["shape"]) > 64 for s in full)


def test_ops_restrict_the_draw(heldout):
    assert {s["op"] for s in heldout.draw(3, 40, ops=("bwd",))} == {"bwd"}
    assert {s["op"] for s in heldout.draw(3, 40)} == {"fwd", "bwd"}


def test_draw_command_takes_ops_and_max_m():
    out = subprocess.run([sys.executable, str(HELDOUT), "draw", "--seed", "340", "--count", "5", "--ops", "fwd",
                          "--max-m", "64"], capture_output=True, text=True, check=True).stdout.split("\n")
    rows = [line.split() for line in out if line]
    assert len(rows) == 5
    assert all(op == "fwd" and m_of(shape) <= 64 for op, shape in rows)
