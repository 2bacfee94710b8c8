"""Tests marked ``serial`` share the Slurm testbed and must run in one worker under ``pytest -n``: conftest
gives them the xdist group ``serial`` and ``--dist loadgroup`` (addopts) keeps a group on one worker. When
the installed pytest and pytest-xdist stop agreeing on how a group is recorded (pytest 9.2 with xdist 3.8:
the node id is no longer renamed ``...@serial``), the group is silently ignored and two workers drive the
testbed at once; this test fails then."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent


@pytest.mark.slow
def test_serial_tests_form_one_xdist_group() -> None:
    pytest.importorskip("xdist")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "-v", "-p", "no:cacheprovider",
                           str(TESTS / "serial_probe.py")], cwd=TESTS.parent, capture_output=True, text=True,
                          timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "serial_probe.py::test_marked_serial@serial PASSED" in proc.stdout or \
        "PASSED tests/serial_probe.py::test_marked_serial@serial" in proc.stdout, proc.stdout[-2000:]
    assert "test_not_serial@" not in proc.stdout
