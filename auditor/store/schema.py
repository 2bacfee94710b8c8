"""The store's tables. Every table and column carries a comment: docs/schema.md is generated from them
(``gpu-audit db schema``) and a test fails when one is missing. Times are UTC epoch seconds (integers)."""

from __future__ import annotations

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Table,
    Text,
    UniqueConstraint,
)

from auditor.store.columns import EXACT_COMMENTS, GPU_ONLY, JUDGED_SUMS, METRIC_COMMENTS
from auditor.store.columns import HOURS as _HOURS
from auditor.store.columns import HOURS_ADDED as _HOURS_ADDED
from auditor.store.columns import STARVED as _STARVED
from auditor.store.metadata import _ts, metadata

clusters = Table(
    "clusters", metadata,
    Column("name", String(128), primary_key=True, comment="Cluster name from the config."),
    _ts("first_seen_ts", "First collection that mentioned the cluster"),
    _ts("last_seen_ts", "Latest collection that mentioned the cluster"),
    comment="Every cluster the store has data for.",
)

#: allocations.failure_reason and job_uid (migration 0039_pod_failure)
FAILURE_REASON_COMMENT = ("Kubernetes: why a Failed pod failed, in the API's words (its DisruptionTarget condition's "
                          "reason, else status.reason, else a container's, e.g. OOMKilled); NULL when it did not "
                          "fail, nothing says, or the source is not Kubernetes.")
JOB_UID_COMMENT = ("Kubernetes: the uid of the Job that owns the pod (its label batch.kubernetes.io/controller-uid "
                   "or controller-uid, kube_jobs.uid); NULL for a pod of no Job and other sources.")
#: allocations.sluid (migration 0032_sluid)
SLUID_COMMENT = ("Slurm 25.11+ SLUID of this run of the job (s + 13 base-32 characters; squeue/scontrol SLUID, "
                 "sacct OriginalSLUID, else SLUID): a requeue gives the same job id a new SLUID, and enforcement "
                 "acts only on the run with the judged SLUID; NULL where the source or Slurm release does not "
                 "say (older Slurm, Kubernetes).")

allocations = Table(
    "allocations", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True, comment="Surrogate key."),
    Column("cluster", String(128), nullable=False, comment="Cluster name."),
    Column("source", String(16), nullable=False, comment="slurm, kubernetes or file."),
    Column("external_id", Text, nullable=False,
           comment="Scheduler id: Slurm job id (array/het part included) or Kubernetes pod UID. Slurm "
           "reuses job ids (wrap-around, state loss): instance_ts tells those jobs apart."),
    Column("instance_ts", Integer, nullable=False, default=0, server_default="0",
           comment="Which job of that id: the submit time (UTC epoch seconds; the start time when the "
           "scheduler gave no submit time) at the first sighting; 0 for Kubernetes pods (a UID is never "
           "reused). A later sighting is the same job when its submit time equals the stored one, or, "
           "if either lacks a submit time, when the start times are equal; a sighting with neither time "
           "belongs to the latest job of that id. See docs/slurm.md \"Job ids\"."),
    Column("name", Text, nullable=False, default="", comment="Job or pod name (user-controlled text)."),
    Column("user_name", Text, nullable=False, default="", comment="Owner user."),
    Column("account", Text, nullable=False, default="",
           comment="Slurm account or Kubernetes namespace."),
    Column("partition", Text, nullable=False, default="", comment="Slurm partition or queue."),
    Column("qos", Text, nullable=False, default="", comment="Slurm QOS or priority class."),
    Column("state", Text, nullable=False, default="", comment="Scheduler state, e.g. RUNNING."),
    _ts("submit_ts", "Submission time"),
    _ts("start_ts", "When the GPUs were first held; NULL if never started"),
    _ts("end_ts", "When the GPUs were released; NULL while running"),
    Column("reservation", Text, nullable=False, default="", comment="Advance reservation name."),
    Column("owner_workload", Text, nullable=False, default="",
           comment="Kubernetes owner chain top, e.g. Job/llama-ft."),
    Column("time_limit_s", Integer, comment="Requested time limit in seconds."),
    Column("labels", JSON, comment="Scheduler labels (pod labels), a JSON object."),
    Column("gpu_count", Float, nullable=False, default=0.0,
           comment="GPUs held: sum of shares of allocated_gpus."),
    _ts("first_seen_ts", "First time a collector saw the allocation"),
    _ts("last_seen_ts", "Latest time a collector saw the allocation"),
    Column("exit_code", Text, comment="Slurm ExitCode of the job, return code:signal (e.g. 0:0, 1:0, 0:9); NULL "
           "when the source does not say."),
    Column("cpus", Integer, comment="CPUs allocated (the cpu count of Slurm's AllocTRES); NULL when the source "
           "does not say."),
    Column("cpu_time_s", Float, comment="CPU seconds the job used (Slurm TotalCPU: user + system over its "
           "steps); NULL when the source does not say or reports 0 for a job that ran (sacct -X may leave "
           "it empty)."),
    Column("restarts", Integer, comment="Times the scheduler restarted the job (Slurm Restarts, squeue --json "
           "restart_cnt: requeues, each a new run with its own submit time; Kubernetes: the pod's container "
           "restarts, the sum of restartCount); NULL when the source does not say."),
    Column("sluid", Text, comment=SLUID_COMMENT),
    Column("failure_reason", Text, comment=FAILURE_REASON_COMMENT),
    Column("job_uid", String(64), comment=JOB_UID_COMMENT),
    UniqueConstraint("cluster", "source", "external_id", "instance_ts"),
    Index(None, "cluster", "start_ts", "end_ts"),
    comment="Jobs and pods that held GPUs (the ledger: kept after the scheduler forgets them).",
)

allocated_gpus = Table(
    "allocated_gpus", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True, comment="Surrogate key."),
    Column("allocation_id", Integer, ForeignKey("allocations.id", ondelete="CASCADE"), nullable=False,
           comment="The allocation."),
    Column("node", Text, nullable=False, comment="Node (host) name."),
    Column("slot", Integer, nullable=False, comment="Ordinal of this GPU among the allocation's GPUs on "
           "the node (stable key when the index is unknown)."),
    Column("gpu_index", Integer, comment="GPU index on the node; NULL when the scheduler no longer says."),
    Column("uuid", Text, comment="GPU UUID when known."),
    Column("model", Text, comment="GPU model, e.g. h100 or NVIDIA-H100-80GB-HBM3."),
    Column("share", Float, nullable=False, default=1.0,
           comment="Fraction of the GPU held: 1, a MIG slice (1g of 7 = 1/7) or a time-sliced replica."),
    Column("mig_profile", Text, comment="MIG profile, e.g. 1g.10gb."),
    UniqueConstraint("allocation_id", "node", "slot"),
    Index(None, "node", "gpu_index"),
    comment="One row per GPU (or GPU fraction) an allocation held, per node.",
)

reservations = Table(
    "reservations", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True, comment="Surrogate key."),
    Column("cluster", String(128), nullable=False, comment="Cluster name."),
    Column("name", Text, nullable=False, comment="Reservation name."),
    Column("slurm_id", String(64), comment="Slurm's reservation id (sacctmgr ID, the ReservationId of "
           "jobs) when known. Identity: one row per reservation, with its latest definition: a sighting "
           "with the same name and the same slurm_id, or (id unknown on either side) an overlapping or "
           "touching span, or both still current when seen, replaces the stored definition."),
    _ts("start_ts", "Reservation start (the earliest piece when accounting split it on updates)",
        nullable=False),
    _ts("end_ts", "Reservation end (the latest piece's end)", nullable=False),
    Column("nodes", JSON, comment="Reserved nodes, a JSON list."),
    Column("gpu_count", Float, nullable=False, default=0.0, comment="GPUs reserved."),
    Column("users", JSON, comment="Users allowed, a JSON list."),
    Column("accounts", JSON, comment="Accounts allowed, a JSON list."),
    Column("flags", JSON, comment="Reservation flags, a JSON list."),
    _ts("last_seen_ts", "Latest time a collector saw it"),
    UniqueConstraint("cluster", "name", "start_ts"),
    comment="Slurm advance reservations, one row per reservation (pieces that sacctmgr keeps per "
            "modification are assembled into one; a moved start or end replaces the old definition).",
)

gpu_inventory = Table(
    "gpu_inventory", metadata,
    Column("cluster", String(128), primary_key=True, comment="Cluster name."),
    Column("host", Text, primary_key=True, comment="Node name."),
    Column("gpu_index", Integer, primary_key=True, comment="GPU index on the node."),
    Column("model", Text, comment="GPU model."),
    Column("uuid", Text, comment="GPU UUID when known."),
    Column("mig_layout", Text, nullable=False, default="", comment="MIG layout, e.g. 1g.10gb:7."),
    _ts("first_seen_ts", "First sighting"),
    _ts("last_seen_ts", "Latest sighting"),
    comment="GPUs that exist according to the schedulers, allocated or not.",
)

telemetry_gpus = Table(
    "telemetry_gpus", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True, comment="Surrogate key used by buckets."),
    Column("cluster", String(128), nullable=False, comment="Cluster name."),
    Column("host", Text, nullable=False, comment="Node name as telemetry reports it."),
    Column("gpu_index", Integer, nullable=False, comment="GPU index on the node."),
    Column("gpu_instance", Text, nullable=False, default="", comment="MIG GPU instance id, '' for "
           "the whole GPU."),
    Column("uuid", Text, comment="Latest UUID seen."),
    Column("model", Text, comment="Latest model seen."),
    Column("has_jobs", Integer, nullable=False, default=0, server_default="0",
           comment="1 once a bucket row with a job label was stored for it (its rows may need combining)."),
    UniqueConstraint("cluster", "host", "gpu_index", "gpu_instance"),
    comment="Each GPU (or MIG instance) telemetry has reported; gpu_buckets refer to it.",
)

gpu_buckets = Table(
    "gpu_buckets", metadata,
    Column("gpu_id", Integer, ForeignKey("telemetry_gpus.id"), primary_key=True,
           comment="telemetry_gpus.id (a foreign key on SQLite; on PostgreSQL every writer takes it from "
           "telemetry_gpus in the same transaction and checks the batch's ids set-wise)."),
    Column("bucket_ts", Integer, primary_key=True, autoincrement=False,
           comment="Bucket start (UTC epoch seconds), aligned to bucket_s."),
    Column("job", String(512), primary_key=True, default="", server_default="",
           comment="Job key of the series: hpc_job label (comma-joined if several) or namespace/pod; '' = no "
           "job label. Series of one GPU with different jobs are separate rows (sub-rows), never merged."),
    Column("bucket_s", Integer, nullable=False, comment="Bucket length in seconds (300 fine, 3600 rolled up)."),
    Column("samples", Integer, nullable=False, comment="Raw samples in the bucket; 0 with observed_s > 0: only "
           "the cover of the series' sample before it."),
    Column("observed_s", Float, nullable=False, comment="Seconds of the bucket its series' samples cover, each "
           "until the next at most one interval, carried across bucket edges (0..bucket_s; bucket_s when the "
           "source cannot tell)."),
    Column("span_start", Integer, comment="Start of the covered seconds; NULL = the whole bucket."),
    Column("span_end", Integer, comment="End of the covered seconds; NULL = the whole bucket."),
    *[Column(name, Float, comment=text) for name, text in METRIC_COMMENTS.items()],
    *[Column(name, Float, comment=text) for name, text in EXACT_COMMENTS.items()],
    Column("hpc_job", Text, comment="dcgm-exporter hpc_job label(s), comma-joined."),
    Column("pod", Text, comment="Pod label from telemetry."),
    Column("namespace", Text, comment="Namespace label from telemetry."),
    Column("container", Text, comment="Container label from telemetry."),
    sqlite_with_rowid=False,
    postgresql_partition_by="RANGE (bucket_ts)",
    comment="Normalised per-GPU telemetry buckets (never raw samples), one row per GPU, bucket and job. "
            "PostgreSQL: partitioned by week on bucket_ts (gpu_buckets_wYYYYMMDD, Monday 00:00 UTC).",
)

# the foreign key is SQLite's only: PostgreSQL's partitioned table has none (migration 0010_partitions), so a
# store created from the models has none there either
next(iter(gpu_buckets.c.gpu_id.foreign_keys)).constraint.ddl_if(dialect="sqlite")

judged_hours = Table(
    "judged_hours", metadata,
    Column("ths", String(16), primary_key=True,
           comment="Threshold-set hash: the first 16 hex digits of the SHA-256 of the verdict SQL that judged the "
           "row (the thresholds and the rules); one set is kept, the one of the latest official audit."),
    Column("gpu_id", Integer, primary_key=True, autoincrement=False,
           comment="telemetry_gpus.id (no foreign key: the id comes from gpu_buckets, and no code deletes "
           "telemetry_gpus rows)."),
    Column("hour", Integer, primary_key=True, autoincrement=False,
           comment="Clock hour: bucket_ts / 3600 of the buckets judged (UTC epoch hours)."),
    Column("job", String(512), primary_key=True,
           comment="Job key: '' = the unlabelled rows of buckets without a labelled sibling; else the rows with "
           "exactly this job label (an allocation with that job key reads both)."),
    *[Column(name, Float, comment=text) for name, text in JUDGED_SUMS.items()],
    sqlite_with_rowid=False,
    comment="The judged aggregate: per GPU, clock hour, job key and threshold set the verdict sums of its "
            "buckets, each bucket seen whole (an allocation holding the whole hour). The audit reads an "
            "allocation's whole hours here and judges only its partial edge hours from gpu_buckets; hours "
            "listed in judged_dirty are judged from gpu_buckets until re-judged.",
)

judged_edges = Table(
    "judged_edges", metadata,
    Column("ths", String(16), primary_key=True, comment="Threshold-set hash (judged_hours.ths) the edge was judged "
           "under."),
    Column("allocated_gpu_id", Integer, primary_key=True, autoincrement=False,
           comment="allocated_gpus.id (no foreign key: a row is read only while every column it was judged for "
           "still matches)."),
    Column("side", Integer, primary_key=True, autoincrement=False,
           comment="0: the head (buckets before the first whole hour), 1: the tail (after the last)."),
    Column("gpu_id", Integer, nullable=False, comment="telemetry_gpus.id the edge was judged on."),
    Column("edge_ts", Integer, nullable=False,
           comment="The reserved interval's start (head) or end (tail) inside the audit window, UTC epoch seconds, "
           "that the edge was judged for."),
    Column("lo_hour", Integer, nullable=False,
           comment="First clock hour of the buckets read (a mark on any hour in [lo_hour, hi_hour] deletes the "
           "row)."),
    Column("hi_hour", Integer, nullable=False, comment="Last clock hour of the buckets read."),
    Column("jkey", Text, comment="The allocation's job key in telemetry labels."),
    Column("lab", Integer, nullable=False,
           comment="1 when the telemetry GPU had carried job labels (telemetry_gpus.has_jobs)."),
    *[Column(name, Float, comment=text) for name, text in JUDGED_SUMS.items()],
    Index("ix_judged_edges_gpu_hour", "gpu_id", "lo_hour"),  # the name migration 0040_judged_edges gave it
    sqlite_with_rowid=False,
    comment="Edges judged once: per allocated GPU and edge the verdict sums of the buckets of its partial clock "
            "hours, read by later audits while the GPU, edge time, job key and thresholds match and no write "
            "marked those hours.",
)

judged_dirty = Table(
    "judged_dirty", metadata,
    Column("gpu_id", Integer, primary_key=True, autoincrement=False, comment="telemetry_gpus.id."),
    Column("hour", Integer, primary_key=True, autoincrement=False,
           comment="Clock hour (bucket_ts / 3600) whose buckets changed since judged_hours was judged."),
    Column("mark", BigInteger, nullable=False,
           comment="Random token of the write that marked it: a re-judging clears only the marks it read."),
    Column("unfit", Integer, nullable=False, default=0, server_default="0",
           comment="1: re-judged, but the hour holds a bucket crossing the hour's end or a comma-joined job "
           "label, so it stays judged from gpu_buckets (cleared by the next write to the hour)."),
    sqlite_with_rowid=False,
    comment="Hours of telemetry written (ingest, roll-ups) and not yet re-judged into judged_hours.",
)

judged_sets = Table(
    "judged_sets", metadata,
    Column("ths", String(16), primary_key=True, comment="Threshold-set hash (judged_hours.ths)."),
    Column("from_hour", Integer, nullable=False,
           comment="judged_hours holds this set for every hour from here on (earlier hours: gpu_buckets)."),
    _ts("built_ts", "When the set was first built", nullable=False),
    comment="The threshold set judged_hours holds, and from which hour on.",
)

store_meta = Table(
    "store_meta", metadata,
    Column("key", String(64), primary_key=True, comment="Setting, e.g. bucket_seconds or rolled_up_before; "
           "parents_deleted: a fresh token at each delete of an allocated GPU or reservation (auditor.store.cascade)."),
    Column("value", String(255), nullable=False, comment="Its value."),
    comment="Facts about the stored data: the bucket width it was collected at, how far it is rolled up.",
)

watermarks = Table(
    "watermarks", metadata,
    Column("cluster", String(128), primary_key=True, comment="Cluster name."),
    Column("source", String(255), primary_key=True, comment="Source key, e.g. telemetry[0]:prometheus."),
    _ts("watermark_ts", "Collected completely up to here", nullable=False),
    _ts("updated_ts", "When the watermark last moved"),
    comment="Incremental collection progress per cluster and source.",
)

node_events = Table(
    "node_events", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True, comment="Surrogate key."),
    Column("cluster", String(128), nullable=False, comment="Cluster name."),
    Column("node", Text, nullable=False, comment="Node name as the scheduler or telemetry names it."),
    Column("gpu_index", Integer, nullable=False, comment="GPU index the event is about; -1 = the whole node."),
    Column("kind", String(16), nullable=False, comment="xid, throttle, ecc_dbe, row_remap (GPU faults from "
           "telemetry), drain, down (Slurm), not_ready, cordoned (Kubernetes)."),
    _ts("start_ts", "Start of the interval", nullable=False),
    _ts("end_ts", "End of the interval; NULL while ongoing"),
    Column("reason", Text, nullable=False, default="", comment="Why: the scheduler's reason (Slurm drain "
           "reason, Kubernetes condition message) or the fault (e.g. XID 79)."),
    Column("source", String(32), nullable=False, default="", comment="sacctmgr, sinfo, kubernetes, dcgm, ..."),
    _ts("first_seen_ts", "First collection that reported it"),
    _ts("last_seen_ts", "Latest collection that reported it"),
    UniqueConstraint("cluster", "node", "gpu_index", "kind", "start_ts"),
    comment="Infrastructure events: intervals when a node or GPU was faulty or taken out of service. Reserved "
            "time inside one is infrastructure-affected (infra_s), never idle.",
)

quarantined_records = Table(
    "quarantined_records", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True, comment="Surrogate key."),
    _ts("collected_ts", "When the record was rejected", nullable=False),
    Column("cluster", String(128), nullable=False, comment="Cluster name."),
    Column("source", Text, nullable=False, comment="File, command or URL the record came from."),
    Column("location", Text, nullable=False, comment="Line, item or series within the source."),
    Column("reason", Text, nullable=False, comment="What was wrong."),
    Column("excerpt", Text, comment="Start of the bad record (at most 200 characters)."),
    comment="Input records skipped as malformed, kept so someone can fix the exporter or scheduler.",
)

audit_runs = Table(
    "audit_runs", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True, comment="Run id."),
    _ts("started_ts", "Run start", nullable=False),
    _ts("finished_ts", "Run end; NULL while running or if it died"),
    _ts("since_ts", "Audit window start", nullable=False),
    _ts("until_ts", "Audit window end (exclusive)", nullable=False),
    Column("status", String(16), nullable=False, comment="running, ok or failed."),
    Column("what_if", Boolean, nullable=False, default=False, comment="A what-if re-judgement, not the "
           "official audit."),
    Column("thresholds", JSON, comment="Thresholds used, a JSON object."),
    Column("summary", JSON, comment="Headline numbers, a JSON object."),
    comment="Each audit over a window.",
)


#: The audit's output tables have no per-row foreign keys on PostgreSQL (migration 0011_audit_output_fks)
_NO_PG_FK = (" (a foreign key on SQLite; none on PostgreSQL: the audit takes the id from that table, and "
             "auditor.store.cascade deletes these rows with their parent).")


def _hours_columns() -> list[Column]:
    """The HOURS sums of usage_gpu and usage_allocation; the ones a migration added keep its server default."""
    return [Column(name, Float, nullable=False, default=0.0, comment=text,
                   **({"server_default": "0"} if name in _HOURS_ADDED else {})) for name, text in _HOURS.items()]


usage_gpu = Table(
    "usage_gpu", metadata,
    Column("run_id", Integer, ForeignKey("audit_runs.id", ondelete="CASCADE"), primary_key=True,
           comment="audit_runs.id" + _NO_PG_FK),
    Column("allocated_gpu_id", Integer, ForeignKey("allocated_gpus.id", ondelete="CASCADE"),
           primary_key=True, comment="allocated_gpus.id" + _NO_PG_FK),
    Column("allocation_id", Integer, nullable=False, comment="allocations.id."),
    Column("attribution", String(16), nullable=False,
           comment="index (node+GPU from the scheduler), uuid (the GPU's UUID from the scheduler, e.g. a DRA "
           "device), label (telemetry labels), node (whole node) or unattributed."),
    Column("gpu_index", Integer, comment="GPU index used for the join (attributed)."),
    Column("gpu_id", Integer, comment="telemetry_gpus.id the GPU was attributed to; NULL if unattributed."),
    Column("signal", String(16), comment="The strongest evidence tier that judged it: sm_active (verified), "
           "counters (the stock GR engine, Tensor and DRAM counters), gpu_util (low confidence) or none."),
    *_hours_columns(),
    Column("peak_fb_mib", Float, comment="Peak frame buffer used, MiB."),
    Column("idle_peak_fb_mib", Float, comment="Peak frame buffer held in idle or mirage buckets, MiB (a live "
           "process holding the GPU while idle)."),
    *[Column(name, Float, nullable=False, default=0.0, server_default="0", comment=text)
      for name, text in _STARVED.items()],
    *[Column(name, Float, nullable=False, default=0.0, server_default="0", comment=text)
      for name, text in GPU_ONLY.items()],
    Index(None, "run_id", "allocation_id"),
    comment="Per allocated GPU and audit run: how its reserved time was judged.",
)

usage_allocation = Table(
    "usage_allocation", metadata,
    Column("run_id", Integer, ForeignKey("audit_runs.id", ondelete="CASCADE"), primary_key=True,
           comment="audit_runs.id" + _NO_PG_FK),
    Column("allocation_id", Integer, ForeignKey("allocations.id", ondelete="CASCADE"), primary_key=True,
           comment="allocations.id" + _NO_PG_FK),
    Column("team", Text, nullable=False, default="", comment="Team from the mapping."),
    Column("gpu_model", Text, comment="GPU model (first GPU)."),
    Column("price_per_gpu_hour", Float, nullable=False, default=0.0, comment="Price card rate applied."),
    *_hours_columns(),
    Column("peak_fb_mib", Float, comment="Peak frame buffer used on any of its GPUs, MiB."),
    Column("idle_peak_fb_mib", Float, comment="Peak frame buffer held on any of its GPUs while idle or mirage, "
           "MiB."),
    *[Column(name, Float, nullable=False, default=0.0, server_default="0", comment=text)
      for name, text in _STARVED.items()],
    Column("gpus", Integer, nullable=False, default=0, comment="Allocated GPU rows."),
    Column("reserved_cost", Float, nullable=False, default=0.0, comment="Reserved GPU-hours x price."),
    Column("idle_cost", Float, nullable=False, default=0.0, comment="(idle + mirage) GPU-hours x price."),
    comment="Per allocation and audit run: totals over its GPUs, and what they cost.",
)

findings = Table(
    "findings", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True, comment="Finding id."),
    Column("run_id", Integer, ForeignKey("audit_runs.id", ondelete="CASCADE"), nullable=False,
           comment="audit_runs.id" + _NO_PG_FK),
    Column("kind", String(32), nullable=False, comment="A finding kind of the registry (auditor/audit/"
           "kinds.py; docs/definitions.md, Finding kinds). idle_quota has no allocation: account = the quota's "
           "account, evidence.quota."),
    Column("cluster", String(128), nullable=False, comment="Cluster name."),
    Column("allocation_id", Integer, ForeignKey("allocations.id", ondelete="CASCADE"),
           comment="allocations.id, when about an allocation" + _NO_PG_FK),
    Column("reservation_id", Integer, ForeignKey("reservations.id", ondelete="CASCADE"),
           comment="reservations.id, when about a reservation" + _NO_PG_FK),
    Column("account", Text, nullable=False, default="", comment="Account or namespace."),
    Column("user_name", Text, nullable=False, default="", comment="User."),
    Column("team", Text, nullable=False, default="", comment="Team."),
    _ts("start_ts", "Evidence window start"),
    _ts("end_ts", "Evidence window end"),
    Column("gpu_hours", Float, nullable=False, default=0.0, comment="GPU-hours the finding is about."),
    Column("idle_gpu_hours", Float, nullable=False, default=0.0, comment="Idle (+mirage) GPU-hours."),
    Column("cost", Float, nullable=False, default=0.0, comment="Cost of the idle GPU-hours."),
    Column("evidence", JSON, comment="Metrics, window, coverage and a sparkline (the thresholds are the run's: "
                                     "audit_runs.thresholds)."),
    Index(None, "run_id", "kind"),
    comment="What the audit flagged, each with its evidence.",
)

# the audit output tables' foreign keys are SQLite's only (_NO_PG_FK): a store created from the models on
# PostgreSQL has none either
for _t in (usage_gpu, usage_allocation, findings):
    for _fk in _t.foreign_key_constraints:
        _fk.ddl_if(dialect="sqlite")

notifications = Table(
    "notifications", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True, comment="Surrogate key."),
    Column("recipient", Text, nullable=False, comment="Email address."),
    Column("kind", String(32), nullable=False, comment="admin_report, team_nudge or user_nudge."),
    Column("allocation_id", Integer, comment="allocations.id the nudge was about, if any."),
    _ts("sent_ts", "When sent (or written as .eml in dry-run)", nullable=False),
    Column("dry_run", Boolean, nullable=False, default=False, comment="Written to a file, not sent."),
    Column("message_id", String(255), comment="Message-ID header."),
    Column("period_key", String(64), comment="Report period the message belongs to (e.g. 2026-W48), so a "
           "restarted daemon does not send the same weekly report twice."),
    Index(None, "recipient", "sent_ts"),
    comment="Emails sent, for throttling nudges.",
)

locks = Table(
    "locks", metadata,
    Column("name", String(128), primary_key=True, comment="Lock name, e.g. weekly-report."),
    Column("holder", String(255), nullable=False, comment="host:pid of the holder."),
    _ts("acquired_ts", "When taken", nullable=False),
    _ts("expires_ts", "When it lapses if the holder dies", nullable=False),
    comment="Leases that keep two daemons on one store from running the same job (e.g. sending the "
            "weekly email twice).",
)

# --- enforcement (docs/enforcement.md): exemptions asked for by people, and the audit log of decisions -------

exemptions = Table(
    "exemptions", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True, comment="Surrogate key."),
    Column("cluster", String(128), nullable=False, comment="Cluster name."),
    Column("external_id", Text, nullable=False, comment="Scheduler id of the exempt allocation "
           "(Slurm job id, or Kubernetes pod UID / namespace/name as given to `gpu-audit exempt`)."),
    _ts("until_ts", "Exempt until this time", nullable=False),
    Column("reason", Text, nullable=False, comment="Why (the justification given)."),
    Column("requested_by", Text, nullable=False, comment="Who asked: --by as given (free text), else the actor."),
    Column("actor", Text, comment="Who ran `gpu-audit exempt` (login@host of the process, not typed); NULL for "
           "exemptions recorded before this column."),
    _ts("created_ts", "When recorded", nullable=False),
    _ts("revoked_ts", "When revoked early; NULL while it stands"),
    Index(None, "cluster", "external_id"),
    comment="Exemptions from enforcement for single allocations (`gpu-audit exempt CLUSTER:ID`).",
)

enforcement_log = Table(
    "enforcement_log", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True, comment="Surrogate key."),
    Column("run_key", String(64), nullable=False, comment="The enforcement run that decided (one id per run)."),
    _ts("decided_ts", "When decided", nullable=False),
    Column("cluster", String(128), nullable=False, comment="Cluster name."),
    Column("allocation_id", Integer, comment="allocations.id, when about an allocation."),
    Column("reservation_id", Integer, comment="reservations.id, when about a reservation."),
    Column("target", Text, nullable=False, comment="What was (or would have been) acted on, e.g. "
           "`slurm job 1234` or `Deployment research/notebook-alice`."),
    Column("policy", String(128), nullable=False, default="", comment="Name of the policy that applied."),
    Column("stage", String(16), nullable=False, comment="warn, escalate, act or notify (reservations)."),
    Column("action", String(32), nullable=False, comment="cancel, requeue, scale_to_zero, suspend_job, "
           "delete_job, delete_pod, warn, escalate, notify_owners or none."),
    Column("decision", String(16), nullable=False, comment="done (acted/sent), dry_run (would have), "
           "skipped (decided not to act, see reason) or failed."),
    Column("reason", Text, nullable=False, comment="Why this decision (the rule, or what blocked it)."),
    Column("actor", Text, nullable=False, comment="Who ran the enforcement (user@host)."),
    Column("dry_run", Boolean, nullable=False, default=True, comment="Decided without --apply."),
    Column("evidence", JSON, comment="Numbers behind the decision: window, idle/unknown/busy_unverified "
           "hours, coverage, thresholds."),
    Column("result", Text, comment="What the scheduler answered (one line), or the error."),
    Index(None, "decided_ts"),
    Index(None, "allocation_id"),
    comment="Audit log of enforcement: every action and every decision not to act, with evidence.",
)

# the queue side's tables (after the rest, so docs/schema.md lists them last)
# and the inference side's table (issue 36), the host side's (node_exporter, issue 36) and the Kubernetes Jobs
# the goodput rules read (issue 36)
from auditor.store.inference import inference_buckets  # noqa: E402, I001
from auditor.store.kube_jobs import kube_jobs  # noqa: E402
from auditor.store.node import ib_port_buckets, node_buckets  # noqa: E402
from auditor.store.queue import gpu_quotas, gpu_waits  # noqa: E402

__all__ = ["gpu_quotas", "gpu_waits", "ib_port_buckets", "inference_buckets", "kube_jobs", "metadata",
           "node_buckets"]
