"""The table ``python -m bench`` closes with: one :class:`Row` per figure (value, target, ratio, status).

A benchmark module returns its rows from ``rows(args, figures) -> list[Row]`` (see bench/__main__.py).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Row:
    """One figure of the final table; ``target`` None means reported, not judged."""

    name: str
    value: float | None
    unit: str
    target: float | None = None
    at_least: bool = False  # the target is a floor (rates), not a ceiling (seconds, ratios, memory)
    note: str = ""

    @property
    def ratio(self) -> float | None:
        return self.value / self.target if self.value is not None and self.target else None

    @property
    def status(self) -> str:
        if self.value is None:
            return "n/a"
        if self.target is None:
            return "-"
        return "met" if (self.value >= self.target if self.at_least else self.value <= self.target) else "MISSED"


def _num(v: float, unit: str) -> str:
    if unit == "rows/s":
        return f"{v:,.0f} rows/s"
    if unit == "x":
        return f"{v:.2f}x"
    if unit == "MiB":
        return f"{v:,.0f} MiB"
    if unit == "s":
        return f"{v:.2f} s"
    return f"{v:,.2f} {unit}".strip()


def table(rows: list[Row]) -> str:
    """The closing table: figure | value | target | ratio | status."""
    head = ("figure", "value", "target", "ratio", "status")
    body = [(r.name, "n/a" if r.value is None else _num(r.value, r.unit),
             "-" if r.target is None else ((">= " if r.at_least else "<= ") + _num(r.target, r.unit)),
             "-" if r.ratio is None else f"{r.ratio:.2f}", r.status + (f"  ({r.note})" if r.note else ""))
            for r in rows]
    widths = [max(len(x[i]) for x in [head, *body]) for i in range(4)]
    fmt = "  ".join(f"{{:{'<' if i == 0 else '>'}{w}}}" for i, w in enumerate(widths)) + "  {}"
    return "\n".join([fmt.format(*head), *(fmt.format(*b) for b in body)])
