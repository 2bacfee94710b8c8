"""allocations.failure_reason and allocations.job_uid (issue 45): the Kubernetes connector puts why a Failed pod
failed and the uid of the Job that owns it on the record, so the goodput rules read two columns instead of
parsing the pod labels (where gpu-audit kept the failure reason under gpu-audit.io/failure-reason). Rows stored
before take them from their labels (the failure-reason label is removed from the labels: it was ours).

Revision ID: 0039_pod_failure
Revises: 0038_prompt_cache
Create Date: 2026-12-05
"""
import sqlalchemy as sa
from alembic import op

revision = "0039_pod_failure"
down_revision = "0038_prompt_cache"
branch_labels = None
depends_on = None

FAILURE_REASON = ("Kubernetes: why a Failed pod failed, in the API's words (its DisruptionTarget condition's "
                  "reason, else status.reason, else a container's, e.g. OOMKilled); NULL when it did not "
                  "fail, nothing says, or the source is not Kubernetes.")
JOB_UID = ("Kubernetes: the uid of the Job that owns the pod (its label batch.kubernetes.io/controller-uid "
           "or controller-uid, kube_jobs.uid); NULL for a pod of no Job and other sources.")
FAILURE_LABEL = "gpu-audit.io/failure-reason"


def upgrade() -> None:
    with op.batch_alter_table("allocations", schema=None) as batch_op:
        batch_op.add_column(sa.Column("failure_reason", sa.Text(), nullable=True, comment=FAILURE_REASON))
        batch_op.add_column(sa.Column("job_uid", sa.String(64), nullable=True, comment=JOB_UID))
    if op.get_bind().dialect.name == "postgresql":
        def get(key: str) -> str:
            return f"NULLIF(labels->>'{key}', '')"
        drop = f"(labels::jsonb - '{FAILURE_LABEL}')::json"
    else:
        def get(key: str) -> str:
            return f"NULLIF(json_extract(labels, '$.\"{key}\"'), '')"
        drop = f"json_remove(labels, '$.\"{FAILURE_LABEL}\"')"
    op.execute(f"UPDATE allocations SET failure_reason = {get(FAILURE_LABEL)}, "
               f"job_uid = COALESCE({get('batch.kubernetes.io/controller-uid')}, {get('controller-uid')}) "
               "WHERE source = 'kubernetes' AND labels IS NOT NULL")
    op.execute(f"UPDATE allocations SET labels = {drop} WHERE failure_reason IS NOT NULL")


def downgrade() -> None:
    with op.batch_alter_table("allocations", schema=None) as batch_op:
        batch_op.drop_column("job_uid")
        batch_op.drop_column("failure_reason")
