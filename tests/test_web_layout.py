"""The web pages in the real Chromium at a laptop's 1280 px and a phone's 390 px: at both widths every
table shows its cost cells inside the viewport with no sideways scrolling, of the page or of the table
(at 390 px rows become cards, the cost and the action first), and no word is broken inside a table
cell (each word of each cell lies on one line: its Range has one client rect). The pages show the
weekly audit after a chargeback run, as they say. SQLite and PostgreSQL (the store fixture)."""

from __future__ import annotations

import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
from helpers import free_port

from auditor.audit.run import run_audit
from auditor.config import Config
from auditor.report.chargeback import chargeback
from auditor.web.app import start_in_thread

sys.path.insert(0, str(Path(__file__).parent))
from chromium import artifacts_dir, browser  # noqa: E402
from test_report import T0  # noqa: E402
from test_web_front import WEEK, front_records  # noqa: E402

PAGES = {"overview": "/", "mine": "/?user=dana", "teams": "/teams", "users": "/users", "clusters": "/clusters",
         "findings": "/findings", "mallory": "/findings?user=mallory", "chargeback": "/chargeback",
         "chargeback-user": "/chargeback?by=user"}

# Every word (a run of non-space characters of one text node) inside a visible table cell that the layout
# broke over more than one line: its Range has more than one client rect.
BROKEN_WORDS_JS = """() => {
  const out = [];
  for (const cell of document.querySelectorAll('table td, table th')) {
    if (cell.getBoundingClientRect().width === 0) continue;
    const walk = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
    for (let node = walk.nextNode(); node; node = walk.nextNode()) {
      const re = /\\S+/g;
      for (let m = re.exec(node.textContent); m; m = re.exec(node.textContent)) {
        const r = document.createRange();
        r.setStart(node, m.index);
        r.setEnd(node, m.index + m[0].length);
        const rects = [...r.getClientRects()].filter(x => x.width > 0);
        if (rects.length > 1)
          out.push({word: m[0].slice(0, 40), lines: rects.length, table: (cell.closest('table') || {}).id});
      }
    }
  }
  return out;
}"""

# The page's sideways scroll, every visible cost cell's box against the viewport and every table wider
# than its scroll box (cost off to the right, to be scrolled to).
COST_JS = """() => {
  const vw = window.innerWidth, cells = [];
  for (const td of document.querySelectorAll('table td.cost')) {
    const r = td.getBoundingClientRect();
    if (r.width > 0) cells.push({left: r.left, right: r.right, text: td.textContent.trim(),
                                 table: (td.closest('table') || {}).id});
  }
  const scrolled = [...document.querySelectorAll('.scroll')].filter(d => d.scrollWidth > d.clientWidth + 1)
    .map(d => ({table: (d.querySelector('table') || {}).id, scroll: d.scrollWidth, box: d.clientWidth}));
  return {vw, scroll: document.scrollingElement.scrollWidth, cells, scrolled};
}"""


@pytest.fixture
def site(store):  # noqa: ANN001, ANN201
    """The world audited as the weekly audit, then a chargeback run of a week-long window after it."""
    store.ingest(front_records())
    rid = run_audit(store, Config(), T0 + timedelta(days=1) - WEEK, T0 + timedelta(days=1)).run_id
    since = T0 + timedelta(hours=1)
    chargeback(store, Config(), since, since + WEEK, "user")
    port = free_port()
    server = start_in_thread(store, Config(), f"127.0.0.1:{port}")
    for _ in range(100):
        if server.started:
            break
        time.sleep(0.05)
    assert server.started, "uvicorn did not start"
    yield f"http://127.0.0.1:{port}", rid
    server.should_exit = True


@pytest.mark.service
def test_tables_fit_a_phone_and_break_no_word(site: tuple[str, int], tmp_path: Path) -> None:
    base, rid = site
    art = artifacts_dir(tmp_path)
    with browser(tmp_path) as ctx:
        page = ctx.new_page()
        for name, path in PAGES.items():
            for width in (1280, 390):
                page.set_viewport_size({"width": width, "height": 900})
                resp = page.goto(base + path)
                assert resp is not None and resp.status == 200, (name, resp and resp.status)
                page.screenshot(path=str(art / f"web-layout-{name}-{width}.png"), full_page=True)
                broken = page.evaluate(BROKEN_WORDS_JS)
                assert broken == [], (name, width, broken[:5])
                got = page.evaluate(COST_JS)
                assert got["scroll"] <= got["vw"], (name, width, got["scroll"], got["vw"])
                assert got["cells"], (name, width, "no cost cell shown")
                outside = [c for c in got["cells"] if c["left"] < 0 or c["right"] > got["vw"]]
                assert outside == [], (name, width, outside[:3])
                assert got["scrolled"] == [], (name, width, got["scrolled"])  # nor a table scrolled inside its box
        # after the chargeback run the pages still show the weekly audit's figures, and say which run
        for path in ("/", "/teams", "/findings", "/chargeback"):
            page.goto(base + path)
            assert page.inner_text("#run-id") == str(rid), path
            assert "weekly audit" in page.inner_text("#run-shown"), path
        page.goto(base + "/")
        assert page.inner_text("#idle-cost") == "USD 18.00"  # 9 idle GPU-hours x 2.0, not the chargeback's 12.00
        assert page.inner_text("#reserved-gpu-hours") == "12.0"
        # the picker shows another run, and the page says it was chosen
        page.select_option("#run-select", str(rid + 1))
        page.click("#run-go")
        page.wait_for_url(f"**run={rid + 1}**")
        assert page.inner_text("#run-id") == str(rid + 1) and "as chosen" in page.inner_text("#run-shown")
        assert page.inner_text("#reserved-gpu-hours") == "8.0"
