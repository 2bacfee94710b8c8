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
from auditor.records import AllocatedGpu, Allocation, GpuBucket, InferenceBucket
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


def two_tenants() -> list[Any]:
    """``Deployment/chat`` in namespaces team-a (user ana, 144,000 tokens) and team-b (user bo, 360,000 tokens),
    one pod each on its own A100, two hours each: two services, never one row adding both teams' money."""
    start, end = datetime.fromtimestamp(T0, UTC), datetime.fromtimestamp(T0 + HOURS * 3600, UTC)
    out: list[Any] = []
    for ns, user, node, per_bucket in (("team-a", "ana", "n1", 6000.0), ("team-b", "bo", "n2", 15000.0)):
        out.append(Allocation("c", "kubernetes", f"uid-{ns}", name="chat-7d9f", account=ns, user=user,
                              start=start, end=end, owner_workload="Deployment/chat", labels={"team": ns},
                              gpus=[AllocatedGpu(node, 0, model="NVIDIA A100")]))
        out += [InferenceBucket("c", "vllm", f"{ns}/chat-7d9f", datetime.fromtimestamp(T0 + 300 * i, UTC), 300,
                                generated_tokens=per_bucket, running_mean=4.0) for i in range(24)]
        out += [GpuBucket("c", node, 0, datetime.fromtimestamp(T0 + 300 * i, UTC), 300, 10, gpu_util=0.9,
                          sm_active=0.5) for i in range(24)]
    return out


def test_same_workload_in_two_namespaces_is_two_services_and_no_tenant_sees_the_other(store: Any,
                                                                                       tmp_path: Path) -> None:
    """Issue 44 "Tenants": the same Deployment name in two namespaces is two services on the report and the
    page; behind the auth proxy (web.user_header) each team's user sees only their own service and money,
    over the API, the HTML page and the real Chromium."""
    store.ingest(two_tenants())
    start = datetime.fromtimestamp(T0, UTC)
    rid = run_audit(store, Config(), start, start + timedelta(hours=HOURS)).run_id
    every = build_context(store, Config(), rid)["inference"]["rows"]
    assert len(every) == 2, [(r["service"], r["tokens"]) for r in every]  # was one row of 504,000 tokens
    assert sorted((r["namespace"], r["service"], r["tokens"], r["cost"]) for r in every) == [
        ("team-a", "Deployment/chat", 144000.0, 4.0), ("team-b", "Deployment/chat", 360000.0, 4.0)]
    cfg = Config.model_validate({"web": {"user_header": "X-User"}})
    client = TestClient(create_app(store, cfg))
    for user, ns, tokens in (("ana", "team-a", 144000.0), ("bo", "team-b", 360000.0)):
        api = client.get("/api/services", headers={"X-User": user}).json()
        assert [(r["namespace"], r["tokens"], r["cost"]) for r in api["rows"]] == [(ns, tokens, 4.0)], user
        assert api["totals"]["cost"] == pytest.approx(4.0) and api["totals"]["tokens"] == pytest.approx(tokens)
        html = client.get("/services", headers={"X-User": user}).text
        other = "team-b" if ns == "team-a" else "team-a"
        assert f'data-namespace="{ns}"' in html and other not in html and "USD 8.00" not in html, user


@pytest.mark.service
def test_a_tenant_in_the_real_browser_sees_only_their_namespaces_service(store: Any, tmp_path: Path) -> None:
    """The same two tenants through ``gpu-audit web`` in the real Chromium, the proxy's header on every request."""
    store.ingest(two_tenants())
    start = datetime.fromtimestamp(T0, UTC)
    run_audit(store, Config(), start, start + timedelta(hours=HOURS))
    cfg = Config.model_validate({"web": {"user_header": "X-User"}})
    with web_server(store, cfg) as base, browser(tmp_path, extra_http_headers={"X-User": "ana"}) as ctx:
        page = ctx.new_page()
        resp = page.goto(f"{base}/services")
        assert resp is not None and resp.status == 200
        assert page.locator("#services tr.row").count() == 1
        assert page.get_attribute("#services tr.row", "data-namespace") == "team-a"
        assert page.inner_text("#total-per-million") == "USD 27.78"  # 4.00 / 144,000 x 10^6: hers alone
        assert "team-b" not in page.content()
