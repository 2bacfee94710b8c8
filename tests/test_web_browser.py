"""The web UI in the real Chromium (Playwright over Debian's /usr/bin/chromium) against uvicorn on loopback:
every page, numbers on the page equal to its JSON API, the findings filter form and sort links, an
allocation reached by clicking, the chargeback CSV downloaded, no sideways scrolling at 375 and 1024 px,
no script ever runs (hostile names), screenshots kept as artifacts."""

from __future__ import annotations

import csv
import json
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from helpers import free_port

from auditor.audit.run import run_audit
from auditor.config import Config
from auditor.report.render import fmt_hours, fmt_money
from auditor.web.app import start_in_thread

sys.path.insert(0, str(Path(__file__).parent))
from chromium import artifacts_dir, browser  # noqa: E402
from test_jobview import DAY  # noqa: E402
from test_report import T0  # noqa: E402
from test_web import world_records  # noqa: E402

PAGES = {"overview": "/", "teams": "/teams", "users": "/users", "clusters": "/clusters", "findings": "/findings",
         "allocation": "/allocation/1", "chargeback": "/chargeback"}


@pytest.fixture
def site(store):  # noqa: ANN001, ANN201
    store.ingest(world_records())
    run_audit(store, Config(), T0, T0 + DAY)
    port = free_port()
    server = start_in_thread(store, Config(), f"127.0.0.1:{port}")
    base = f"http://127.0.0.1:{port}"
    for _ in range(100):
        if server.started:
            break
        time.sleep(0.05)
    assert server.started, "uvicorn did not start"
    yield base
    server.should_exit = True


def api(base: str, path: str) -> dict:
    with urllib.request.urlopen(base + path, timeout=10) as r:  # noqa: S310 - loopback test server
        return json.loads(r.read())


@pytest.mark.service
def test_every_page_in_chromium(site: str, tmp_path: Path) -> None:
    art = artifacts_dir(tmp_path)
    dialogs: list[str] = []
    with browser(tmp_path, accept_downloads=True) as ctx:
        page = ctx.new_page()
        page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
        for name, path in PAGES.items():
            for w in (375, 1024):
                page.set_viewport_size({"width": w, "height": 900})
                resp = page.goto(site + path)
                assert resp is not None and resp.status == 200, (name, resp and resp.status)
                sw = page.evaluate("() => [document.documentElement.scrollWidth, document.documentElement.clientWidth]")
                assert sw[0] <= sw[1], (name, w, sw)  # the page itself never scrolls sideways
                page.screenshot(path=str(art / f"web-{name}-{w}.png"), full_page=True)
        # overview: the headline equals the API's
        h = api(site, "/api/overview")["headline"]
        page.goto(site + "/")
        assert page.inner_text("#idle-cost") == fmt_money(h["idle_cost"], "USD") == "USD 18.00"
        assert page.inner_text("#reserved-gpu-hours") == fmt_hours(h["reserved_gpu_hours"])
        # groups: every row's idle cost
        for kind in ("teams", "users", "clusters"):
            data = api(site, f"/api/{kind}")
            page.goto(site + f"/{kind}")
            cells = page.locator("tr.row td.idle-cost").all_inner_texts()
            assert cells == [fmt_money(r["idle_cost"], "USD") for r in data["rows"]], kind
            assert page.inner_text("#total-idle-cost") == fmt_money(data["totals"]["idle_cost"], "USD")
        # findings: the form filters, the sort link flips the order
        page.goto(site + "/findings")
        assert page.locator("tr.row").count() == api(site, "/api/findings")["total"]
        page.select_option("#filter-kind", "util_mirage")
        page.click("#apply")
        page.wait_for_url("**kind=util_mirage**")
        assert page.locator("tr.row").count() == api(site, "/api/findings?kind=util_mirage")["total"] == 1
        page.goto(site + "/findings")
        page.click("#sort-cost")  # cost is the default (desc): clicking asks for asc
        page.wait_for_url("**order=asc**")
        asc = api(site, "/api/findings?sort=cost&order=asc")["rows"]
        assert page.locator("tr.row td.cost").all_inner_texts() == [fmt_money(r["cost"], "USD") for r in asc]
        # an allocation, reached by clicking its name
        page.goto(site + "/findings?user=dana")
        page.locator("a.alloc").first.click()
        page.wait_for_url("**/allocation/**")
        aid = page.url.rsplit("/", 1)[1]
        a = api(site, f"/api/allocation/{aid}")
        assert page.inner_text("#idle-cost") == fmt_money(a["idle_cost"], "USD")
        assert page.locator("svg.chart").count() == len(a["gpus"])
        # chargeback: totals and the CSV download
        cb = api(site, "/api/chargeback?by=user")
        page.goto(site + "/chargeback?by=user")
        assert page.inner_text("#total-reserved-cost") == fmt_money(cb["totals"]["reserved_cost"], "USD")
        with page.expect_download() as dl:
            page.click("#csv")
        rows = list(csv.DictReader(Path(dl.value.path()).open(encoding="utf-8")))
        assert [r["owner"] for r in rows] == [r["owner"] for r in cb["rows"]]
        # a hostile name: shown as text, shortened, never run
        page.goto(site + "/findings?user=mallory")
        text = page.inner_text("#findings")
        assert "<script>alert(1)</script>" in text and "-tail" in text and "x" * 100 not in text
        assert page.evaluate("() => document.scripts.length") == 0
    assert dialogs == []
