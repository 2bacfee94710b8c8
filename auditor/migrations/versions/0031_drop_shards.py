"""Drop store_shards: the postgres_fdw sharded store (`gpu-audit db shard`) is retired; past one server the
store is partitioned by cluster, shared-nothing, and read together from the Parquet fleet export
(docs/scale-out.md). A store that was sharded (rows in store_shards) is refused: its per-GPU tables are foreign
partitions on other servers, which this migration cannot bring back.

Revision ID: 0031_drop_shards
Revises: 0023_judged_classes
Create Date: 2026-12-05
"""
import sqlalchemy as sa
from alembic import op

from auditor.errors import StoreError

revision = "0031_drop_shards"
down_revision = "0023_judged_classes"
branch_labels = None
depends_on = None


def upgrade() -> None:
    conn = op.get_bind()
    if conn.execute(sa.text("SELECT COUNT(*) FROM store_shards")).scalar():
        raise StoreError("this store is sharded over postgres_fdw (`gpu-audit db shard`), which this version no "
                           "longer supports: keep the previous version for it, or export it "
                           "(`gpu-audit export`) and start one store per cluster (docs/scale-out.md)")
    op.drop_table("store_shards")


def downgrade() -> None:
    op.create_table(
        "store_shards",
        sa.Column("shard", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("server", sa.String(length=63), nullable=False),
        sa.Column("location", sa.String(length=255), nullable=False),
        sa.Column("schema_name", sa.String(length=63), nullable=False),
        sa.Column("added_ts", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("shard", name=op.f("pk_store_shards")),
    )
