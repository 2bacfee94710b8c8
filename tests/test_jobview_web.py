"""The web allocation page on SQLite and PostgreSQL: the job view's verdict and header, the findings before the
per-GPU panels, GPU-Util drawn over the SM bars with a 0-100 % scale and a time axis (points checked by hand),
no-data bins, the per-GPU table equal to the job view's figures; and in Chromium at 1280 and 390 px."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from auditor.audit.run import run_audit
from auditor.config import Config
from auditor.report import jobview
from auditor.web import svg
from auditor.web.app import create_app

sys.path.insert(0, str(Path(__file__).parent))
from test_jobview import DAY, eight_gpu_records, records  # noqa: E402
from test_report import T0  # noqa: E402


@pytest.fixture
def site(store):  # noqa: ANN001, ANN201
    cfg = Config()
    store.ingest(records() + eight_gpu_records())
    run_audit(store, cfg, T0, T0 + DAY)
    return store, cfg, TestClient(create_app(store, cfg))


def _aid(store, ext: str) -> int:  # noqa: ANN001
    from sqlalchemy import text

    with store.engine.connect() as c:
        return int(c.execute(text("SELECT id FROM allocations WHERE external_id = :e"), {"e": ext}).scalar())


def _points(polyline: str) -> list[tuple[float, float]]:
    pts = re.search(r'points="([^"]*)"', polyline).group(1)  # type: ignore[union-attr]
    return [(float(x), float(y)) for x, y in (p.split(",") for p in pts.split())]


def test_verdict_header_and_findings_first(site) -> None:  # noqa: ANN001
    store, cfg, c = site
    aid = _aid(store, "501")
    page = c.get(f"/allocation/{aid}").text
    v = jobview.job_view(store, cfg, aid)
    api = c.get(f"/api/allocation/{aid}").json()
    # one computation: the page, its JSON and the CLI's job view say the same verdict
    assert api["verdict"] == v["verdict"] and v["verdict"]["text"].startswith("IDLE: 6.0 of its 8.0 GPU-h idle")
    assert re.search(r'id="verdict"><strong>IDLE: 6\.0 of its 8\.0 GPU-h idle \(75%, USD 12\.00\)', page)
    # the verdict, then the findings, then the per-GPU panels
    assert page.index('id="verdict"') < page.index("<h2>Findings</h2>") < page.index('class="card gpu"')
    assert page.index('class="card finding"') < page.index('class="card gpu"')
    assert 'id="exit-code">not collected<' in page and 'id="cpu-eff">not collected<' in page
    assert 'id="no-actions"' in page


def test_chart_draws_util_over_sm_with_scale_and_axis(site) -> None:  # noqa: ANN001
    store, cfg, c = site
    aid = _aid(store, "501")
    page = c.get(f"/allocation/{aid}").text
    charts = page.split('<div class="gchart">')[1:]
    assert len(charts) == 2
    for ch in charts:
        assert re.findall(r"<span>([^<]*)</span>", ch.split('<div class="gplot">')[0]) == ["100 %", "50 %", "0 %"]
        # the axis: five ticks from the start (2026-11-16 00:00 UTC) to the end, 4 h later, one hour apart
        assert re.findall(r'class="tick [a-z]+">([^<]*)<', ch) == [
            "2026-11-16 00:00 UTC", "2026-11-16 01:00 UTC", "2026-11-16 02:00 UTC", "2026-11-16 03:00 UTC",
            "2026-11-16 04:00 UTC"]
    # the plot is 80 units high, 48 time bins wide. GPU 0: GPU-Util 1.0 for 24 bins then 0 -> y 0 then 80;
    # GPU 1 (the mirage): GPU-Util 0.95 all along -> y = 80 - 0.95 x 80 = 4, SM 0.02 -> a 1.6-unit bar
    util0 = _points(re.search(r'<polyline[^>]*class="util"/>', charts[0]).group(0))  # type: ignore[union-attr]
    assert [y for _, y in util0] == [0.0] * 24 + [80.0] * 24 and util0[0][0] == 0.5
    util1 = _points(re.search(r'<polyline[^>]*class="util"/>', charts[1]).group(0))  # type: ignore[union-attr]
    assert len(util1) == 48 and all(y == pytest.approx(4.0) for _, y in util1)
    bars1 = re.findall(r'<rect x="[\d.]+" y="([\d.]+)" width="0.84" height="([\d.]+)"[^>]*class="sm"', charts[1])
    assert len(bars1) == 48 and {(float(y), float(h)) for y, h in bars1} == {(78.4, 1.6)}


def test_no_data_bins_and_the_gpu_table(site) -> None:  # noqa: ANN001
    store, cfg, c = site
    aid = _aid(store, "800")
    page = c.get(f"/allocation/{aid}").text
    v = jobview.job_view(store, cfg, aid)
    charts = page.split('<div class="gchart">')[1:]
    assert len(charts) == 8
    # GPU 7 sent nothing in the job's second hour: 12 bins drawn as no data, its GPU-Util line broken in two
    g7 = charts[7]
    assert g7.count('class="nodata"') == 12 and g7.count('class="util"') == 2
    assert charts[0].count('class="nodata"') == 0 and charts[0].count('class="util"') == 1
    # the per-GPU table: one row per GPU with the job view's figures (GPU 3: SM 30 %, memory 11.0 GiB)
    table = page.split('id="gpu-table">')[1].split("</table>")[0]
    rows = re.findall(r"<tr><td class=\"gpu-name\">(.*?)</tr>", table, re.S)
    assert len(rows) == 8
    cells = [re.findall(r'<td class="n[^"]*">([^<]*)</td>', r) for r in rows]
    assert cells[3][:6] == ["90%", "30%", "20%", "30%", "11.0 GiB", "300 W"]
    for g, row in zip(v["gpus"], cells, strict=True):
        assert row[1] == f"{g['metrics']['sm_active']['mean'] * 100:.0f}%"
    assert cells[7][-1] == "75%"  # coverage: 3 of its 4 hours had samples
    assert "used 10% of it" in page and ">high<" in page  # time limit 40 h, 4 h used; the QOS


def test_gpu_chart_escapes_the_title() -> None:
    out = str(svg.gpu_chart([None], [None], [None], [{"frac": 0, "label": "<b>"}], "<script>x</script>"))
    assert "<script>" not in out and "&lt;script&gt;" in out and "&lt;b&gt;" in out


@pytest.mark.service
@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_allocation_page_in_chromium(store, tmp_path: Path) -> None:  # noqa: ANN001
    """1280 and 390 px: no sideways scrolling, the scale and the axis labels visible and apart, the findings
    above the first GPU panel, and the per-GPU table's cells whole (no word broken inside)."""
    from chromium import artifacts_dir, browser
    from helpers import web_server

    cfg = Config()
    store.ingest(records() + eight_gpu_records())
    run_audit(store, cfg, T0, T0 + DAY)
    aid = _aid(store, "800")
    art = artifacts_dir(tmp_path)
    with web_server(store, cfg) as base:
        with browser(tmp_path) as ctx:
            page = ctx.new_page()
            for w in (1280, 390):
                page.set_viewport_size({"width": w, "height": 900})
                page.goto(f"{base}/allocation/{aid}")
                sw = page.evaluate("() => [document.documentElement.scrollWidth, document.documentElement.clientWidth]")
                assert sw[0] <= sw[1], (w, sw)
                page.screenshot(path=str(art / f"allocation-{w}.png"), full_page=True)
                ticks = page.locator(".gchart").first.locator(".tick").all()
                boxes = [t.bounding_box() for t in ticks if t.is_visible()]
                assert len(boxes) == (5 if w == 1280 else 2), (w, boxes)  # the middle ticks hide on a phone
                for a, b in zip(boxes, boxes[1:], strict=False):
                    assert a["x"] + a["width"] <= b["x"], (w, boxes)  # labels never overlap
                assert all(b["x"] >= 0 and b["x"] + b["width"] <= w for b in boxes)
                scale = page.locator(".gchart").first.locator(".gscale span").all_inner_texts()
                assert scale == ["100 %", "50 %", "0 %"]
                assert page.locator("h2", has_text="Findings").bounding_box()["y"] < \
                    page.locator(".card.gpu").first.bounding_box()["y"]
                # a GPU cell holds "3 on n1" on one line: no word broken inside
                cell = page.locator("td.gpu-name").nth(3)
                assert cell.inner_text() == "3 on n1"
                assert cell.bounding_box()["height"] < 30, (w, cell.bounding_box())
