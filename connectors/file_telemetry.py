"""The file telemetry connector: a long CSV of samples (one metric value per row) folded into GPU buckets, with
GPU faults (XID, throttling, ECC, row remap) as node events (docs/file-formats.md). Where a GPU has rows of
DCGM 4.x's SM cycle counters, a bucket's SM activity is their increase (:mod:`connectors._cycles`)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

from pydantic import Field

from auditor.records import METRIC_FIELDS, GpuBucket, NodeEvent
from auditor.timeutil import parse_time
from connectors._coverage import carried_from, covers, gaps, interval, job_key
from connectors._cycles import CycleCounters
from connectors._faults import FaultFolder, to_events
from connectors._rows import error_reason, files_matching, read_rows
from connectors.aliases import (
    CYCLE_COUNTERS,
    FAULT_ALIASES,
    METRIC_ALIASES,
    RATIO_FIELDS,
    BadValue,
    Unit,
    normalise,
)
from connectors.base import Context, Options, Problems, Window


class _Acc:
    """Running sums of one GPU bucket."""

    __slots__ = ("sums", "counts", "instants", "labels", "uuid", "model", "last")

    def __init__(self) -> None:
        self.sums: dict[str, float] = {}
        self.counts: dict[str, int] = {}
        self.instants: set[int] = set()
        self.labels: dict[str, str] = {}
        self.uuid: str | None = None
        self.model: str | None = None
        self.last: dict[str, tuple[int, float]] = {}  # field -> (instant, value) of its latest sample

    def add(self, field: str, value: float, ts: int) -> None:
        self.instants.add(ts)
        if field in CYCLE_COUNTERS:  # its reading is the counters' (connectors._cycles), only an instant here
            return
        if field not in self.last or ts >= self.last[field][0]:
            self.last[field] = (ts, value)
        if field == "fb_used_mib":
            self.sums[field] = max(self.sums.get(field, 0.0), value)
            self.counts[field] = 1
        else:
            self.sums[field] = self.sums.get(field, 0.0) + value
            self.counts[field] = self.counts.get(field, 0) + 1


def stored_unit(field: str) -> Unit:
    """The unit a canonical field name is stored in (long CSVs may use canonical names directly)."""
    if field in RATIO_FIELDS:
        return "ratio"
    return {"fb_used_mib": "mib", "power_w": "watts"}.get(field, "bytes_per_s")  # type: ignore[return-value]


LABEL_COLUMNS = ("pod", "namespace", "container", "hpc_job")


class FileTelemetry:
    """Telemetry from a long CSV: timestamp, host, gpu, uuid, metric, value[, model, gpu_instance, pod,
    namespace, container, hpc_job]. Metric names are canonical fields (stored units) or any alias. Rows
    with different job labels (hpc_job, or namespace/pod) are separate sub-rows; observed seconds and spans
    come from the sample timestamps (:mod:`connectors._coverage`)."""

    class Options(Options):
        paths: list[str] = Field(description="Long-CSV files or glob patterns, relative to the config file.")

    def __init__(self, context: Context, options: FileTelemetry.Options) -> None:
        self.ctx, self.options, self.name = context, options, "file"

    def collect(self, window: Window, problems: Problems) -> Iterator[GpuBucket | NodeEvent]:
        faults = FaultFolder(window.bucket_seconds)  # GPU faults (XID, throttling, ECC, row remap)
        for path in files_matching(self.ctx, self.options.paths):
            yield from self._read(path, window, problems, faults)
        yield from to_events(self.ctx.cluster, window.bucket_seconds, faults.hits(), "file")

    def _read(self, path: Path, window: Window, problems: Problems, faults: FaultFolder) -> Iterator[GpuBucket]:
        size = window.bucket_seconds
        lo, hi = int(window.since.timestamp()), int(window.until.timestamp())
        accs: dict[tuple[str, int, str, int, str], _Acc] = {}
        cycles = CycleCounters(size)
        unknown: set[str] = set()
        # Long CSVs repeat each timestamp for every GPU and metric, and each label set for every sample of a
        # series: parse each distinct text once (the same parse, so the same value or the same error).
        instants: dict[str, int] = {}
        jobs: dict[tuple[str, ...], tuple[dict[str, str], str]] = {}
        for loc, row in read_rows(path, "csv"):
            if isinstance(row, str):
                problems.skip(str(path), loc, row)
                continue
            try:
                stamp = row.get("timestamp")
                if not stamp:
                    raise ValueError("timestamp: missing")
                ts = instants.get(stamp)
                if ts is None:
                    ts = int(parse_time(stamp).timestamp())
                    if len(instants) >= 65536:
                        instants.clear()
                    instants[stamp] = ts
                host = (row.get("host") or "").strip()
                gpu = int(row.get("gpu") or "")
                metric = (row.get("metric") or "").strip()
                if not host:
                    raise ValueError("host: missing")
                if gpu < 0:
                    raise ValueError(f"gpu: negative index {gpu}")
                if metric in METRIC_FIELDS:
                    field, unit = metric, stored_unit(metric)
                elif metric in METRIC_ALIASES:
                    field, unit = METRIC_ALIASES[metric].field, METRIC_ALIASES[metric].unit
                elif metric in FAULT_ALIASES:
                    if lo <= ts < hi:
                        faults.add(host, gpu, metric, float(row.get("value") or ""), ts)
                    continue
                elif metric in CYCLE_COUNTERS:
                    field, unit = metric, "counter"
                else:
                    if metric not in unknown:
                        unknown.add(metric)
                        problems.skip(str(path), loc, f"unknown metric {metric[:60]!r} (further lines of "
                                      "it skipped silently)")
                    continue
                raw = float(row.get("value") or "")
                if unit == "counter":  # a cumulative count: any finite reading >= 0
                    if not 0.0 <= raw < float("inf"):
                        raise ValueError(f"{metric}: {raw} is not a counter reading")
                    value, clamped = raw, False
                else:
                    value, clamped = normalise(field, unit, raw)
            except (ValueError, KeyError, TypeError, ArithmeticError, BadValue) as exc:
                problems.skip(str(path), loc, error_reason(exc), ",".join(str(v) for v in row.values()))
                continue
            if clamped:
                problems.clamp(str(path), field)
            if not lo <= ts < hi and not (unit == "counter" and ts < lo):  # a counter's reading before: the
                continue                                                     # first bucket's first increase
            label_values = tuple(row.get(lab) or "" for lab in LABEL_COLUMNS)
            known = jobs.get(label_values)
            if known is None:
                labels = {lab: v for lab, v in zip(LABEL_COLUMNS, label_values, strict=True) if v}
                known = jobs[label_values] = (labels, job_key(labels))
            labels, job = known
            key = (host, gpu, (row.get("gpu_instance") or "").strip(), ts - ts % size, job)
            if unit == "counter":
                cycles.add((*key[:3], job), field, value, ts)
                if ts < lo:
                    continue
            acc = accs.get(key)
            if acc is None:
                acc = accs[key] = _Acc()
            acc.add(field, value, ts)
            acc.uuid = acc.uuid or (row.get("uuid") or None)
            acc.model = acc.model or (row.get("model") or None)
            if labels:
                acc.labels.update(labels)
        series: dict[tuple[str, int, str, str], set[int]] = {}
        for (host, gpu, inst, _start, job), acc in accs.items():
            series.setdefault((host, gpu, inst, job), set()).update(acc.instants)
        per_gpu: dict[tuple[str, int, str], list[float]] = {}
        for (host, gpu, inst, _job), ts in series.items():
            per_gpu.setdefault((host, gpu, inst), []).extend(gaps(ts))
        step = {k: interval(v) for k, v in per_gpu.items()}
        cover = {k: covers(ts, size, step.get(k[:3])) for k, ts in series.items()}
        keys = sorted((*k[:3], start, k[3]) for k, per in cover.items() for start in per)
        for host, gpu, inst, start, job in keys:
            obs, sp_s, sp_e = cover[(host, gpu, inst, job)][start]
            acc = accs.get((host, gpu, inst, start, job))
            samples = len(acc.instants) if acc is not None else 0
            if acc is None:  # only cover carried from the series' last sample before this bucket
                at = carried_from(series[(host, gpu, inst, job)], start)
                acc = accs[(host, gpu, inst, at - at % size, job)]
                values = {f: v for f, (t, v) in acc.last.items() if t == at}
            else:
                values = {f: acc.sums[f] / acc.counts[f] for f in acc.sums}
                exact = cycles.sm_active((host, gpu, inst, job), start)
                if exact is not None:  # SM activity from the cycle counters, before the sampled mean
                    try:
                        values["sm_active"], clamped = normalise("sm_active", "ratio", exact)
                        values["sm_exact"] = True
                        if clamped:
                            problems.clamp(str(path), "sm_active")
                    except BadValue as exc:
                        problems.skip(str(path), f"{host}/gpu{gpu} bucket {start}", f"SM cycle counters: {exc}")
            yield GpuBucket(cluster=self.ctx.cluster, host=host, gpu=gpu, gpu_instance=inst,
                            start=datetime.fromtimestamp(start, window.since.tzinfo), seconds=size,
                            samples=samples, uuid=acc.uuid, model=acc.model, **values,
                            **{k: acc.labels.get(k) for k in LABEL_COLUMNS}, observed_s=obs, span_start=sp_s,
                            span_end=sp_e, job=job)
