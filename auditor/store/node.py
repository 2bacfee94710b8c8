"""Node buckets (host telemetry: node_exporter, the Lustre client exporter): the idempotent upsert of one
batch, and their hourly roll-up with the GPU buckets (``gpu-audit db prune``).

A value that is not a finite, non-negative number (or a share above 1) is refused with one line and the rest
of the batch goes in. A bucket for an hour already rolled up (``store_meta.rolled_up_before``) is dropped, as
GPU buckets are: the hourly row holds that hour."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from sqlalchemy import Connection, text

from auditor.records import NODE_FIELDS, NodeBucket
from auditor.store.schema_node import node_buckets
from auditor.store.sqlfuncs import upsert, upsert_checked

HOUR = 3600
#: a rate above this is no host's (a counter reset read as a jump, a corrupt exporter): refused
MAX_RATE = {"cpus": 1e5, "cpu_busy": 1e5, "cpu_iowait": 1e5, "cpu_pegged": 1e5, "disk_busy": 1.0,
            "nfs_ops": 1e9}
MAX_BPS = 1e13  # 10 TB/s: no node moves more


def problem(b: NodeBucket) -> str:
    """Why a bucket cannot be stored ("" when it can)."""
    if not isinstance(b.node, str) or not b.node or len(b.node) > 255 or "\x00" in b.node:
        return "node: not a host name"
    if not isinstance(b.seconds, int) or b.seconds <= 0:
        return f"seconds: {b.seconds!r} is not a bucket length"
    if not isinstance(b.samples, int) or b.samples < 0:
        return f"samples: {b.samples!r} is not a count"
    if b.observed_s is not None and (not isinstance(b.observed_s, int | float) or not math.isfinite(b.observed_s)
                                     or not 0 <= b.observed_s <= b.seconds):
        return f"observed_s: {b.observed_s!r} is not within the bucket"
    for f in NODE_FIELDS:
        v = getattr(b, f)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
            return f"{f}: {v!r} is not a rate"
        if v > MAX_RATE.get(f, MAX_BPS):
            return f"{f}: {v:g} is beyond any host"
    return ""


def row(b: NodeBucket) -> dict[str, Any]:
    return {"cluster": b.cluster, "node": b.node, "start_ts": int(b.start.timestamp()), "seconds": b.seconds,
            "samples": b.samples, "observed_s": None if b.observed_s is None else float(b.observed_s),
            **{f: (float(getattr(b, f)) if getattr(b, f) is not None else None) for f in NODE_FIELDS}}


def ingest_nodes(conn: Connection, buckets: list[NodeBucket], on_bad: Callable[[NodeBucket, str], None],
                 rolled_up_before: int | None = None) -> int:
    """Upsert ``buckets`` (the last of duplicates in one batch wins); the refused ones go to ``on_bad``; fine
    buckets of hours already rolled up are dropped (counted in the return as not written)."""
    def keep(r: dict[str, Any]) -> bool:
        return rolled_up_before is None or r["seconds"] >= HOUR or r["start_ts"] >= rolled_up_before

    return upsert_checked(conn, node_buckets, buckets, ("cluster", "node", "start_ts"), problem, row, on_bad, keep)


_W = "observed_s"
#: one hourly row per node and hour: samples and observed seconds summed (observed at most 3600, NULL when no
#: row knew them), every field the observed-seconds-weighted mean of the rows that had it (a row that does not
#: know its observed seconds weighs its whole bucket)
_WEIGHT = "COALESCE(n.observed_s, CASE WHEN n.samples > 0 THEN n.seconds ELSE 0 END)"
ROLLUP = ("SELECT n.cluster, n.node, (n.start_ts / 3600) * 3600 AS h, SUM(n.samples) AS samples, "
          "{least}(3600, SUM(n.observed_s)) AS observed_s, "
          + ", ".join(f"SUM(CASE WHEN n.{f} IS NOT NULL THEN {_WEIGHT} * n.{f} END) / NULLIF(SUM(CASE WHEN n.{f} "
                      f"IS NOT NULL THEN {_WEIGHT} END), 0) AS {f}" for f in NODE_FIELDS)
          + " FROM node_buckets n WHERE n.start_ts >= :lo AND n.start_ts < :hi"
            " GROUP BY n.cluster, n.node, (n.start_ts / 3600) * 3600 HAVING MIN(n.seconds) < 3600")


def roll_up(conn: Connection, lo: int, hi: int) -> tuple[int, int]:
    """Node buckets of [lo, hi) (whole hours) rolled up to one hourly row per node and hour, as the GPU buckets
    beside them (:mod:`auditor.store.retention`), so the waiting rule finds its node row at the same grid.
    Returns (fine rows replaced, hourly rows written)."""
    least = "LEAST" if conn.dialect.name == "postgresql" else "min"
    p = {"lo": lo, "hi": hi}
    hourly = [dict(r._mapping) for r in conn.execute(text(ROLLUP.format(least=least)), p)]
    if not hourly:
        return 0, 0
    fine = conn.execute(text("SELECT COUNT(*) FROM node_buckets WHERE start_ts >= :lo AND start_ts < :hi "
                             "AND seconds < 3600"), p).scalar() or 0
    conn.execute(text("DELETE FROM node_buckets WHERE start_ts >= :lo AND start_ts < :hi AND EXISTS (SELECT 1 FROM "
                      "node_buckets f WHERE f.cluster = node_buckets.cluster AND f.node = node_buckets.node AND "
                      "f.start_ts >= (node_buckets.start_ts / 3600) * 3600 AND f.start_ts < (node_buckets.start_ts "
                      "/ 3600) * 3600 + 3600 AND f.seconds < 3600)"), p)
    rows = [{"cluster": r["cluster"], "node": r["node"], "start_ts": int(r["h"]), "seconds": HOUR,
             "samples": int(r["samples"] or 0), "observed_s": r["observed_s"], **{f: r[f] for f in NODE_FIELDS}}
            for r in hourly]
    upsert(conn, node_buckets, rows, ("cluster", "node", "start_ts"))
    return int(fine), len(rows)


def oldest_fine(conn: Connection, cutoff: int) -> int | None:
    return conn.execute(text("SELECT MIN(start_ts) FROM node_buckets WHERE seconds < 3600 AND start_ts < :c"),
                        {"c": cutoff}).scalar()


def count_fine(conn: Connection, cutoff: int) -> int:
    return int(conn.execute(text("SELECT COUNT(*) FROM node_buckets WHERE seconds < 3600 AND start_ts < :c"),
                            {"c": cutoff}).scalar() or 0)
