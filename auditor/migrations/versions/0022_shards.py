"""store_shards: the shards of a PostgreSQL sharded store (`gpu-audit db shard`, docs/scale-out.md). The table
only lists them; `db shard` itself turns the per-GPU tables into foreign partitions. Empty on one server and
on SQLite.

Revision ID: 0022_shards
Revises: 0021_results_cost
Create Date: 2026-12-04
"""
import sqlalchemy as sa
from alembic import op

revision = "0022_shards"
down_revision = "0021_results_cost"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "store_shards",
        sa.Column("shard", sa.Integer(), autoincrement=False, nullable=False,
                  comment="Shard number, 1..n: hash partition (MODULUS n, REMAINDER shard - 1) of gpu_id."),
        sa.Column("server", sa.String(length=63), nullable=False,
                  comment="postgres_fdw foreign server of the shard (gpu_audit_shard<n>_<store id>), with its user "
                  "mapping."),
        sa.Column("location", sa.String(length=255), nullable=False,
                  comment="host:port/database and schema of the shard, as printed (never a password)."),
        sa.Column("schema_name", sa.String(length=63), nullable=False,
                  comment="Schema of the shard's tables on its server."),
        sa.Column("added_ts", sa.Integer(), nullable=False,
                  comment="When `gpu-audit db shard` set the shard up (UTC epoch seconds)"),
        sa.PrimaryKeyConstraint("shard", name=op.f("pk_store_shards")),
        comment="PostgreSQL sharded store (`gpu-audit db shard`, docs/scale-out.md): the shards that hold the "
                "per-GPU tables (gpu_buckets, judged_hours, judged_dirty) as foreign partitions; empty on a single "
                "server.",
    )


def downgrade() -> None:
    op.drop_table("store_shards")
