"""GPU faults from telemetry (README "Infrastructure-affected time"): samples of the metrics in
:data:`connectors.aliases.FAULT_ALIASES` -> per GPU, the buckets with a fault -> node events.

A fault marks the bucket it falls in; consecutive faulty buckets of one GPU and kind are one event
[first bucket start, last bucket end). Shared by the scrape-file and Prometheus readers.
"""

from __future__ import annotations

import math
from collections import defaultdict
from datetime import UTC, datetime

from auditor.records import NodeEvent
from connectors.aliases import FAULT_ALIASES, THROTTLE_FAULT_BITS, FaultSpec

REASON_MAX = 200

#: (host, gpu, kind) -> bucket start -> what was seen
Hits = dict[tuple[str, int, str], dict[int, set[str]]]


def bits_named(value: float) -> list[str]:
    """The fault bits set in a clock-event bitmask, by name."""
    v = int(value)
    return [name for bit, name in sorted(THROTTLE_FAULT_BITS.items()) if v & bit]


def judge(spec: FaultSpec, prev: float | None, value: float) -> str | None:
    """What fault one sample shows, given the series' previous sample (None: the first seen), or None."""
    if spec.rule == "code":
        return f"{spec.what} {int(value)}" if value != 0 and prev is not None and value != prev else None
    if spec.rule == "nonzero":
        return spec.what if value > 0 else None
    if spec.rule == "increase":
        return f"{spec.what} +{value - prev:g}" if prev is not None and value > prev else None
    names = bits_named(value)
    return f"{spec.what}: {', '.join(names)}" if names else None


class FaultFolder:
    """Collects fault metric samples per series (one GPU, one metric, its other labels), then judges each
    series in time order."""

    def __init__(self, bucket_s: int) -> None:
        self.bucket_s = bucket_s
        self.series: dict[tuple[str, int, str, str], dict[float, float]] = defaultdict(dict)

    def add(self, host: str, gpu: int, metric: str, value: float, ts: float, series: str = "") -> None:
        if math.isfinite(value) and value >= 0:
            self.series[(host, gpu, metric, series)][ts] = value

    def hits(self) -> Hits:
        out: Hits = defaultdict(lambda: defaultdict(set))
        for (host, gpu, metric, _s), per_ts in self.series.items():
            spec, prev = FAULT_ALIASES[metric], None
            for ts in sorted(per_ts):
                v = per_ts[ts]
                why = judge(spec, prev, v)
                prev = v
                if why:
                    out[(host, gpu, spec.kind)][int(ts // self.bucket_s) * self.bucket_s].add(why)
        return out


def to_events(cluster: str, bucket_s: int, hits: Hits, source: str) -> list[NodeEvent]:
    """Consecutive faulty buckets of one GPU and kind -> one event, with the faults seen as its reason."""
    out = []
    for (host, gpu, kind), per in sorted(hits.items()):
        starts = sorted(per)
        run: list[int] = []
        for i, s in enumerate(starts):
            run.append(s)
            if i + 1 < len(starts) and starts[i + 1] == s + bucket_s:
                continue
            whys = sorted({w for x in run for w in per[x]})
            out.append(NodeEvent(cluster, host, kind, datetime.fromtimestamp(run[0], UTC),
                                 datetime.fromtimestamp(run[-1] + bucket_s, UTC), gpu,
                                 "; ".join(whys)[:REASON_MAX], source))
            run = []
    return out


def promql(selector: str, spec: FaultSpec, bucket_s: int, step_s: int) -> list[tuple[str, str]]:
    """(what, query) pairs that find one fault metric's faults per bucket on a Prometheus-compatible server,
    evaluated at each bucket's end (``offset 1ms``: inside the bucket, as the value queries); a returned
    point is a faulty bucket, its value the code or the increase. ``code``/``increase``: the value at the
    bucket's end against the value at the previous bucket's end; ``nonzero``: any non-zero sample;
    ``bits``: any fault bit set, one query per bit, sampled every ``step_s`` (PromQL has no bitwise AND)."""
    prev = f"{selector} offset {bucket_s * 1000 + 1}ms"
    now = f"{selector} offset 1ms"
    if spec.rule == "code":
        return [(spec.what, f"(({now}) != ({prev})) > 0")]
    if spec.rule == "increase":
        return [(spec.what, f"(({now}) - ({prev})) > 0")]
    if spec.rule == "nonzero":
        return [(spec.what, f"max_over_time({selector}[{bucket_s}s] offset 1ms) > 0")]
    return [(f"{spec.what}: {name}", f"max_over_time((floor({selector} / {bit}) % 2)[{bucket_s}s:{step_s}s] "
             "offset 1ms) > 0") for bit, name in sorted(THROTTLE_FAULT_BITS.items())]


def reason(spec: FaultSpec, what: str, value: float) -> str:
    """The reason of a faulty bucket from its query's value."""
    if spec.rule == "code":
        return f"{what} {int(value)}"
    if spec.rule == "increase":
        return f"{what} +{value:g}"
    return what
