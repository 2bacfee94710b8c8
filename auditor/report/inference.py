"""The report's "Inference services" section, from the audit run's per-service figures (summary
``inference``, computed once by auditor/audit/inference.py): the text, Markdown and HTML reports and the JSON
export show these same numbers and words."""

from __future__ import annotations

from typing import Any


def _count(x: float | None) -> str:
    """Tokens in words a reader compares: 144,000; 1.2 M; 3.4 B."""
    if x is None:
        return "n/a"
    for unit, div in (("B", 1e9), ("M", 1e6)):
        if x >= div * 10:
            return f"{x / div:,.1f} {unit}"
    return f"{x:,.0f}"


def inference_section(summary: dict[str, Any], *, full: bool, top_n: int) -> dict[str, Any] | None:
    """Services most expensive per token first, cut at ``top_n`` (``full``: all), with totals over all of
    them; None when no inference service reported (older runs, clusters without one)."""
    every = list(summary.get("inference") or [])
    if not every:
        return None
    rows = [{**s, "tokens_text": _count(s["tokens"]), "per_gpu_hour_text": _count(s["tokens_per_gpu_hour"]),
             "concurrency_text": "n/a" if s["concurrency"] is None else f"{s['concurrency']:.1f}"}
            for s in (every if full else every[:top_n])]
    tokens = sum(s["tokens"] for s in every)
    cost = sum(s["cost"] for s in every)
    gpu_h = sum(s["gpu_hours"] for s in every)
    return {"rows": rows, "total": len(every), "shown": len(rows), "cut": len(every) > len(rows),
            "totals": {"tokens": tokens, "tokens_text": _count(tokens), "cost": cost, "gpu_hours": gpu_h,
                       "cost_per_million": cost / tokens * 1e6 if tokens > 0 else None,
                       "headroom": sum(1 for s in every if s["batching_headroom"])}}
