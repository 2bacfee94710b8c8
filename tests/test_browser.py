"""The HTML report in a real browser (headless Chromium): key numbers visible in the rendered DOM, hostile
job names shown as text and never run, images present with alt text, a screenshot taken.

Screenshot by hand: /usr/bin/chromium --headless --no-sandbox --disable-gpu --screenshot=/tmp/report.png
--window-size=1280,3000 file://$PWD/reports/report-<run>.html
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest
from conftest import need

from auditor.report import charts, render
from auditor.report import context as report

sys.path.insert(0, str(Path(__file__).parent))
from test_report import EVIL_NAMES, audited, make_cfg  # noqa: E402

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
PWNED = "<img src=x onerror=\"document.title='PWNED'\">"


def chromium(tmp_path: Path, url: str, *extra: str) -> subprocess.CompletedProcess:
    need(CHROMIUM is not None, "chromium is not installed (apt-get install -y chromium)")
    cmd = [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
           "--no-first-run", "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
           f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1280,3000", *extra, url]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)  # noqa: S603


class Dom(HTMLParser):
    """The rendered DOM's visible text and the elements a script injection would have created."""

    def __init__(self) -> None:
        super().__init__()
        self.text: list[str] = []
        self.scripts = 0
        self.imgs: list[dict[str, str | None]] = []
        self.title = ""
        self._in_title = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "script":
            self.scripts += 1
        if tag == "img":
            self.imgs.append(dict(attrs))
        self._in_title = tag == "title"

    def handle_endtag(self, tag: str) -> None:
        self._in_title = False

    def handle_data(self, data: str) -> None:
        if self._in_title:
            self.title += data
        self.text.append(data)


@pytest.mark.service
def test_report_in_headless_chromium(tmp_path: Path) -> None:
    need(CHROMIUM is not None, "chromium is not installed (apt-get install -y chromium)")
    cfg = make_cfg()
    store, run_id = audited(tmp_path, cfg)
    from sqlalchemy import text as sql

    with store.begin() as c:  # a third hostile name, one that would retitle the page if it ever ran
        c.execute(sql("UPDATE allocations SET name = :n WHERE external_id = '104'"), {"n": PWNED})
        c.execute(sql("UPDATE findings SET evidence = REPLACE(evidence, 'half | *bold* _x_', :n)"),
                  {"n": PWNED.replace('"', '\\"')})
    paths = render.write_reports(store, cfg, run_id, tmp_path / "out", ["html"])
    html_path = paths[0]
    url = html_path.resolve().as_uri()
    dom = chromium(tmp_path, url, "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    parsed = Dom()
    parsed.feed(dom.stdout)
    text = " ".join(" ".join(parsed.text).split())
    ctx = report.build_context(store, cfg, run_id)
    h = ctx["headline"]
    for number in (render.fmt_hours(h["reserved_gpu_hours"]), render.fmt_hours(h["idle_gpu_hours"]),
                   render.fmt_hours(h["effective_gpu_hours"]), render.fmt_money(h["idle_cost"], "USD")):
        assert number in text, number
    assert (f"The dashboard said {render.fmt_pct(h['dashboard_busy'])} busy (GPU-Util); SM activity says "
            f"{render.fmt_pct(h['sm_active'])}") in text
    for name in (*EVIL_NAMES, PWNED):
        assert name in text, name  # shown as text...
    assert parsed.scripts == 0  # ...and never parsed as markup
    assert "PWNED" not in parsed.title and "GPU audit" in parsed.title
    assert all(i.get("onerror") is None for i in parsed.imgs)
    sparks = [i for i in parsed.imgs if (i.get("src") or "").startswith("data:image/png;base64,")]
    assert len(sparks) >= 3 and all(i.get("alt") for i in parsed.imgs)
    shot = tmp_path / "report.png"
    res = chromium(tmp_path, url, f"--screenshot={shot}")
    assert res.returncode == 0 and shot.exists(), res.stderr[-2000:]
    assert charts.png_size(shot.read_bytes()) == (1280, 3000)
