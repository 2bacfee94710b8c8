"""A new store is created from the models (auditor/store/schema.py: ``metadata.create_all``) and stamped at
the head revision in one transaction; the migrations only upgrade existing stores (issue 46: no fixed cost
per run). A store created that way must be the store the migrations build, table by table: columns (type,
nullable, server default, comment), keys, foreign keys, indexes, unique and check constraints, table
comments, PostgreSQL's partitioning and the catalog's own definitions, on SQLite and PostgreSQL.

Not compared: column order (a migration appends a column, the model puts it where it reads; every statement
names its columns) and, on SQLite only, constraint names (SQLite cannot rename a constraint, and nothing
refers to one by name there; 0005 left gpu_buckets' as pk_gpu_buckets_v3)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from alembic.script import ScriptDirectory
from conftest import pg_schema
from sqlalchemy import event, inspect, text

from auditor.store import schema
from auditor.store.engine import Store, head_revision


def snapshot(store: Store) -> dict[str, Any]:
    """The reflected schema of ``store``, normalised as the module docstring says."""
    pg = store.dialect == "postgresql"
    out: dict[str, Any] = {}
    with store.engine.connect() as conn:
        i = inspect(conn)
        name = (lambda d: d.get("name")) if pg else (lambda d: None)
        for t in sorted(i.get_table_names()):
            out[t] = {
                "columns": sorted((c["name"], str(c["type"]), c["nullable"], str(c.get("default")),
                                   c.get("comment")) for c in i.get_columns(t)),
                "pk": (name(i.get_pk_constraint(t)), i.get_pk_constraint(t)["constrained_columns"]),
                "fks": sorted((name(f), f["constrained_columns"], f["referred_table"], f["referred_columns"],
                               sorted(f.get("options", {}).items())) for f in i.get_foreign_keys(t)),
                "indexes": sorted((x["name"], x["column_names"], x["unique"]) for x in i.get_indexes(t)),
                "unique": sorted((name(u), u["column_names"]) for u in i.get_unique_constraints(t)),
                "checks": sorted((name(c), c["sqltext"]) for c in i.get_check_constraints(t)),
                "comment": i.get_table_comment(t)["text"] if pg else None,
                "rows": conn.execute(text(f'SELECT count(*) FROM "{t}"')).scalar(),
            }
        if pg:  # what reflection does not show: partitioning, every constraint's and index's definition
            out["_pg_partitioned"] = sorted(conn.execute(text(
                "SELECT c.relname, pg_get_partkeydef(c.oid) FROM pg_class c WHERE c.relkind = 'p' AND "
                "c.relnamespace = current_schema()::regnamespace")).all())
            out["_pg_constraints"] = sorted(conn.execute(text(
                "SELECT r.relname, x.conname, pg_get_constraintdef(x.oid) FROM pg_constraint x JOIN pg_class r "
                "ON r.oid = x.conrelid WHERE x.connamespace = current_schema()::regnamespace")).all())
            out["_pg_indexes"] = sorted(conn.execute(text(
                "SELECT tablename, indexname, replace(indexdef, current_schema() || '.', '') FROM pg_indexes "
                "WHERE schemaname = current_schema()")).all())
            out["_pg_sequences"] = sorted(r[0] for r in conn.execute(text(
                "SELECT sequencename FROM pg_sequences WHERE schemaname = current_schema()")))
        else:  # WITHOUT ROWID is a table's own option, not reflected
            out["_sqlite_without_rowid"] = sorted(r[0] for r in conn.execute(text(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND sql LIKE '%WITHOUT ROWID%'")))
        out["_version"] = conn.execute(text("SELECT version_num FROM alembic_version")).scalar()
    return out


def _differences(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    return [f"{t}.{k}: created {a.get(t, {}).get(k) if isinstance(a.get(t), dict) else a.get(t)!r} / "
            f"migrated {b.get(t, {}).get(k) if isinstance(b.get(t), dict) else b.get(t)!r}"
            for t in sorted(set(a) | set(b))
            for k in (sorted(set(a.get(t) or {}) | set(b.get(t) or {})) if isinstance(a.get(t) or b.get(t), dict)
                      else [""])
            if (a.get(t, {}).get(k) if isinstance(a.get(t), dict) else a.get(t))
            != (b.get(t, {}).get(k) if isinstance(b.get(t), dict) else b.get(t))]


@pytest.fixture
def second_url(store_url: str, tmp_path: Path) -> Any:
    """A second empty store on the same engine as ``store_url``."""
    if store_url.startswith("sqlite"):
        yield f"sqlite:///{tmp_path / 'migrated.db'}"
        return
    base = store_url.split("?", 1)[0]
    with pg_schema(base, "mig") as url:
        yield url


def test_head_revision_is_alembics(tmp_path: Path) -> None:
    """The head read from the migration files without importing them is alembic's own."""
    s = Store.open(f"sqlite:///{tmp_path / 's.db'}")
    assert head_revision() == ScriptDirectory.from_config(s.alembic_config()).get_current_head()


def test_a_new_store_is_created_from_the_models_and_equals_the_migrated_one(store_url: str,
                                                                              second_url: str) -> None:
    created, migrated = Store.open(store_url), Store.open(second_url)
    statements: list[str] = []
    event.listen(created.engine, "before_cursor_execute",
                 lambda conn, cur, stmt, *rest: statements.append(stmt.lstrip().split(None, 2)[0].upper()))
    created.upgrade()
    migrated.upgrade(via_migrations=True)
    assert created.current() == migrated.current() == head_revision()
    # one CREATE TABLE per table, no migration's ALTER, UPDATE or DROP
    assert statements.count("CREATE") >= len(schema.metadata.tables) + 1
    assert not {"ALTER", "DROP", "UPDATE", "DELETE"} & set(statements), statements
    a, b = snapshot(created), snapshot(migrated)
    assert set(a) - {"alembic_version"} == set(schema.metadata.tables) | {k for k in a if k.startswith("_")}
    assert _differences(a, b) == []
    created.engine.dispose()
    migrated.engine.dispose()


def test_the_comparison_sees_a_difference_only_a_migration_makes(store_url: str, second_url: str) -> None:
    """The comparison can fail: an index, a server default or a dropped key that a migration adds and the
    models lack is a difference."""
    created, migrated = Store.open(store_url), Store.open(second_url)
    created.upgrade()
    migrated.upgrade(via_migrations=True)
    with migrated.begin() as conn:
        conn.execute(text("CREATE INDEX ix_only_migrated ON allocations (name)"))
    diff = _differences(snapshot(created), snapshot(migrated))
    assert any("allocations.indexes" in d and "ix_only_migrated" in d for d in diff), diff
    created.engine.dispose()
    migrated.engine.dispose()


def test_an_existing_store_is_upgraded_by_the_migrations(store_url: str) -> None:
    """A store that has tables (here one a revision behind) is never re-created: the migrations move it on."""
    s = Store.open(store_url)
    prev = ScriptDirectory.from_config(s.alembic_config()).get_revision(head_revision()).down_revision
    s.upgrade(prev)
    assert s.current() == prev
    assert s.create() is False
    s.upgrade()
    assert s.current() == head_revision()
    s.engine.dispose()
