"""Folding Prometheus answers into GPU buckets (:class:`Merge`), apart from the HTTP side of the connector
(:mod:`connectors.prometheus`): one GpuBucket per GPU, bucket and job, copies of a series combined with max."""

from __future__ import annotations

import json
import logging
import math
import statistics
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from auditor.errors import SourceError
from auditor.records import LABEL_FIELDS, GpuBucket
from connectors.aliases import (
    LABEL_ALIASES,
    RATIO_FIELDS,
    BadValue,
    host_from_instance,
    normalise,
    pick_label,
)
from connectors.base import Problems

if TYPE_CHECKING:
    from connectors.prometheus import PrometheusTelemetry

log = logging.getLogger("gpu_audit.prometheus")


class Merge:
    """Folds the per-field answers of one chunk into one GpuBucket per (host, gpu, instance, start).

    The hot loop runs once per returned point (millions for a fleet), so it stays flat: the series key
    and labels are worked out once per series, and values take a fast path unless they need clamping
    or quarantine (then :func:`normalise` decides)."""

    def __init__(self, src: PrometheusTelemetry, bucket_s: int, problems: Problems) -> None:
        self.src, self.bucket_s, self.problems = src, bucket_s, problems
        self.rows: dict[tuple[str, int, str], dict[tuple[int, str], dict[str, Any]]] = {}
        self.jobs: dict[tuple[str, int, str], dict[int, set[str]]] = {}  # jobstats' jobId values
        self._dropped: set[object] = set()  # problems already reported (one line per series/bucket)

    def key(self, metric: dict[str, str]) -> tuple[str, int, str] | None:
        label = self.src.options.host_label
        if label:
            host = metric.get(label)
            host = host_from_instance(host) if host and label == "instance" else host
        else:
            host = pick_label(metric, "host")
            if host and not any(metric.get(k) for k in LABEL_ALIASES["host"][:-1]):
                host = host_from_instance(host)
        gpu = pick_label(metric, "gpu")
        if gpu is None and host:
            index = self.src.index_of.get((host, pick_label(metric, "uuid") or ""))
            gpu = None if index is None else str(index)
        if not host or not gpu or not gpu.isdigit():
            sig = json.dumps(metric, sort_keys=True)
            if sig not in self._dropped:
                self._dropped.add(sig)
                self.problems.skip(self.src.source, "query_range", "series without host or gpu label",
                                   sig)
            return None
        return host, int(gpu), pick_label(metric, "gpu_instance") or ""

    @staticmethod
    def meta(metric: dict[str, str]) -> tuple[str | None, str | None, tuple[tuple[str, str], ...]]:
        model, profile = pick_label(metric, "model"), pick_label(metric, "gpu_profile")
        if profile:
            model = f"{model} MIG {profile}" if model else f"MIG {profile}"
        labels = tuple((k, v) for k in LABEL_FIELDS if (v := pick_label(metric, k)))
        return pick_label(metric, "uuid"), model, labels

    def add(self, kind: str, what: str, data: Any) -> None:
        if not isinstance(data, dict) or data.get("resultType") != "matrix":
            raise SourceError(self.src.source, f"query_range answered {str(data)[:60]!r}, not a matrix")
        if kind == "jobid":
            self.add_jobs(data)
            return
        if kind == "value":
            fname, unit, metric_name = what.split(":")
        else:
            field, metric_name = what.split(":")
            fname, unit = "_count_" + field, ""
        div = 1.0 / normalise(fname, unit, 1.0)[0] if kind == "value" else 1.0  # type: ignore[arg-type]
        bounded, counting = fname in RATIO_FIELDS, kind == "count"
        back = self.bucket_s  # a point stands at its bucket's end
        for series in data.get("result") or ():
            metric = series.get("metric") or {}
            gkey = self.key(metric)
            if gkey is None:
                continue
            rows = self.rows.setdefault(gkey, {})
            meta = self.meta(metric)
            copy = (metric_name, meta[2])
            job = job_of(meta[2])
            for t, text in series.get("values") or ():
                start = int(t) - back
                row = rows.get((start, job))
                if row is None:
                    row = rows[(start, job)] = {"_meta": meta}
                elif row["_meta"] is not meta and row["_meta"] != meta:
                    row["_meta"] = _merge_meta(row["_meta"], meta)
                v = float(text)
                if counting:  # series split by a relabel (Hostname rename) add up; copies and aliases do not
                    per_copy = row.get(fname)
                    if per_copy is None:
                        per_copy = row[fname] = {}
                    per_copy[copy] = per_copy.get(copy, 0) + int(v)
                    continue
                if v >= 0.0 and v != math.inf:
                    v /= div
                    if bounded and v > 1.0:
                        v = self.slow(fname, unit, v * div, metric_name, gkey, start)
                else:
                    v = self.slow(fname, unit, v, metric_name, gkey, start)
                if v is None:
                    continue
                old = row.get(fname)
                if old is None or v > old:  # copies of one GPU: max, never summed
                    row[fname] = v

    def add_jobs(self, data: dict[str, Any]) -> None:
        """Job ids from nvidia_gpu_jobId values (jobstats publishes the job as a value, 0 = no job), per GPU
        and bucket: they become the job key of that bucket's unlabelled row (comma-joined when the GPU
        changed hands inside the bucket)."""
        for series in data.get("result") or ():
            gkey = self.key(series.get("metric") or {})
            if gkey is None:
                continue
            per_bucket = self.jobs.setdefault(gkey, {})
            for t, text in series.get("values") or ():
                try:
                    job = int(float(text))
                except ValueError:
                    continue
                if job > 0:
                    per_bucket.setdefault(int(t) - self.bucket_s, set()).add(str(job))

    def slow(self, fname: str, unit: str, raw: float, metric_name: str, gkey: tuple[str, int, str],
             start: int) -> float | None:
        """Clamp (counted) or quarantine (one problem per GPU bucket and field) a value off the fast path."""
        if fname.startswith("_count_"):
            return raw if raw == raw else None
        try:
            v, clamped = normalise(fname, unit, raw)  # type: ignore[arg-type]
        except BadValue as exc:
            host, gpu, inst = gkey
            when = datetime.fromtimestamp(start, UTC).isoformat()
            where = f"{host}/gpu{gpu}{'/' + inst if inst else ''} @ {when}"
            if (where, fname) not in self._dropped:
                self._dropped.add((where, fname))
                self.problems.skip(self.src.source, where, str(exc), metric_name)
            return None
        if clamped:
            self.problems.clamp(self.src.source, f"{fname}>1")
        return v

    def buckets(self) -> Iterator[GpuBucket]:
        cluster, seconds = self.src.context.cluster, self.bucket_s
        interval = self.src.options.sample_interval_s
        for (host, gpu, inst), rows in sorted(self.rows.items()):
            valued = self.jobs.get((host, gpu, inst))
            if valued:  # jobstats: the unlabelled row of a bucket takes the job ids its jobId series gave
                for (start, job) in [k for k in rows if k[1] == "" and k[0] in valued]:
                    ids = ",".join(sorted(valued[start], key=lambda j: (len(j), j)))
                    row = rows.pop((start, job))
                    uuid, model, labels = row["_meta"]
                    row["_meta"] = (uuid, model, (*labels, ("hpc_job", ids)))
                    rows[(start, ids)] = row
            yield from self._gpu(cluster, seconds, host, gpu, inst, rows, interval)

    @staticmethod
    def _gpu(cluster: str, seconds: int, host: str, gpu: int, inst: str,
             rows: dict[tuple[int, str], dict[str, Any]], interval: float | None = None) -> Iterator[GpuBucket]:
        counted = []
        for (start, job), row in sorted(rows.items()):
            uuid, model, labels = row.pop("_meta")
            counts = row.pop("_count_sm_active", None) or row.pop("_count_gpu_util", None) or {0: 0}
            row.pop("_count_gpu_util", None)
            counted.append((start, job, row, uuid, model, labels, max(counts.values())))
        observed = carried(seconds, [(start, job, samples) for start, job, _r, _u, _m, _l, samples in counted],
                           interval)
        for start, job, row, uuid, model, labels, samples in counted:
            joined: dict[str, set[str]] = {}
            for k, v in labels:
                joined.setdefault(k, set()).add(v)
            yield GpuBucket(cluster=cluster, host=host, gpu=gpu, gpu_instance=inst, seconds=seconds,
                            start=datetime.fromtimestamp(start, UTC), samples=samples, uuid=uuid, model=model,
                            observed_s=observed[(start, job)], job=job,
                            **row, **{k: ",".join(sorted(vs)) for k, vs in joined.items()})


def carried(seconds: int, rows: list[tuple[int, str, int]],
            interval: float | None) -> dict[tuple[int, str], float | None]:
    """Observed seconds per (bucket start, job) of one GPU from sample counts (docs/definitions.md): each
    sample covers one interval, carried into the series' next bucket (at most one interval) when the
    counts cover more than their bucket. The interval is ``sample_interval_s``, else estimated as the
    median of the seconds per sample of the GPU's inner buckets (those whose series has samples in the
    bucket before and after: the queries return counts, not instants; one bucket with a dropped scrape
    does not move it); else the bucket length over the most samples."""
    have = {(start, job) for start, job, n in rows if n > 0}
    inner = [n for start, job, n in rows if n > 0 and (start - seconds, job) in have
             and (start + seconds, job) in have]
    most = max((n for _s, _j, n in rows), default=0)
    step = interval or (statistics.median(seconds / n for n in inner) if inner else seconds / most if most > 0
                        else None)
    out: dict[tuple[int, str], float | None] = {}
    carry: dict[str, tuple[int, float]] = {}  # job -> (bucket start it reaches, seconds carried)
    for start, job, n in sorted(rows):
        if step is None:
            out[(start, job)] = None
            continue
        reach, extra = carry.pop(job, (start, 0.0))
        avail = n * step + (extra if reach == start and n > 0 else 0.0)
        out[(start, job)] = min(float(seconds), avail)
        if n > 0 and avail > seconds:
            carry[job] = (start + seconds, min(step, avail - seconds))
    return out


def job_of(labels: tuple[tuple[str, str], ...]) -> str:
    """The job key of a series: its hpc_job label, else namespace/pod, else "" (no job label)."""
    d = dict(labels)
    if d.get("hpc_job"):
        return d["hpc_job"]
    if d.get("pod"):
        return f"{d.get('namespace', '')}/{d['pod']}"
    return ""


def _merge_meta(a: tuple, b: tuple) -> tuple:
    """Two series of one GPU bucket (hpc_job / pod copies): first uuid and model, all labels."""
    return (a[0] or b[0], a[1] or b[1], tuple(dict.fromkeys(a[2] + b[2])))
