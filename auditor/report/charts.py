"""Charts that survive mail clients: tiny PNGs written in pure Python (zlib + struct), no plotting library.

Mail clients strip JavaScript and often SVG, so sparklines are PNG images (inline as ``cid:`` in email,
``data:`` in a browser) and bars are table cells with a CSS width. Every image carries alt text.
"""

from __future__ import annotations

import base64
import math
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

import markupsafe

RGB = tuple[int, int, int]
SM_COLOUR: RGB = (37, 99, 235)      # blue: SM activity (real work)
UTIL_COLOUR: RGB = (234, 88, 12)    # orange: GPU-Util (what the dashboard shows)
NODATA_COLOUR: RGB = (226, 232, 240)  # light grey: no telemetry in that bin
BACKGROUND: RGB = (255, 255, 255)


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def png_bytes(width: int, height: int, pixels: Sequence[Sequence[RGB]]) -> bytes:
    """Encode rows of RGB tuples as an 8-bit truecolour PNG (filter 0 on every row)."""
    if width <= 0 or height <= 0 or len(pixels) != height:
        raise ValueError("pixel rows do not match the image size")
    raw = bytearray()
    for row in pixels:
        if len(row) != width:
            raise ValueError("pixel row length does not match the width")
        raw.append(0)
        for r, g, b in row:
            raw += bytes((r, g, b))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", header) + _chunk(b"IDAT", zlib.compress(bytes(raw), 9))
            + _chunk(b"IEND", b""))


def png_size(data: bytes) -> tuple[int, int]:
    """(width, height) of a PNG, checking the signature and the IHDR CRC (for tests and sanity)."""
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG")
    length, kind = struct.unpack(">I4s", data[8:16])
    body = data[16:16 + length]
    (crc,) = struct.unpack(">I", data[16 + length:20 + length])
    if kind != b"IHDR" or zlib.crc32(kind + body) & 0xFFFFFFFF != crc:
        raise ValueError("bad IHDR chunk")
    w, h = struct.unpack(">II", body[:8])
    return w, h


@dataclass(frozen=True)
class Image:
    """An inline image: ``cid`` names it in email, ``data_uri`` in a browser; ``alt`` always set."""

    cid: str
    png: bytes
    alt: str
    width: int
    height: int
    short_alt: str = ""  # what a mail client shows with images blocked: short enough never to widen a column

    @property
    def data_uri(self) -> markupsafe.Markup:
        """Markup: base64 needs no escaping, and the cap on shown values (render.cap_shown) must not cut it."""
        return markupsafe.Markup("data:image/png;base64," + base64.b64encode(self.png).decode("ascii"))


def _clamp(v: float | None) -> float | None:
    if v is None:
        return None
    return min(1.0, max(0.0, float(v)))


def sparkline(sm: Sequence[float | None], util: Sequence[float | None], *, bin_px: int = 4,
              height: int = 28) -> tuple[bytes, int, int]:
    """SM activity as blue bars with GPU-Util as an orange line on top; grey where no data.

    The gap between the orange line and the blue bars is the "reads busy, does no work" picture."""
    n = max(len(sm), len(util), 1)
    width = n * bin_px
    rows = [[BACKGROUND] * width for _ in range(height)]
    for i in range(n):
        s = _clamp(sm[i] if i < len(sm) else None)
        u = _clamp(util[i] if i < len(util) else None)
        x0 = i * bin_px
        if s is None and u is None:
            for y in range(height - 3, height):
                for x in range(x0, x0 + bin_px):
                    rows[y][x] = NODATA_COLOUR
            continue
        if s is not None:
            bar = max(1, round(s * (height - 2)))
            for y in range(height - bar, height):
                for x in range(x0, x0 + bin_px - 1):
                    rows[y][x] = SM_COLOUR
        if u is not None:
            y = min(height - 1, max(0, height - 1 - round(u * (height - 2))))
            for x in range(x0, x0 + bin_px):
                rows[y][x] = UTIL_COLOUR
                if y + 1 < height:
                    rows[y + 1][x] = UTIL_COLOUR
    return png_bytes(width, height, rows), width, height


def sparkline_alt(sm: Sequence[float | None], util: Sequence[float | None]) -> str:
    """Alt text that says what the picture shows, in numbers."""
    s = [v for v in sm if v is not None]
    u = [v for v in util if v is not None]
    if not s and not u:
        return "Sparkline: no telemetry in this window"
    parts = []
    if s:
        parts.append(f"SM activity mean {sum(s) / len(s):.0%} (max {max(s):.0%})")
    if u:
        parts.append(f"GPU-Util mean {sum(u) / len(u):.0%}")
    missing = sum(1 for i in range(max(len(sm), len(util)))
                  if (i >= len(sm) or sm[i] is None) and (i >= len(util) or util[i] is None))
    if missing:
        parts.append(f"{missing} of {max(len(sm), len(util))} time bins without data")
    return "Sparkline: " + ", ".join(parts)


def sparkline_short_alt(sm: Sequence[float | None], util: Sequence[float | None]) -> str:
    """The alt text a mail client shows in place of a blocked image: the two means only (about 30
    characters, which fit a 375 px column; the full :func:`sparkline_alt` goes in the title)."""
    s = [v for v in sm if v is not None]
    u = [v for v in util if v is not None]
    if not s and not u:
        return "Sparkline: no data"
    parts = ([f"SM {sum(s) / len(s):.0%}"] if s else []) + ([f"GPU-Util {sum(u) / len(u):.0%}"] if u else [])
    return "Sparkline: " + ", ".join(parts)


MIN_SPARK_WIDTH = 144  # px: a short job's few bins are drawn wide enough to read


def sparkline_image(cid: str, spark: dict | None) -> Image | None:
    """The sparkline of a finding's evidence (``{"sm": [...], "util": [...], "bin_hours": k}``), or None without
    one. Its bins are whole clock hours, so an empty bin is missing data, never structure; a short job's few
    bins get wider bars (at least MIN_SPARK_WIDTH px in all)."""
    if not spark:
        return None
    sm = list(spark.get("sm") or [])
    util = list(spark.get("util") or [])
    if not sm and not util:
        return None
    n = max(len(sm), len(util), 1)
    png, w, h = sparkline(sm, util, bin_px=max(4, math.ceil(MIN_SPARK_WIDTH / n)))
    return Image(cid=cid, png=png, alt=sparkline_alt(sm, util), width=w, height=h,
                 short_alt=sparkline_short_alt(sm, util))


def bar_width(value: float | None, maximum: float | None, *, full: int = 100) -> int:
    """Percent width of a CSS bar (0-100), at least 1 for any positive value so it stays visible."""
    if not value or not maximum or maximum <= 0 or value <= 0:
        return 0
    return max(1, min(full, round(full * value / maximum)))


def text_bar(value: float | None, maximum: float | None, *, width: int = 20) -> str:
    """The same bar for plain text and Markdown."""
    n = round(bar_width(value, maximum, full=width))
    return "#" * n + "." * (width - n)


def knee_svg(k: dict | None, concurrency: float | None = None, *, width: int = 240, height: int = 96
             ) -> markupsafe.Markup:
    """A service's batching curve (auditor/audit/inference.py ``knee``) as a small inline SVG: tokens/s (up)
    against requests running (across, log 2), its knee marked, the service's mean concurrency a dashed line.
    Static markup, no script or external reference; a mail client that drops SVG keeps the text beside it
    (the curve's points in words, :func:`knee_text`). Empty without at least two points."""
    pts = (k or {}).get("points") or []
    if len(pts) < 2:
        return markupsafe.Markup("")
    pad = 6
    lo, hi = math.log2(pts[0]["running"]), math.log2(pts[-1]["running"])
    top = max(p["tokens_per_s"] for p in pts) or 1.0

    def xy(c: float, t: float) -> tuple[float, float]:
        x = pad + (width - 2 * pad) * ((math.log2(max(c, 1e-9)) - lo) / (hi - lo) if hi > lo else 0.5)
        return round(x, 1), round(height - pad - (height - 2 * pad) * t / top, 1)

    line = " ".join(f"{x},{y}" for x, y in (xy(p["running"], p["tokens_per_s"]) for p in pts))
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" width="{width}" '
             f'height="{height}" style="max-width:100%;height:auto" role="img" class="knee">'
             f'<title>{markupsafe.escape(knee_text(k))}</title>',
             f'<polyline points="{line}" fill="none" stroke="#2563eb" stroke-width="2"/>']
    if concurrency is not None and pts[0]["running"] <= concurrency <= pts[-1]["running"]:
        x, _ = xy(concurrency, 0)
        parts.append(f'<line x1="{x}" y1="{pad}" x2="{x}" y2="{height - pad}" stroke="#64748b" '
                     'stroke-dasharray="3,3"/>')
    if k and k.get("knee"):
        x, y = xy(k["knee"]["running"], k["knee"]["tokens_per_s"])
        parts.append(f'<circle cx="{x}" cy="{y}" r="4" fill="#ea580c"/>')
    return markupsafe.Markup("".join(parts) + "</svg>")


def knee_text(k: dict | None) -> str:
    """The batching curve in words: "1 running 100 tokens/s; 2: 200; 4: 400 (knee); ..."."""
    pts = (k or {}).get("points") or []
    kn = (k or {}).get("knee")
    out = []
    for i, p in enumerate(pts):
        mark = " (knee)" if kn and abs(p["running"] - kn["running"]) < 1e-9 else ""
        out.append(f"{p['running']:.1f}{' running' if i == 0 else ''}: {p['tokens_per_s']:,.0f}"
                   f"{' tokens/s' if i == 0 else ''}{mark}")
    return "; ".join(out)
