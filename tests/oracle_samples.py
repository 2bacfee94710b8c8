"""The oracle's bucket rows from raw samples (definitions "Observed seconds from samples"), plain Python.

Each sample covers [t, min(next sample of its series, t + interval)); a series is one GPU and job label;
the interval is the median gap between consecutive instants of the GPU's series. A bucket row (one per
series and bucket its cover reaches) gets the covered seconds inside its bucket, the hull of them as its span
(none when they fill the bucket), metrics as the mean of its samples (memory: the largest); a bucket with
no sample of its own, only the cover of the series' last sample before it, has 0 samples and that sample's
values.
Nothing here comes from ``connectors``; tests/test_oracle.py feeds the same samples to the real connector.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime

from auditor.records import GpuBucket

B = 300


@dataclass
class Sample:
    """One exporter sample of a whole GPU: fields in stored units (ratios 0-1), labels as exported."""

    cluster: str
    host: str
    gpu: int
    ts: float
    metrics: dict[str, float]
    labels: dict[str, str] = field(default_factory=dict)

    @property
    def job(self) -> str:
        if self.labels.get("hpc_job"):
            return self.labels["hpc_job"]
        if self.labels.get("pod"):
            return f"{self.labels.get('namespace', '')}/{self.labels['pod']}"
        return ""


def median(xs: list[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def covered(cover: list[tuple[float, float]], lo: float, hi: float) -> list[tuple[float, float]]:
    """The parts of the (disjoint, sorted) covering intervals inside [lo, hi)."""
    return [(max(a, lo), min(b, hi)) for a, b in cover if min(b, hi) > max(a, lo)]


def rows(samples: list[Sample], width: int = B) -> list[GpuBucket]:
    """The bucket rows of one batch of samples (the batch is one collection window)."""
    series: dict[tuple[str, str, int, str], dict[float, list[Sample]]] = {}
    for s in samples:
        series.setdefault((s.cluster, s.host, s.gpu, s.job), {}).setdefault(s.ts, []).append(s)
    gaps: dict[tuple[str, str, int], list[float]] = {}
    for (c, h, g, _j), at in series.items():
        ts = sorted(at)
        gaps.setdefault((c, h, g), []).extend(b - a for a, b in zip(ts, ts[1:], strict=False))
    out: list[GpuBucket] = []
    for (c, h, g, j), at in sorted(series.items()):
        ts = sorted(at)
        iv = median(gaps[(c, h, g)]) if gaps[(c, h, g)] else None
        cover = [] if iv is None else [(t, min(ts[i + 1], t + iv) if i + 1 < len(ts) else t + iv)
                                       for i, t in enumerate(ts)]
        reached = {int(t // width) * width for t in ts}
        for a, b in cover:  # a bucket the cover of a sample before it reaches: a row without samples
            reached |= {k * width for k in range(int(a // width), int(-(-b // width)))}
        for start in sorted(reached):
            inside = [t for t in ts if start <= t < start + width]
            before = [t for t in ts if t < start]
            mine = [s for t in inside for s in at[t]] or at[before[-1]]
            kw: dict[str, object] = {}
            for f in {k for s in mine for k in s.metrics}:
                vals = [s.metrics[f] for s in mine if f in s.metrics]
                kw[f] = max(vals) if f == "fb_used_mib" else sum(vals) / len(vals)
            labels = mine[0].labels
            if labels.get("hpc_job"):
                kw["hpc_job"] = labels["hpc_job"]
            elif labels.get("pod"):
                kw["pod"], kw["namespace"] = labels["pod"], labels.get("namespace", "")
            if iv is not None:
                part = covered(cover, start, start + width)
                obs = min(float(width), sum(b - a for a, b in part))
                kw["observed_s"] = obs
                if obs < width - 1e-9:  # stored spans are whole seconds, taken outward
                    kw["span_start"] = datetime.fromtimestamp(int(min(a for a, _ in part) // 1), UTC)
                    kw["span_end"] = datetime.fromtimestamp(-int(-max(b for _, b in part) // 1), UTC)
            out.append(GpuBucket(c, h, g, datetime.fromtimestamp(start, UTC), width, len(inside), job=j, **kw))
    return out
