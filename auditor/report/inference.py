"""The report's "Inference services" section, from the audit run's per-service figures (summary
``inference``, computed once by auditor/audit/inference.py): the text, Markdown and HTML reports and the JSON
export show these same numbers and words."""

from __future__ import annotations

from typing import Any

from auditor.audit.inference import KNEE_MIN_POINTS, LOW_CACHE_HIT_RATE


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
             "concurrency_text": "n/a" if s["concurrency"] is None else f"{s['concurrency']:.1f}",
             "cache_text": _cache(s), "knee_words": knee_words(s)}
            for s in (every if full else every[:top_n])]
    tokens = sum(s["tokens"] for s in every)
    cost = sum(s["cost"] for s in every)
    gpu_h = sum(s["gpu_hours"] for s in every)
    return {"rows": rows, "total": len(every), "shown": len(rows), "cut": len(every) > len(rows),
            "totals": {"tokens": tokens, "tokens_text": _count(tokens), "cost": cost, "gpu_hours": gpu_h,
                       "cost_per_million": cost / tokens * 1e6 if tokens > 0 else None,
                       "headroom": sum(1 for s in every if s["batching_headroom"]),
                       "low_cache": sum(1 for s in every if s.get("low_cache_hit_rate")),
                       "left_of_knee": sum(1 for s in every if (s.get("knee") or {}).get("left_of_knee"))},
            "low_cache_hit_rate": LOW_CACHE_HIT_RATE}


def knee_words(s: dict[str, Any]) -> str:
    """The batching knee of a service in one sentence ("" without a curve: no requests-running gauge, or a
    run stored before issue 48)."""
    k = s.get("knee")
    if not k or len(k["points"]) < 2:  # one level of requests running: no curve to speak of
        return ""
    kn = k.get("knee")
    if kn is None:
        return (f"batching curve: {len(k['points'])} levels of requests running seen, too few for a knee "
                f"(at least {KNEE_MIN_POINTS})")
    where = f"batching knee at {kn['running']:.1f} running, {kn['tokens_per_s']:,.0f} tokens/s" + (
        " (still rising at the most requests seen)" if k.get("rising") else "")
    if k.get("left_of_knee"):
        return (f"left of its {where}: at {s['concurrency']:.1f} running it makes {k['at_tokens_per_s']:,.0f} "
                f"tokens/s, leaving {k['leaves_tokens_per_s']:,.0f} tokens/s ({k['leaves_share'] * 100:.0f} %) "
                "a pod on the chip")
    return f"at or past its {where}"


def _cache(s: dict[str, Any]) -> str:
    """The prompt-cache hit rate in words: "42 %" (a rate gauge: "42 % (gauge)"); "n/a" when the engine
    reported none or caching was off (a run stored before issue 48 has no such key)."""
    rate = s.get("cache_hit_rate")
    if rate is None:
        return "n/a"
    return f"{rate * 100:.0f} %" + (" (gauge)" if s.get("cache_measured") == "gauge" else "")
