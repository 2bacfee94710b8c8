"""Helpers shared by several test modules (fixtures stay in conftest.py): one copy of each."""

from __future__ import annotations

import socket
import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from importlib.metadata import EntryPoint
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

import connectors
from auditor.store.engine import Store


@contextmanager
def migrated_store(engine: str, tmp_dir: Path, prefix: str = "t") -> Iterator[Store]:
    """A migrated store on ``engine``: "sqlite", a file in ``tmp_dir``; "postgresql", a fresh schema of the
    test database, dropped afterwards (skipped without PostgreSQL, failed under CI). For fixtures that share
    one store per module or pair the engines; a store per test is conftest's ``store``."""
    from conftest import need_pg, pg_schema

    if engine == "sqlite":
        store = Store.open(f"sqlite:///{tmp_dir / 'store.db'}")
        try:
            store.upgrade()
            yield store
        finally:
            store.engine.dispose()
        return
    with pg_schema(need_pg(), prefix) as url:  # only the identified test database
        store = Store.open(url)
        try:
            store.upgrade()
            yield store
        finally:
            store.engine.dispose()


def free_port() -> int:
    """A TCP port on 127.0.0.1 nothing listens on now (the OS picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def web_server(store: Store, cfg: Any) -> Iterator[str]:
    """``gpu-audit web`` over ``store`` on a free loopback port, in a thread: its base URL, stopped after."""
    import time

    from auditor.web.app import start_in_thread

    port = free_port()
    server = start_in_thread(store, cfg, f"127.0.0.1:{port}")
    for _ in range(100):
        if server.started:
            break
        time.sleep(0.05)
    assert server.started, "uvicorn did not start"
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True


def usage(store: Store, run_id: int) -> dict[str, dict[str, Any]]:
    """Run ``run_id``'s usage_allocation rows by the allocation's external id, every column."""
    with store.engine.connect() as conn:
        return {r.external_id: dict(r._mapping) for r in conn.execute(text(
            "SELECT a.external_id, u.* FROM usage_allocation u JOIN allocations a ON a.id = u.allocation_id "
            "WHERE u.run_id = :r"), {"r": run_id})}


def gpu_usage(store: Store, run_id: int) -> dict[tuple[str, int], dict[str, Any]]:
    """Run ``run_id``'s usage_gpu rows by (external id, GPU index), every column."""
    with store.engine.connect() as conn:
        return {(r.external_id, r.gpu_index): dict(r._mapping) for r in conn.execute(text(
            "SELECT a.external_id, u.* FROM usage_gpu u JOIN allocations a ON a.id = u.allocation_id "
            "WHERE u.run_id = :r"), {"r": run_id})}


def add_connector(monkeypatch: pytest.MonkeyPatch, kind: str, module: types.ModuleType) -> None:
    """Register an in-memory ``module`` as connector ``kind`` for one test, through the entry-point group as
    an installed package would (``connectors`` finds kinds nowhere else). Undone with ``monkeypatch``."""
    monkeypatch.setitem(sys.modules, module.__name__, module)
    ep = EntryPoint(kind, module.__name__, connectors.ENTRY_POINT_GROUP)
    registered = connectors._entry_points.__wrapped__

    @cache
    def with_kind() -> dict[str, EntryPoint]:
        return {**registered(), kind: ep}

    monkeypatch.setattr(connectors, "_entry_points", with_kind)
