"""The web UI's inference services page (``/services``, ``/api/services``): every service's cost per million
generated tokens and batching headroom, the very rows of the report's "Inference services" section (the run
summary auditor/audit/inference.py wrote: one computation), scoped to a user's own services behind an auth
proxy, and laid out in the real Chromium at 1280 and 390 px like tests/test_web_layout.py (no sideways scroll,
the cost cell inside the viewport, no word broken inside a cell). SQLite and PostgreSQL (the store fixture).

The fleet is tests/test_inference.py's five pods with its per-bucket figures stored directly (no Prometheus
here): the same hand figures, dearest per token first, Triton's vLLM backend 4.00 / 36,000 x 10^6 = 111.11
down to TGI's 4.00 / 360,000 x 10^6 = 11.11; chat-7d9f and triton-trt-0 have batching headroom. Pods
chat-7d9f and sglang-0 belong to user ana, the other three to bo.
"""

from __future__ import annotations

import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from helpers import web_server
from starlette.testclient import TestClient
from test_inference import EXPECTED, HOURS, PER_BUCKET, T0, _allocations, _gpu_buckets

from auditor.audit.run import run_audit
from auditor.config import Config
from auditor.records import InferenceBucket
from auditor.report.context import build_context
from auditor.web.app import create_app

sys.path.insert(0, str(Path(__file__).parent))
from chromium import artifacts_dir, browser  # noqa: E402
from test_web_layout import BROKEN_WORDS_JS, COST_JS  # noqa: E402

ANA = {"chat-7d9f", "sglang-0"}


def records() -> list[Any]:
    allocs = _allocations()
    for a in allocs:
        a.user = "ana" if a.name in ANA else "bo"
    buckets = [InferenceBucket("c", engine, job, datetime.fromtimestamp(T0 + 300 * i, UTC), 300,
                               generated_tokens=tokens, running_mean=run, waiting_mean=wait, batch_mean=batch)
               for (engine, job), (tokens, run, wait, batch) in PER_BUCKET.items() for i in range(24)]
    return [*allocs, *_gpu_buckets(), *buckets]


@pytest.fixture
def audited(store: Any) -> tuple[Any, int]:
    store.ingest(records())
    start = datetime.fromtimestamp(T0, UTC)
    return store, run_audit(store, Config(), start, start + timedelta(hours=HOURS)).run_id


def test_services_page_shows_the_reports_figures(audited: tuple[Any, int]) -> None:
    store, rid = audited
    client = TestClient(create_app(store, Config()))
    api = client.get("/api/services").json()
    assert api["run"]["id"] == rid and api["total"] == 5
    assert [r["service"] for r in api["rows"]] == list(EXPECTED)
    for r in api["rows"]:
        tokens, per_million, conc, headroom = EXPECTED[r["service"]]
        assert r["tokens"] == pytest.approx(tokens) and r["cost_per_million"] == pytest.approx(per_million)
        assert r["batching_headroom"] is headroom
    # one computation: the report's section rows, field for field
    report = build_context(store, Config(), rid)["inference"]
    assert api["rows"] == report["rows"]
    assert api["totals"] == report["totals"]
    html = client.get("/services").text
    for figure in ("USD 111.11", "USD 55.56", "USD 27.78", "USD 18.52", "USD 11.11", "828,000"):
        assert figure in html, figure
    assert html.count('class="headroom"') == 2 and 'id="nav-services"' in html


def test_a_user_sees_the_services_with_a_pod_of_theirs(audited: tuple[Any, int]) -> None:
    store, _ = audited
    cfg = Config.model_validate({"web": {"user_header": "X-User"}})
    client = TestClient(create_app(store, cfg))
    ana = client.get("/api/services", headers={"X-User": "ana"}).json()
    assert [r["service"] for r in ana["rows"]] == ["Deployment/chat", "StatefulSet/sglang"]
    # her two services: 8.00 for 144,000 + 216,000 tokens
    assert ana["totals"]["cost_per_million"] == pytest.approx(8.0 / 360000 * 1e6)
    nobody = client.get("/api/services", headers={"X-User": "carol"}).json()
    assert nobody["rows"] == [] and nobody["total"] == 0
    assert 'id="no-services"' in client.get("/services", headers={"X-User": "carol"}).text


@pytest.mark.service
def test_services_page_fits_a_phone(audited: tuple[Any, int], tmp_path: Path) -> None:
    store, _ = audited
    art = artifacts_dir(tmp_path)
    with web_server(store, Config()) as base, browser(tmp_path) as ctx:
        page = ctx.new_page()
        for width in (1280, 390):
            page.set_viewport_size({"width": width, "height": 900})
            resp = page.goto(f"{base}/services")
            assert resp is not None and resp.status == 200
            page.screenshot(path=str(art / f"web-services-{width}.png"), full_page=True)
            assert page.evaluate(BROKEN_WORDS_JS) == [], width
            got = page.evaluate(COST_JS)
            assert got["scroll"] <= got["vw"], (width, got["scroll"], got["vw"])
            assert len(got["cells"]) == 6, got["cells"]  # five services and the total
            assert [c for c in got["cells"] if c["left"] < 0 or c["right"] > got["vw"]] == [], width
            assert got["scrolled"] == [], (width, got["scrolled"])
        assert page.inner_text("#total-per-million") == "USD 24.15"  # 20.00 / 828,000 x 10^6
