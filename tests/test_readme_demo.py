"""The demo output shown in README.md is what `gpu-audit demo` prints: the README block is compared with the
headline of a real demo run (regenerate the block from the assertion message when the numbers change)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIRST, LAST = "Reserved GPU-hours:", "Findings:"


def headline_block(text: str) -> list[str]:
    """The lines from 'Reserved GPU-hours:' to 'Findings: ...' (the first such block)."""
    lines = text.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith(FIRST)), None)
    assert start is not None, f"no line starting with {FIRST!r}"
    end = next((i for i in range(start, len(lines)) if lines[i].startswith(LAST)), None)
    assert end is not None, f"no line starting with {LAST!r} after {FIRST!r}"
    return [ln.rstrip() for ln in lines[start:end + 1]]


def readme_demo_block() -> list[str]:
    """The fenced block after the README's `gpu-audit demo` command."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    at = text.index("gpu-audit demo")
    fences = [m.start() for m in re.finditer(r"^```", text[at:], re.M)]
    assert len(fences) >= 3, "README: no fenced output block after `gpu-audit demo`"
    return headline_block(text[at + fences[1]:at + fences[2]])


def test_readme_block_parser_reads_the_block() -> None:
    block = readme_demo_block()
    assert block[0].startswith(FIRST) and block[-1].startswith(LAST) and len(block) >= 3


@pytest.mark.slow
def test_readme_shows_what_the_demo_prints(tmp_path: Path) -> None:
    res = subprocess.run([sys.executable, "-m", "auditor", "demo", "--out", str(tmp_path / "demo")],
                         cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    printed = headline_block(res.stdout)
    assert readme_demo_block() == printed, (
        "README.md's demo output is stale; replace the block after `gpu-audit demo` with:\n" + "\n".join(printed))


@pytest.mark.slow
def test_the_demo_prints_the_same_week_at_any_hour(tmp_path: Path) -> None:
    """The demo's week ends at the hour it runs; what it prints does not depend on that hour (its inference
    jobs' daily cycle runs from the week's start, not from the wall clock: at 00:00 and at 14:00 UTC the mean
    SM activity was 57.497 % and 57.500 %, printed 57 % and 58 %, before)."""
    blocks = []
    for now in ("2026-11-23T00:00", "2026-11-23T14:00"):
        res = subprocess.run([sys.executable, "-m", "auditor", "demo", "--out", str(tmp_path / now[-5:-3]),
                              "--now", now], cwd=tmp_path, capture_output=True, text=True, timeout=600)
        assert res.returncode == 0, res.stderr[-2000:]
        blocks.append(headline_block(res.stdout))
    assert blocks[0] == blocks[1] and len(blocks[0]) >= 8
