"""Render deploy/grafana/gpu-audit.json without Grafana: every panel's PromQL is run against a Prometheus and
drawn into one HTML page laid out by the panels' gridPos (stat: the number; bargauge, barchart and table: a
row per series with a bar; timeseries: an SVG line per series over the last minutes). Grafana is not a Debian
package, so this is how the dashboard is looked at here; it is not Grafana's rendering (no thresholds, units or
colours from the JSON beyond the value's unit), only its queries' answers in its layout.

    python scripts/render_dashboard.py --prometheus http://127.0.0.1:9090 --out dash.html [--png dash.png]

``--png`` opens the page in headless Chromium (Playwright with Debian's /usr/bin/chromium) and saves a
screenshot. tests/test_dashboard_render.py runs it against a Prometheus scraping `gpu-audit serve`'s /metrics.
"""

from __future__ import annotations

import argparse
import html
import json
import shutil
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

DASHBOARD = Path(__file__).resolve().parent.parent / "deploy" / "grafana" / "gpu-audit.json"
CELL_W, CELL_H = 40, 30  # pixels per gridPos unit (Grafana: 24 columns, 30 px rows)
COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b"]


def _get(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=30) as r:  # noqa: S310 (the Prometheus given on the command line)
        body = json.loads(r.read())
    if body.get("status") != "success":
        raise RuntimeError(f"{url}: {body}")
    return body["data"]


def query(prom: str, expr: str, at: float) -> list[dict[str, Any]]:
    return _get(f"{prom}/api/v1/query?" + urllib.parse.urlencode({"query": expr, "time": f"{at:.3f}"}))["result"]


def query_range(prom: str, expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
    return _get(f"{prom}/api/v1/query_range?" + urllib.parse.urlencode(
        {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"}))["result"]


def _label(metric: dict[str, str]) -> str:
    return ", ".join(f"{v}" for k, v in sorted(metric.items()) if k != "__name__") or "value"


def _num(v: float) -> str:
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:,.2f}"


def render_panel(prom: str, panel: dict[str, Any], now: float, minutes: int) -> tuple[str, int]:
    """The panel's inner HTML and how many series its queries returned."""
    kind, body, n = panel["type"], [], 0
    unit = (panel.get("fieldConfig", {}).get("defaults", {}) or {}).get("unit", "")
    unit = "" if unit == "none" else unit
    if kind == "timeseries":
        lines, lo, hi = [], None, None
        for t in panel["targets"]:
            for s in query_range(prom, t["expr"], now - minutes * 60, now, 15):
                pts = [(float(ts), float(v)) for ts, v in s["values"] if v not in ("NaN", "+Inf", "-Inf")]
                # a series of NaN only (a quantile of no observations) is an answer with nothing to draw
                lines.append((_label(s["metric"]) + ("" if pts else " (NaN: nothing to draw)"), pts))
                if pts:
                    vals = [v for _, v in pts]
                    lo = min(vals + ([lo] if lo is not None else []))
                    hi = max(vals + ([hi] if hi is not None else []))
        n = len(lines)
        w, h = panel["gridPos"]["w"] * CELL_W - 20, panel["gridPos"]["h"] * CELL_H - 70
        flat = lo is None or hi == lo  # a constant series is drawn across the middle
        span = 1.0 if flat else hi - lo
        svg = [f'<svg width="{w}" height="{h}" style="background:#fafafa">']
        for i, (name, pts) in enumerate(lines):
            xy = " ".join(f"{(ts - now + minutes * 60) / (minutes * 60) * w:.1f},"
                          f"{h / 2 if flat else h - 5 - (v - lo) / span * (h - 10):.1f}" for ts, v in pts)
            svg.append(f'<polyline fill="none" stroke="{COLOURS[i % 6]}" stroke-width="2" points="{xy}">'
                       f"<title>{html.escape(name)}</title></polyline>")
            # a dot per point: a series as young as the scrape (one step in the range) is a point, not a line
            svg += [f'<circle cx="{x}" cy="{y}" r="3" fill="{COLOURS[i % 6]}"/>'
                    for x, y in (pair.split(",") for pair in xy.split())]
        svg.append("</svg>")
        body.append("".join(svg))
        body.append(f'<div class="axis">{minutes} min; {_num(lo or 0)} .. {_num(hi or 0)} {html.escape(unit)}</div>')
        body += [f'<div class="key" style="color:{COLOURS[i % 6]}">{html.escape(nm)}</div>'
                 for i, (nm, _) in enumerate(lines)]
    else:
        rows = []
        for t in panel["targets"]:
            for s in query(prom, t["expr"], now):
                rows.append((_label(s["metric"]) + (f" [{t.get('legendFormat') or t['refId']}]"
                                                    if len(panel["targets"]) > 1 else ""), float(s["value"][1])))
        n = len(rows)
        if kind == "stat":
            body += [f'<div class="stat">{_num(v)} <small>{html.escape(unit)}</small></div>'
                     f'<div class="key">{html.escape(k)}</div>' for k, v in rows]
        else:  # bargauge, barchart, table: one row per series with a bar scaled to the largest
            top = max([abs(v) for _, v in rows] + [1e-12])
            body.append("<table>" + "".join(
                f'<tr><td>{html.escape(k)}</td><td class="n">{_num(v)}</td><td><div class="bar" '
                f'style="width:{abs(v) / top * 160:.0f}px"></div></td></tr>' for k, v in rows) + "</table>")
    if not n:
        body = ['<div class="nodata">No data</div>']
    return "".join(body), n


def render(prom: str, minutes: int = 10, now: float | None = None) -> tuple[str, dict[str, int]]:
    dash = json.loads(DASHBOARD.read_text())
    now = time.time() if now is None else now
    cells, counts = [], {}
    for p in dash["panels"]:
        g = p["gridPos"]
        inner, counts[p["title"]] = render_panel(prom, p, now, minutes)
        cells.append(f'<div class="panel" data-series="{counts[p["title"]]}" style="left:{g["x"] * CELL_W}px;'
                     f'top:{g["y"] * CELL_H}px;width:{g["w"] * CELL_W - 8}px;height:{g["h"] * CELL_H - 8}px">'
                     f'<h3>{html.escape(p["title"])}</h3>{inner}</div>')
    height = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in dash["panels"]) * CELL_H
    page = f"""<!doctype html><meta charset="utf-8"><title>{html.escape(dash['title'])}</title>
<style>body{{font:13px sans-serif;margin:8px;background:#eee}} .grid{{position:relative;width:{24 * CELL_W}px;
height:{height}px}} .panel{{position:absolute;background:#fff;border:1px solid #ccc;padding:4px 8px;overflow:hidden;
box-sizing:border-box}} h3{{margin:0 0 4px;font-size:13px}} .stat{{font-size:28px;font-weight:bold}}
.key{{font-size:11px;color:#444}} .axis{{font-size:11px;color:#666}} .bar{{height:10px;background:#1f77b4}}
td{{padding:1px 4px;font-size:12px}} td.n{{text-align:right}} .nodata{{color:#b00;font-size:20px}}</style>
<h2>{html.escape(dash['title'])} <small>(queries of deploy/grafana/gpu-audit.json against {html.escape(prom)},
{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(now))})</small></h2><div class="grid">{''.join(cells)}</div>"""
    return page, counts


def screenshot(page: Path, png: Path) -> None:
    from playwright.sync_api import sync_playwright

    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=exe, args=["--no-sandbox", "--disable-gpu",
                                                                "--disable-dev-shm-usage"])
        try:
            tab = browser.new_page(viewport={"width": 24 * CELL_W + 30, "height": 800})
            tab.goto(page.resolve().as_uri())
            tab.screenshot(path=str(png), full_page=True)
        finally:
            browser.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prometheus", required=True)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--png", type=Path)
    ap.add_argument("--minutes", type=int, default=10, help="time series span")
    args = ap.parse_args(argv)
    page, counts = render(args.prometheus.rstrip("/"), args.minutes)
    args.out.write_text(page)
    if args.png:
        screenshot(args.out, args.png)
    empty = [t for t, n in counts.items() if not n]
    print(f"{len(counts)} panels, {len(counts) - len(empty)} with data" + (f"; no data: {empty}" if empty else ""))
    return 1 if empty else 0


if __name__ == "__main__":
    sys.exit(main())
