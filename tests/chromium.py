"""Debian's Chromium driven through Playwright (``executable_path=/usr/bin/chromium``), shared by the browser
tests: a fresh profile per test, the flags CI needs, layout and contrast probes run inside the page."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from conftest import need

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage"]

# Every element whose right edge passes the viewport (what a reader would have to scroll sideways to see).
OVERFLOW_JS = """() => {
  const vw = document.documentElement.clientWidth, out = [];
  for (const el of document.querySelectorAll('body *')) {
    const r = el.getBoundingClientRect();
    if (r.width > 0 && (r.right > vw + 0.5 || r.left < -0.5))
      out.push({tag: el.tagName, id: el.id, cls: el.className && String(el.className), right: r.right,
                width: r.width, text: (el.textContent || '').slice(0, 60)});
  }
  return {vw, scroll: document.documentElement.scrollWidth, offenders: out.slice(0, 20), n: out.length};
}"""

# WCAG contrast of every element that has its own text, against the first opaque background behind it.
CONTRAST_JS = """() => {
  const rgb = s => { const m = s.match(/[\\d.]+/g) || [0, 0, 0, 0]; return m.map(Number); };
  const lum = c => { const f = v => { v /= 255; return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); };
                     return 0.2126 * f(c[0]) + 0.7152 * f(c[1]) + 0.0722 * f(c[2]); };
  const bg = el => { for (let e = el; e; e = e.parentElement) { const c = rgb(getComputedStyle(e).backgroundColor);
                     if (c.length < 4 || c[3] > 0.5) return c; } return [255, 255, 255]; };
  const out = [];
  for (const el of document.querySelectorAll('body *')) {
    const own = [...el.childNodes].some(n => n.nodeType === 3 && n.textContent.trim());
    if (!own || el.getBoundingClientRect().width === 0 || el.closest('[aria-hidden="true"]')) continue;
    const a = lum(rgb(getComputedStyle(el).color)), b = lum(bg(el));
    const ratio = (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05);
    out.push({ratio, tag: el.tagName, text: el.textContent.trim().slice(0, 40)});
  }
  return out;
}"""


def artifacts_dir(tmp_path: Path) -> Path:
    """Where screenshots go: $GPU_AUDIT_ARTIFACTS (CI keeps it) or the test's tmp dir."""
    d = Path(os.environ.get("GPU_AUDIT_ARTIFACTS") or tmp_path / "artifacts")
    d.mkdir(parents=True, exist_ok=True)
    return d


@contextmanager
def browser(tmp_path: Path, **context: Any) -> Iterator[Any]:
    """A Playwright browser context on the real Chromium, with a fresh --user-data-dir."""
    need(CHROMIUM is not None, "chromium is not installed (apt-get install -y chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        need(False, "playwright is not installed (pip install playwright)")
    profile = tmp_path / "chromium-profile"
    with sync_playwright() as p:
        ctx = p.chromium.launch_persistent_context(str(profile), executable_path=CHROMIUM, headless=True,
                                                   args=FLAGS, **context)
        try:
            yield ctx
        finally:
            ctx.close()
