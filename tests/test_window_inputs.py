"""Inputs (issue 44): ISO 8601 basic dates are dates, never epoch seconds, and a window implausibly long or
starting long before the store's first data is refused in one line (``--long-window`` allows it) by every
command that stores an audit of its window, on both engines."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
from conftest import run_cli
from sqlalchemy import func, select
from test_chargeback import mixed

from auditor.store import schema
from auditor.store.engine import Store
from auditor.timeutil import parse_time


@pytest.mark.parametrize(("text", "want"), [
    ("20261122", datetime(2026, 11, 22, tzinfo=UTC)),
    ("20261122T0800", datetime(2026, 11, 22, 8, tzinfo=UTC)),
    ("20261122T080000", datetime(2026, 11, 22, 8, tzinfo=UTC)),
    ("20261122T080000Z", datetime(2026, 11, 22, 8, tzinfo=UTC)),
    ("20261122T080000+0100", datetime(2026, 11, 22, 7, tzinfo=UTC)),
    ("1795963018", datetime.fromtimestamp(1795963018, UTC)),  # ten digits: still epoch seconds
])
def test_iso_basic_dates(text: str, want: datetime) -> None:
    """Before: 20261122 was epoch seconds (1970-08-24)."""
    assert parse_time(text) == want


@pytest.fixture
def cfg_file(store_url: str, tmp_path: Path) -> Path:
    s = Store.open(store_url)
    s.upgrade()
    s.ingest(mixed())  # allocations from 2026-11-15 22:00 UTC
    s.engine.dispose()
    p = tmp_path / "c.toml"
    p.write_text(f'[store]\nurl = "{store_url}"\n[prices]\nmodels = {{h100 = 4.0}}\n')
    return p


def _runs(cfg_file: Path) -> int:
    import connectors

    s = Store.open(connectors.load_config(cfg_file).store.resolved_url())
    try:
        with s.engine.connect() as conn:
            return conn.execute(select(func.count()).select_from(schema.audit_runs)).scalar() or 0
    finally:
        s.engine.dispose()


def test_audit_since_a_basic_date(cfg_file: Path) -> None:
    """Before: `audit --since 20261116` audited from 1970 and stored it without a word."""
    res = run_cli("--json", "-c", str(cfg_file), "audit", "--since", "20261116", "--until", "20261116T0700")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["since"] == "2026-11-16T00:00:00+00:00"


@pytest.mark.parametrize("cmd", [["audit"], ["run", "--steps", "audit"], ["chargeback"],
                                 ["export", "--out", "EXP"], ["what-if", "idle_sm=0.1"]])
def test_implausible_windows_are_refused(cfg_file: Path, cmd: list[str]) -> None:
    """A 56-year window and one starting two months before the first allocation: one line each, nothing
    stored; --long-window lets the second through."""
    cmd = [str(cfg_file.parent / "exp") if c == "EXP" else c for c in cmd]
    base = ["-c", str(cfg_file), *cmd]
    res = run_cli(*base, "--since", "19700824", "--until", "20261117")
    assert res.returncode == 1 and len(res.stderr.splitlines()) == 1, res.stderr
    assert "days long (more than 400)" in res.stderr and "--long-window" in res.stderr
    res = run_cli(*base, "--since", "2026-09-01", "--until", "2026-11-17")
    assert res.returncode == 1 and len(res.stderr.splitlines()) == 1, res.stderr
    assert "before the store's first allocation (2026-11-15 22:00 UTC)" in res.stderr
    assert _runs(cfg_file) == 0
    res = run_cli(*base, "--since", "2026-09-01", "--until", "2026-11-17", "--long-window")
    assert res.returncode == 0, res.stderr
    res = run_cli(*base, "--since", "2026-11-01", "--until", "2026-11-17")  # inside the slack: a month
    assert res.returncode == 0, res.stderr
