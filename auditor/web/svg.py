"""Server-side SVG charts for the web UI: no charting library, no CDN, works offline and without scripts.

Every chart scales to its container (viewBox + width 100%) and carries a <title> for screen readers. Text
inside is escaped; numbers are formatted here, never taken from user input.
"""

from __future__ import annotations

from collections.abc import Sequence

from markupsafe import Markup, escape

VERDICT_COLOURS = {"working": "#2563eb", "low": "#93c5fd", "idle": "#dc2626", "mirage": "#f97316",
                   "idle_by_util": "#fca5a5", "unknown": "#cbd5e1", None: "#f1f5f9",
                   # the stock-counter tier (no SM activity): busy, idle, an engine spin
                   "busy_by_counters": "#a5b4fc", "idle_by_counters": "#f87171", "engine_spin": "#fdba74"}


SM_FILL, UTIL_STROKE = "#2563eb", "#c2410c"  # the report's sparkline colours: SM bars blue, GPU-Util orange


def _runs(values: Sequence[float | None]) -> list[list[tuple[int, float]]]:
    """Consecutive bins that have a value (a line is broken where a bin has no data)."""
    out: list[list[tuple[int, float]]] = [[]]
    for i, v in enumerate(values):
        if v is None:
            if out[-1]:
                out.append([])
        else:
            out[-1].append((i, max(0.0, min(1.0, float(v)))))
    return [r for r in out if r]


def gpu_chart(verdicts: Sequence[str | None], sm: Sequence[float | None], util: Sequence[float | None],
              ticks: Sequence[dict], title: str) -> Markup:
    """One GPU over the allocation: SM activity as bars with GPU-Util as a line over them (the gap between the
    two is the "reads busy, does no work" picture), the verdict of each time bin as a strip below.

    The plot is an SVG stretched to the width (one unit per time bin); the 0-100 % scale and the time axis
    (``ticks``: evenly spaced, from start to end) are HTML beside and under it, so their text stays
    readable at every width instead of shrinking with the drawing."""
    n = max(1, len(verdicts))
    strip, plot = 12, 80  # px; web.css sizes the scale beside the plot to match (.gscale)
    height = plot + 4 + strip
    parts = ['<div class="gchart"><div class="gscale" aria-hidden="true">'
             '<span>100 %</span><span>50 %</span><span>0 %</span></div><div class="gplot">',
             f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {n} {height}" width="100%" height="{height}" '
             f'preserveAspectRatio="none" role="img" class="chart gpu"><title>{escape(title)}</title>',
             f'<rect x="0" y="0" width="{n}" height="{plot}" fill="#f8fafc"/>']
    for frac in (0.25, 0.5, 0.75):
        y = plot - frac * plot
        parts.append(f'<line x1="0" x2="{n}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e2e8f0" '
                     'vector-effect="non-scaling-stroke"/>')
    for i in range(n):
        v = sm[i] if i < len(sm) else None
        u = util[i] if i < len(util) else None
        if v is not None:
            h = max(1.0, min(1.0, float(v)) * plot)
            parts.append(f'<rect x="{i + 0.08:.2f}" y="{plot - h:.2f}" width="0.84" height="{h:.2f}" '
                         f'fill="{SM_FILL}" class="sm"/>')
        elif u is None:  # no data at all in this bin: grey at the bottom, as in the report's sparkline
            parts.append(f'<rect x="{i}" y="{plot - 3}" width="1" height="3" fill="#94a3b8" class="nodata"/>')
    for run in _runs(util[:n]):
        pts = [(i + 0.5, plot - u * plot) for i, u in run]
        if len(pts) == 1:
            pts = [(pts[0][0] - 0.5, pts[0][1]), (pts[0][0] + 0.5, pts[0][1])]
        parts.append('<polyline points="' + " ".join(f"{x:.2f},{y:.2f}" for x, y in pts) + f'" fill="none" '
                     f'stroke="{UTIL_STROKE}" stroke-width="2.5" vector-effect="non-scaling-stroke" class="util"/>')
    i = 0
    while i < n:  # the verdict strip: one rectangle per run of equal verdicts
        v = verdicts[i] if i < len(verdicts) else None
        j = i
        while j + 1 < n and (verdicts[j + 1] if j + 1 < len(verdicts) else None) == v:
            j += 1
        parts.append(f'<rect x="{i}" y="{plot + 4}" width="{j - i + 1}" height="{strip}" '
                     f'fill="{VERDICT_COLOURS.get(v, "#cbd5e1")}"><title>{escape(str(v or "no data"))}</title></rect>')
        i = j + 1
    parts.append('</svg><div class="gaxis">')
    for t in ticks:  # the time axis: evenly spaced labels (CSS spreads them: the page allows no inline style)
        f = float(t["frac"])
        cls = "start" if f <= 0 else "end" if f >= 1 else "mid"
        parts.append(f'<span class="tick {cls}">{escape(str(t.get("label") or ""))}</span>')
    parts.append("</div></div></div>")
    return Markup("".join(parts))


def trend_bars(values: Sequence[float], labels: Sequence[str], title: str, *, current: int = -1,
               width: int = 600, height: int = 140) -> Markup:
    """Idle GPU-hours per window, this window highlighted; labels under the bars."""
    n = max(1, len(values))
    peak = max([v for v in values if v] or [1.0])
    slot = width / n
    plot = height - 34
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" width="100%" role="img" '
             f'class="chart trend"><title>{escape(title)}</title>']
    for i, v in enumerate(values):
        h = (v / peak) * (plot - 14) if v else 0.0
        x = i * slot + slot * 0.15
        colour = "#dc2626" if i == (current % n) else "#fca5a5"
        parts.append(f'<rect x="{x:.1f}" y="{plot - h:.1f}" width="{slot * 0.7:.1f}" height="{h:.1f}" '
                     f'fill="{colour}"/>')
        parts.append(f'<text x="{x + slot * 0.35:.1f}" y="{plot - h - 3:.1f}" font-size="11" text-anchor="middle" '
                     f'fill="currentColor">{v:,.1f}</text>')
        parts.append(f'<text x="{x + slot * 0.35:.1f}" y="{height - 12}" font-size="11" text-anchor="middle" '
                     f'fill="currentColor">{escape(labels[i] if i < len(labels) else "")}</text>')
    parts.append("</svg>")
    return Markup("".join(parts))
