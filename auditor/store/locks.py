"""Leases in the store's ``locks`` table, so two daemons on one store never run the same job at once (and
never both send the weekly email). A lease lapses at ``expires_ts`` if its holder dies; a live holder
renews it while the job runs.

Acquire is one transaction: take the row over if it lapsed (or is already ours), else insert it; a
conflicting insert does nothing. On PostgreSQL the row lock and ON CONFLICT make this race-free between
processes; on SQLite the database lock does.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from collections.abc import Callable
from datetime import datetime
from types import TracebackType

from sqlalchemy import delete, or_, update

from auditor.store import schema
from auditor.store.engine import Store
from auditor.store.sqlfuncs import dialect_insert
from auditor.timeutil import utcnow

log = logging.getLogger("gpu_audit.locks")

Clock = Callable[[], datetime]


def default_holder() -> str:
    """host:pid:token: unique per daemon even for two in one process (tests) or one PID namespace."""
    return f"{socket.gethostname()[:120]}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def _now(clock: Clock) -> int:
    return int(clock().timestamp())


def acquire(store: Store, name: str, holder: str, ttl_s: int, clock: Clock = utcnow) -> bool:
    """Take lease ``name`` for ``ttl_s`` seconds if it is free, lapsed or already ours."""
    t = schema.locks
    now = _now(clock)
    values = {"holder": holder, "acquired_ts": now, "expires_ts": now + ttl_s}
    with store.begin() as conn:
        taken = conn.execute(update(t).where(t.c.name == name, or_(t.c.expires_ts <= now, t.c.holder == holder))
                             .values(**values).returning(t.c.name)).first()
        if taken is not None:
            return True
        ins = dialect_insert(conn)(t)
        # RETURNING, not rowcount: psycopg reports -1 for INSERT ... ON CONFLICT DO NOTHING
        return conn.execute(ins.values(name=name, **values).on_conflict_do_nothing(index_elements=["name"])
                            .returning(t.c.name)).first() is not None


def renew(store: Store, name: str, holder: str, ttl_s: int, clock: Clock = utcnow) -> bool:
    """Push the expiry out; False when the lease is no longer ours (it lapsed and someone took it)."""
    t = schema.locks
    with store.begin() as conn:
        return conn.execute(update(t).where(t.c.name == name, t.c.holder == holder)
                            .values(expires_ts=_now(clock) + ttl_s).returning(t.c.name)).first() is not None


def release(store: Store, name: str, holder: str) -> None:
    t = schema.locks
    with store.begin() as conn:
        conn.execute(delete(t).where(t.c.name == name, t.c.holder == holder))


class Lease:
    """``with Lease(store, "weekly-report", holder, ttl) as lease: if lease.acquired: ...``

    While held, a background timer renews it every ``ttl_s / 3`` seconds; it is released on exit."""

    def __init__(self, store: Store, name: str, holder: str, ttl_s: int, clock: Clock = utcnow) -> None:
        self.store, self.name, self.holder, self.ttl_s, self.clock = store, name, holder, ttl_s, clock
        self.acquired = False
        self.lost = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> Lease:
        self.acquired = acquire(self.store, self.name, self.holder, self.ttl_s, self.clock)
        if self.acquired:
            self._thread = threading.Thread(target=self._renew_loop, name=f"lease-{self.name}", daemon=True)
            self._thread.start()
        return self

    def check(self) -> bool:
        """Still ours? Renews now (so a lease that lapsed and was taken over is noticed at once, not at the
        next renewal tick); once lost, it stays lost."""
        if not self.acquired or self.lost:
            return False
        try:
            ok = renew(self.store, self.name, self.holder, self.ttl_s, self.clock)
        except Exception as exc:  # cannot tell: the store is down, so nothing can be done safely either
            log.warning("lease %s: cannot check it: %s", self.name, exc)
            return False
        if not ok:
            self.lost = True
            log.error("lease %s was taken over by another holder; stopping this job", self.name)
        return ok

    def _renew_loop(self) -> None:
        while not self._stop.wait(max(self.ttl_s / 3, 0.05)):
            try:
                if not renew(self.store, self.name, self.holder, self.ttl_s, self.clock):
                    self.lost = True
                    log.error("lease %s was taken over by another holder", self.name)
                    return
            except Exception as exc:  # a store hiccup must not kill the renewer; retry next tick
                log.warning("lease %s: renew failed: %s", self.name, exc)

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=5)
        if self.acquired:
            try:
                release(self.store, self.name, self.holder)
            except Exception as err:  # it lapses by itself at expires_ts
                log.warning("lease %s: release failed: %s", self.name, err)
