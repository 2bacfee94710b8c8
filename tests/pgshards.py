"""A sharded store for tests: a coordinator schema in the test database and a schema on each of the chosen
clusters of scripts/testbed-pgshards.sh (identified by tests/conftest.py before use), set up by
``gpu-audit db shard``'s own function, and everything it made removed afterwards (schemas, foreign servers
and user mappings). ``clear`` empties one between examples without losing the layout."""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from urllib.parse import quote

from sqlalchemy import create_engine, text

from auditor.store import schema, sharding, shards
from auditor.store.engine import Store


def in_schema(url: str, name: str) -> str:
    return f"{url}{'&' if '?' in url else '?'}options={quote(f'-csearch_path={name}')}"


@contextmanager
def shard_schemas(numbers: Sequence[int], prefix: str = "s") -> Iterator[list[str]]:
    """A fresh schema on each identified shard cluster of ``numbers``; URLs selecting it (dropped after)."""
    from conftest import shard_url

    bases = [shard_url(n) for n in numbers]
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    made = []
    try:
        for base in bases:
            eng = create_engine(base, isolation_level="AUTOCOMMIT")
            with eng.connect() as conn:
                conn.execute(text(f'CREATE SCHEMA "{name}"'))
            eng.dispose()
            made.append(base)
        yield [in_schema(b, name) for b in bases]
    finally:
        for base in made:
            eng = create_engine(base, isolation_level="AUTOCOMMIT")
            try:
                with eng.connect() as conn:
                    conn.execute(text(f'DROP SCHEMA IF EXISTS "{name}" CASCADE'))
            except Exception:  # a shard the test stopped and could not start again: its schema stays
                pass
            eng.dispose()


def drop_servers(store: Store) -> None:
    """The coordinator's foreign servers (and their user mappings, foreign tables) of this store."""
    with store.engine.connect() as conn:
        servers = [r.server for r in shards.listed(conn)]
    shards.forget(store.engine)
    store.engine.dispose()
    admin = create_engine(store.engine.url.render_as_string(hide_password=False), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        for s in servers:
            conn.execute(text(f'DROP SERVER IF EXISTS "{s}" CASCADE'))
    admin.dispose()


def ensure_fdw(pg_url: str) -> None:
    """postgres_fdw in the public schema of the test database, so no test's schema owns it (dropping a
    schema that owned the extension would drop every other test's servers with it)."""
    eng = create_engine(pg_url, isolation_level="AUTOCOMMIT")
    with eng.connect() as conn:
        conn.execute(text("SELECT pg_advisory_lock(7301530155)"))
        try:
            conn.execute(text("CREATE EXTENSION IF NOT EXISTS postgres_fdw SCHEMA public"))
        finally:
            conn.execute(text("SELECT pg_advisory_unlock(7301530155)"))
    eng.dispose()


@contextmanager
def sharded_store(numbers: Sequence[int] = (1, 2), prefix: str = "sh") -> Iterator[Store]:
    """A migrated coordinator sharded over the testbed clusters ``numbers`` (shard k = numbers[k - 1])."""
    from conftest import need_pg, pg_schema

    pg = need_pg()
    ensure_fdw(pg)
    with pg_schema(pg, prefix) as url, shard_schemas(numbers, prefix) as urls:
        store = Store.open(url)
        try:
            store.upgrade()
            sharding.setup(store, urls)
            yield store
        finally:
            drop_servers(store)


COORDINATOR_KEEP = {"store_shards", "store_meta", shards.SETS, *shards.SHARDED}


def clear(store: Store) -> None:
    """Empty a sharded store's data (not its layout): the coordinator's tables, the shards' tables, the
    facts in store_meta other than the store's and shards' identity, and the layout's caches."""
    tables = [t.name for t in reversed(schema.metadata.sorted_tables) if t.name not in COORDINATOR_KEEP]
    with store.begin() as conn:
        conn.execute(text(f"TRUNCATE {', '.join(tables)} RESTART IDENTITY CASCADE"))
        conn.execute(text("DELETE FROM store_meta WHERE key NOT IN ('store_id')"))
        lay = shards.layout(conn)
    assert lay is not None
    for s in lay.shards:
        with s.begin() as sconn:
            for t in (*shards.SHARDED, shards.SETS, "telemetry_gpus"):
                sconn.execute(text(f"TRUNCATE {t}"))
            sconn.execute(text("DELETE FROM store_meta WHERE key NOT IN ('shard_of')"))
    lay.synced.clear()
