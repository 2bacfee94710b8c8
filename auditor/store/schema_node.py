"""The host side's table: what each node's host did per bucket (node_exporter, the Lustre client exporter),
read by "Where the waiting goes" (auditor/audit/waiting.py; docs/definitions.md). Registered on the shared
MetaData; :mod:`auditor.store.schema` re-exports it."""

from __future__ import annotations

from sqlalchemy import Column, Float, Index, Integer, PrimaryKeyConstraint, String, Table

from auditor.store.schema_base import _ts, metadata

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
