"""What each useful result costs (issue 36): inference buckets rolled up by `gpu-audit db prune` (the seconds and
the span of the buckets an hourly row was made of), SGLang and Triton as inference engines (column comments),
and kube_jobs, the Kubernetes Jobs with GPU pods whose failed pods the goodput rules count as restarts.

Revision ID: 0021_results_cost
Revises: 0019_host_telemetry
Create Date: 2026-12-03
"""
import sqlalchemy as sa
from alembic import op

revision = "0021_results_cost"
down_revision = "0019_host_telemetry"
branch_labels = None
depends_on = None

#: inference_buckets columns whose comment changes: name -> (type, nullable, old comment, new comment)
COMMENTS = {
    "engine": (sa.String(length=16), False, "Inference server: vllm or tgi.",
               "Inference server: vllm, tgi, sglang or triton."),
    "seconds": (sa.Integer(), False, "Bucket length, seconds.",
                "Bucket length, seconds (3600: an hour rolled up by `gpu-audit db prune`)."),
    "model": (sa.Text(), False, "Model served, where the engine labels it (vLLM model_name).",
              "Model served, where the engine labels it (model_name; Triton: model)."),
    "running_mean": (sa.Float(), True, "Mean requests running (the concurrency; TGI: the batch size).",
                     "Mean requests running (the concurrency; TGI: the batch size; Triton: TensorRT-LLM's active "
                     "requests)."),
    "batch_mean": (sa.Float(), True, "Mean batch size where the engine reports one (TGI).",
                   "Mean batch size where the engine reports one (TGI; Triton: TensorRT-LLM's scheduled "
                   "requests)."),
}


def upgrade() -> None:
    with op.batch_alter_table("inference_buckets", schema=None) as batch_op:
        batch_op.add_column(sa.Column("observed_s", sa.Float(), nullable=True,
                                      comment="Rolled-up hour: the seconds of the buckets it was made of; NULL for a "
                                      "bucket as collected (= seconds)."))
        batch_op.add_column(sa.Column("span_start", sa.Integer(), nullable=True,
                                      comment="Rolled-up hour: the start of the first bucket it was made of; NULL "
                                      "for a bucket as collected (UTC epoch seconds)"))
        batch_op.add_column(sa.Column("span_end", sa.Integer(), nullable=True,
                                      comment="Rolled-up hour: the end of the last bucket it was made of; NULL for "
                                      "a bucket as collected (UTC epoch seconds)"))
        for name, (type_, nullable, old, new) in COMMENTS.items():
            batch_op.alter_column(name, existing_type=type_, existing_nullable=nullable, comment=new,
                                  existing_comment=old)
    op.create_table(
        "kube_jobs",
        sa.Column("cluster", sa.String(length=128), nullable=False, comment="Cluster name."),
        sa.Column("uid", sa.String(length=64), nullable=False,
                  comment="The Job's metadata.uid (its pods' label controller-uid, or "
                  "batch.kubernetes.io/controller-uid)."),
        sa.Column("namespace", sa.Text(), nullable=False, comment="Namespace."),
        sa.Column("name", sa.Text(), nullable=False, comment="Job name (user-controlled text)."),
        sa.Column("backoff_limit", sa.Integer(), nullable=True,
                  comment="spec.backoffLimit: failed pods retried before the Job fails; NULL when not said."),
        sa.Column("failed", sa.Integer(), nullable=False,
                  comment="Pods that failed: status.failed plus the failed pods not yet counted "
                  "(status.uncountedTerminatedPods.failed); the most any sighting said."),
        sa.Column("succeeded", sa.Integer(), nullable=False, comment="Pods that succeeded (status.succeeded)."),
        sa.Column("active", sa.Integer(), nullable=False,
                  comment="Pods running or pending at the last sighting (status.active)."),
        sa.Column("state", sa.String(length=16), nullable=False,
                  comment="Running, Complete, Failed or Suspended (the Job's conditions at the last sighting)."),
        sa.Column("reason", sa.Text(), nullable=False,
                  comment="Why it failed, the Failed condition's reason (e.g. BackoffLimitExceeded, "
                  "DeadlineExceeded); '' otherwise."),
        sa.Column("start_ts", sa.Integer(), nullable=True, comment="status.startTime (UTC epoch seconds)"),
        sa.Column("end_ts", sa.Integer(), nullable=True,
                  comment="status.completionTime, or when the Failed condition was set; NULL while it runs "
                  "(UTC epoch seconds)"),
        sa.Column("first_seen_ts", sa.Integer(), nullable=True,
                  comment="First collection that listed it (UTC epoch seconds)"),
        sa.Column("last_seen_ts", sa.Integer(), nullable=True,
                  comment="Latest collection that listed it (UTC epoch seconds)"),
        sa.PrimaryKeyConstraint("cluster", "uid", name=op.f("pk_kube_jobs")),
        comment="Kubernetes Jobs with GPU pods: failed, succeeded and active pods, backoff limit and outcome.",
    )


def downgrade() -> None:
    op.drop_table("kube_jobs")
    with op.batch_alter_table("inference_buckets", schema=None) as batch_op:
        for name, (type_, nullable, old, new) in COMMENTS.items():
            batch_op.alter_column(name, existing_type=type_, existing_nullable=nullable, comment=old,
                                  existing_comment=new)
        batch_op.drop_column("span_end")
        batch_op.drop_column("span_start")
        batch_op.drop_column("observed_s")
