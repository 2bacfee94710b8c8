"""Ingest of inference buckets (vLLM, TGI, SGLang, Triton per pod and bucket): one set-based upsert per batch,
idempotent (a re-read bucket replaces the stored one). A value that is not a finite count is refused with one
line and the rest of the batch goes in. A bucket of an hour that ``gpu-audit db prune`` already rolled up is
dropped, with a log line: the hourly row holds that hour (auditor/store/retention.py), and the bucket would
count its tokens twice, or (at the hour's start) overwrite the hourly row."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any

from sqlalchemy import Connection, bindparam, text

from auditor.records import InferenceBucket
from auditor.store.schema_inference import inference_buckets
from auditor.store.sqlfuncs import upsert

log = logging.getLogger("gpu_audit.ingest")
FIELDS = ("generated_tokens", "running_mean", "waiting_mean", "batch_mean")
HOUR = 3600
#: a request count above this is no concurrency a GPU serves (a corrupt gauge), refused
MAX_REQUESTS = 1e6


def problem(b: InferenceBucket) -> str:
    """Why a bucket cannot be stored ("" when it can)."""
    if not isinstance(b.job, str) or not b.job or len(b.job) > 255 or "\x00" in b.job:
        return "job: not a namespace/pod key"
    if not isinstance(b.seconds, int) or b.seconds <= 0:
        return f"seconds: {b.seconds!r} is not a bucket length"
    for f in FIELDS:
        v = getattr(b, f)
        if v is None:
            continue
        if not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
            return f"{f}: {v!r} is not a count"
        if f != "generated_tokens" and v > MAX_REQUESTS:
            return f"{f}: {v:g} requests is not a concurrency"
    return ""


def row(b: InferenceBucket) -> dict[str, Any]:
    return {"cluster": b.cluster, "engine": b.engine[:16], "job": b.job, "start_ts": int(b.start.timestamp()),
            "seconds": b.seconds, "instance": b.instance.replace("\x00", ""), "model": b.model.replace("\x00", ""),
            **{f: (float(getattr(b, f)) if getattr(b, f) is not None else None) for f in FIELDS}}


def ingest_inference(conn: Connection, buckets: list[InferenceBucket],
                     on_bad: Callable[[InferenceBucket, str], None]) -> int:
    """Upsert ``buckets`` (the last of duplicates in one batch wins); the refused ones go to ``on_bad``."""
    rows: dict[tuple, dict[str, Any]] = {}
    for b in buckets:
        if why := problem(b):
            on_bad(b, why)
            continue
        r = row(b)
        rows[(r["cluster"], r["engine"], r["job"], r["start_ts"])] = r
    keep = _not_rolled_up(conn, list(rows.values()))
    upsert(conn, inference_buckets, keep, ("cluster", "engine", "job", "start_ts"))
    return len(keep)


def _not_rolled_up(conn: Connection, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` less those whose hour already holds a rolled-up row (logged with a count)."""
    hours = sorted({r["start_ts"] // HOUR * HOUR for r in rows})
    if not hours:
        return rows
    # (cluster, start_ts) leads an index: the look-up reads the batch's hours, not the table
    q = text("SELECT cluster, engine, job, start_ts FROM inference_buckets WHERE cluster IN :clusters "
             "AND start_ts IN :hours AND span_start IS NOT NULL").bindparams(
                 bindparam("clusters", expanding=True), bindparam("hours", expanding=True))
    rolled = {tuple(r) for r in conn.execute(q, {"clusters": sorted({r["cluster"] for r in rows}), "hours": hours})}
    if not rolled:
        return rows
    keep = [r for r in rows if (r["cluster"], r["engine"], r["job"], r["start_ts"] // HOUR * HOUR) not in rolled]
    log.warning("dropped %d inference buckets for hours already rolled up (gpu-audit db prune): the hourly rows "
                "hold those hours", len(rows) - len(keep))
    return keep
