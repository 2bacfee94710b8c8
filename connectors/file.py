"""File connectors (kind "file"): allocations from CSV/JSON, telemetry from a long CSV.

For sites with custom exporters and for backfill. The formats are documented in docs/file-formats.md.
Scrape files (Prometheus text / OpenMetrics) are the "scrape" kind; saved ``sacct -P`` output is read by
the Slurm parsers (format "sacct").
"""

from __future__ import annotations

import glob
import json
import re
from collections.abc import Iterable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from auditor.records import (
    METRIC_FIELDS,
    NODE_EVENT_KINDS,
    AllocatedGpu,
    Allocation,
    GpuBucket,
    GpuInventory,
    NodeEvent,
    Reservation,
)
from auditor.timeutil import parse_time
from connectors._coverage import coverage, interval, job_key
from connectors._faults import FaultFolder, to_events
from connectors._rows import check_regular, fixed_dir, read_bounded, read_rows, read_sacct_file
from connectors.aliases import FAULT_ALIASES, METRIC_ALIASES, RATIO_FIELDS, BadValue, Unit, normalise
from connectors.base import Context, Options, Problems, Window
from connectors.file_queue import QUEUE_ROWS
from connectors.slurm.saved import read_saved, sniff

MAX_GPUS = 1024  # per allocation: more is a typo or hostile input, not a job
_GPU_PART = re.compile(r"^\s*(?P<node>[^:;\s]+)\s*:\s*(?:\*(?P<count>\d+)|(?P<idx>[\d,\-\s]+))\s*$")


def expand_indices(text: str) -> list[int]:
    """``0-2,5`` -> [0, 1, 2, 5]."""
    out: list[int] = []
    for part in text.replace(" ", "").split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        a, b = int(lo), int(hi or lo)
        if b < a or b - a > 4096:
            raise ValueError(f"bad index range {part!r}")
        out.extend(range(a, b + 1))
    return out


def parse_gpus(text: str, model: str | None, share: float, mig: str | None) -> list[AllocatedGpu]:
    """``node-a:0-3;node-b:*2`` -> one AllocatedGpu per GPU (``*N`` = N GPUs, indices unknown)."""
    gpus: list[AllocatedGpu] = []
    for part in filter(None, (p.strip() for p in text.split(";"))):
        m = _GPU_PART.match(part)
        if not m:
            raise ValueError(f"bad gpus entry {part!r} (want node:0-3 or node:*N)")
        if m.group("count"):
            count = int(m["count"])
            if count > MAX_GPUS:
                raise ValueError(f"bad gpus entry {part!r}: more than {MAX_GPUS} GPUs")
            gpus += [AllocatedGpu(m["node"], None, None, model, share, mig) for _ in range(count)]
        else:
            gpus += [AllocatedGpu(m["node"], i, None, model, share, mig) for i in expand_indices(m["idx"])]
    return gpus


def _time(value: Any, what: str) -> datetime | None:
    if value in (None, "", "None", "Unknown"):
        return None
    try:
        return parse_time(str(value))
    except ValueError:
        raise ValueError(f"{what}: cannot parse time {str(value)[:40]!r}") from None


LABEL_DEPTH = 8  # a nested label value deeper than this is an error, not a label


def _depth(v: Any, limit: int) -> int:
    if limit < 0 or not isinstance(v, dict | list):
        return 0
    items = v.values() if isinstance(v, dict) else v
    return 1 + max((_depth(x, limit - 1) for x in items), default=0)


def _label_map(d: Any) -> dict[str, str]:
    """Labels as flat text; a nested value is kept as compact JSON unless nested absurdly deep."""
    if not isinstance(d, dict):
        raise ValueError("labels: not a JSON object")
    out: dict[str, str] = {}
    for k, v in d.items():
        if isinstance(v, dict | list):
            if _depth(v, LABEL_DEPTH + 1) > LABEL_DEPTH:
                raise ValueError(f"labels: value of {str(k)[:40]!r} nested more than {LABEL_DEPTH} levels deep")
            out[str(k)] = json.dumps(v, separators=(",", ":"), default=str)
        else:
            out[str(k)] = str(v)
    return out


def _labels(value: Any) -> dict[str, str]:
    if isinstance(value, dict):
        return _label_map(value)
    if not value:
        return {}
    text = _scalar(value, "labels").strip()
    if text.startswith("{"):
        return _label_map(json.loads(text))
    return dict(kv.split("=", 1) for kv in text.split(";") if "=" in kv)


def _scalar(value: Any, what: str) -> str:
    """A text field: a JSON object or list where text belongs is an error, not its Python repr."""
    if isinstance(value, dict | list):
        raise ValueError(f"{what}: a JSON {'object' if isinstance(value, dict) else 'list'} where text belongs")
    return str(value)


def _gpu_object(g: Any, model: str | None, share: float) -> AllocatedGpu:
    """One entry of a JSON ``gpus`` list, checked like the string form."""
    if not isinstance(g, dict) or not g.get("node"):
        raise ValueError("gpus: each entry needs a node")
    index = g.get("index")
    if index is not None:
        if isinstance(index, bool) or not str(index).isdigit():
            raise ValueError(f"gpus: index {str(index)[:20]!r} is not a GPU index")
        index = int(index)
    gshare = float(g.get("share", share))
    if not 0 < gshare <= 1:
        raise ValueError(f"gpus: share {gshare} not in (0, 1]")
    return AllocatedGpu(str(g["node"]), index, g.get("uuid"), g.get("model", model), gshare, g.get("mig_profile"))


def allocation_from_row(cluster: str, row: dict[str, Any]) -> Allocation:
    """Build an Allocation from one CSV row or JSON object; raises ValueError naming the field."""
    ext = _scalar(row.get("id") or "", "id").strip()
    if not ext:
        raise ValueError("id: missing")
    model = row.get("model") or None
    share = float(row.get("share") or 1.0)
    if not 0 < share <= 1:
        raise ValueError(f"share: {share} not in (0, 1]")
    gpus_field = row.get("gpus")
    if isinstance(gpus_field, list):
        gpus = [_gpu_object(g, model, share) for g in gpus_field]
    else:
        gpus = parse_gpus(str(gpus_field or ""), model, share, row.get("mig_profile") or None)
    if not gpus:
        raise ValueError("gpus: no GPUs")
    if len(gpus) > MAX_GPUS:
        raise ValueError(f"gpus: {len(gpus)} GPUs in one allocation (more than {MAX_GPUS})")
    start, end = _time(row.get("start"), "start"), _time(row.get("end"), "end")
    if start and end and end < start:
        raise ValueError(f"end {end.isoformat()} is before start {start.isoformat()}")
    source = row.get("source") or "file"
    if source not in ("slurm", "kubernetes", "file"):
        raise ValueError(f"source: {source!r} is not slurm, kubernetes or file")
    limit = row.get("time_limit_s")
    text = {k: _scalar(row.get(k) or "", k) for k in ("name", "user", "account", "partition", "qos", "state",
                                                     "reservation", "owner")}
    try:
        time_limit = int(limit) if limit not in (None, "") else None
    except OverflowError:
        raise ValueError(f"time_limit_s: {str(limit)[:40]} is not a number of seconds") from None
    return Allocation(cluster=cluster, source=source, external_id=ext, name=text["name"],
                      user=text["user"], account=text["account"],
                      partition=text["partition"], qos=text["qos"],
                      state=text["state"], submit=_time(row.get("submit"), "submit"),
                      start=start, end=end, reservation=text["reservation"],
                      owner_workload=text["owner"],
                      time_limit_s=time_limit,
                      labels=_labels(row.get("labels")), gpus=gpus)


def _names(value: Any) -> list[str]:
    if isinstance(value, list):
        return [str(v) for v in value]
    return [v.strip() for v in str(value or "").split(",") if v.strip()]


def reservation_from_row(cluster: str, row: dict[str, Any]) -> Reservation:
    """A Slurm-style advance reservation (``"type": "reservation"`` in JSON allocation files)."""
    name = str(row.get("name") or "").strip()
    if not name:
        raise ValueError("name: missing")
    start, end = _time(row.get("start"), "start"), _time(row.get("end"), "end")
    if start is None or end is None:
        raise ValueError("start and end are required for a reservation")
    if end <= start:
        raise ValueError(f"end {end.isoformat()} is not after start {start.isoformat()}")
    gpus = float(row.get("gpu_count") or 0)
    if gpus < 0:
        raise ValueError(f"gpu_count: negative ({gpus})")
    return Reservation(cluster, name, start, end, nodes=_names(row.get("nodes")), gpu_count=gpus,
                       users=_names(row.get("users")), accounts=_names(row.get("accounts")),
                       flags=_names(row.get("flags")))


def inventory_from_row(cluster: str, row: dict[str, Any]) -> list[GpuInventory]:
    """GPUs that exist on a node (``"type": "inventory"``: node, gpus (count), model, mig_layout)."""
    node = str(row.get("node") or "").strip()
    if not node:
        raise ValueError("node: missing")
    count = int(row.get("gpus") or 0)
    if not 0 < count <= 64:
        raise ValueError(f"gpus: {count} is not a GPU count")
    return [GpuInventory(cluster, node, i, row.get("model") or None, None, str(row.get("mig_layout") or ""))
            for i in range(count)]


def node_event_from_row(cluster: str, row: dict[str, Any]) -> NodeEvent:
    """A node or GPU out of service (``"type": "node_event"``: node, kind, start, end (empty: ongoing), gpu
    (empty: the whole node), reason)."""
    node, kind = str(row.get("node") or "").strip(), str(row.get("kind") or "")
    if not node or kind not in NODE_EVENT_KINDS:
        raise ValueError(f"node_event needs a node and a kind ({', '.join(NODE_EVENT_KINDS)})")
    start, end = _time(row.get("start"), "start"), _time(row.get("end"), "end")
    if start is None or (end is not None and end < start):
        raise ValueError("node_event: start missing or after end")
    gpu = row.get("gpu")
    return NodeEvent(cluster, node, kind, start, end, None if gpu in (None, "") else int(gpu),
                     str(row.get("reason") or ""), "file")


def _files(ctx: Context, patterns: list[str]) -> list[Path]:
    out: list[Path] = []
    for p in patterns:
        full = ctx.path(p)
        matches = sorted(Path(x) for x in glob.glob(str(full))) if any(c in p for c in "*?[") else [full]
        for m in matches:
            check_regular(m, fixed_dir(full) if m is not full else None)
            out.append(m)
    return out


class FileAllocations:
    """Allocations from CSV, JSON (a list or JSON Lines) or saved ``sacct -P`` output."""

    class Options(Options):
        paths: list[str] = Field(description="Files or glob patterns, relative to the config file.")
        format: Literal["auto", "csv", "json", "sacct", "scontrol", "slurm-json", "sacctmgr-events"] = Field(
            "auto", description="auto picks by content and extension: saved `scontrol show job -d` text "
            "(`scontrol`), Slurm jobs JSON from squeue/sacct --json or slurmrestd (`slurm-json`), .csv, "
            ".json/.jsonl, else .sacct/.txt (sacct -P). `sacctmgr-events` (never picked by auto): saved "
            "`sacctmgr -n -P show event event=node format=NodeName,Start,End,State,Reason` output: "
            "drained/down nodes with their reason.")

    def __init__(self, context: Context, options: FileAllocations.Options) -> None:
        self.ctx, self.options, self.name = context, options, "file"

    def collect(self, window: Window, problems: Problems
                ) -> Iterator[Allocation | Reservation | GpuInventory | NodeEvent]:
        for path in _files(self.ctx, self.options.paths):
            fmt = self.options.format
            if fmt == "auto":
                fmt = sniff(path) or {".csv": "csv", ".json": "json", ".jsonl": "json"}.get(
                    path.suffix.lower(), "sacct")
            for _loc, rec in self._rows(path, fmt, problems):
                if isinstance(rec, Allocation):
                    if rec.start is None or rec.start >= window.until:
                        continue
                    if rec.end is not None and rec.end <= window.since:
                        continue
                elif isinstance(rec, Reservation) and (rec.start >= window.until or rec.end <= window.since):
                    continue
                yield rec

    def _rows(self, path: Path, fmt: str, problems: Problems
              ) -> Iterable[tuple[str, Allocation | Reservation | GpuInventory | NodeEvent]]:
        if fmt == "sacct":
            yield from read_sacct_file(path, self.ctx.cluster, problems)
            return
        if fmt in ("scontrol", "slurm-json"):  # parsing lives with the Slurm connector
            yield from read_saved(path, fmt, self.ctx.cluster, problems)
            return
        if fmt == "sacctmgr-events":
            from connectors.slurm.events import parse_events

            text = read_bounded(path).decode("utf-8", errors="replace")
            yield from (("", e) for e in parse_events(text, self.ctx.cluster, problems, str(path)))
            return
        for loc, row in read_rows(path, fmt):
            if isinstance(row, str):
                problems.skip(str(path), loc, row)
                continue
            try:
                kind = row.get("type") or "allocation"
                if kind == "reservation":
                    yield loc, reservation_from_row(self.ctx.cluster, row)
                elif kind == "inventory":
                    for inv in inventory_from_row(self.ctx.cluster, row):
                        yield loc, inv
                elif kind == "allocation":
                    yield loc, allocation_from_row(self.ctx.cluster, row)
                elif kind in QUEUE_ROWS:
                    yield loc, QUEUE_ROWS[kind](self.ctx.cluster, row)
                elif kind == "node_event":
                    yield loc, node_event_from_row(self.ctx.cluster, row)
                else:
                    raise ValueError(f"type: {str(kind)[:40]!r} is not allocation, reservation, inventory, wait, "
                                     "quota or node_event")
            except (ValueError, KeyError, TypeError, ArithmeticError, RecursionError) as exc:
                problems.skip(str(path), loc, _reason(exc), _excerpt(row))


def _reason(exc: BaseException) -> str:
    text = str(exc).strip("'").strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _excerpt(row: Any) -> str:
    try:
        return json.dumps(row, default=str)[:200]
    except (ValueError, TypeError, RecursionError):
        return "(not printable)"


class _Acc:
    """Running sums of one GPU bucket."""

    __slots__ = ("sums", "counts", "instants", "labels", "uuid", "model")

    def __init__(self) -> None:
        self.sums: dict[str, float] = {}
        self.counts: dict[str, int] = {}
        self.instants: set[int] = set()
        self.labels: dict[str, str] = {}
        self.uuid: str | None = None
        self.model: str | None = None

    def add(self, field: str, value: float, ts: int) -> None:
        if field == "fb_used_mib":
            self.sums[field] = max(self.sums.get(field, 0.0), value)
            self.counts[field] = 1
        else:
            self.sums[field] = self.sums.get(field, 0.0) + value
            self.counts[field] = self.counts.get(field, 0) + 1
        self.instants.add(ts)


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
        for path in _files(self.ctx, self.options.paths):
            yield from self._read(path, window, problems, faults)
        yield from to_events(self.ctx.cluster, window.bucket_seconds, faults.hits(), "file")

    def _read(self, path: Path, window: Window, problems: Problems, faults: FaultFolder) -> Iterator[GpuBucket]:
        size = window.bucket_seconds
        lo, hi = int(window.since.timestamp()), int(window.until.timestamp())
        accs: dict[tuple[str, int, str, int], _Acc] = {}
        unknown: set[str] = set()
        for loc, row in read_rows(path, "csv"):
            if isinstance(row, str):
                problems.skip(str(path), loc, row)
                continue
            try:
                if not row.get("timestamp"):
                    raise ValueError("timestamp: missing")
                ts = int(parse_time(row["timestamp"]).timestamp())
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
                else:
                    if metric not in unknown:
                        unknown.add(metric)
                        problems.skip(str(path), loc, f"unknown metric {metric[:60]!r} (further lines of "
                                      "it skipped silently)")
                    continue
                raw = float(row.get("value") or "")
                value, clamped = normalise(field, unit, raw)
            except (ValueError, KeyError, TypeError, ArithmeticError, BadValue) as exc:
                problems.skip(str(path), loc, _reason(exc), ",".join(str(v) for v in row.values()))
                continue
            if clamped:
                problems.clamp(str(path), field)
            if not lo <= ts < hi:
                continue
            labels = {lab: row[lab] for lab in LABEL_COLUMNS if row.get(lab)}
            key = (host, gpu, (row.get("gpu_instance") or "").strip(), ts - ts % size, job_key(labels))
            acc = accs.get(key)
            if acc is None:
                acc = accs[key] = _Acc()
            acc.add(field, value, ts)
            acc.uuid = acc.uuid or (row.get("uuid") or None)
            acc.model = acc.model or (row.get("model") or None)
            acc.labels.update(labels)
        steps: dict[tuple[str, int, str], set[int]] = {}
        for (host, gpu, inst, _start, _job), acc in accs.items():
            steps.setdefault((host, gpu, inst), set()).update(acc.instants)
        step = {k: interval(v) for k, v in steps.items()}
        for (host, gpu, inst, start, job), acc in sorted(accs.items()):
            values = {f: acc.sums[f] / acc.counts[f] for f in acc.sums}
            obs, sp_s, sp_e = coverage(acc.instants, start, size, step[(host, gpu, inst)])
            yield GpuBucket(cluster=self.ctx.cluster, host=host, gpu=gpu, gpu_instance=inst,
                            start=datetime.fromtimestamp(start, window.since.tzinfo), seconds=size,
                            samples=len(acc.instants), uuid=acc.uuid, model=acc.model, **values,
                            **{k: acc.labels.get(k) for k in LABEL_COLUMNS}, observed_s=obs, span_start=sp_s,
                            span_end=sp_e, job=job)


ALLOCATIONS = FileAllocations
TELEMETRY = FileTelemetry
