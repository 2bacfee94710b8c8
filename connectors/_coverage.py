"""Observed seconds and sample spans of buckets built from raw samples (scrape files, long CSVs).

A bucket's samples cover ``samples x interval`` seconds (at most the bucket) and span from the first sample
to the last sample plus one interval. The interval is the exporter's scrape interval, estimated per GPU as
the smallest gap between two of its sample instants; a GPU with a single instant gives None (the source
cannot tell: the store counts the whole bucket). So a job with 1 minute of samples in a 5-minute bucket is
1 minute observed, not 5 (issue 13). A bucket whose samples cover it completely gets no span (the whole
bucket): a once-per-bucket sampler's sample in mid-bucket stands for the bucket, not for its second half.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime


def interval(instants: Iterable[float]) -> float | None:
    """Smallest positive gap between sorted distinct instants, or None with fewer than two."""
    ts = sorted(set(instants))
    gaps = [b - a for a, b in zip(ts, ts[1:], strict=False) if b > a]
    return min(gaps) if gaps else None


def coverage(instants: Iterable[float], start: int, seconds: int,
             step: float | None) -> tuple[float | None, datetime | None, datetime | None]:
    """(observed_s, span_start, span_end) of one bucket's instants; all None when ``step`` is unknown."""
    ts = sorted(set(instants))
    if not ts or step is None:
        return None, None, None
    if len(ts) * step >= seconds:  # samples all through the bucket: no span (a sample in the middle of a
        return float(seconds), None, None  # 5-minute bucket at a 5-minute interval covers the bucket)
    end = start + seconds
    first, last = max(start, int(ts[0])), min(end, int(ts[-1] + step + 0.999999))
    return (min(float(seconds), len(ts) * step), datetime.fromtimestamp(first, UTC),
            datetime.fromtimestamp(max(first, last), UTC))


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
