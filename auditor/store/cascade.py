"""The deletes that ``ON DELETE CASCADE`` used to do for the audit's output tables.

On PostgreSQL usage_gpu, usage_allocation and findings have no foreign keys (migration
``0011_audit_output_fks``): their per-row checks were most of the time it took to write an audit's
hundreds of thousands of rows, and they could never fail, because the audit takes every id it writes from
the parent tables in its own statements. What the keys still did was the cascade, so every code path that
deletes a parent row deletes its dependants here, on both engines (SQLite keeps its foreign keys; the
explicit delete finds nothing left to do there):

- a GPU dropped from an allocation at ingest (``allocated_gpus``) -> its ``usage_gpu`` rows;
- a duplicate reservation merged at ingest (``reservations``) -> its ``findings``;
- an audit run deleted (retention, enforcement's what-if run) -> its rows in all three (those callers
  already deleted them explicitly, by ``run_id``);
- nothing deletes ``allocations`` rows.

One race is left that a foreign key closed with its row lock: ingest may delete a GPU (or a reservation) after
the audit read it and before the audit commits the rows that refer to it. :func:`sweep_run` deletes such rows
set-wise after the audit wrote its findings, when a delete happened since the audit began: every delete here
writes a fresh token to ``store_meta`` (:data:`DELETED`), and the audit compares it with the token it read
before judging (the sweep read the 16,384-GPU bench run's 380,895 rows in 0.39 s, for nothing in nearly
every run).
"""

from __future__ import annotations

import uuid
from collections.abc import Collection

from sqlalchemy import Connection, delete, text

from auditor.store import meta, schema

#: ``store_meta`` key: a fresh token each time a GPU or a reservation is deleted
DELETED = "parents_deleted"


def deletions(conn: Connection) -> str | None:
    """The token of the latest delete (None: never); an audit reads it before it judges."""
    return meta.get(conn, DELETED)


def delete_allocated_gpus(conn: Connection, ids: Collection[int]) -> None:
    """Delete these allocated GPUs and what every audit run judged of them."""
    if not ids:
        return
    ug, g = schema.usage_gpu, schema.allocated_gpus
    conn.execute(delete(ug).where(ug.c.allocated_gpu_id.in_(list(ids))))
    je = schema.judged_edges  # their kept edges (auditor.audit.judging.keep_edges)
    conn.execute(delete(je).where(je.c.allocated_gpu_id.in_(list(ids))))
    conn.execute(delete(g).where(g.c.id.in_(list(ids))))
    meta.put(conn, DELETED, uuid.uuid4().hex)


def delete_reservations(conn: Connection, ids: Collection[int]) -> None:
    """Delete these reservations and the findings about them."""
    if not ids:
        return
    f, r = schema.findings, schema.reservations
    conn.execute(delete(f).where(f.c.reservation_id.in_(list(ids))))
    conn.execute(delete(r).where(r.c.id.in_(list(ids))))
    meta.put(conn, DELETED, uuid.uuid4().hex)


#: An audit run's rows whose parent a concurrent ingest deleted (PostgreSQL; the foreign key on SQLite)
_ORPHANS = [
    "DELETE FROM usage_gpu u WHERE u.run_id = :r AND NOT EXISTS "
    "(SELECT 1 FROM allocated_gpus g WHERE g.id = u.allocated_gpu_id)",
    "DELETE FROM findings f WHERE f.run_id = :r AND f.reservation_id IS NOT NULL AND NOT EXISTS "
    "(SELECT 1 FROM reservations s WHERE s.id = f.reservation_id)",
]


def sweep_run(conn: Connection, run_id: int, before: str | None) -> int:
    """Delete the run's rows whose GPU or reservation was deleted while it ran (``before``: the
    :func:`deletions` token read before it judged); returns how many."""
    if conn.dialect.name != "postgresql" or deletions(conn) == before:
        return 0
    return sum(conn.execute(text(sql), {"r": run_id}).rowcount or 0 for sql in _ORPHANS)
