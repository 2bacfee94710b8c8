"""faults: user-controlled text columns become TEXT (no 255-character limit PostgreSQL enforces and SQLite
does not), so one long user, account, label or host name is stored the same on both engines

Revision ID: 0006_faults
Revises: 0005_verdict
Create Date: 2026-11-30
"""
import sqlalchemy as sa
from alembic import op

revision = "0006_faults"
down_revision = "0005_verdict"
branch_labels = None
depends_on = None

#: table -> [(column, former VARCHAR length, nullable)]
COLUMNS: dict[str, list[tuple[str, int, bool]]] = {
    "allocations": [("external_id", 255, False), ("user_name", 255, False), ("account", 255, False),
                    ("partition", 255, False), ("qos", 255, False), ("state", 64, False),
                    ("reservation", 255, False), ("owner_workload", 512, False)],
    "allocated_gpus": [("node", 255, False), ("uuid", 128, True), ("model", 128, True), ("mig_profile", 64, True)],
    "reservations": [("name", 255, False)],
    "gpu_inventory": [("host", 255, False), ("model", 128, True), ("uuid", 128, True), ("mig_layout", 255, False)],
    "telemetry_gpus": [("host", 255, False), ("gpu_instance", 32, False), ("uuid", 128, True),
                       ("model", 128, True)],
    "gpu_buckets": [("hpc_job", 255, True), ("pod", 255, True), ("namespace", 255, True), ("container", 255, True)],
    "quarantined_records": [("source", 255, False), ("location", 255, False)],
    "usage_allocation": [("team", 255, False), ("gpu_model", 128, True)],
    "findings": [("account", 255, False), ("user_name", 255, False), ("team", 255, False)],
    "notifications": [("recipient", 320, False)],
    "exemptions": [("external_id", 255, False), ("requested_by", 255, False)],
    "enforcement_log": [("target", 512, False), ("actor", 255, False)],
}


def upgrade() -> None:
    for table, cols in COLUMNS.items():
        with op.batch_alter_table(table, schema=None) as batch_op:
            for name, length, nullable in cols:
                batch_op.alter_column(name, existing_type=sa.String(length), type_=sa.Text(),
                                      existing_nullable=nullable)


def downgrade() -> None:
    """Back to VARCHAR(n): fails on PostgreSQL if a longer value was stored since (nothing is cut)."""
    for table, cols in COLUMNS.items():
        with op.batch_alter_table(table, schema=None) as batch_op:
            for name, length, nullable in cols:
                batch_op.alter_column(name, existing_type=sa.Text(), type_=sa.String(length),
                                      existing_nullable=nullable)
