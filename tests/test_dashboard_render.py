"""The Grafana dashboard drawn without Grafana (scripts/render_dashboard.py): every panel's queries run against a
real Prometheus scraping `gpu-audit serve`'s /metrics over the demo store (test_observability's fixture), laid
out by gridPos into one HTML page, and a Chromium screenshot of it. Every panel must show data, and the figures
on the page are the ones Prometheus answers."""

from __future__ import annotations

import importlib.util
import re
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import need
from test_observability import demo, scraped  # noqa: F401 (the fixtures)

ROOT = Path(__file__).resolve().parent.parent


def renderer() -> Any:
    spec = importlib.util.spec_from_file_location("render_dashboard", ROOT / "scripts" / "render_dashboard.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["render_dashboard"] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.service
@pytest.mark.slow
def test_dashboard_renders_every_panel_with_data(scraped: str, tmp_path: Path) -> None:  # noqa: F811
    mod = renderer()
    page, counts = mod.render(scraped, minutes=2)
    assert len(counts) == 15 and all(counts.values()), {t: n for t, n in counts.items() if not n}
    assert "No data" not in page
    assert page.count("<circle ") >= 9, "the time series panels drew no point"
    # the stat panel's number is the query's own answer, as Prometheus gives it
    idle = float(mod.query(scraped, "sum(gpu_audit_team_idle_gpu_seconds) / 3600", mod.time.time())[0]["value"][1])
    assert mod._num(idle) in page
    out = tmp_path / "dash.html"
    out.write_text(page)
    need(bool(shutil.which("chromium") or shutil.which("chromium-browser")), "no Chromium (scripts/testbed-*.sh)")
    png = tmp_path / "dash.png"
    mod.screenshot(out, png)
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert width >= 24 * mod.CELL_W and height >= 20 * mod.CELL_H, (width, height)
    keep = Path(__import__("os").environ.get("GPU_AUDIT_DASHBOARD_PNG", ""))
    if keep.name:
        shutil.copy(png, keep)
        shutil.copy(out, keep.with_suffix(".html"))
    assert re.search(r"Idle GPU-hours \(latest audit\)", page)
