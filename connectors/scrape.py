"""Telemetry from saved exporter scrapes (Prometheus text format or OpenMetrics files).

Sites without a Prometheus, and tests, can point gpu-audit at files written by ``curl exporter:9400/metrics``
(dcgm-exporter, nvidia_gpu_exporter, ...). Every metric in :data:`connectors.aliases.METRIC_ALIASES` is
normalised and folded into per-GPU buckets aligned to ``window.bucket_seconds``.

One row per GPU, bucket and job: dcgm-exporter repeats a GPU's series once per ``hpc_job`` and once per
time-sliced pod; series with different job labels stay separate rows (the audit picks the rows naming the
allocation). Copies of one job's series are collapsed with ``max`` (never summed) before the bucket mean.
Observed seconds and spans come from the sample instants (:mod:`connectors._coverage`). Where a GPU's page
has DCGM 4.x's SM cycle counters, a bucket's SM activity is their increase (:mod:`connectors._cycles`).
"""

from __future__ import annotations

import glob
import logging
import math
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from pydantic import Field

from auditor.errors import SourceError
from auditor.intparse import INT32_MAX, parse_uint, uint_or_none
from auditor.records import LABEL_FIELDS, GpuBucket, NodeEvent
from connectors._coverage import carried_from, covers, gaps, interval, job_key
from connectors._cycles import CycleCounters
from connectors._faults import FaultFolder, to_events
from connectors._rows import MAX_FILE_BYTES, check_regular, fixed_dir, read_bounded
from connectors._unstored import UnstoredGpus
from connectors.aliases import (
    CYCLE_COUNTERS,
    FAULT_ALIASES,
    JOB_ID_METRICS,
    METRIC_ALIASES,
    BadValue,
    host_from_instance,
    normalise,
    pick_label,
)
from connectors.base import Context, Problems, Window
from connectors.workload import Workload, WorkloadOptions, shared_copy

#: Largest scrape file read, in bytes: a larger one fails the source instead of filling memory (the files' own
#: bound, :data:`connectors._rows.MAX_FILE_BYTES`; a `scrape.` option until issue 45)
MAX_BYTES = MAX_FILE_BYTES

log = logging.getLogger("gpu_audit.scrape")


@dataclass(frozen=True, slots=True)
class Sample:
    """One parsed exposition line: name, labels, value and (if the line had one) a UTC epoch time."""

    line: int
    name: str
    labels: dict[str, str]
    value: float
    ts: float | None


_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}


def _parse_labels(s: str, i: int) -> tuple[dict[str, str], int]:
    """Parse ``{a="b",...}`` starting at ``s[i] == "{"``; returns labels and the index after ``}``."""
    labels: dict[str, str] = {}
    i += 1
    n = len(s)
    while True:
        while i < n and s[i] in " ,":
            i += 1
        if i >= n:
            raise ValueError("unterminated label set")
        if s[i] == "}":
            return labels, i + 1
        eq = s.find("=", i)
        if eq < 0:
            raise ValueError("label without '='")
        key = s[i:eq].strip()
        i = eq + 1
        while i < n and s[i] == " ":
            i += 1
        if i >= n or s[i] != '"':
            raise ValueError(f"label {key!r}: value is not quoted")
        i += 1
        out: list[str] = []
        while True:
            if i >= n:
                raise ValueError(f"label {key!r}: unterminated value")
            c = s[i]
            if c == "\\" and i + 1 < n:
                out.append(_ESCAPES.get(s[i + 1], "\\" + s[i + 1]))
                i += 2
            elif c == '"':
                i += 1
                break
            else:
                out.append(c)
                i += 1
        if not key.replace("_", "a").isalnum():
            raise ValueError(f"bad label name {key!r}")
        labels[key] = "".join(out)


def parse_line(raw: str, openmetrics: bool) -> tuple[str, dict[str, str], float, float | None] | None:
    """One sample line -> (name, labels, value, epoch seconds or None); None for comments and blanks.

    Prometheus text timestamps are integer milliseconds, OpenMetrics ones are (float) seconds; an
    OpenMetrics exemplar (`` # {...} v``) is ignored. Raises ValueError on a malformed line.
    """
    s = raw.strip()
    if not s or s.startswith("#"):
        return None
    brace = s.find("{")
    space = s.find(" ")
    if brace >= 0 and (space < 0 or brace < space):
        name = s[:brace]
        labels, end = _parse_labels(s, brace)
        rest = s[end:]
    else:
        if space < 0:
            raise ValueError("no value")
        name, labels, rest = s[:space], {}, s[space:]
    if not name or not name.replace("_", "a").replace(":", "a").isalnum() or name[0].isdigit():
        raise ValueError(f"bad metric name {name[:40]!r}")
    if " # " in rest:
        rest = rest.split(" # ", 1)[0]
    parts = rest.split()
    if not parts or len(parts) > 2:
        raise ValueError("expected 'value [timestamp]' after the labels")
    value = float(parts[0])
    ts: float | None = None
    if len(parts) == 2:
        ts = float(parts[1]) if openmetrics else int(parts[1]) / 1000.0
    return name, labels, value, ts


def parse_text(text: str, source: str, problems: Problems,
               fmt: Literal["auto", "prometheus", "openmetrics"] = "auto") -> Iterator[Sample]:
    """Every sample of one exposition text; malformed lines are quarantined as ``source:line N``."""
    openmetrics = fmt == "openmetrics" or (fmt == "auto" and any(
        ln.strip() == "# EOF" for ln in text[-200:].splitlines()))
    for n, raw in enumerate(text.splitlines(), 1):
        if raw.strip() == "# EOF":
            break
        try:
            parsed = parse_line(raw, openmetrics)
        except ValueError as exc:
            problems.skip(source, f"line {n}", f"not an exposition line: {exc}", raw)
            continue
        if parsed is not None:
            yield Sample(n, *parsed)


@dataclass(slots=True)
class _Acc:
    """Running state of one GPU (or MIG instance) in one bucket."""

    uuid: str | None = None
    model: str | None = None
    instants: set[float] = field(default_factory=set)
    values: dict[str, dict[float, float]] = field(default_factory=dict)
    labels: dict[str, set[str]] = field(default_factory=dict)


class BucketBuilder:
    """Folds normalised samples into per-GPU, per-job buckets (mean per bucket; fb_used: max; copies of one
    job's series: max). Series with different job labels stay separate rows; each row's observed seconds
    and span come from its sample instants (:mod:`connectors._coverage`)."""

    def __init__(self, cluster: str, bucket_seconds: int, problems: Problems) -> None:
        self.cluster, self.bucket_s, self.problems = cluster, bucket_seconds, problems
        self._accs: dict[tuple[str, int, str, int, str], _Acc] = {}
        self.cycles = CycleCounters(bucket_seconds)

    def add_counter(self, host: str, gpu: int, instance: str, metric: str, value: float, ts: float,
                    where: tuple[str, str], labels: dict[str, str], inside: bool) -> None:
        """A reading of an SM cycle counter; ``inside`` the window it is also a sample of the GPU's bucket."""
        if not math.isfinite(value) or value < 0:
            self.problems.skip(where[0], where[1], f"{metric}: {value} is not a counter reading", f"{metric} {value}")
            return
        job = job_key(labels)
        self.cycles.add((host, gpu, instance, job), metric, value, ts)
        if inside:
            start = int(ts // self.bucket_s) * self.bucket_s
            self._accs.setdefault((host, gpu, instance, start, job), _Acc()).instants.add(ts)

    def add(self, host: str, gpu: int, instance: str, metric: str, value: float, ts: float,
            where: tuple[str, str], *, uuid: str | None = None, model: str | None = None,
            labels: dict[str, str] | None = None, copy: bool = False) -> None:
        """One sample; ``copy``: the shared GPU's value on a sharing pod's series (a sample of its row, no value
        of it: :func:`connectors.workload.shared_copy`)."""
        spec = METRIC_ALIASES[metric]
        try:
            v, clamped = normalise(spec.field, spec.unit, value)
        except BadValue as exc:
            self.problems.skip(where[0], where[1], str(exc), f"{metric} {value}")
            return
        if clamped:
            self.problems.clamp(where[0], f"{metric}>1")
        start = int(ts // self.bucket_s) * self.bucket_s
        key = (host, gpu, instance, start, job_key(labels or {}))
        acc = self._accs.get(key)
        if acc is None:
            acc = self._accs[key] = _Acc()
        acc.uuid = uuid or acc.uuid
        acc.model = model or acc.model
        acc.instants.add(ts)
        if copy:
            return
        per_ts = acc.values.setdefault(spec.field, {})
        old = per_ts.get(ts)
        per_ts[ts] = v if old is None else max(old, v)
        for k, lv in (labels or {}).items():
            if lv:
                acc.labels.setdefault(k, set()).add(lv)

    def buckets(self) -> Iterator[GpuBucket]:
        series: dict[tuple[str, int, str, str], set[float]] = {}
        for (host, gpu, instance, _start, job), acc in self._accs.items():
            series.setdefault((host, gpu, instance, job), set()).update(acc.instants)
        per_gpu: dict[tuple[str, int, str], list[float]] = {}
        for (host, gpu, instance, _job), ts in series.items():
            per_gpu.setdefault((host, gpu, instance), []).extend(gaps(ts))
        step = {k: interval(v) for k, v in per_gpu.items()}
        cover = {k: covers(ts, self.bucket_s, step.get(k[:3])) for k, ts in series.items()}
        keys = sorted((*k[:3], start, k[3]) for k, per in cover.items() for start in per)
        for host, gpu, instance, start, job in keys:
            obs, sp_s, sp_e = cover[(host, gpu, instance, job)][start]
            acc = self._accs.get((host, gpu, instance, start, job))
            at: float | None = None
            if acc is None:  # only cover carried from the series' last sample before this bucket
                at = carried_from(series[(host, gpu, instance, job)], start)
                acc = self._accs[(host, gpu, instance, int(at // self.bucket_s) * self.bucket_s, job)]
            b = GpuBucket(cluster=self.cluster, host=host, gpu=gpu, gpu_instance=instance,
                          start=datetime.fromtimestamp(start, UTC), seconds=self.bucket_s,
                          samples=0 if at is not None else len(acc.instants), uuid=acc.uuid, model=acc.model,
                          observed_s=obs, span_start=sp_s, span_end=sp_e, job=job)
            for fname, per_ts in acc.values.items():
                if at is not None:
                    if at in per_ts:
                        setattr(b, fname, per_ts[at])
                    continue
                vals = list(per_ts.values())
                setattr(b, fname, max(vals) if fname == "fb_used_mib" else math.fsum(vals) / len(vals))
            if at is None:
                self.exact(b, (host, gpu, instance, job), start)
            for k, vs in acc.labels.items():
                setattr(b, k, ",".join(sorted(vs)))
            yield b

    def exact(self, b: GpuBucket, key: tuple[str, int, str, str], start: int) -> None:
        """SM activity from the cycle counters, before the sampled gauge's mean, where the series has them."""
        raw = self.cycles.sm_active(key, start)
        if raw is None:
            return
        try:
            b.sm_active, clamped = normalise("sm_active", "ratio", raw)
        except BadValue as exc:
            self.problems.skip("scrape", f"{b.host}/gpu{b.gpu} @ {b.start.isoformat()}", f"SM cycle counters: {exc}")
            return
        b.sm_exact = True
        if clamped:
            self.problems.clamp("scrape", "sm_active>1")


class ScrapeFiles:
    """Reads saved scrapes (``curl .../metrics > file``) and returns normalised per-GPU buckets."""

    class Options(WorkloadOptions):
        paths: list[str] = Field(description="Scrape files or glob patterns (relative to the config file).")
        format: Literal["auto", "prometheus", "openmetrics"] = Field(
            "auto", description="Exposition format; auto = OpenMetrics when the file ends with `# EOF` "
            "(timestamps in seconds), else Prometheus text (timestamps in milliseconds).")
        at: datetime | None = Field(None, description="Time of samples without a timestamp; unset = the "
                                    "file's modification time.")
        host: str | None = Field(None, description="Node name for every sample, overriding the labels "
                                 "(for exporters that carry no host label, or carry a pod name).")
        host_label: str | None = Field(None, description="Take the node name from this label only (e.g. "
                                       "`instance`); unset = Hostname, hostname, node, then instance.")

    name = "scrape"

    def __init__(self, context: Context, options: ScrapeFiles.Options) -> None:
        self.context, self.options = context, options
        #: namespace/pod of the pods the cluster's allocations source saw holding GPUs (set by collect)
        self.gpu_holders: frozenset[str] = frozenset()

    def files(self) -> list[Path]:
        out: list[Path] = []
        for pattern in self.options.paths:
            p = self.context.path(pattern)
            magic = glob.has_magic(str(p))
            matches = sorted(Path(m) for m in glob.glob(str(p))) if magic else [p]
            if not matches:
                raise SourceError(self.name, f"no file matches {pattern}")
            if magic:  # what a pattern finds must stay inside the pattern's directory
                for m in matches:
                    try:
                        check_regular(m, fixed_dir(p))
                    except SourceError as exc:
                        raise SourceError(self.name, f"cannot read {m}: {exc.reason}") from None
            out.extend(matches)
        return out

    def collect(self, window: Window, problems: Problems) -> Iterable[GpuBucket | NodeEvent]:
        lo, hi = window.since.timestamp(), window.until.timestamp()
        builder = BucketBuilder(self.context.cluster, window.bucket_seconds, problems)
        self.faults = FaultFolder(window.bucket_seconds)
        self.seen: Counter[str] = Counter()
        self.unstored = UnstoredGpus()
        self.workload = Workload(self.options, self.gpu_holders)
        for path in self.files():
            try:
                text = read_bounded(path, MAX_BYTES).decode("utf-8", errors="replace")
            except SourceError as exc:
                raise SourceError(self.name, f"cannot read {path}: {exc.reason}", transient=exc.transient) from None
            try:
                mtime = path.stat().st_mtime
            except OSError as exc:
                raise SourceError(self.name, f"cannot read {path}: {exc.strerror}") from None
            default_ts = self.options.at.timestamp() if self.options.at else mtime
            self._fold(str(path), text, default_ts, lo, hi, builder, problems)
        out: list[GpuBucket | NodeEvent] = list(builder.buckets())
        out += to_events(self.context.cluster, window.bucket_seconds, self.faults.hits(), "scrape")
        if not out and self.seen and not any(n in METRIC_ALIASES for n in self.seen):
            self.empty_reason = (f"{sum(self.seen.values())} samples but no supported GPU metric; most common "
                                 f"names: {common_names(self.seen)} (the alias table, docs/telemetry.md, "
                                 "lists the supported ones)")
            log.warning("%s: %s", self.options.paths[0], self.empty_reason)
        self.notes = self.unstored.report(f"{self.name} {self.options.paths[0]}")
        note = self.workload.note()
        if note:
            log.info("%s: %s", self.options.paths[0], note)  # the collect output prints it as a note
            self.notes.append(note)
        return out

    def _unstored(self, s: Sample, default_ts: float, lo: float, hi: float, index_of: dict[str, int]) -> None:
        """Note a sample of a metric gpu-audit does not store against its GPU, if it names one."""
        ts = s.ts if s.ts is not None else default_ts
        if not lo <= ts < hi or s.name in JOB_ID_METRICS:
            return
        host, uuid, gpu_text = self._host(s.labels), pick_label(s.labels, "uuid"), pick_label(s.labels, "gpu")
        gpu = uint_or_none(gpu_text, hi=INT32_MAX) if gpu_text else index_of.get(uuid or "")
        if host and (gpu is not None or uuid):
            self.unstored.seen(host, gpu, uuid, s.name)

    def _host(self, labels: dict[str, str]) -> str | None:
        if self.options.host:
            return self.options.host
        if self.options.host_label:
            value = labels.get(self.options.host_label)
            return host_from_instance(value) if value and self.options.host_label == "instance" else value
        host = pick_label(labels, "host")
        if host and host == labels.get("instance") and not any(
                labels.get(k) for k in ("Hostname", "hostname", "node", "kubernetes_node")):
            return host_from_instance(host)
        return host

    def _job_ids(self, samples: list[Sample], default_ts: float) -> dict[tuple[str, int, float], str]:
        """jobstats publishes the job on a GPU as the value of ``nvidia_gpu_jobId`` (0 = none):
        (host, gpu, instant) -> Slurm job id, so the GPU's other series of that instant carry it."""
        out: dict[tuple[str, int, float], str] = {}
        for s in samples:
            if s.name not in JOB_ID_METRICS or not math.isfinite(s.value) or s.value <= 0:
                continue
            host, gpu_text = self._host(s.labels), pick_label(s.labels, "gpu")
            gpu = uint_or_none(gpu_text, hi=INT32_MAX) if gpu_text else None
            if host and gpu is not None:
                ts = s.ts if s.ts is not None else default_ts
                out[(host, gpu, ts)] = str(int(s.value))
        return out

    def _fold(self, source: str, text: str, default_ts: float, lo: float, hi: float,
              builder: BucketBuilder, problems: Problems) -> None:
        samples = list(parse_text(text, source, problems, self.options.format))
        self.seen.update(s.name for s in samples)
        # nvidia_gpu_exporter labels its series with uuid only: the index comes from nvidia_smi_index
        # or nvidia_smi_gpu_info, the model from nvidia_smi_gpu_info's name label.
        index_of: dict[str, int] = {}
        model_of: dict[str, str] = {}
        for s in samples:
            uuid = s.labels.get("uuid")
            if not uuid:
                continue
            if s.name == "nvidia_smi_index" and math.isfinite(s.value):
                index_of[uuid] = int(s.value)
            elif s.name == "nvidia_smi_gpu_info":
                index = uint_or_none(s.labels.get("index", ""), hi=INT32_MAX)
                if index is not None:
                    index_of.setdefault(uuid, index)
                if s.labels.get("name"):
                    model_of[uuid] = s.labels["name"]
        job_of = self._job_ids(samples, default_ts)

        def gpu_of(labels: dict[str, str]) -> tuple[str, str] | None:
            host, gpu = self._host(labels), pick_label(labels, "gpu") or pick_label(labels, "uuid")
            return (host, gpu) if host and gpu else None

        self.workload.scan((s.labels for s in samples if s.name in METRIC_ALIASES), gpu_of)
        for s in samples:
            fault, counter = s.name in FAULT_ALIASES, s.name in CYCLE_COUNTERS
            if s.name not in METRIC_ALIASES and not fault and not counter:
                self._unstored(s, default_ts, lo, hi, index_of)
                continue
            where = f"line {s.line}"
            ts = s.ts if s.ts is not None else default_ts
            if not lo <= ts < hi and not (counter and ts < lo):  # a counter's reading before: the first increase
                continue
            host = self._host(s.labels)
            uuid = pick_label(s.labels, "uuid")
            gpu_text = pick_label(s.labels, "gpu")
            if gpu_text:
                try:
                    gpu: int | None = parse_uint(gpu_text, hi=INT32_MAX, what="gpu label")
                except ValueError as exc:  # this line only: the file's other lines still count
                    problems.skip(source, where, f"{s.name}: {exc}", f"{s.name} {s.labels}")
                    continue
            else:
                gpu = index_of.get(uuid or "")
            if host and gpu is not None and not fault:
                self.unstored.stored(host, gpu, uuid)
            if not host or gpu is None:
                if fault:  # the GPU's utilization lines already say why (one reason per GPU metric, not more)
                    continue
                what = "host (set scrape.host)" if not host else \
                     "GPU index (no gpu label or nvidia_smi_index)"
                problems.skip(source, where, f"{s.name}: no {what}", f"{s.name} {s.labels}")
                continue
            instance = pick_label(s.labels, "gpu_instance") or ""
            if fault:  # a GPU fault (XID, throttling, ECC, row remap): judged per series in time order
                self.faults.add(host, gpu, s.name, s.value, ts, f"{instance}|{s.labels.get('xid', '')}")
                continue
            model = pick_label(s.labels, "model") or model_of.get(uuid or "")
            profile = pick_label(s.labels, "gpu_profile")
            if profile:
                model = f"{model} MIG {profile}" if model else f"MIG {profile}"
            work = self.workload.labels(s.labels)  # pod/namespace/container: connectors.workload
            labels = {k: (pick_label(s.labels, k) if k == "hpc_job" else work.get(k)) or "" for k in LABEL_FIELDS}
            if not labels["hpc_job"] and job_of:
                labels["hpc_job"] = job_of.get((host, gpu, ts), "")
            if counter and s.labels.get("vgpu"):
                continue  # the whole shared GPU's cycles copied onto a pod (dcgm-exporter virtual GPUs)
            if counter:
                builder.add_counter(host, gpu, instance, s.name, s.value, ts, (source, where), labels, ts >= lo)
                continue
            builder.add(host, gpu, instance, s.name, s.value, ts, (source, where),
                        uuid=uuid, model=model, labels=labels,
                        copy=shared_copy(s.labels, METRIC_ALIASES[s.name].field))


def common_names(counts: Counter[str], n: int = 5) -> str:
    """``a (120), b (80)``: the most frequent metric names, for "nothing supported" messages."""
    return ", ".join(f"{name} ({k})" for name, k in counts.most_common(n))


TELEMETRY = ScrapeFiles
