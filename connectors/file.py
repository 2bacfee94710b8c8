"""File connectors (kind "file"): allocations from CSV/JSON, telemetry from a long CSV.

For sites with custom exporters and for backfill. The formats are documented in docs/file-formats.md.
Scrape files (Prometheus text / OpenMetrics) are the "scrape" kind; saved ``sacct -P`` output is read by
the Slurm parsers (format "sacct").
"""

from __future__ import annotations

import csv
import json
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from auditor.errors import SourceError
from auditor.intparse import INT32_MAX, uint_or_none
from auditor.records import (
    AllocatedGpu,
    Allocation,
    GpuInventory,
    NodeEvent,
    Reservation,
)
from connectors._rows import (
    check_regular,
    error_reason,
    files_matching,
    read_bounded,
    read_rows,
    read_sacct_file,
    row_time,
)
from connectors.base import Context, Options, Problems, Window
from connectors.file_rows import EXTRA_ROWS
from connectors.k8s_resources import FAILURE_LABEL, job_uid
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
        if isinstance(index, bool) or uint_or_none(index, hi=INT32_MAX) is None:
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
    start, end = row_time(row.get("start"), "start"), row_time(row.get("end"), "end")
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
    labels = _labels(row.get("labels"))
    why, uid = "", ""
    if source == "kubernetes":  # a pod's Job and why it failed, as the Kubernetes connector puts them on the record
        why, uid = str(labels.pop(FAILURE_LABEL, "") or ""), job_uid(labels)
    return Allocation(cluster=cluster, source=source, external_id=ext, name=text["name"],
                      user=text["user"], account=text["account"],
                      partition=text["partition"], qos=text["qos"],
                      state=text["state"], submit=row_time(row.get("submit"), "submit"),
                      start=start, end=end, reservation=text["reservation"],
                      owner_workload=text["owner"],
                      time_limit_s=time_limit,
                      labels=labels, gpus=gpus, failure_reason=why, job_uid=uid)


def _names(value: Any) -> list[str]:
    if isinstance(value, list):
        return [str(v) for v in value]
    return [v.strip() for v in str(value or "").split(",") if v.strip()]


def reservation_from_row(cluster: str, row: dict[str, Any]) -> Reservation:
    """A Slurm-style advance reservation (``"type": "reservation"`` in JSON allocation files)."""
    name = str(row.get("name") or "").strip()
    if not name:
        raise ValueError("name: missing")
    start, end = row_time(row.get("start"), "start"), row_time(row.get("end"), "end")
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


#: every column an allocations CSV may have (the row kinds of docs/file-formats.md), and what a file of
#: allocations only (no ``type`` column) cannot do without
CSV_COLUMNS = frozenset({
    "type", "id", "name", "user", "account", "partition", "qos", "state", "reservation", "owner", "submit", "start",
    "end", "gpus", "model", "share", "mig_profile", "labels", "source", "time_limit_s",  # allocation
    "gpu_count", "nodes", "users", "accounts", "flags",  # reservation
    "node", "mig_layout",  # inventory
    "eligible", "kind", "gpu", "reason",  # wait, quota, node_event
})
CSV_REQUIRED = ("id", "gpus", "start")


def check_csv_header(path: Path) -> None:
    """A header with a column this format does not know, or without a required one, fails the file with one
    line naming them: ``start_time,end_time`` for ``start,end`` would otherwise read as zero allocations."""
    check_regular(path)
    try:
        with path.open(encoding="utf-8-sig", errors="replace", newline="") as fh:
            header = next(csv.reader([fh.readline(1 << 20)]), [])
    except (OSError, csv.Error):
        return  # read_rows reports an unreadable file or header itself
    cols = [h.strip() for h in header]
    if not any(cols) or any("\ufffd" in c for c in cols):
        return
    unknown = [c for c in cols if c not in CSV_COLUMNS]
    missing = [] if "type" in cols else [c for c in CSV_REQUIRED if c not in cols]
    if unknown or missing:
        parts = ([f"unknown column{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}"] if unknown
                 else []) + ([f"missing required column{'s' if len(missing) > 1 else ''} "
                              f"{', '.join(map(repr, missing))}"] if missing else [])
        raise SourceError(str(path), f"CSV header: {'; '.join(parts)} (columns: docs/file-formats.md)")


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
        for path in files_matching(self.ctx, self.options.paths):
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
        if fmt == "csv":
            check_csv_header(path)
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
                elif kind in EXTRA_ROWS:
                    yield loc, EXTRA_ROWS[kind](self.ctx.cluster, row)
                else:
                    raise ValueError(f"type: {str(kind)[:40]!r} is not allocation, reservation, inventory, wait, "
                                     "quota or node_event")
            except (ValueError, KeyError, TypeError, ArithmeticError, RecursionError) as exc:
                problems.skip(str(path), loc, error_reason(exc), _excerpt(row))


def _excerpt(row: Any) -> str:
    try:
        return json.dumps(row, default=str)[:200]
    except (ValueError, TypeError, RecursionError):
        return "(not printable)"


from connectors.file_telemetry import FileTelemetry  # noqa: E402  (the kind's second class)

ALLOCATIONS = FileAllocations
TELEMETRY = FileTelemetry
