"""PostgreSQL: no per-row foreign keys on the audit's output tables (usage_gpu, usage_allocation, findings).

An audit writes hundreds of thousands of rows into these tables, each of which its per-row foreign-key
triggers checked against audit_runs, allocations, allocated_gpus and reservations: 2.7 of the 3.2 s it took
to write the 259,530 usage_allocation rows of the 16,384-GPU bench week (docs/performance.md). The audit
takes every id it writes from those tables in its own statements, so the checks could never fail; what the
foreign keys still did is ON DELETE CASCADE, and the code that deletes those parents now deletes the
dependants itself (:mod:`auditor.store.cascade`, which also writes ``store_meta.parents_deleted``). SQLite
keeps its foreign keys (its checks are cheap and it has one writer).

Downgrade deletes the rows that refer to nothing (what the cascade would have deleted) and adds the keys back.

Revision ID: 0011_audit_output_fks
Revises: 0010_partitions
Create Date: 2026-11-30
"""
from alembic import op

revision = "0011_audit_output_fks"
down_revision = "0010_partitions"
branch_labels = None
depends_on = None

#: (table, column, parent table) of each dropped key; the names are the naming convention's (0001)
KEYS = [("usage_gpu", "run_id", "audit_runs"), ("usage_gpu", "allocated_gpu_id", "allocated_gpus"),
        ("usage_allocation", "run_id", "audit_runs"), ("usage_allocation", "allocation_id", "allocations"),
        ("findings", "run_id", "audit_runs"), ("findings", "allocation_id", "allocations"),
        ("findings", "reservation_id", "reservations")]
NEW_COMMENT = (" (a foreign key on SQLite; none on PostgreSQL: the audit takes the id from that table, and "
               "auditor.store.cascade deletes these rows with their parent).")


def _name(table: str, column: str, parent: str) -> str:
    return f"fk_{table}_{column}_{parent}"


def _comment(table: str, column: str, text: str) -> None:
    op.execute(f"COMMENT ON COLUMN {table}.{column} IS '" + text.replace("'", "''") + "'")


def _old_comment(table: str, column: str, parent: str) -> str:
    if table == "findings" and column != "run_id":
        return f"{parent}.id, when about {'an allocation' if parent == 'allocations' else 'a reservation'}."
    return f"{parent}.id."


META_KEY = "Setting, e.g. bucket_seconds or rolled_up_before."
NEW_META_KEY = ("Setting, e.g. bucket_seconds or rolled_up_before; parents_deleted: a fresh token at each delete of an "
                "allocated GPU or reservation (auditor.store.cascade).")


def upgrade() -> None:
    if op.get_context().dialect.name != "postgresql":
        return
    for table, column, parent in KEYS:
        op.execute(f"ALTER TABLE {table} DROP CONSTRAINT IF EXISTS {_name(table, column, parent)}")
        _comment(table, column, _old_comment(table, column, parent).rstrip(".") + NEW_COMMENT)
    _comment("store_meta", "key", NEW_META_KEY)


def downgrade() -> None:
    if op.get_context().dialect.name != "postgresql":
        return
    for table, column, parent in KEYS:
        op.execute(f"DELETE FROM {table} t WHERE t.{column} IS NOT NULL AND NOT EXISTS "
                   f"(SELECT 1 FROM {parent} p WHERE p.id = t.{column})")
        op.execute(f"ALTER TABLE {table} ADD CONSTRAINT {_name(table, column, parent)} FOREIGN KEY ({column}) "
                   f"REFERENCES {parent} (id) ON DELETE CASCADE")
        _comment(table, column, _old_comment(table, column, parent))
    _comment("store_meta", "key", META_KEY)
