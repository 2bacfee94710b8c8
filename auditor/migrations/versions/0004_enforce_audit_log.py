"""enforcement: exemptions and the enforcement audit log

Revision ID: 0004_enforce
Revises: 0003_ledger
Create Date: 2026-11-30
"""
import sqlalchemy as sa
from alembic import op

revision = "0004_enforce"
down_revision = "0003_ledger"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "exemptions",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False, comment="Surrogate key."),
        sa.Column("cluster", sa.String(length=128), nullable=False, comment="Cluster name."),
        sa.Column("external_id", sa.String(length=255), nullable=False,
                  comment="Scheduler id of the exempt allocation (Slurm job id, or Kubernetes pod UID / "
                  "namespace/name as given to `gpu-audit exempt`)."),
        sa.Column("until_ts", sa.Integer(), nullable=False, comment="Exempt until this time (UTC epoch seconds)"),
        sa.Column("reason", sa.Text(), nullable=False, comment="Why (the justification given)."),
        sa.Column("requested_by", sa.String(length=255), nullable=False,
                  comment="Who asked (login of whoever ran `gpu-audit exempt`, or --by)."),
        sa.Column("created_ts", sa.Integer(), nullable=False, comment="When recorded (UTC epoch seconds)"),
        sa.Column("revoked_ts", sa.Integer(), nullable=True,
                  comment="When revoked early; NULL while it stands (UTC epoch seconds)"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_exemptions")),
        comment="Exemptions from enforcement for single allocations (`gpu-audit exempt CLUSTER:ID`).",
    )
    with op.batch_alter_table("exemptions", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_exemptions_cluster_external_id"), ["cluster", "external_id"],
                              unique=False)
    op.create_table(
        "enforcement_log",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False, comment="Surrogate key."),
        sa.Column("run_key", sa.String(length=64), nullable=False,
                  comment="The enforcement run that decided (one id per run)."),
        sa.Column("decided_ts", sa.Integer(), nullable=False, comment="When decided (UTC epoch seconds)"),
        sa.Column("cluster", sa.String(length=128), nullable=False, comment="Cluster name."),
        sa.Column("allocation_id", sa.Integer(), nullable=True, comment="allocations.id, when about an allocation."),
        sa.Column("reservation_id", sa.Integer(), nullable=True,
                  comment="reservations.id, when about a reservation."),
        sa.Column("target", sa.String(length=512), nullable=False,
                  comment="What was (or would have been) acted on, e.g. `slurm job 1234` or `Deployment "
                  "research/notebook-alice`."),
        sa.Column("policy", sa.String(length=128), nullable=False, comment="Name of the policy that applied."),
        sa.Column("stage", sa.String(length=16), nullable=False,
                  comment="warn, escalate, act or notify (reservations)."),
        sa.Column("action", sa.String(length=32), nullable=False,
                  comment="cancel, requeue, scale_to_zero, suspend_job, delete_job, delete_pod, warn, escalate, "
                  "notify_owners or none."),
        sa.Column("decision", sa.String(length=16), nullable=False,
                  comment="done (acted/sent), dry_run (would have), skipped (decided not to act, see reason) "
                  "or failed."),
        sa.Column("reason", sa.Text(), nullable=False, comment="Why this decision (the rule, or what blocked it)."),
        sa.Column("actor", sa.String(length=255), nullable=False, comment="Who ran the enforcement (user@host)."),
        sa.Column("dry_run", sa.Boolean(), nullable=False, comment="Decided without --apply."),
        sa.Column("evidence", sa.JSON(), nullable=True,
                  comment="Numbers behind the decision: window, idle/unknown/busy_unverified hours, coverage, "
                  "thresholds."),
        sa.Column("result", sa.Text(), nullable=True,
                  comment="What the scheduler answered (one line), or the error."),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_enforcement_log")),
        comment="Audit log of enforcement: every action and every decision not to act, with evidence.",
    )
    with op.batch_alter_table("enforcement_log", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_enforcement_log_decided_ts"), ["decided_ts"], unique=False)
        batch_op.create_index(batch_op.f("ix_enforcement_log_allocation_id"), ["allocation_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("enforcement_log", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_enforcement_log_allocation_id"))
        batch_op.drop_index(batch_op.f("ix_enforcement_log_decided_ts"))
    op.drop_table("enforcement_log")
    with op.batch_alter_table("exemptions", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_exemptions_cluster_external_id"))
    op.drop_table("exemptions")
