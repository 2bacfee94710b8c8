"""Server-side SVG charts for the web UI: no charting library, no CDN, works offline and without scripts.

Every chart scales to its container (viewBox + width 100%) and carries a <title> for screen readers. Text
inside is escaped; numbers are formatted here, never taken from user input.
"""

from __future__ import annotations

from collections.abc import Sequence

from markupsafe import Markup, escape

VERDICT_COLOURS = {"working": "#2563eb", "low": "#93c5fd", "idle": "#dc2626", "mirage": "#f97316",
                   "idle_by_util": "#fca5a5", "unknown": "#cbd5e1", None: "#f1f5f9"}


def gpu_chart(verdicts: Sequence[str | None], sm: Sequence[float | None], title: str, *, width: int = 600,
              height: int = 90) -> Markup:
    """One GPU over the allocation: SM activity as bars, the verdict of each time bin as a strip below."""
    n = max(1, len(verdicts))
    bw = width / n
    plot = height - 22
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" width="100%" '
             f'preserveAspectRatio="none" role="img" class="chart"><title>{escape(title)}</title>',
             f'<rect x="0" y="0" width="{width}" height="{plot}" fill="#f8fafc" stroke="#e2e8f0"/>']
    for frac in (0.25, 0.5, 0.75):
        y = plot - frac * plot
        parts.append(f'<line x1="0" x2="{width}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e2e8f0"/>')
    for i in range(n):
        v = sm[i] if i < len(sm) else None
        x = i * bw
        if v is not None:
            h = max(1.0, min(1.0, float(v)) * plot)
            parts.append(f'<rect x="{x:.2f}" y="{plot - h:.2f}" width="{max(bw - 1, 0.5):.2f}" height="{h:.2f}" '
                         'fill="#2563eb"/>')
    i = 0
    while i < n:  # the verdict strip: one rectangle per run of equal verdicts
        v = verdicts[i] if i < len(verdicts) else None
        j = i
        while j + 1 < n and (verdicts[j + 1] if j + 1 < len(verdicts) else None) == v:
            j += 1
        parts.append(f'<rect x="{i * bw:.2f}" y="{plot + 6}" width="{(j - i + 1) * bw:.2f}" height="14" '
                     f'fill="{VERDICT_COLOURS.get(v, "#cbd5e1")}"><title>{escape(str(v or "no data"))}</title></rect>')
        i = j + 1
    parts.append("</svg>")
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
