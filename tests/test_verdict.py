"""The one verdict definition (auditor/audit/verdict.py), executed as SQL on SQLite and PostgreSQL against a table
of hand-written expectations (docs/definitions.md), and a check that no other module judges on its own."""

from __future__ import annotations

import io
import re
import shutil
import tokenize
from pathlib import Path

import pytest
from sqlalchemy import text

from auditor.audit import verdict
from auditor.config import Thresholds
from auditor.store.engine import Store

ROOT = Path(__file__).resolve().parent.parent
U, I, F, M, L, W, B = (verdict.UNKNOWN, verdict.IDLE, verdict.IDLE_BY_UTIL, verdict.MIRAGE, verdict.LOW,  # noqa: E741 - verdict initials
                       verdict.WORKING, verdict.BUSY_UNVERIFIED)
CI, CB, CS = verdict.IDLE_BY_COUNTERS, verdict.BUSY_BY_COUNTERS, verdict.ENGINE_SPIN  # the stock-counter tier
COLS = ("samples", "sm_active", "dram_active", "tensor_active", "gpu_util", "gr_engine", "power_w")

# (thresholds, samples, sm, dram, tensor, gpu_util, gr_engine, power_w) -> verdict; defaults: idle_sm 0.05,
# idle_dram 0.05, idle_tensor 0.01, mirage 0.5 / 0.5, working_sm 0.5, idle_util 0.05
CASES = [
    ({}, 0, 0.0, None, None, None, None, None, U),          # no samples: unknown, never idle
    ({}, 10, 0.01, None, None, None, None, None, I),        # missing DRAM/Tensor do not prevent idle
    ({}, 10, 0.01, 0.0, 0.0, 0.2, None, None, I),
    ({}, 10, 0.05, 0.0, 0.0, None, None, None, L),          # exactly at idle_sm: not below it
    ({}, 10, 0.05 - 1e-10, None, None, None, None, None, L),  # within 1e-9: still at the threshold
    ({}, 10, 0.049, 0.05, None, None, None, None, L),       # DRAM at its threshold: busy memory
    ({}, 10, 0.049, None, 0.01, None, None, None, L),       # Tensor at its threshold
    ({}, 10, 0.01, None, None, 0.5, None, None, M),         # GPU-Util exactly 50 % is "at least"
    ({}, 10, 0.01, None, None, 0.5 - 1e-10, None, None, M),
    ({}, 10, 0.01, None, None, None, 0.6, None, M),         # GR engine alone makes a mirage
    ({}, 10, 0.01, None, None, 0.49, 0.49, None, I),
    ({}, 10, 0.5, None, None, 0.0, None, None, W),          # working_sm is "at least"
    ({}, 10, 0.49, None, None, 1.0, None, None, L),
    ({}, 10, None, None, None, 0.04, None, None, F),        # GPU-Util only: idle-by-util
    ({}, 10, None, None, None, 0.05, None, None, B),        # 5 % GPU-Util is not "< 5 %"
    ({}, 10, None, None, None, 0.9, None, None, B),         # busy by GPU-Util: observed, unverifiable
    ({}, 10, None, None, None, None, None, 300.0, B),       # no utilization field at all: observed
    ({"util_fallback": False}, 10, None, None, None, 0.0, None, None, B),
    ({"idle_power_w": 100.0}, 10, None, None, None, 0.01, None, None, B),   # power required, missing
    ({"idle_power_w": 100.0}, 10, None, None, None, 0.01, None, 50.0, F),
    ({"idle_power_w": 100.0}, 10, None, None, None, 0.01, None, 100.0, B),  # at the power threshold
    ({"working_sm": 0.03}, 10, 0.04, None, None, None, None, None, I),      # idle test comes first
    # evidence tier 2, the stock counters (no SM activity; GR engine with Tensor or DRAM): before GPU-Util
    ({}, 10, None, 0.0, 0.0, 0.9, 0.0, None, CI),      # engine, Tensor, DRAM at zero: idle (GPU-Util aside)
    ({}, 10, None, 0.0, None, None, 0.04, None, CI),   # MIG: no GPU-Util, no Tensor reading
    ({}, 10, None, 0.049, 0.0099, None, 0.049, None, CI),
    ({}, 10, None, 0.0, 0.01, 0.0, 0.3, None, CB),     # Tensor at its threshold: work
    ({}, 10, None, 0.05, 0.0, 0.0, 0.0, None, CB),     # DRAM at its threshold: work
    ({}, 10, None, 0.3, None, None, 0.9, None, CB),
    ({}, 10, None, 0.0, 0.0, 0.0, 0.05, None, CS),     # engine at idle_gr_engine, Tensor and DRAM idle: spin
    ({}, 10, None, None, 0.0, 1.0, 0.9, None, CS),
    ({"idle_gr_engine": 0.2}, 10, None, 0.0, 0.0, None, 0.1, None, CI),
    ({"util_fallback": False}, 10, None, 0.0, 0.0, None, 0.0, None, CI),   # not the GPU-Util fallback
    ({}, 10, None, None, None, 0.04, 0.0, None, F),    # GR engine without Tensor or DRAM: GPU-Util decides
    ({}, 10, None, 0.3, 0.2, 0.04, None, None, F),     # Tensor and DRAM without the engine: GPU-Util decides
    ({}, 10, 0.6, 0.0, 0.0, None, 0.0, None, W),       # SM activity first
    ({}, 0, None, 0.3, 0.2, None, 0.9, None, U),       # no samples: unknown
]


@pytest.mark.parametrize("working_first", [False, True])
def test_verdict_sql_on_both_engines(store: Store, working_first: bool) -> None:
    sel = ", ".join(f"CAST(:{c} AS {'INTEGER' if c == 'samples' else 'DOUBLE PRECISION'}) AS {c}" for c in COLS)
    got, want = [], []
    with store.engine.connect() as conn:
        for th, *values, expected in CASES:
            sql = (f"SELECT {verdict.case(Thresholds(**th), verdict.prefixed('b'), working_first=working_first)}"
                   f" FROM (SELECT {sel}) b")
            got.append(conn.execute(text(sql), dict(zip(COLS, values, strict=True))).scalar())
            want.append(expected)
    assert got == want


#: the verdict's thresholds (Thresholds fields the one definition reads)
VERDICT_THRESHOLDS = (r"(idle_sm|idle_dram|idle_tensor|idle_util|working_sm|mirage_util|mirage_gr|idle_gr"
                      r"|idle_power_w)")
#: SQL text (anywhere in a module, strings included): a metric compared with a bound parameter or with an
#: interpolated value, or a verdict threshold bound as a parameter
SQL_JUDGING = re.compile(r"(sm_active|gpu_util|dram_active|tensor_active|gr_engine)\s*[<>]=?\s*[:{]"
                         rf"|:{VERDICT_THRESHOLDS[:-1]}|idle_power)\b|[<>]=?\s*\{{[^}}]*\b{VERDICT_THRESHOLDS}\b")
#: Python code (strings and comments removed): a comparison with a verdict threshold on either side
PY_JUDGING = re.compile(rf"[<>]=?\s*(?:\w+\s*\.\s*)*{VERDICT_THRESHOLDS}\b|\b{VERDICT_THRESHOLDS}\s*[<>]")


def _code(src: str) -> str:
    """``src`` without its strings and comments (the docs may say "SM < idle_sm"; code may not)."""
    drop = (tokenize.STRING, tokenize.COMMENT, tokenize.FSTRING_START, tokenize.FSTRING_MIDDLE,
            tokenize.FSTRING_END) if hasattr(tokenize, "FSTRING_START") else (tokenize.STRING, tokenize.COMMENT)
    toks = tokenize.generate_tokens(io.StringIO(src).readline)
    return " ".join(t.string for t in toks if t.type not in drop)


def judging_modules(package: Path) -> list[str]:
    """Modules of ``package`` (a directory; all its subpackages) other than auditor/audit/verdict.py that
    compare a metric with a verdict threshold, in SQL or in Python; named relative to its parent."""
    found = (str(p.relative_to(package.parent)) for p in package.rglob("*.py")
             if SQL_JUDGING.search(src := p.read_text()) or PY_JUDGING.search(_code(src)))
    return sorted(name for name in found if name != "auditor/audit/verdict.py")


def test_no_other_module_judges_on_its_own() -> None:
    """Only auditor/audit/verdict.py compares a metric with a verdict threshold (issue 13 section 2: one
    definition): every module of every stage package is read, and the connectors'."""
    assert len(list((ROOT / "auditor").rglob("*.py"))) > 90  # the stage packages, not just the top level
    assert judging_modules(ROOT / "auditor") + judging_modules(ROOT / "connectors") == []


@pytest.mark.parametrize("stray", [
    'SQL = "SELECT 1 FROM gpu_buckets b WHERE b.sm_active < :idle_sm"\n',
    'SQL = f"SELECT 1 FROM gpu_buckets b WHERE b.sm_active < {th.idle_sm!r}"\n',
    "def stray(sm: float, th) -> bool:\n    return sm < th.idle_sm\n",
])
def test_the_guard_sees_a_stray_comparison_in_a_stage_package(tmp_path: Path, stray: str) -> None:
    """A copy of auditor/ with one stray comparison appended to auditor/audit/episodes.py is caught."""
    shutil.copytree(ROOT / "auditor", tmp_path / "auditor")
    episodes = tmp_path / "auditor" / "audit" / "episodes.py"
    episodes.write_text(episodes.read_text() + "\n\n" + stray)
    assert judging_modules(tmp_path / "auditor") == ["auditor/audit/episodes.py"]
