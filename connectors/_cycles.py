"""SM activity from DCGM 4.x's cumulative SM cycle counters (:data:`connectors.aliases.CYCLE_COUNTERS`).

A sampled SM_ACTIVE gauge is DCGM's average over its own short sampling period at the scrape instant; the
cycle counters count every cycle. Between two scrapes of one GPU the increase of active cycles over that of
elapsed cycles is the exact share of SM-active cycles in between, whatever happened between the scrapes.
A bucket's figure is the sum of those increases over the pairs of consecutive scrapes whose later scrape
lies in the bucket (so consecutive buckets share no cycle and miss none), for the instants both counters
were read at. A counter that goes down was reset (GPU reset, driver or DCGM restart): it counts again from
0, so the increase of that pair is its new value (Prometheus' rule for counters). A pair further apart than
one bucket (the exporter was down) is not credited to the bucket of its later scrape, which would take the
activity of the whole gap for its own.
"""

from __future__ import annotations

from collections.abc import Mapping

from connectors.aliases import SM_CYCLES_ACTIVE, SM_CYCLES_ELAPSED


def step(prev: float, cur: float) -> float:
    """The increase of a counter from one reading to the next; a drop is a reset, counted from 0."""
    return cur - prev if cur >= prev else cur


def increases(active: Mapping[float, float], elapsed: Mapping[float, float],
              bucket_s: int) -> dict[int, tuple[float, float]]:
    """Per bucket start: (increase of active cycles, increase of elapsed cycles) over the pairs of consecutive
    instants at which both counters were read whose later instant lies in the bucket."""
    ts = sorted(set(active) & set(elapsed))
    out: dict[int, tuple[float, float]] = {}
    for prev, cur in zip(ts, ts[1:], strict=False):
        if cur - prev > bucket_s:
            continue
        start = int(cur // bucket_s) * bucket_s
        a, e = out.get(start, (0.0, 0.0))
        out[start] = (a + step(active[prev], active[cur]), e + step(elapsed[prev], elapsed[cur]))
    return out


def ratio(active_increase: float | None, elapsed_increase: float | None) -> float | None:
    """SM activity from the counters' increases over one bucket; None when no cycle elapsed."""
    if active_increase is None or not elapsed_increase or elapsed_increase <= 0 or active_increase < 0:
        return None
    return active_increase / elapsed_increase


class CycleCounters:
    """The SM cycle counter readings of raw samples (scrape files, long CSVs) per series key (host, GPU,
    instance, job), and the exact SM activity of a bucket of that series. Copies of one reading (aliases, the
    Hostname rename) keep the largest value. Readings before the window count: the first bucket's first pair
    starts there."""

    def __init__(self, bucket_s: int) -> None:
        self.bucket_s = bucket_s
        self.points: dict[tuple, dict[str, dict[float, float]]] = {}
        self._done: dict[tuple, dict[int, tuple[float, float]]] = {}

    def add(self, key: tuple, name: str, value: float, ts: float) -> None:
        per_ts = self.points.setdefault(key, {}).setdefault(name, {})
        old = per_ts.get(ts)
        per_ts[ts] = value if old is None else max(old, value)

    def sm_active(self, key: tuple, start: int) -> float | None:
        """The bucket's SM activity from the counters (not yet clamped: :func:`connectors.aliases.normalise`),
        or None where the series has no pair of both counters ending in it."""
        series = self.points.get(key)
        if series is None:
            return None
        done = self._done.get(key)
        if done is None:
            done = self._done[key] = increases(series.get(SM_CYCLES_ACTIVE, {}), series.get(SM_CYCLES_ELAPSED, {}),
                                               self.bucket_s)
        a, e = done.get(start, (None, None))
        return ratio(a, e)
