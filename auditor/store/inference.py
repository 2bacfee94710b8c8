"""Ingest of inference buckets (vLLM, TGI per pod and bucket): one set-based upsert per batch, idempotent
(a re-read bucket replaces the stored one). A value that is not a finite count is refused with one line and
the rest of the batch goes in."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from sqlalchemy import Connection

from auditor.records import InferenceBucket
from auditor.store.schema_inference import inference_buckets
from auditor.store.sqlfuncs import upsert_checked

FIELDS = ("generated_tokens", "running_mean", "waiting_mean", "batch_mean")
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
    return upsert_checked(conn, inference_buckets, buckets, ("cluster", "engine", "job", "start_ts"), problem, row,
                          on_bad)
