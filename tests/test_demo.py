"""The demo finds exactly the planted problems, and the telemetry gap is unknown, not idle."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from sqlalchemy import text

from auditor.cli import main
from auditor.store import Store

CORE = {"idle_allocation", "idle_gpus", "util_mirage", "unmonitored"}


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path]:
    out = tmp_path_factory.mktemp("demo")
    res = CliRunner().invoke(main, ["--json", "demo", "--out", str(out), "--now", "2026-11-29T00:00"])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout), out


def findings(out: Path, run_id: int) -> dict[str, set[str]]:
    s = Store.open(f"sqlite:///{out / 'gpu-audit-demo.db'}")
    got: dict[str, set[str]] = {}
    with s.engine.connect() as conn:
        for r in conn.execute(text("SELECT a.external_id, f.kind FROM findings f JOIN allocations a "
                                   "ON a.id = f.allocation_id WHERE f.run_id = :r"), {"r": run_id}):
            got.setdefault(r.external_id, set()).add(r.kind)
    return got


def test_demo_finds_exactly_the_planted_problems(demo: tuple[dict, Path]) -> None:
    data, out = demo
    got = {k: v & CORE for k, v in findings(out, data["run_id"]).items() if v & CORE}
    assert got == {"1002": {"util_mirage"}, "1003": {"idle_gpus"}, "5b0c-notebook": {"idle_allocation"}}


def test_demo_headline_numbers(demo: tuple[dict, Path]) -> None:
    data, _ = demo
    # 1001: 8 GPUs x 140 h; 1002: 2 x 48; 1003: 4 x 36; 1010_*: 6 x 2 x 16; notebook 120; triton 2 x 168; resnet 4 x 30
    assert data["reserved_gpu_hours"] == pytest.approx(1120 + 96 + 144 + 192 + 120 + 336 + 120)
    assert data["mirage_gpu_hours"] == pytest.approx(96)
    assert data["idle_gpu_hours"] == pytest.approx(96 + 108 + 120)  # mirage + 3 idle GPUs of 1003 + notebook
    assert data["unknown_gpu_hours"] == pytest.approx(48)  # the 6 h gap on 8 GPUs of job 1001
    assert data["mean_gpu_util"] > 0.75 and data["mean_sm_active"] < 0.65


def test_demo_gap_is_unknown_never_idle(demo: tuple[dict, Path]) -> None:
    data, out = demo
    s = Store.open(f"sqlite:///{out / 'gpu-audit-demo.db'}")
    with s.engine.connect() as conn:
        u = conn.execute(text("SELECT u.* FROM usage_allocation u JOIN allocations a ON a.id = u.allocation_id "
                              "WHERE a.external_id = '1001' AND u.run_id = :r"), {"r": data["run_id"]}).one()
    assert u.unknown_s == pytest.approx(48 * 3600)
    assert u.idle_s == 0 and u.mirage_s == 0


def test_demo_is_idempotent_when_collected_again(demo: tuple[dict, Path]) -> None:
    _, out = demo
    s = Store.open(f"sqlite:///{out / 'gpu-audit-demo.db'}")
    before = {t: v for t, v in s.checksum().items() if t not in ("watermarks", "audit_runs", "usage_gpu",
                                                                 "usage_allocation", "findings")}
    res = CliRunner().invoke(main, ["-c", str(out / "demo.toml"), "collect", "--since", "2026-11-21",
                                    "--until", "2026-11-29T00:00"])
    assert res.exit_code == 0, res.output
    after = {t: v for t, v in s.checksum().items() if t in before}
    assert after == before
