"""The inference side in the store: its table ``inference_buckets`` (read by the inference rule,
auditor/audit/inference.py) and the ingest of inference buckets (vLLM, TGI, SGLang, Triton per pod and
bucket): one set-based upsert per batch,
idempotent (a re-read bucket replaces the stored one). A value that is not a finite count is refused with one
line and the rest of the batch goes in. A bucket of an hour that ``gpu-audit db prune`` already rolled up is
dropped, with a log line: the hourly row holds that hour (auditor/store/retention.py), and the bucket would
count its tokens twice, or (at the hour's start) overwrite the hourly row."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any

from sqlalchemy import (
    Column,
    Connection,
    Float,
    Index,
    Integer,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
    bindparam,
    text,
)

from auditor.records import InferenceBucket
from auditor.store.metadata import _ts, metadata
from auditor.store.sqlfuncs import upsert

inference_buckets = Table(
    "inference_buckets", metadata,
    Column("cluster", String(128), nullable=False, comment="Cluster name."),
    Column("engine", String(16), nullable=False, comment="Inference server: vllm, tgi, sglang or triton."),
    Column("job", String(255), nullable=False, comment="Telemetry job key of the serving pod: namespace/pod "
           "(the key GPU telemetry ties to an allocation)."),
    _ts("start_ts", "Bucket start", nullable=False),
    Column("seconds", Integer, nullable=False, comment="Bucket length, seconds (3600: an hour rolled up by "
           "`gpu-audit db prune`)."),
    Column("observed_s", Float, comment="Rolled-up hour: the seconds of the buckets it was made of; NULL for a "
           "bucket as collected (= seconds)."),
    _ts("span_start", "Rolled-up hour: the start of the first bucket it was made of; NULL for a bucket as "
        "collected"),
    _ts("span_end", "Rolled-up hour: the end of the last bucket it was made of; NULL for a bucket as collected"),
    Column("instance", Text, nullable=False, default="", comment="Scrape target(s) of the series (host:port)."),
    Column("model", Text, nullable=False, default="", comment="Model served, where the engine labels it "
           "(model_name; Triton: model)."),
    Column("generated_tokens", Float, comment="Tokens generated in the bucket (the counter's increase)."),
    Column("running_mean", Float, comment="Mean requests running (the concurrency; TGI: the batch size; Triton: "
           "TensorRT-LLM's active requests)."),
    Column("waiting_mean", Float, comment="Mean requests waiting in the server's queue."),
    Column("batch_mean", Float, comment="Mean batch size where the engine reports one (TGI; Triton: TensorRT-LLM's "
           "scheduled requests)."),
    Column("cache_queries", Float, comment="Prompt-cache (prefix cache) tokens looked up in the bucket (vLLM: "
           "the increase of vllm:prefix_cache_queries_total)."),
    Column("cache_hits", Float, comment="Of cache_queries, tokens found in the prefix cache (vLLM: the increase "
           "of vllm:prefix_cache_hits_total)."),
    Column("cache_hit_rate", Float, comment="Mean prefix-cache hit rate, 0-1, where the engine exports only a "
           "rate (SGLang: sglang:cache_hit_rate)."),
    PrimaryKeyConstraint("cluster", "engine", "job", "start_ts"),
    Index(None, "cluster", "start_ts"),
    comment="Per serving pod and bucket: tokens generated, mean requests running and waiting, batch size.",
)

log = logging.getLogger("gpu_audit.ingest")
FIELDS = ("generated_tokens", "running_mean", "waiting_mean", "batch_mean", "cache_queries", "cache_hits",
          "cache_hit_rate")
#: fields that count tokens (no request bound); the hit rate is a share
TOKEN_FIELDS = ("generated_tokens", "cache_queries", "cache_hits")
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
        if f == "cache_hit_rate" and v > 1:
            return f"{f}: {v:g} is not a share (0-1)"
        if f not in TOKEN_FIELDS and v > MAX_REQUESTS:
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
