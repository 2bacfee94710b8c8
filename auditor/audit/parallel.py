"""Helper connections for the read-only parts of a PostgreSQL audit.

PostgreSQL runs one query on one core. When every share of the judging was committed by its own connection
(``store.judge_connections`` > 1, :func:`auditor.audit.run.run_audit`), the usage rows of the run are
visible to any connection, so the per-finding queries that only read (sparklines) can run in several
connections at once, and a rule that reads only committed rows (ghosts on unallocated GPUs) can run on a
helper while this connection works on something else (:func:`later`). The audit's own connection keeps its
transaction (usage_allocation, findings) and its temporary tables; a helper sees neither, so only queries
that need neither are handed out here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from sqlalchemy import Connection, text

T = TypeVar("T")
R = TypeVar("R")
#: conn.info key: how many connections may read this audit's committed usage at once
KEY = "gpu_audit_readers"


def readers(conn: Connection) -> int:
    """Connections that may read this run's usage at once (1: only ``conn`` itself)."""
    return int(conn.info.get(KEY, 1))


def _on_helper(conn: Connection, fn: Callable[[Connection, T], R], item: T) -> R:
    with conn.engine.connect() as c, c.begin():
        c.execute(text("SET LOCAL jit = off"))  # as the audit's own connection (auditor.audit.usage.setup_pg)
        c.execute(text("SET LOCAL work_mem = '64MB'"))
        return fn(c, item)


def ahead(conn: Connection, fn: Callable[..., R], *args: Any) -> Callable[[], R]:
    """``fn(*args)`` begun now in a background thread where the run has helpers (:func:`readers` > 1), else
    run when asked: call the returned function for the result (an error of ``fn`` is raised there). ``fn``
    must not use ``conn`` itself, only helper connections (``helpers_only`` of :func:`map_read`)."""
    if readers(conn) <= 1:
        return lambda: fn(*args)
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gpu-audit-ahead")
    future = pool.submit(fn, *args)
    pool.shutdown(wait=False)  # the thread ends with its one task
    return future.result


def later(conn: Connection, fn: Callable[..., R], *args: Any) -> Callable[[], R]:
    """``fn(connection, *args)`` begun now on a helper connection where the run has helpers, else run on
    ``conn`` when asked (:func:`ahead`). For reads that need nothing of ``conn``'s transaction."""
    if readers(conn) <= 1:
        return lambda: fn(conn, *args)
    return ahead(conn, _on_helper, conn, lambda c, _item: fn(c, *args), None)


def map_read(conn: Connection, fn: Callable[[Connection, T], R], items: Sequence[T], *,
             helpers_only: bool = False) -> Iterator[R]:
    """``fn(connection, item)`` for every item, results in order: on ``conn`` one after the other, or on
    :func:`readers` helper connections at once (at most that many results waiting, so memory stays one
    batch per connection). ``helpers_only``: never on ``conn``, even for one item (the caller runs in
    another thread than ``conn``'s, see :func:`later`)."""
    n = readers(conn)
    if n <= 1 or (len(items) <= 1 and not helpers_only):
        for item in items:
            yield fn(conn, item)
        return
    with ThreadPoolExecutor(max_workers=n) as pool:
        pending: list[Any] = []
        for item in items:
            pending.append(pool.submit(_on_helper, conn, fn, item))
            if len(pending) >= n:
                yield pending.pop(0).result()
        for f in pending:
            yield f.result()
