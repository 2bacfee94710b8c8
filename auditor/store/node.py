"""Node buckets (host telemetry: node_exporter, the Lustre client exporter): their table ``node_buckets`` (read
by "Where the waiting goes", auditor/audit/waiting.py), the idempotent upsert of one batch, and their hourly
roll-up with the GPU buckets (``gpu-audit db prune``). Beside them, per InfiniBand or RoCE port, ``ib_port_buckets``
(transmit wait, link errors, ECN-marked share; issue 48 §2; read by auditor/audit/fabric.py), stored and rolled up
alike.

A value that is not a finite, non-negative number (or a share above 1) is refused with one line and the rest
of the batch goes in. A bucket for an hour already rolled up (``store_meta.rolled_up_before``) is dropped, as
GPU buckets are: the hourly row holds that hour."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from sqlalchemy import Column, Connection, Float, Index, Integer, PrimaryKeyConstraint, String, Table, text

from auditor.records import NODE_FIELDS, NodeBucket, PortBucket
from auditor.store.metadata import _ts, metadata
from auditor.store.sqlfuncs import upsert, upsert_checked

node_buckets = Table(
    "node_buckets", metadata,
    Column("cluster", String(128), nullable=False, comment="Cluster name."),
    Column("node", String(255), nullable=False, comment="Node (host) name, as GPU telemetry and the schedulers "
           "name it: the key that ties the bucket to the allocations on the node."),
    _ts("start_ts", "Bucket start", nullable=False),
    Column("seconds", Integer, nullable=False, comment="Bucket length, seconds (3600 once rolled up)."),
    Column("samples", Integer, nullable=False, default=0, comment="Samples of the exporter's CPU counters in the "
           "bucket (per series)."),
    Column("observed_s", Float, comment="Seconds of the bucket the exporter's samples covered (NULL: not known; "
           "the whole bucket when samples > 0)."),
    Column("cpus", Float, comment="CPU cores the exporter reports (mean over the bucket)."),
    Column("cpu_busy", Float, comment="Cores busy in user, nice, system, irq and softirq modes: the per-second rate "
           "of node_cpu_seconds_total, mean over the bucket."),
    Column("cpu_iowait", Float, comment="Cores idle in I/O wait (mode iowait), mean over the bucket; the share is "
           "cpu_iowait / cpus."),
    Column("cpu_pegged", Float, comment="Cores busy at least the connector's pegged_core_busy share of the bucket."),
    Column("disk_read_bps", Float, comment="Bytes/s read from local disks (node_disk_read_bytes_total, devices "
           "the connector's disk_exclude does not drop)."),
    Column("disk_write_bps", Float, comment="Bytes/s written to local disks."),
    Column("disk_busy", Float, comment="0-1: the busiest local disk's share of the bucket with I/O in flight "
           "(node_disk_io_time_seconds_total)."),
    Column("ib_rx_bps", Float, comment="InfiniBand bytes/s received, all devices and ports."),
    Column("ib_tx_bps", Float, comment="InfiniBand bytes/s transmitted, all devices and ports."),
    Column("nfs_read_bps", Float, comment="Bytes/s read from NFS servers, all mounts "
           "(node_mountstats_nfs_total_read_bytes_total)."),
    Column("nfs_write_bps", Float, comment="Bytes/s written to NFS servers, all mounts."),
    Column("nfs_ops", Float, comment="NFS client requests/s, all procedures (node_nfs_requests_total)."),
    Column("lustre_read_bps", Float, comment="Lustre client bytes/s read (lustre_read_bytes_total, component "
           "client)."),
    Column("lustre_write_bps", Float, comment="Lustre client bytes/s written."),
    PrimaryKeyConstraint("cluster", "node", "start_ts"),
    Index(None, "start_ts"),
    comment="Per node and bucket: the host's CPU, I/O wait, disk, InfiniBand, NFS and Lustre client activity "
            "(node_exporter), per-second means; NULL = the exporter did not report it.",
)

ib_port_buckets = Table(
    "ib_port_buckets", metadata,
    Column("cluster", String(128), nullable=False, comment="Cluster name."),
    Column("node", String(255), nullable=False, comment="Node (host) name, as in node_buckets."),
    Column("device", String(64), nullable=False, comment="InfiniBand device (HCA) as node_exporter labels it, "
           "e.g. mlx5_2."),
    Column("port", String(16), nullable=False, comment="Port number of the device, e.g. 1."),
    _ts("start_ts", "Bucket start", nullable=False),
    Column("seconds", Integer, nullable=False, comment="Bucket length, seconds (3600 once rolled up)."),
    Column("wait_share", Float, comment="0-1: share of the bucket the port had data to send and sent none "
           "(node_infiniband_port_transmit_wait_total ticks x 8 bytes / node_infiniband_rate_bytes_per_second; "
           "docs/node-telemetry.md \"Per port\")."),
    Column("link_errors", Float, comment="Link errors counted in the bucket: the increase of symbol errors, link "
           "error recoveries, links downed and received packets with errors."),
    Column("ecn_share", Float, comment="0-1, RoCE: share of the packets the port received that a switch marked "
           "congested (node_infiniband_np_ecn_marked_roce_packets_received_total / "
           "node_infiniband_port_packets_received_total; docs/node-telemetry.md \"Per port\")."),
    PrimaryKeyConstraint("cluster", "node", "device", "port", "start_ts"),
    Index(None, "start_ts"),
    comment="Per InfiniBand or RoCE port and bucket: its transmit wait share, link errors and ECN-marked share "
            "(node_exporter); NULL = not measured.",
)

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


def port_problem(b: PortBucket) -> str:
    """Why a port bucket cannot be stored ("" when it can)."""
    if not isinstance(b.node, str) or not b.node or len(b.node) > 255 or "\x00" in b.node:
        return "node: not a host name"
    for f, n in (("device", 64), ("port", 16)):
        v = getattr(b, f)
        if not isinstance(v, str) or not v or len(v) > n or "\x00" in v:
            return f"{f}: {str(v)[:70]!r} is not an InfiniBand {f} name"
    if not isinstance(b.seconds, int) or b.seconds <= 0:
        return f"seconds: {b.seconds!r} is not a bucket length"
    for f, hi in (("wait_share", 1.0), ("link_errors", 1e15), ("ecn_share", 1.0)):
        v = getattr(b, f)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v)
                              or not 0 <= v <= hi):
            return f"{f}: {v!r} is not a {'share' if hi == 1.0 else 'count'}"
    return ""


def port_row(b: PortBucket) -> dict[str, Any]:
    return {"cluster": b.cluster, "node": b.node, "device": b.device, "port": b.port,
            "start_ts": int(b.start.timestamp()), "seconds": b.seconds,
            "wait_share": None if b.wait_share is None else float(b.wait_share),
            "link_errors": None if b.link_errors is None else float(b.link_errors),
            "ecn_share": None if b.ecn_share is None else float(b.ecn_share)}


PORT_KEY = ("cluster", "node", "device", "port", "start_ts")


def ingest_ports(conn: Connection, buckets: list[PortBucket], on_bad: Callable[[PortBucket, str], None],
                 rolled_up_before: int | None = None) -> int:
    """Upsert port ``buckets`` as :func:`ingest_nodes` does node buckets."""
    def keep(r: dict[str, Any]) -> bool:
        return rolled_up_before is None or r["seconds"] >= HOUR or r["start_ts"] >= rolled_up_before

    return upsert_checked(conn, ib_port_buckets, buckets, PORT_KEY, port_problem, port_row, on_bad, keep)


#: one hourly row per port and hour: each share the seconds-weighted mean of the rows that had it, the link
#: errors summed
PORT_ROLLUP = ("SELECT cluster, node, device, port, (start_ts / 3600) * 3600 AS h, "
               + "".join(f"SUM(CASE WHEN {f} IS NOT NULL THEN seconds * {f} END) / NULLIF(SUM(CASE WHEN {f} IS NOT "
                         f"NULL THEN seconds END), 0) AS {f}, " for f in ("wait_share", "ecn_share"))
               + "SUM(link_errors) AS link_errors "
               "FROM ib_port_buckets WHERE start_ts >= :lo AND start_ts < :hi "
               "GROUP BY cluster, node, device, port, (start_ts / 3600) * 3600 HAVING MIN(seconds) < 3600")


def roll_up_ports(conn: Connection, lo: int, hi: int) -> int:
    """Port buckets of [lo, hi) to one hourly row per port and hour (with the node buckets); rows written."""
    p = {"lo": lo, "hi": hi}
    rows = [{"cluster": r.cluster, "node": r.node, "device": r.device, "port": r.port, "start_ts": int(r.h),
             "seconds": HOUR, "wait_share": r.wait_share, "link_errors": r.link_errors, "ecn_share": r.ecn_share}
            for r in conn.execute(text(PORT_ROLLUP), p)]
    if rows:
        conn.execute(text("DELETE FROM ib_port_buckets WHERE start_ts >= :lo AND start_ts < :hi AND seconds < 3600"),
                     p)
        upsert(conn, ib_port_buckets, rows, PORT_KEY)
    return len(rows)


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
    roll_up_ports(conn, lo, hi)
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
