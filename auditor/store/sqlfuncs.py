"""Portable SQL scalar functions: SQLite spells GREATEST/LEAST as multi-argument max()/min()."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, Table
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.functions import GenericFunction
from sqlalchemy.types import Float

if TYPE_CHECKING:
    pass


class greatest(GenericFunction):  # noqa: N801 - SQL function name
    type = Float()
    inherit_cache = True


class least(GenericFunction):  # noqa: N801 - SQL function name
    type = Float()
    inherit_cache = True


@compiles(greatest, "sqlite")
def _greatest_sqlite(element: Any, compiler: Any, **kw: Any) -> str:
    return f"max({compiler.process(element.clauses, **kw)})"


@compiles(least, "sqlite")
def _least_sqlite(element: Any, compiler: Any, **kw: Any) -> str:
    return f"min({compiler.process(element.clauses, **kw)})"


def sql_names(dialect: str) -> dict[str, str]:
    """GREATEST and LEAST as ``dialect`` spells them in SQL text (SQLite: multi-argument max()/min()),
    under both the long keys (``GREATEST``, ``LEAST``) and the short ones (``G``, ``L``) the audit's SQL
    templates use. The one place this spelling lives."""
    g, le = ("GREATEST", "LEAST") if dialect == "postgresql" else ("max", "min")
    return {"GREATEST": g, "LEAST": le, "G": g, "L": le}


def greatest_least(dialect: str) -> tuple[str, str]:
    """(GREATEST, LEAST) of the engine, for f-strings (see :func:`sql_names`)."""
    n = sql_names(dialect)
    return n["G"], n["L"]


Merge = Callable[[Table, Any], Any]


def dialect_insert(conn: Connection) -> Callable[[Table], Any]:
    """The dialect's INSERT with ON CONFLICT; the dialect module is imported on first use (the PostgreSQL one
    costs a SQLite command 0.05-0.1 s of start-up)."""
    if conn.dialect.name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert
    else:
        from sqlalchemy.dialects.sqlite import insert
    return insert


def upsert(conn: Connection, table: Table, rows: Sequence[dict[str, Any]], keys: Sequence[str],
           merge: dict[str, Merge | None] | None = None) -> None:
    """INSERT ... ON CONFLICT (keys) DO UPDATE; ``merge`` overrides the default "new value wins" per column
    (None = keep the stored value)."""
    if not rows:
        return
    ins = dialect_insert(conn)(table)
    merge = merge or {}
    sets: dict[str, Any] = {}
    for col in rows[0]:
        if col in keys or col == "id":
            continue
        if col in merge:
            if merge[col] is not None:
                sets[col] = merge[col](table, ins.excluded)  # type: ignore[misc]
        else:
            sets[col] = getattr(ins.excluded, col)
    stmt = ins.on_conflict_do_update(index_elements=list(keys), set_=sets) if sets \
        else ins.on_conflict_do_nothing(index_elements=list(keys))
    conn.execute(stmt, list(rows))


def upsert_checked(conn: Connection, table: Table, records: Sequence[Any], keys: Sequence[str],
                   problem: Callable[[Any], str], row: Callable[[Any], dict[str, Any]],
                   on_bad: Callable[[Any, str], None], keep: Callable[[dict[str, Any]], bool] | None = None) -> int:
    """Upsert the rows (``row``) of the ``records`` that ``problem`` finds storable (""; else the record and
    why go to ``on_bad``) and ``keep`` keeps; the last of duplicates on ``keys`` wins. Returns the rows
    written."""
    rows: dict[tuple, dict[str, Any]] = {}
    for rec in records:
        if why := problem(rec):
            on_bad(rec, why)
            continue
        r = row(rec)
        if keep is None or keep(r):
            rows[tuple(r[k] for k in keys)] = r
    upsert(conn, table, list(rows.values()), keys)
    return len(rows)
