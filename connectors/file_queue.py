"""Rows of JSON allocation files for the queue side (docs/connectors.md "file"): ``"type": "wait"`` (a GPU
job that waited: id, gpus, eligible, end (absent while it waits), partition, account, user, qos, state) and
``"type": "quota"`` (kind ``qos`` or ``account``, name, gpus)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from auditor.records import GpuQuota, GpuWait
from auditor.timeutil import parse_time

MAX_GPUS = 65536


def _when(value: Any, what: str) -> datetime | None:
    if value in (None, "", "None", "Unknown"):
        return None
    try:
        return parse_time(str(value))
    except ValueError:
        raise ValueError(f"{what}: cannot parse time {str(value)[:40]!r}") from None


def _gpus(value: Any) -> float:
    gpus = float(value or 0)
    if not 0 < gpus <= MAX_GPUS:
        raise ValueError(f"gpus: {gpus:g} is not a GPU count")
    return gpus


def wait_from_row(cluster: str, row: dict[str, Any]) -> GpuWait:
    """A GPU job that waited; ``end`` is when it started (or left the queue), absent while still waiting."""
    ext = str(row.get("id") or "").strip()
    if not ext:
        raise ValueError("id: missing")
    eligible = _when(row.get("eligible"), "eligible")
    if eligible is None:
        raise ValueError("eligible: missing")
    end = _when(row.get("end"), "end")
    if end is not None and end < eligible:
        raise ValueError(f"end {end.isoformat()} is before eligible {eligible.isoformat()}")
    source = "kubernetes" if row.get("source") == "kubernetes" else "slurm"
    return GpuWait(cluster, source, ext, _gpus(row.get("gpus")), eligible=eligible, end=end,
                   submit=_when(row.get("submit"), "submit"), name=str(row.get("name") or ""),
                   user=str(row.get("user") or ""), account=str(row.get("account") or ""),
                   partition=str(row.get("partition") or ""), qos=str(row.get("qos") or ""),
                   state=str(row.get("state") or ("PENDING" if end is None else "")))


def quota_from_row(cluster: str, row: dict[str, Any]) -> GpuQuota:
    """A GPU quota of a QOS or an account (namespace)."""
    kind = row.get("kind")
    if kind not in ("qos", "account"):
        raise ValueError(f"kind: {str(kind)[:40]!r} is not qos or account")
    name = str(row.get("name") or "").strip()
    if not name:
        raise ValueError("name: missing")
    return GpuQuota(cluster, kind, name, _gpus(row.get("gpus")))


#: ``type`` of a JSON row -> its reader
QUEUE_ROWS = {"wait": wait_from_row, "quota": quota_from_row}
