"""The Kubernetes Jobs whose pods hold GPUs (docs/definitions.md "Goodput"): how many of their pods failed and
their retry policy, read by the goodput rules (auditor/audit/goodput.py) to count a Job's failed pods as its
restarts. Registered on the shared MetaData; :mod:`auditor.store.schema` re-exports it."""

from __future__ import annotations

from sqlalchemy import Column, Integer, PrimaryKeyConstraint, String, Table, Text

from auditor.store.schema_base import _ts, metadata

kube_jobs = Table(
    "kube_jobs", metadata,
    Column("cluster", String(128), nullable=False, comment="Cluster name."),
    Column("uid", String(64), nullable=False, comment="The Job's metadata.uid (its pods' label controller-uid, "
           "or batch.kubernetes.io/controller-uid)."),
    Column("namespace", Text, nullable=False, comment="Namespace."),
    Column("name", Text, nullable=False, comment="Job name (user-controlled text)."),
    Column("backoff_limit", Integer, comment="spec.backoffLimit: failed pods retried before the Job fails; NULL "
           "when not said."),
    Column("failed", Integer, nullable=False, default=0, comment="Pods that failed: status.failed plus the failed "
           "pods not yet counted (status.uncountedTerminatedPods.failed); the most any sighting said."),
    Column("succeeded", Integer, nullable=False, default=0, comment="Pods that succeeded (status.succeeded)."),
    Column("active", Integer, nullable=False, default=0, comment="Pods running or pending at the last sighting "
           "(status.active)."),
    Column("state", String(16), nullable=False, default="", comment="Running, Complete, Failed or Suspended (the "
           "Job's conditions at the last sighting)."),
    Column("reason", Text, nullable=False, default="", comment="Why it failed, the Failed condition's reason "
           "(e.g. BackoffLimitExceeded, DeadlineExceeded); '' otherwise."),
    _ts("start_ts", "status.startTime"),
    _ts("end_ts", "status.completionTime, or when the Failed condition was set; NULL while it runs"),
    _ts("first_seen_ts", "First collection that listed it"),
    _ts("last_seen_ts", "Latest collection that listed it"),
    PrimaryKeyConstraint("cluster", "uid"),
    comment="Kubernetes Jobs with GPU pods: failed, succeeded and active pods, backoff limit and outcome.",
)
