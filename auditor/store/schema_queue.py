"""Tables of the queue side (docs/definitions.md "Opportunity cost"): GPU jobs that waited, and the GPU
quotas teams and queues hold. Registered on the shared MetaData; :mod:`auditor.store.schema` re-exports them."""

from __future__ import annotations

from sqlalchemy import Column, Float, Index, Integer, String, Table, Text, UniqueConstraint

from auditor.store.schema_base import _ts, metadata

gpu_waits = Table(
    "gpu_waits", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True, comment="Surrogate key."),
    Column("cluster", String(128), nullable=False, comment="Cluster name."),
    Column("source", String(16), nullable=False, comment="slurm or kubernetes."),
    Column("external_id", Text, nullable=False, comment="Slurm job id or Kubernetes pod UID."),
    Column("instance_ts", Integer, nullable=False, default=0, server_default="0",
           comment="Which job of that id: its submit time (UTC epoch seconds; the eligible time when the "
           "scheduler gave no submit time), as in allocations."),
    Column("name", Text, nullable=False, default="", comment="Job or pod name (user-controlled text)."),
    Column("user_name", Text, nullable=False, default="", comment="Owner user."),
    Column("account", Text, nullable=False, default="", comment="Slurm account or Kubernetes namespace."),
    Column("partition", Text, nullable=False, default="",
           comment="Slurm partition it waited in; '' for Kubernetes (the cluster is one queue)."),
    Column("qos", Text, nullable=False, default="", comment="Slurm QOS."),
    Column("state", Text, nullable=False, default="", comment="Scheduler state when last seen, e.g. PENDING."),
    Column("gpus", Float, nullable=False, default=0.0, comment="GPUs requested."),
    _ts("submit_ts", "Submission time"),
    _ts("eligible_ts", "When it could have started (Slurm Eligible; a Pending pod's creation)", nullable=False),
    _ts("end_ts", "When the wait ended: the job started, or left the queue without starting; NULL while "
        "it waits (the audit then ends the wait at last_seen_ts)"),
    _ts("first_seen_ts", "First sighting"),
    _ts("last_seen_ts", "Latest sighting"),
    UniqueConstraint("cluster", "source", "external_id", "instance_ts"),
    Index(None, "cluster", "eligible_ts"),
    comment="GPU jobs and pods that waited for GPUs (pending), one row per job: the demand idle GPUs "
            "blocked (finding idle_while_queued).",
)

gpu_quotas = Table(
    "gpu_quotas", metadata,
    Column("cluster", String(128), primary_key=True, comment="Cluster name."),
    Column("kind", String(16), primary_key=True, comment="qos (Slurm QOS GrpTRES) or account (Slurm "
           "association GrpTRES of an account): which allocations count against it."),
    Column("name", String(255), primary_key=True, comment="QOS or account name."),
    Column("gpus", Float, nullable=False, comment="GPUs the quota allows at once (gres/gpu=N)."),
    _ts("first_seen_ts", "First sighting"),
    _ts("last_seen_ts", "Latest sighting"),
    comment="GPU quotas held by teams or queues, with their latest definition (finding idle_quota).",
)
