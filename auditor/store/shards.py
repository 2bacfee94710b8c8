"""PostgreSQL sharded store: the per-GPU tables spread over several PostgreSQL servers as ``postgres_fdw``
foreign partitions, the ledger on the coordinator (docs/scale-out.md).

Layout. The coordinator is the store of ``store.url``: allocations, runs, usage, findings and every other
table stay there. :data:`SHARDED` (``gpu_buckets``, ``judged_hours``, ``judged_dirty``: the tables keyed by
GPU) become hash-partitioned on ``gpu_id`` there, each partition a foreign table on one shard
(``FOR VALUES WITH (MODULUS n, REMAINDER k - 1)``, server ``gpu_audit_shard<k>_<store id>``); ``judged_sets``
becomes a view of the sets every shard holds. Each shard is a whole gpu-audit store (the same migrations, so
every statement the store runs on one server runs there unchanged) that holds only its GPUs' telemetry, a
copy of those GPUs' ``telemetry_gpus`` rows and its own judged aggregate, and says whose shard it is
(``store_meta.shard_of`` = ``<store id>:<k>``): a database that does not say so is refused.

Reads of the audit, the reports and the web go through the coordinator's foreign partitions with their SQL
unchanged. What postgres_fdw cannot push down goes to each shard's own tables over a direct connection
(built from the foreign server's options and the user mapping, so the coordinator's URL stays the one
setting) with the same SQL as on one server:

- writes: ``INSERT ... ON CONFLICT`` is refused on a foreign table, and COPY routed to foreign partitions
  is one remote INSERT per row on PostgreSQL 15; so a bucket batch is split by shard and each part takes
  ingest's own path on its shard (:func:`write_buckets`); retention and the aggregate's upkeep run per
  shard (:func:`on_each`);
- the judging: its per-allocated-GPU LATERAL scans become one remote query per allocated GPU fetching every
  bucket row; so the allocated GPUs (``_attr`` and the infrastructure tables) are shipped to their shards,
  judged there by the audit's own statements, and the usage rows streamed back (:func:`run_shipped`).

A shard that cannot be reached fails the statement or the step that needs it, with its number and
location: an audit fails whole, never with a partial total.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from weakref import WeakKeyDictionary

from sqlalchemy import Connection, Engine, event, text
from sqlalchemy.engine import URL
from sqlalchemy.exc import SQLAlchemyError

from auditor.errors import StoreError
from auditor.store.messages import REWRITES, first_line

if TYPE_CHECKING:
    from auditor.store.engine import Store

#: the per-GPU tables, hash-partitioned on gpu_id over the shards (a new per-GPU table belongs here)
SHARDED = ("gpu_buckets", "judged_hours", "judged_dirty")
#: per-shard tables the coordinator sees as a view of what every shard holds
SETS = "judged_sets"
#: one `db shard` at a time
LOCK = 7301530154
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
#: libpq options of a shard URL that go into the foreign server (besides host, port and dbname)
SERVER_OPTS = ("sslmode", "sslrootcert", "sslcert", "sslkey", "sslcrl", "connect_timeout", "target_session_attrs")


def ident(name: str) -> str:
    if not _NAME.match(name):
        raise StoreError(f"{name[:70]!r} is not a plain SQL name ([A-Za-z_][A-Za-z0-9_]*)")
    return f'"{name}"'


def lit(value: str) -> str:
    return "'" + str(value).replace("'", "''") + "'"


@dataclass
class Shard:
    """One shard: its number, foreign server, printable location and direct connection."""

    number: int
    server: str
    location: str
    engine: Engine
    mark: str  # store_meta.shard_of the shard must hold
    revision: str | None  # the coordinator's migration revision the shard must be at
    checked: bool = False

    def __str__(self) -> str:
        return f"shard {self.number} ({self.location})"

    @contextmanager
    def begin(self) -> Iterator[Connection]:
        """A transaction on the shard's own tables; every failure becomes one line naming the shard."""
        try:
            with self.engine.connect() as conn:
                if not self.checked:
                    self._identify(conn)
                with conn.begin():
                    yield conn
        except StoreError as exc:
            raise StoreError(f"{self}: {strip_store(str(exc))}") from None
        except SQLAlchemyError as exc:
            raise StoreError(f"{self}: {first_line(exc)}") from None

    def _identify(self, conn: Connection) -> None:
        mark = conn.execute(text("SELECT value FROM store_meta WHERE key = 'shard_of'")).scalar() \
            if conn.execute(text("SELECT to_regclass('store_meta') IS NOT NULL")).scalar() else None
        conn.rollback()
        if mark != self.mark:
            raise StoreError(f"not a shard this store made (store_meta.shard_of is {mark!r}, not {self.mark!r}): "
                             "refused")
        rev = conn.execute(text("SELECT version_num FROM alembic_version")).scalar()
        conn.rollback()
        if self.revision is not None and rev != self.revision:
            raise StoreError(f"at revision {rev}, the coordinator at {self.revision}: run `gpu-audit db upgrade`")
        self.checked = True


@dataclass
class Layout:
    """The shards of one coordinator store, and which shard holds which GPU (cached: it never changes)."""

    store_id: str
    shards: list[Shard]
    routes: dict[int, int] = field(default_factory=dict)
    synced: set[int] = field(default_factory=set)  # GPU ids whose telemetry_gpus copy is on their shard
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def n(self) -> int:
        return len(self.shards)


_LAYOUTS: WeakKeyDictionary[Engine, Layout | None] = WeakKeyDictionary()
#: foreign server -> "shard k (location)", for messages (every layout this process loaded)
_NAMES: dict[str, str] = {}
_SERVER = re.compile(r'server "(gpu_audit_shard\d+_[0-9a-f]+)"')


def name_servers(line: str) -> str:
    """A driver message naming a shard's foreign server names the shard and its place too (postgres_fdw says
    only 'could not connect to server "gpu_audit_shard2_..."')."""
    return _SERVER.sub(lambda m: f"{_NAMES[m.group(1)]} (server {m.group(1)})" if m.group(1) in _NAMES
                       else m.group(0), line)


REWRITES.append(name_servers)


def strip_store(msg: str) -> str:
    """A store's own error without its ``store URL:`` prefix (the shard's name replaces it)."""
    return re.sub(r"^store \S+: ", "", msg)


def _planner(dbapi_conn: Any, _record: Any) -> None:
    """Coordinator sessions: aggregate per partition (pushed to the shard), joins per partition."""
    with dbapi_conn.cursor() as cur:
        cur.execute("SET enable_partitionwise_aggregate = on")
        cur.execute("SET enable_partitionwise_join = on")


def listed(conn: Connection) -> list[Any]:
    """The rows of ``store_shards`` (none before migration 0022, on SQLite, or on one server)."""
    if conn.dialect.name != "postgresql" or not conn.execute(
            text("SELECT to_regclass('store_shards') IS NOT NULL")).scalar():
        return []
    return list(conn.execute(text("SELECT shard, server, location, schema_name FROM store_shards ORDER BY shard")))


def layout(conn: Connection) -> Layout | None:
    """The store's shards, or None on one server (cached per engine; `db shard` resets it)."""
    engine = conn.engine
    if engine in _LAYOUTS:
        lay = _LAYOUTS[engine]
    else:
        rows = listed(conn)
        lay = load_layout(conn, rows) if rows else None
        _LAYOUTS[engine] = lay
        if lay is not None and not event.contains(engine, "connect", _planner):
            event.listen(engine, "connect", _planner)
    if lay is not None and not conn.connection.info.get("gpu_audit_planner"):
        _planner(conn.connection.dbapi_connection, None)
        conn.connection.info["gpu_audit_planner"] = True
    return lay


def forget(engine: Engine) -> None:
    """Drop the cached layout (after `db shard` changed it)."""
    lay = _LAYOUTS.pop(engine, None)
    for s in lay.shards if lay else ():
        s.engine.dispose()


def fdw_options(arr: Sequence[str] | None) -> dict[str, str]:
    return dict(o.split("=", 1) for o in arr or ())


def load_layout(conn: Connection, rows: list[Any], *, check: bool = True) -> Layout:
    """The layout of ``store_shards``'s rows, with a direct connection per shard. ``check``: every per-GPU
    table has its n foreign partitions (a missing one would make reads through the coordinator partial)."""
    from auditor.store import meta

    store_id = meta.get(conn, "store_id") or ""
    rev = conn.execute(text("SELECT version_num FROM alembic_version")).scalar()
    shards = []
    for r in rows:
        found = conn.execute(text(
            "SELECT s.srvoptions, m.umoptions FROM pg_foreign_server s LEFT JOIN pg_user_mappings m ON m.srvid = "
            "s.oid AND m.usename IN (current_user, 'public') WHERE s.srvname = :n ORDER BY m.usename = 'public' "
            "LIMIT 1"), {"n": r.server}).first()
        if found is None:
            raise StoreError(f"shard {r.shard} ({r.location}): foreign server {r.server} is missing on the "
                             "coordinator: run `gpu-audit db shard` again")
        srv, um = fdw_options(found[0]), fdw_options(found[1])
        url = URL.create("postgresql+psycopg", username=um.get("user"), password=um.get("password"),
                         host=srv.get("host"), port=int(srv["port"]) if srv.get("port") else None,
                         database=srv.get("dbname"),
                         query={**{k: srv[k] for k in SERVER_OPTS if k in srv},
                                "options": f"-csearch_path={r.schema_name}"})
        shards.append(Shard(r.shard, r.server, r.location, engine(url), f"{store_id}:{r.shard}", rev))
        _NAMES[r.server] = str(shards[-1])
    for table in SHARDED if check else ():
        have = conn.execute(text("SELECT count(*) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid WHERE "
                                 "i.inhparent = to_regclass(:t) AND c.relkind = 'f'"), {"t": table}).scalar()
        if have != len(rows):
            raise StoreError(f"the coordinator's {table} has {have} of its {len(rows)} foreign partitions: run "
                             "`gpu-audit db shard` again with the shard URLs")
    return Layout(store_id, shards)


def engine(url: URL) -> Engine:
    """An engine on a shard's own tables (its password registered as a secret: never printed)."""
    from sqlalchemy import create_engine

    from auditor import jsonsafe
    from auditor.logs import register_secret

    register_secret(url.password if isinstance(url.password, str) else None)
    return create_engine(url, pool_pre_ping=True, json_serializer=jsonsafe.dumps)


# -- routing ------------------------------------------------------------------------------------------------

def route(conn: Connection, lay: Layout, ids: Iterable[int]) -> dict[int, int]:
    """Shard number of each GPU id: the hash partition PostgreSQL itself routes it to (asked once per id)."""
    want = set(ids)
    with lay.lock:
        missing = sorted(want - lay.routes.keys())
    if missing:
        got = conn.exec_driver_sql(
            "SELECT u.id, k.r FROM unnest(%s::int[]) u(id) CROSS JOIN generate_series(0, %s) k(r) "
            "WHERE satisfies_hash_partition('gpu_buckets'::regclass, %s, k.r, u.id)",
            (missing, lay.n - 1, lay.n)).all()
        with lay.lock:
            lay.routes.update((g, r + 1) for g, r in got)
    return {g: lay.routes[g] for g in want}


def route_sql(lay: Layout, k: int, col: str) -> str:
    """Rows of shard ``k`` (1-based) by column ``col`` (NULL goes to shard 1, as PostgreSQL routes it)."""
    return f"satisfies_hash_partition('gpu_buckets'::regclass, {lay.n}, {k - 1}, {col})"


@contextmanager
def committed(conn: Connection) -> Iterator[Connection]:
    """A transaction of its own on the coordinator, committed at once (before any shard commits what refers to
    it: GPU ids, and the labels flag the judging reads)."""
    with conn.engine.connect() as other, other.begin():
        yield other


# -- writes -------------------------------------------------------------------------------------------------

GPU_COLS = "id, cluster, host, gpu_index, gpu_instance, uuid, model, has_jobs"


def _sync_gpus(conn: Connection, sconn: Connection, lay: Layout, ids: list[int]) -> None:
    """The shard's copy of its GPUs' telemetry_gpus rows (what its ingest, judging and roll-ups join)."""
    with lay.lock:
        need = [g for g in ids if g not in lay.synced]
    if not need:
        return
    rows = conn.exec_driver_sql(f"SELECT {GPU_COLS} FROM telemetry_gpus WHERE id = ANY(%s)", (need,)).all()
    sconn.exec_driver_sql(f"INSERT INTO telemetry_gpus ({GPU_COLS}) VALUES (%s, %s, %s, %s, %s, %s, %s, %s) "
                          "ON CONFLICT (id) DO UPDATE SET has_jobs = GREATEST(telemetry_gpus.has_jobs, "
                          "excluded.has_jobs)", [tuple(r) for r in rows])
    with lay.lock:
        lay.synced.update(r[0] for r in rows)


def write_buckets(conn: Connection, lay: Layout, buckets: list[Any], gids: list[int],
                  store_rows: Callable[[Connection, list[Any], list[int]], list[tuple]]) -> int:
    """A batch of buckets (their telemetry GPU ids resolved and committed on the coordinator) split by shard,
    each part written by ingest's own path (``store_rows``) in a transaction on its shard. The GPUs that
    got labelled rows are flagged on the coordinator (committed) before the shard commits them, so the
    judging never reads a labelled row of a GPU flagged unlabelled."""
    where = route(conn, lay, gids)
    parts: dict[int, tuple[list[Any], list[int]]] = {}
    for g, b in zip(gids, buckets, strict=True):
        part = parts.get(where[g])
        if part is None:
            part = parts[where[g]] = ([], [])
        part[0].append(b)
        part[1].append(g)
    n = 0
    for k in sorted(parts):
        bs, gs = parts[k]
        with lay.shards[k - 1].begin() as sconn:
            _sync_gpus(conn, sconn, lay, sorted(set(gs)))
            rows = store_rows(sconn, bs, gs)
            labelled = sorted({r[0] for r in rows if r[2]})
            if labelled:
                with committed(conn) as c:
                    c.exec_driver_sql("UPDATE telemetry_gpus SET has_jobs = 1 WHERE id = ANY(%s) AND has_jobs = 0",
                                      (labelled,))
            n += len(rows)
    return n


def on_each(store: Store, work: Callable[[Connection], Any]) -> list[Any]:
    """``work`` in a committed transaction on each shard at once (one thread per shard: the driver waits on
    the servers without the GIL), or on the store itself when it is not sharded; the results in shard
    order. The first failure is raised, naming its shard."""
    with store.engine.connect() as conn:
        lay = layout(conn)
    if lay is None:
        with store.begin() as conn:
            return [work(conn)]

    def one(shard: Shard) -> Any:
        with shard.begin() as sconn:
            return work(sconn)

    return each_shard(lay, one)


def each_shard(lay: Layout, work: Callable[[Shard], Any]) -> list[Any]:
    """``work(shard)`` for every shard at once (a thread each), results in shard order; the first failure is
    raised as one line naming its shard."""

    def one(shard: Shard) -> Any:
        try:
            if not shard.checked:
                with shard.begin():
                    pass
            return work(shard)
        except StoreError as exc:
            raise StoreError(f"{shard}: {strip_store(str(exc))}") from None
        except SQLAlchemyError as exc:
            raise StoreError(f"{shard}: {first_line(exc)}") from None

    with ThreadPoolExecutor(lay.n) as pool:
        futures = [pool.submit(one, s) for s in lay.shards]
        return [f.result() for f in futures]


# -- the judging, shipped -----------------------------------------------------------------------------------

def _temp_ddl(conn: Connection, table: str) -> list[str]:
    """CREATE statements that rebuild the temporary table ``table`` (columns, primary key, indexes)."""
    oid = conn.execute(text(f"SELECT to_regclass('pg_temp.{table}')::oid")).scalar()
    if oid is None:
        return []
    cols = conn.execute(text("SELECT attname, format_type(atttypid, atttypmod), attnotnull FROM pg_attribute "
                             "WHERE attrelid = :o AND attnum > 0 AND NOT attisdropped ORDER BY attnum"), {"o": oid})
    defs = [f'"{c}" {t}{" NOT NULL" if nn else ""}' for c, t, nn in cols]
    pk = conn.execute(text("SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conrelid = :o AND "
                           "contype = 'p'"), {"o": oid}).scalar()
    out = [f"CREATE TEMPORARY TABLE {table} ({', '.join(defs + ([pk] if pk else []))})"]
    for (idx,) in conn.execute(text("SELECT pg_get_indexdef(indexrelid) FROM pg_index WHERE indrelid = :o AND NOT "
                                    "indisprimary"), {"o": oid}):
        out.append(re.sub(r"^CREATE (UNIQUE )?INDEX \S+ ON \S+", rf"CREATE \1INDEX ON {table}", idx))
    return out


def copy_out(conn: Connection, query: str) -> bytes:
    buf = bytearray()
    with conn.connection.dbapi_connection.cursor() as cur, cur.copy(f"COPY ({query}) TO STDOUT (FORMAT BINARY)") as cp:
        for chunk in cp:
            buf += chunk
    return bytes(buf)


def _copy_in(conn: Connection, table: str, data: bytes) -> None:
    with conn.connection.dbapi_connection.cursor() as cur, cur.copy(f"COPY {table} FROM STDIN (FORMAT BINARY)") as cp:
        cp.write(data)


def run_shipped(conn: Connection, lay: Layout, ship: dict[str, str | None], work: Callable[[Connection], None],
                out: str, cols: Sequence[str], where: str) -> dict[str, Any]:
    """Run ``work`` (statements that read the temporary tables of ``ship`` and the shard's own per-GPU tables
    and write ``out``) on every shard at once, then stream the rows of ``out`` matching ``where`` into the
    coordinator's ``out``. ``ship``: temporary table -> its GPU column (each shard gets the rows of its
    GPUs; a NULL GPU goes to shard 1) or None (every shard gets all rows). Nothing is committed on a shard:
    its transaction only holds the temporary tables and the rows ``work`` wrote until they are read.
    Returns the seconds spent: reading what is shipped, each shard's part (loading and ``work``), the gathering."""
    t0 = time.perf_counter()
    ddl = {t: _temp_ddl(conn, t) for t in ship}
    ddl = {t: d for t, d in ddl.items() if d}
    data = {(t, s.number): copy_out(conn, f"SELECT * FROM {t}" + (
        f" WHERE {route_sql(lay, s.number, ship[t])}" if ship[t] else "")) for t in ddl for s in lay.shards}
    names = ", ".join(cols)
    held: list[tuple[Shard, Connection, Any]] = []
    spent: dict[str, Any] = {"read_s": time.perf_counter() - t0, "shards_s": {}}

    def one(shard: Shard) -> tuple[Shard, Connection, Any]:
        t = time.perf_counter()
        try:
            sconn = shard.engine.connect()
        except SQLAlchemyError as exc:
            raise StoreError(f"{shard}: {first_line(exc)}") from None
        try:
            if not shard.checked:
                shard._identify(sconn)
            tx = sconn.begin()
            for table, stmts in ddl.items():
                for stmt in stmts:
                    sconn.execute(text(stmt))
                _copy_in(sconn, table, data[(table, shard.number)])
                sconn.execute(text(f"ANALYZE {table}"))
            work(sconn)
            spent["shards_s"][shard.number] = time.perf_counter() - t
            return shard, sconn, tx
        except StoreError as exc:
            sconn.close()
            raise StoreError(f"{shard}: {strip_store(str(exc))}") from None
        except SQLAlchemyError as exc:
            sconn.close()
            raise StoreError(f"{shard}: {first_line(exc)}") from None
        except BaseException:
            sconn.close()
            raise

    try:
        with ThreadPoolExecutor(lay.n) as pool:
            futures = [pool.submit(one, s) for s in lay.shards]
            errors = []
            for f in futures:
                try:
                    held.append(f.result())
                except Exception as exc:
                    errors.append(exc)
            if errors:
                raise errors[0]
        t = time.perf_counter()
        dst = conn.connection.dbapi_connection
        for shard, sconn, _tx in held:
            try:
                with sconn.connection.dbapi_connection.cursor() as src_cur, src_cur.copy(
                        f"COPY (SELECT {names} FROM {out} WHERE {where}) TO STDOUT (FORMAT BINARY)") as src, \
                        dst.cursor() as dst_cur, dst_cur.copy(f"COPY {out} ({names}) FROM STDIN (FORMAT BINARY)") as cp:
                    for chunk in src:
                        cp.write(chunk)
            except Exception as exc:
                raise StoreError(f"{shard}: {first_line(exc)}") from None
        spent["gather_s"] = time.perf_counter() - t
    finally:
        for _shard, sconn, tx in held:
            try:
                tx.rollback()
            finally:
                sconn.close()
    return spent
