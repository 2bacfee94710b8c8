"""Observed seconds and sample spans of buckets built from raw samples (scrape files, long CSVs).

Each sample covers the time until the next sample of its series (one GPU, MIG instance and job label), at
most one scrape interval, carried across bucket boundaries (docs/definitions.md): a sample 20 s before a
bucket's end at a 57 s interval covers those 20 s and the first 37 s of the next bucket, so a series sampled
every 57 s without a gap covers every bucket completely, whatever the bucket width. A bucket row's observed
seconds are the covered seconds inside the bucket and its span is their hull (none when they cover the
whole bucket). Cover that crosses into a bucket where the series has no sample of its own is not credited
(no row there to hold it; that time stays unknown, never idle).

The interval is the exporter's scrape interval, estimated per GPU as the median gap between consecutive
instants of each of its series (never the smallest: one scrape a second early must not shrink the interval
for the whole window); a GPU with no gap gives None (the source cannot tell: the store counts the whole
bucket). So a job with 1 minute of samples in a 5-minute bucket is 1 minute observed, not 5 (issue 13).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from datetime import UTC, datetime

#: (observed seconds, span start, span end) of one bucket row; the span None = the whole bucket
Cover = tuple[float | None, datetime | None, datetime | None]


def gaps(instants: Iterable[float]) -> list[float]:
    """Positive gaps between the sorted distinct instants of one series."""
    ts = sorted(set(instants))
    return [b - a for a, b in zip(ts, ts[1:], strict=False) if b > a]


def interval(series_gaps: Iterable[float]) -> float | None:
    """The scrape interval of one GPU: the median of its series' gaps, or None without a gap."""
    gs = list(series_gaps)
    return float(statistics.median(gs)) if gs else None


def covers(instants: Iterable[float], bucket_s: int, step: float | None) -> dict[int, Cover]:
    """Per bucket start the series' samples cover: (observed_s, span_start, span_end); all None when
    ``step`` is unknown (then only the buckets with samples). Sample t covers [t, min(next sample, t + step)),
    split at bucket boundaries; a bucket in the result without a sample of its own holds only cover carried
    from the series' last sample before it (:func:`carried_from`)."""
    ts = sorted(set(instants))
    starts = {int(t // bucket_s) * bucket_s for t in ts}
    if step is None:
        return {s: (None, None, None) for s in starts}
    pieces: dict[int, list[tuple[float, float]]] = {}
    for i, t in enumerate(ts):
        end = min(ts[i + 1], t + step) if i + 1 < len(ts) else t + step
        lo = t
        while lo < end:
            b = int(lo // bucket_s) * bucket_s
            hi = min(end, b + bucket_s)
            pieces.setdefault(b, []).append((lo, hi))
            lo = hi
    out: dict[int, Cover] = {}
    for b, ps in pieces.items():
        obs = min(float(bucket_s), math.fsum(hi - lo for lo, hi in ps))
        first, last = min(lo for lo, _ in ps), max(hi for _, hi in ps)
        if obs >= bucket_s - 1e-9:  # covered all through: no span
            out[b] = (float(bucket_s), None, None)
            continue
        s0, s1 = max(b, math.floor(first)), min(b + bucket_s, math.ceil(last))
        out[b] = (obs, datetime.fromtimestamp(s0, UTC), datetime.fromtimestamp(max(s0, s1), UTC))
    return out


def carried_from(instants: Iterable[float], start: int) -> float:
    """The instant whose cover reaches into a bucket (``start``) without samples: the last one before it."""
    return max(t for t in instants if t < start)


def job_key(labels: dict[str, str] | dict[str, set[str]]) -> str:
    """Job key of one series: hpc_job, else namespace/pod, else "" (no job label)."""
    def one(k: str) -> str:
        v = labels.get(k)
        if isinstance(v, set):
            return ",".join(sorted(v))
        return v or ""

    if one("hpc_job"):
        return one("hpc_job")
    if one("pod"):
        return f"{one('namespace')}/{one('pod')}"
    return ""
