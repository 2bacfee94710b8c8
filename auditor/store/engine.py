"""The SQL store: engine setup, migrations, watermarks. Ingest lives in :mod:`auditor.store.ingest`.

SQLite (WAL, foreign keys, busy timeout) is the embedded default; PostgreSQL is the production store.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event, select, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, OperationalError, SQLAlchemyError

from auditor import jsonsafe
from auditor.errors import StoreError
from auditor.records import Record
from auditor.resources import resource_dir
from auditor.store import schema
from auditor.store.messages import first_line as _first_line
from auditor.store.sqlfuncs import greatest
from auditor.store.stats import IngestStats
from auditor.timeutil import utcnow

log = logging.getLogger("gpu_audit.store")

SQLITE_BUSY_MS = 120_000  # a writer waits this long for another (an audit of a large fleet holds the lock)


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    # SQLAlchemy, not the sqlite3 module, decides when transactions begin (see _sqlite_begin)
    dbapi_conn.isolation_level = None
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_MS}")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.close()


def _sqlite_begin(conn: Connection) -> None:
    """Writers take the write lock up front (BEGIN IMMEDIATE), so two writers queue on the busy timeout
    instead of one failing with "database is locked" when its read lock cannot be upgraded. Readers stay
    deferred and never block (WAL)."""
    conn.exec_driver_sql("BEGIN IMMEDIATE" if conn.info.get("gpu_audit_writer") else "BEGIN")


def make_engine(url: str) -> Engine:
    from auditor.config.base import store_url
    from auditor.logs import SECRET_PARAM, register_secret

    try:
        u = make_url(store_url(url))
    except (ArgumentError, ValueError):
        raise StoreError("store.url is not a valid SQLAlchemy URL (value not shown)") from None
    register_secret(u.password if isinstance(u.password, str) else None)
    for key, value in u.query.items():
        if SECRET_PARAM.search(key):
            for v in (value,) if isinstance(value, str) else value:
                register_secret(v)
    if u.get_backend_name() == "sqlite":
        if u.database and u.database != ":memory:":
            try:
                Path(u.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise StoreError(f"store directory for {u.database}: {exc.strerror or exc}") from None
        engine = create_engine(u, connect_args={"timeout": SQLITE_BUSY_MS / 1000}, json_serializer=jsonsafe.dumps)
        event.listen(engine, "connect", _sqlite_pragmas)
        event.listen(engine, "begin", _sqlite_begin)
        return engine
    try:
        # JSON columns (evidence, summaries) never get a NaN token: PostgreSQL's json type rejects it
        return create_engine(u, pool_pre_ping=True, json_serializer=jsonsafe.dumps, pool_size=5,
                             max_overflow=POOL_HEADROOM)
    except ModuleNotFoundError as exc:
        extra = " (pip install 'gpu-audit[postgres]')" if u.get_backend_name() == "postgresql" else ""
        raise StoreError(f"store.url needs the database driver {exc.name!r}, which is not installed{extra}") from None


#: Alembic's own version table, as alembic creates it (MigrationContext: version_num VARCHAR(32), primary key
#: alembic_version_pkc): a store created from the models gets the same table, so later migrations see it
def _version_table() -> Any:
    from sqlalchemy import Column, MetaData, PrimaryKeyConstraint, String, Table

    return Table("alembic_version", MetaData(), Column("version_num", String(32), nullable=False),
                 PrimaryKeyConstraint("version_num", name="alembic_version_pkc"))


VERSION_TABLE = _version_table()
_REVISION = re.compile(r"""^(down_revision|revision)\s*=\s*(?:['"]([^'"]+)['"]|None)""", re.M)


@lru_cache(maxsize=1)
def head_revision() -> str:
    """The newest migration's revision, read from the files of migrations/versions (the revision no other
    names as its down_revision) without importing them (alembic's ScriptDirectory imports each one:
    tests/test_store_create.py checks both agree). More than one head is an error, as for alembic."""
    revs, downs = set(), set()
    for path in (resource_dir("migrations") / "versions").glob("*.py"):
        found = dict((m.group(1), m.group(2)) for m in _REVISION.finditer(path.read_text(encoding="utf-8")))
        if "revision" in found:
            revs.add(found["revision"])
            if found.get("down_revision"):
                downs.add(found["down_revision"])
    heads = revs - downs
    if len(heads) != 1:
        raise StoreError(f"migrations/versions has {len(heads)} head revisions ({', '.join(sorted(heads))}), "
                         "not one")
    return heads.pop()


#: pool connections beyond the pool's 5 (an audit's own; the web UI's readers; the daemon's jobs). An audit's
#: per-cluster processes open engines of their own
POOL_HEADROOM = 24


class Store:
    """A handle on the SQL store. Every write is a bounded transaction; reads are plain SQL."""

    def __init__(self, engine: Engine, batch_rows: int = 50_000) -> None:
        self.engine = engine
        self.batch_rows = batch_rows

    @classmethod
    def open(cls, url: str, batch_rows: int = 50_000) -> Store:
        return cls(make_engine(url), batch_rows)

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    def redacted_url(self) -> str:
        """The store URL fit to print: no password, in userinfo or in query parameters (sslpassword=...)."""
        from auditor.logs import redact_url

        return redact_url(self.engine.url.render_as_string(hide_password=False))

    @contextmanager
    def begin(self) -> Iterator[Connection]:
        """A write transaction: committed on success, rolled back on any error (no partial batch)."""
        try:
            with self.engine.connect() as conn:
                conn.info["gpu_audit_writer"] = True
                try:
                    with conn.begin():
                        yield conn
                finally:
                    conn.info.pop("gpu_audit_writer", None)
        except OperationalError as exc:
            raise StoreError(f"store {self.redacted_url()}: {_first_line(exc)}") from None

    # -- migrations ---------------------------------------------------------------------------------
    def alembic_config(self) -> Any:
        from alembic.config import Config as AlembicConfig

        cfg = AlembicConfig()
        cfg.set_main_option("script_location", str(resource_dir("migrations")))
        cfg.attributes["engine"] = self.engine
        return cfg

    def upgrade(self, revision: str = "head", *, via_migrations: bool = False) -> None:
        """Bring the store to ``revision``. A NEW store (no table yet) asked for the head is created from the
        models (:func:`create`): every table in one transaction, stamped at the head revision, without running
        the migrations one by one; an existing store is upgraded by the migrations. ``via_migrations``
        builds a new store by the migrations too (tests/test_store_create.py compares the two)."""
        from alembic import command

        if not via_migrations and revision in ("head", head_revision()) and self.create():
            return
        try:
            command.upgrade(self.alembic_config(), revision)
        except SQLAlchemyError as exc:
            raise StoreError(f"store {self.redacted_url()}: migration failed: {_first_line(exc)}") from None

    def create(self) -> bool:
        """Create a new store's tables from the models and stamp it at the head revision, in one transaction;
        False (nothing done) when the store already has an ``alembic_version`` table or any model table."""
        from sqlalchemy import inspect

        try:
            with self.begin() as conn:
                have = set(inspect(conn).get_table_names())
                if VERSION_TABLE.name in have or have & set(schema.metadata.tables):
                    return False
                schema.metadata.create_all(conn)
                VERSION_TABLE.create(conn)
                conn.execute(VERSION_TABLE.insert().values(version_num=head_revision()))
        except SQLAlchemyError as exc:
            raise StoreError(f"store {self.redacted_url()}: creating the tables failed: {_first_line(exc)}") from None
        log.debug("created the store's tables from the models at revision %s", head_revision())
        return True

    def current(self) -> str | None:
        """The store's revision (its ``alembic_version`` row), None for a store without one."""
        from sqlalchemy import inspect

        try:
            with self.engine.connect() as conn:
                if not inspect(conn).has_table(VERSION_TABLE.name):
                    return None
                return conn.execute(select(VERSION_TABLE.c.version_num)).scalar()
        except SQLAlchemyError as exc:
            raise StoreError(f"store {self.redacted_url()}: {_first_line(exc)}") from None

    def head(self) -> str | None:
        return head_revision()

    def require_current(self) -> None:
        cur = self.current()
        if cur != self.head():
            raise StoreError(f"store {self.redacted_url()} is at revision {cur or 'none'}, "
                             f"not {self.head()}: run `gpu-audit db upgrade`")

    # -- ingest -------------------------------------------------------------------------------------
    def ingest(self, records: Iterable[Record], *, seen_at_ts: int | None = None,
               on_bad: Callable[[Record, str], None] | None = None) -> IngestStats:
        """Idempotent upsert of any mix of records, in transactions of at most ``batch_rows`` rows; with
        ``on_bad``, records the store refuses are handed to it and the rest are stored."""
        from auditor.store.ingest import ingest

        return ingest(self, records, seen_at_ts=seen_at_ts or int(utcnow().timestamp()), on_bad=on_bad)

    # -- watermarks ---------------------------------------------------------------------------------
    def watermark(self, cluster: str, source: str) -> int | None:
        t = schema.watermarks
        with self.engine.connect() as conn:
            return conn.execute(select(t.c.watermark_ts).where(t.c.cluster == cluster,
                                                               t.c.source == source)).scalar()

    def set_watermark(self, conn: Connection, cluster: str, source: str, ts: int) -> None:
        """Move a watermark forward only (an older window collected later never moves it back)."""
        from auditor.store.sqlfuncs import upsert

        now = int(utcnow().timestamp())
        upsert(conn, schema.watermarks, [{"cluster": cluster, "source": source, "watermark_ts": ts,
                                          "updated_ts": now}], ("cluster", "source"),
               {"watermark_ts": lambda t, ex: greatest(t.c.watermark_ts, ex.watermark_ts),
                "updated_ts": lambda t, ex: ex.updated_ts})

    def count(self, table: str) -> int:
        with self.engine.connect() as conn:
            return int(conn.execute(text(f"SELECT count(*) FROM {schema.metadata.tables[table].name}"))
                       .scalar() or 0)
