"""What-if: threshold overrides parse (names, aliases, units), and the re-judgement diff is right on
hand-computed history without touching the official audit runs."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner
from test_findings_extra import IDLE, WORK, job, run

from auditor.audit.run import latest_run
from auditor.audit.whatif import format_diff, parse_overrides, what_if
from auditor.config import Config
from auditor.errors import GpuAuditError
from auditor.records import AllocatedGpu
from auditor.store.engine import Store

T0 = datetime(2026, 11, 16, tzinfo=UTC)
W0, W1 = T0 - timedelta(hours=1), T0 + timedelta(hours=8)


@pytest.mark.parametrize("spec, expected", [
    ("idle_sm=0.1", {"idle_sm": 0.1}),
    ("idle=10%,episode=1h", {"idle_sm": 0.1, "episode_hours": 1.0}),
    ("episode=90min, mirage_min=1h", {"episode_hours": 1.5, "mirage_min_minutes": 60.0}),
    ("episode_hours=3,low_hours=2h", {"episode_hours": 3.0, "low_efficiency_min_gpu_hours": 2.0}),
    ("fallback=off,power=none,coverage=30%", {"util_fallback": False, "idle_power_w": None,
                                               "unmonitored_coverage": 0.3}),
    ("Low-SM=0.2", {"low_efficiency_sm": 0.2}),
])
def test_parse_overrides(spec: str, expected: dict[str, Any]) -> None:
    got = parse_overrides(spec)
    assert got.keys() == expected.keys()
    for k, v in expected.items():
        assert got[k] == (pytest.approx(v) if isinstance(v, float) else v)


@pytest.mark.parametrize("spec, message", [
    ("idel_sm=0.1", "unknown threshold 'idel_sm'"),
    ("idle_sm", "not KEY=VALUE"),
    ("idle_sm=lots", "not a number"),
    ("fallback=maybe", "expected true or false"),
    ("", "no thresholds given"),
])
def test_parse_overrides_rejects(spec: str, message: str) -> None:
    with pytest.raises(GpuAuditError, match=message):
        parse_overrides(spec)


def history() -> list[Any]:
    """``slow``: 4 h at SM 8% (low, not idle). ``paused``: 6 h, working but idle 90 min in the middle.
    ``busy``: works all along."""
    recs: list[Any] = [job("slow", [AllocatedGpu("n1", 0)], hours=4), job("paused", [AllocatedGpu("n1", 1)], hours=6),
                       job("busy", [AllocatedGpu("n1", 2)], hours=6)]
    recs += run("n1", 0, 0, 48, sm_active=0.08, gpu_util=0.3)
    recs += run("n1", 1, 0, 24, **WORK) + run("n1", 1, 24, 18, **IDLE) + run("n1", 1, 42, 30, **WORK)
    recs += run("n1", 2, 0, 72, **WORK)
    return recs


@pytest.fixture
def store(tmp_path) -> Store:
    s = Store.open(f"sqlite:///{tmp_path / 'a.db'}")
    s.upgrade()
    s.ingest(history())
    return s


def test_what_if_diff(store: Store) -> None:
    diff = what_if(store, Config(), W0, W1, "idle_sm=0.1,episode=1h")
    assert diff["overrides"] == {"idle_sm": {"official": 0.05, "what_if": 0.1},
                                 "episode_hours": {"official": 2.0, "what_if": 1.0}}
    k = diff["kinds"]
    # slow: low efficiency officially (mean SM 8% over 4 GPU-hours); idle once idle means SM < 10%
    assert k["low_efficiency"]["removed"] == ["c:slow"] and k["low_efficiency"]["added"] == []
    assert k["idle_allocation"]["added"] == ["c:slow"] and k["idle_allocation"]["flagged"]["delta"] == 1
    assert k["idle_allocation"]["idle_gpu_hours"]["what_if"] == pytest.approx(4.0)
    # paused: a 1.5 h pause is an episode only with the 1 h threshold
    assert k["idle_episode"]["added"] == ["c:paused"]
    assert k["idle_episode"]["idle_gpu_hours"] == {"official": 0, "what_if": pytest.approx(1.5),
                                                   "delta": pytest.approx(1.5)}
    s = diff["summary"]
    assert s["idle_gpu_hours"]["delta"] == pytest.approx(4.0) and s["low_gpu_hours"]["delta"] == pytest.approx(-4.0)
    assert s["reserved_gpu_hours"]["delta"] == 0
    text = format_diff(diff)
    assert "idle_sm 0.05 -> 0.1" in text and "added: c:slow" in text and "removed: c:slow" in text
    assert latest_run(store) is None  # what-if runs never become the official audit
    assert latest_run(store, what_if=True) == diff["what_if_run_id"]


def test_what_if_rejects_out_of_range(store: Store) -> None:
    with pytest.raises(GpuAuditError, match="thresholds.idle_sm"):
        what_if(store, Config(), W0, W1, {"idle_sm": 1.5})


def test_cli_what_if(store: Store, tmp_path: Path) -> None:
    from auditor.cli import App
    from auditor.cli.money import register

    cfg_file = tmp_path / "gpu-audit.toml"
    cfg_file.write_text(f'[store]\nurl = "sqlite:///{tmp_path / "a.db"}"\n')
    group = click.Group()
    register(group)
    res = CliRunner().invoke(group, ["what-if", "episode=1h", "--since", W0.isoformat(), "--until",
                                     W1.isoformat()], obj=App(str(cfg_file), as_json=True),
                             catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["kinds"]["idle_episode"]["added"] == ["c:paused"]
