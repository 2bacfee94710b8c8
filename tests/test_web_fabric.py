"""The web UI's fabric page (``/fabric``, ``/api/fabric``): fabric fit and the congested ports, the very figures
of the report's two sections (auditor/audit/fabric.py: one computation), and scoped to a user's own allocations
behind an auth proxy. SQLite and PostgreSQL (the store fixture).

Fleets: tests/test_fabric_fit.py's (jobs A, single node, 6 GPU-h / USD 12, and B, multi-node with the fabric
quiet, 4 GPU-h / USD 8; D placed with n3 off the fabric) and tests/test_congested_ports.py's (job "lock": a2
mlx5_2/1 held it up 2.0 GPU-h, a1 mlx5_0/1 0.4). Job B belongs to user ana, the others to u: ana sees only B
(4 GPU-h, USD 8) and no port (lock is not hers).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from helpers import web_server
from starlette.testclient import TestClient
from test_congested_ports import fleet as port_fleet
from test_fabric_fit import W0 as F0
from test_fabric_fit import W1 as F1
from test_fabric_fit import fleet as fit_fleet
from test_waiting import W0, W1

from auditor.audit.run import run_audit
from auditor.config import Config, PriceCard
from auditor.records import Allocation
from auditor.report.context import build_context
from auditor.web.app import create_app

sys.path.insert(0, str(Path(__file__).parent))
from chromium import artifacts_dir, browser  # noqa: E402
from test_web_layout import BROKEN_WORDS_JS, COST_JS  # noqa: E402

CFG = Config(prices=PriceCard(default=2.0))


@pytest.fixture
def audited(store: Any) -> tuple[Any, int]:
    recs = fit_fleet() + port_fleet()
    for r in recs:
        if isinstance(r, Allocation) and r.external_id == "B":
            r.user = "ana"
    store.ingest(recs)
    return store, run_audit(store, CFG, min(W0, F0), max(W1, F1)).run_id


def test_fabric_page_shows_the_reports_figures(audited: tuple[Any, int]) -> None:
    store, rid = audited
    cfg = CFG
    client = TestClient(create_app(store, cfg))
    api = client.get("/api/fabric").json()
    ctx = build_context(store, cfg, rid, full=True)
    assert api["run"]["id"] == rid
    assert api["fit"]["totals"] == pytest.approx({"allocations": 2, "gpu_hours": 10.0, "cost": 20.0})
    assert api["fit"]["totals"] == pytest.approx(ctx["fabric"]["totals"])
    assert [(x["node"], x["port"], x["held_gpu_hours"]) for x in api["ports"]["ports"]] == [
        ("a2", "mlx5_2/1", pytest.approx(2.0)), ("a1", "mlx5_0/1", pytest.approx(0.4))]
    assert api["ports"]["ports"] == ctx["congested_ports"]["ports"]
    html = client.get("/fabric").text
    assert 'id="fabric-fit"' in html and 'id="congested-ports"' in html and 'id="nav-fabric"' in html
    assert '<td class="n" data-label="GPU-h" id="fit-gpu-hours">10.0</td>' in html
    assert '<td class="n cost" data-label="Held-up GPU-h" id="ports-held">2.4</td>' in html
    assert "mlx5_2/1" in html and "n3 off the fabric" in html

    scoped = TestClient(create_app(store, Config(prices=PriceCard(default=2.0), web={"user_header": "X-User"})))
    mine = scoped.get("/api/fabric", headers={"X-User": "ana"}).json()
    assert mine["scope"] == "ana"
    assert [a["job"] for a in mine["fit"]["allocations"]] == ["B"]
    assert mine["fit"]["totals"] == pytest.approx({"allocations": 1, "gpu_hours": 4.0, "cost": 8.0})
    assert mine["ports"]["ports"] == [] and mine["fit"]["off_fabric"] == []
    assert "lock" not in scoped.get("/fabric", headers={"X-User": "ana"}).text


@pytest.mark.service
def test_fabric_page_fits_a_phone(audited: tuple[Any, int], tmp_path: Path) -> None:
    store, _ = audited
    art = artifacts_dir(tmp_path)
    with web_server(store, CFG) as base, browser(tmp_path) as ctx:
        page = ctx.new_page()
        for width in (1280, 390):
            page.set_viewport_size({"width": width, "height": 900})
            resp = page.goto(f"{base}/fabric")
            assert resp is not None and resp.status == 200
            page.screenshot(path=str(art / f"web-fabric-{width}.png"), full_page=True)
            assert page.evaluate(BROKEN_WORDS_JS) == [], width
            got = page.evaluate(COST_JS)
            assert got["scroll"] <= got["vw"], (width, got["scroll"], got["vw"])
            # fit: one group, its total and two allocations; ports: two and their total
            assert len(got["cells"]) == 2 + 2 + 3, got["cells"]
            assert [c for c in got["cells"] if c["left"] < 0 or c["right"] > got["vw"]] == [], width
            assert got["scrolled"] == [], (width, got["scrolled"])
        assert page.inner_text("#ports-held") == "2.4"
