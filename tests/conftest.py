"""Shared test helpers. Real-service tests call :func:`need` : it skips with a reason on a laptop without
the service, and fails when CI is set, so CI can never silently skip them."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"
IN_CI = bool(os.environ.get("CI"))


def need(available: bool, reason: str) -> None:
    """Skip (laptop) or fail (CI) when a real service a test needs is not there."""
    if available:
        return
    if IN_CI:
        pytest.fail(f"required service missing in CI: {reason}")
    pytest.skip(reason)


def port_open(host: str, port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


PG_URL = os.environ.get("GPU_AUDIT_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/test")


@pytest.fixture
def fixtures_dir() -> Path:
    return FIXTURES


@pytest.fixture
def pg_url() -> str:
    """A real PostgreSQL database (127.0.0.1:5432, db ``test``), emptied of gpu-audit tables."""
    need(port_open("127.0.0.1", 5432), "PostgreSQL on 127.0.0.1:5432 is not running")
    try:
        import psycopg  # noqa: F401
    except ImportError:
        need(False, "psycopg is not installed")
    return PG_URL


@contextmanager
def pg_schema(pg_url: str, prefix: str = "t") -> Iterator[str]:
    """A URL whose search_path is a fresh, uniquely named schema, dropped afterwards (tests share db ``test``)."""
    import uuid

    from sqlalchemy import create_engine, text

    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    engine = create_engine(pg_url)
    with engine.begin() as conn:
        conn.execute(text(f'CREATE SCHEMA "{name}"'))
    sep = "&" if "?" in pg_url else "?"
    try:
        yield f"{pg_url}{sep}options=-csearch_path%3D{name}"
    finally:
        with engine.begin() as conn:
            conn.execute(text(f'DROP SCHEMA "{name}" CASCADE'))
        engine.dispose()


@pytest.fixture
def pg_schema_url(pg_url: str) -> Iterator[str]:
    with pg_schema(pg_url) as url:
        yield url


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Both engines: an SQLite file, and a real PostgreSQL schema (service test)."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'store.db'}"
    return request.getfixturevalue("pg_schema_url")


@pytest.fixture
def store(store_url: str):
    from auditor.store.engine import Store

    s = Store.open(store_url)
    s.upgrade()
    yield s
    s.engine.dispose()
