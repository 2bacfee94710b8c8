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
  judged there by the audit's own statements, and the usage rows streamed back (:func:`judge`).

A shard that cannot be reached fails the statement or the step that needs it, with its number and
location: an audit fails whole, never with a partial total.
"""

from __future__ import annotations

import re
import secrets
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote
from weakref import WeakKeyDictionary

from sqlalchemy import Connection, Engine, event, text
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import SQLAlchemyError

from auditor.errors import StoreError
from auditor.store.engine import MESSAGE_REWRITES, Store

#: the per-GPU tables, hash-partitioned on gpu_id over the shards (a new per-GPU table belongs here)
SHARDED = ("gpu_buckets", "judged_hours", "judged_dirty")
#: per-shard tables the coordinator sees as a view of what every shard holds
SETS = "judged_sets"
#: one `db shard` at a time
_LOCK = 7301530154
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
#: libpq options of a shard URL that go into the foreign server (besides host, port and dbname)
_SERVER_OPTS = ("sslmode", "sslrootcert", "sslcert", "sslkey", "sslcrl", "connect_timeout", "target_session_attrs")


def _ident(name: str) -> str:
    if not _NAME.match(name):
        raise StoreError(f"{name[:70]!r} is not a plain SQL name ([A-Za-z_][A-Za-z0-9_]*)")
    return f'"{name}"'


def _lit(value: str) -> str:
    return "'" + str(value).replace("'", "''") + "'"


@dataclass
class Shard:
    """One shard: its number, foreign server, printable location and direct connection."""

    number: int
    server: str
    location: str
    store: Store
    mark: str  # store_meta.shard_of the shard must hold
    revision: str | None  # the coordinator's migration revision the shard must be at
    checked: bool = False

    def __str__(self) -> str:
        return f"shard {self.number} ({self.location})"

    @contextmanager
    def begin(self) -> Iterator[Connection]:
        """A transaction on the shard's own tables; every failure becomes one line naming the shard."""
        try:
            with self.store.engine.connect() as conn:
                if not self.checked:
                    self._identify(conn)
                with conn.begin():
                    yield conn
        except StoreError as exc:
            raise StoreError(f"{self}: {_strip_store(str(exc))}") from None
        except SQLAlchemyError as exc:
            raise StoreError(f"{self}: {_first_line(exc)}") from None

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


MESSAGE_REWRITES.append(name_servers)


def _first_line(exc: BaseException) -> str:
    from auditor.logs import scrub

    msg = str(getattr(exc, "orig", None) or exc).strip()
    return scrub(msg.splitlines()[0]) if msg else type(exc).__name__


def _strip_store(msg: str) -> str:
    """A shard Store's own error without its ``store URL:`` prefix (the shard's name replaces it)."""
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
        lay = _load(conn, rows) if rows else None
        _LAYOUTS[engine] = lay
        if lay is not None:
            event.listen(engine, "connect", _planner)
    if lay is not None and not conn.connection.info.get("gpu_audit_planner"):
        _planner(conn.connection.dbapi_connection, None)
        conn.connection.info["gpu_audit_planner"] = True
    return lay


def forget(engine: Engine) -> None:
    """Drop the cached layout (after `db shard` changed it)."""
    lay = _LAYOUTS.pop(engine, None)
    for s in lay.shards if lay else ():
        s.store.engine.dispose()


def _options(arr: Sequence[str] | None) -> dict[str, str]:
    return dict(o.split("=", 1) for o in arr or ())


def _load(conn: Connection, rows: list[Any]) -> Layout:
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
        srv, um = _options(found[0]), _options(found[1])
        url = URL.create("postgresql+psycopg", username=um.get("user"), password=um.get("password"),
                         host=srv.get("host"), port=int(srv["port"]) if srv.get("port") else None,
                         database=srv.get("dbname"),
                         query={**{k: srv[k] for k in _SERVER_OPTS if k in srv},
                                "options": f"-csearch_path={r.schema_name}"})
        shards.append(Shard(r.shard, r.server, r.location, Store(_engine(url)), f"{store_id}:{r.shard}", rev))
        _NAMES[r.server] = str(shards[-1])
    return Layout(store_id, shards)


def _engine(url: URL) -> Engine:
    from auditor.store.engine import make_engine

    return make_engine(url.render_as_string(hide_password=False))


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


def _route_sql(lay: Layout, k: int, col: str) -> str:
    """Rows of shard ``k`` (1-based) by column ``col`` (NULL goes to shard 1, as PostgreSQL routes it)."""
    return f"satisfies_hash_partition('gpu_buckets'::regclass, {lay.n}, {k - 1}, {col})"


@contextmanager
def committed(conn: Connection) -> Iterator[Connection]:
    """A transaction of its own on the coordinator, committed at once (before any shard commits what refers to
    it: GPU ids, and the labels flag the judging reads)."""
    with conn.engine.connect() as other, other.begin():
        yield other


# -- writes -------------------------------------------------------------------------------------------------

_GPU_COLS = "id, cluster, host, gpu_index, gpu_instance, uuid, model, has_jobs"


def _sync_gpus(conn: Connection, sconn: Connection, lay: Layout, ids: list[int]) -> None:
    """The shard's copy of its GPUs' telemetry_gpus rows (what its ingest, judging and roll-ups join)."""
    with lay.lock:
        need = [g for g in ids if g not in lay.synced]
    if not need:
        return
    rows = conn.exec_driver_sql(f"SELECT {_GPU_COLS} FROM telemetry_gpus WHERE id = ANY(%s)", (need,)).all()
    sconn.exec_driver_sql(f"INSERT INTO telemetry_gpus ({_GPU_COLS}) VALUES (%s, %s, %s, %s, %s, %s, %s, %s) "
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
            raise StoreError(f"{shard}: {_strip_store(str(exc))}") from None
        except SQLAlchemyError as exc:
            raise StoreError(f"{shard}: {_first_line(exc)}") from None

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


def _copy_out(conn: Connection, query: str) -> bytes:
    buf = bytearray()
    with conn.connection.dbapi_connection.cursor() as cur, cur.copy(f"COPY ({query}) TO STDOUT (FORMAT BINARY)") as cp:
        for chunk in cp:
            buf += chunk
    return bytes(buf)


def _copy_in(conn: Connection, table: str, data: bytes) -> None:
    with conn.connection.dbapi_connection.cursor() as cur, cur.copy(f"COPY {table} FROM STDIN (FORMAT BINARY)") as cp:
        cp.write(data)


def judge(conn: Connection, lay: Layout, ship: dict[str, str | None], work: Callable[[Connection], None],
          out: str, cols: Sequence[str], where: str) -> None:
    """Run ``work`` (statements that read the temporary tables of ``ship`` and the shard's own per-GPU tables
    and write ``out``) on every shard at once, then stream the rows of ``out`` matching ``where`` into the
    coordinator's ``out``. ``ship``: temporary table -> its GPU column (each shard gets the rows of its
    GPUs; a NULL GPU goes to shard 1) or None (every shard gets all rows). Nothing is committed on a shard:
    its transaction only holds the temporary tables and the rows ``work`` wrote until they are read."""
    ddl = {t: _temp_ddl(conn, t) for t in ship}
    ddl = {t: d for t, d in ddl.items() if d}
    data = {(t, s.number): _copy_out(conn, f"SELECT * FROM {t}" + (
        f" WHERE {_route_sql(lay, s.number, ship[t])}" if ship[t] else "")) for t in ddl for s in lay.shards}
    names = ", ".join(cols)
    held: list[tuple[Shard, Connection, Any]] = []

    def one(shard: Shard) -> tuple[Shard, Connection, Any]:
        try:
            sconn = shard.store.engine.connect()
        except SQLAlchemyError as exc:
            raise StoreError(f"{shard}: {_first_line(exc)}") from None
        try:
            if not shard.checked:
                shard._identify(sconn)
            tx = sconn.begin()
            for t, stmts in ddl.items():
                for stmt in stmts:
                    sconn.execute(text(stmt))
                _copy_in(sconn, t, data[(t, shard.number)])
                sconn.execute(text(f"ANALYZE {t}"))
            work(sconn)
            return shard, sconn, tx
        except StoreError as exc:
            sconn.close()
            raise StoreError(f"{shard}: {_strip_store(str(exc))}") from None
        except SQLAlchemyError as exc:
            sconn.close()
            raise StoreError(f"{shard}: {_first_line(exc)}") from None
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
        dst = conn.connection.dbapi_connection
        for shard, sconn, _tx in held:
            try:
                with sconn.connection.dbapi_connection.cursor() as src_cur, src_cur.copy(
                        f"COPY (SELECT {names} FROM {out} WHERE {where}) TO STDOUT (FORMAT BINARY)") as src, \
                        dst.cursor() as dst_cur, dst_cur.copy(f"COPY {out} ({names}) FROM STDIN (FORMAT BINARY)") as cp:
                    for chunk in src:
                        cp.write(chunk)
            except Exception as exc:
                raise StoreError(f"{shard}: {_first_line(exc)}") from None
    finally:
        for _shard, sconn, tx in held:
            try:
                tx.rollback()
            finally:
                sconn.close()


# -- setting up: `gpu-audit db shard` ------------------------------------------------------------------------

@dataclass
class Target:
    """One shard URL, parsed (the password stays in ``url`` only)."""

    url: URL
    schema: str

    @property
    def location(self) -> str:
        u = self.url
        where = f"{u.host or 'localhost'}:{u.port or 5432}/{u.database}"
        return where if self.schema == "public" else f"{where} schema {self.schema}"


def parse_target(raw: str) -> Target:
    """A shard URL (``postgresql+psycopg://USER@HOST:PORT/DB``, optionally ``?options=-csearch_path=SCHEMA``);
    errors never show it (it may hold a password)."""
    from auditor.config.base import check_store_url
    from auditor.logs import register_secret

    try:
        check_store_url(raw, "shard URL")
    except ValueError as exc:
        raise StoreError(str(exc)) from None
    u = make_url(raw.strip())
    register_secret(u.password if isinstance(u.password, str) else None)
    if u.get_backend_name() != "postgresql" or not u.database:
        raise StoreError("a shard URL names a PostgreSQL database: postgresql+psycopg://USER@HOST:PORT/DB")
    opts = unquote(str(u.query.get("options", "")))
    m = re.search(r"-c\s*search_path=([^\s,]+)", opts)
    schema = m.group(1).strip('"') if m else "public"
    _ident(schema)
    return Target(u, schema)


def _tables(sconn: Connection, schema: str) -> int:
    return int(sconn.execute(text("SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                                  "WHERE n.nspname = :s AND c.relkind IN ('r', 'p', 'v', 'f')"),
                             {"s": schema}).scalar() or 0)


def _prepare_shard(t: Target, k: int, store_id: str) -> str:
    """Make the database of ``t`` shard ``k`` of the store: a fresh (empty) schema is migrated and marked; one
    already marked as this shard is migrated to head; anything else is refused. Returns what was done."""
    from auditor.store import meta

    s = Store(_engine(t.url))
    name = f"shard {k} ({t.location})"
    try:
        try:
            with s.engine.connect() as c:
                has_meta = c.execute(text("SELECT to_regclass('store_meta') IS NOT NULL")).scalar()
                mark = meta.get(c, "shard_of") if has_meta else None
                schema_exists = c.execute(text("SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = :s)"),
                                          {"s": t.schema}).scalar()
                others = _tables(c, t.schema) if schema_exists else 0
                owner = meta.get(c, "store_id") if has_meta else None
        except SQLAlchemyError as exc:
            raise StoreError(f"{name}: {_first_line(exc)}") from None
        want = f"{store_id}:{k}"
        if mark == want:
            done = "already shard of this store"
        elif others:
            why = (f"it is shard {mark.split(':')[-1]} of {'this' if mark.startswith(store_id) else 'another'} store"
                   if mark else "it is a gpu-audit store of its own" if owner or has_meta
                   else f"schema {t.schema} holds {others} tables gpu-audit did not make")
            raise StoreError(f"{name}: refused: {why}; a shard must be an empty database or schema, or one "
                             f"`gpu-audit db shard` made as shard {k} of this store")
        elif not schema_exists:
            raise StoreError(f"{name}: schema {t.schema} does not exist (create it, empty, first)")
        else:
            done = "created"
        s.upgrade()
        with s.begin() as c:
            if mark != want:
                meta.put(c, "shard_of", want)
        return done
    finally:
        s.engine.dispose()


def setup(store: Store, raw_urls: Sequence[str]) -> dict[str, Any]:
    """`gpu-audit db shard`: make the databases of ``raw_urls`` shards 1..n of ``store`` (idempotent: a second
    run with the same URLs checks them, updates host, port and password, and changes nothing else), and turn
    the coordinator's per-GPU tables into foreign partitions, moving any rows they hold to their shards."""
    from auditor.store import meta
    from auditor.timeutil import utcnow

    if store.dialect != "postgresql":
        raise StoreError("sharding needs a PostgreSQL store (store.url postgresql+psycopg://...); SQLite is one file")
    if not raw_urls:
        raise StoreError("no shard URLs given")
    targets = [parse_target(u) for u in raw_urls]
    if len({t.location for t in targets}) != len(targets):
        raise StoreError("the same shard is listed twice")
    store.require_current()
    with store.begin() as conn:
        rows = listed(conn)
        if rows and len(rows) != len(targets):
            raise StoreError(f"the store is sharded over {len(rows)} shards, not {len(targets)}: changing the number "
                             "of shards would move GPUs between shards, which `db shard` does not do")
        store_id = meta.get(conn, "store_id")
        if store_id is None:
            store_id = secrets.token_hex(8)
            meta.put(conn, "store_id", store_id)
    report: dict[str, Any] = {"shards": [], "moved_rows": 0}
    for k, t in enumerate(targets, 1):
        done = _prepare_shard(t, k, store_id)
        report["shards"].append({"shard": k, "location": t.location, "state": done})
    forget(store.engine)
    with store.begin() as conn:
        conn.execute(text(f"SELECT pg_advisory_xact_lock({_LOCK})"))
        try:
            conn.execute(text("CREATE EXTENSION IF NOT EXISTS postgres_fdw"))
        except SQLAlchemyError as exc:
            raise StoreError(f"CREATE EXTENSION postgres_fdw on the coordinator: {_first_line(exc)} (a superuser "
                             "can create it once: CREATE EXTENSION postgres_fdw)") from None
        now = int(utcnow().timestamp())
        for k, t in enumerate(targets, 1):
            server = f"gpu_audit_shard{k}_{store_id[:8]}"
            _server(conn, server, t)
            conn.execute(text(
                "INSERT INTO store_shards (shard, server, location, schema_name, added_ts) VALUES (:k, :s, :l, :n, :t) "
                "ON CONFLICT (shard) DO UPDATE SET server = excluded.server, location = excluded.location, "
                "schema_name = excluded.schema_name"), {"k": k, "s": server, "l": t.location, "n": t.schema, "t": now})
        report["moved_rows"] = _convert(conn, len(targets))
    forget(store.engine)
    return report


def _server(conn: Connection, server: str, t: Target) -> None:
    """The foreign server and this role's user mapping for shard ``t`` (options updated when they exist)."""
    u = t.url
    opts = {"host": u.host or "localhost", "port": str(u.port or 5432), "dbname": str(u.database),
            **{k: str(v) for k, v in u.query.items() if k in _SERVER_OPTS},
            "fetch_size": "10000", "async_capable": "true", "batch_size": "1000"}
    exists = conn.execute(text("SELECT srvoptions FROM pg_foreign_server WHERE srvname = :s"), {"s": server}).first()
    if exists is None:
        conn.execute(text(f"CREATE SERVER {_ident(server)} FOREIGN DATA WRAPPER postgres_fdw OPTIONS ("
                          + ", ".join(f"{k} {_lit(v)}" for k, v in opts.items()) + ")"))
    else:
        have = _options(exists[0])
        sets = [f"{'SET' if k in have else 'ADD'} {k} {_lit(v)}" for k, v in opts.items() if have.get(k) != v]
        if sets:
            conn.execute(text(f"ALTER SERVER {_ident(server)} OPTIONS ({', '.join(sets)})"))
    um = {"user": u.username or ""}
    if u.password:
        um["password"] = str(u.password)
    mapped = conn.execute(text("SELECT umoptions FROM pg_user_mappings WHERE srvname = :s AND usename = "
                               "current_user"), {"s": server}).first()
    # the password goes into the statement as a literal (DDL takes no parameters); statements are never logged
    if mapped is None:
        conn.exec_driver_sql(f"CREATE USER MAPPING FOR CURRENT_USER SERVER {_ident(server)} OPTIONS ("
                             + ", ".join(f"{k} {_lit(v)}" for k, v in um.items()) + ")")
    else:
        have = _options(mapped[0])
        sets = [f"{'SET' if k in have else 'ADD'} {k} {_lit(v)}" for k, v in um.items() if have.get(k) != v]
        if sets:
            conn.exec_driver_sql(f"ALTER USER MAPPING FOR CURRENT_USER SERVER {_ident(server)} OPTIONS "
                                 f"({', '.join(sets)})")


def _strategy(conn: Connection, table: str) -> str | None:
    """'h' (hash: already sharded), 'r' (weekly range), None (a plain table) or '' (not a table: a view)."""
    row = conn.execute(text("SELECT c.relkind, p.partstrat FROM pg_class c LEFT JOIN pg_partitioned_table p ON "
                            "p.partrelid = c.oid WHERE c.oid = to_regclass(:t)"), {"t": table}).first()
    if row is None or row[0] not in ("r", "p"):
        return ""
    return row[1]


def _convert(conn: Connection, n: int) -> int:
    """Turn each table of SHARDED that is still local into a hash-partitioned table of foreign partitions,
    moving its rows to their shards (buckets; the judged aggregate is not moved: the shards rebuild it at
    the next audit), and judged_sets into a view. Idempotent; returns the bucket rows moved."""
    rows = listed(conn)
    lay = _load(conn, rows)
    moved = 0
    for table in SHARDED:
        if _strategy(conn, table) == "h":
            continue
        old = f"{table}_unsharded"
        conn.execute(text(f"ALTER TABLE {table} RENAME TO {old}"))
        conn.execute(text(f"CREATE TABLE {table} (LIKE {old} INCLUDING DEFAULTS INCLUDING COMMENTS) "
                          "PARTITION BY HASH (gpu_id)"))
        comment = conn.execute(text("SELECT obj_description(to_regclass(:t), 'pg_class')"), {"t": old}).scalar()
        if comment:
            conn.execute(text(f"COMMENT ON TABLE {table} IS {_lit(comment)}"))
        for s, r in zip(lay.shards, rows, strict=True):
            conn.execute(text(
                f"CREATE FOREIGN TABLE {table}_s{s.number} PARTITION OF {table} FOR VALUES WITH (MODULUS {n}, "
                f"REMAINDER {s.number - 1}) SERVER {_ident(s.server)} OPTIONS (schema_name {_lit(r.schema_name)}, "
                f"table_name {_lit(table)})"))
        if table == "gpu_buckets":
            moved = _move_buckets(conn, lay, old)
        conn.execute(text(f"DROP TABLE {old} CASCADE"))
    if _strategy(conn, SETS) != "":
        conn.execute(text(f"DROP TABLE {SETS}"))
        for s, r in zip(lay.shards, rows, strict=True):
            conn.execute(text(f"DROP FOREIGN TABLE IF EXISTS {SETS}_s{s.number}"))
            conn.execute(text(f"CREATE FOREIGN TABLE {SETS}_s{s.number} (ths VARCHAR(16) NOT NULL, from_hour INTEGER "
                              f"NOT NULL, built_ts INTEGER NOT NULL) SERVER {_ident(s.server)} OPTIONS (schema_name "
                              f"{_lit(r.schema_name)}, table_name {_lit(SETS)})"))
        union = " UNION ALL ".join(f"SELECT * FROM {SETS}_s{s.number}" for s in lay.shards)
        conn.execute(text(f"CREATE VIEW {SETS} AS SELECT ths, MAX(from_hour) AS from_hour, MIN(built_ts) AS built_ts "
                          f"FROM ({union}) s GROUP BY ths HAVING COUNT(*) = {n}"))
        conn.execute(text(f"COMMENT ON VIEW {SETS} IS {_lit('The threshold set every shard holds (sharded store).')}"))
    for s in lay.shards:
        s.store.engine.dispose()
    return moved


def _move_buckets(conn: Connection, lay: Layout, old: str) -> int:
    """The rows of the old local table to their shards (binary COPY, one stream per shard), with the
    telemetry_gpus copies of their GPUs; a shard's telemetry tables are emptied first, so a run that failed
    before the coordinator committed is simply done again."""
    from auditor.store import partitions

    total = 0
    cols = [r[0] for r in conn.execute(text(
        "SELECT attname FROM pg_attribute WHERE attrelid = to_regclass(:t) AND attnum > 0 AND NOT attisdropped "
        "ORDER BY attnum"), {"t": old})]
    names = ", ".join(cols)
    for s in lay.shards:
        mine = _route_sql(lay, s.number, "gpu_id")
        weeks = [w for (w,) in conn.execute(text(f"SELECT DISTINCT bucket_ts / 604800 * 604800 FROM {old} "
                                                 f"WHERE {mine}"))]
        gpus = _copy_out(conn, f"SELECT {_GPU_COLS} FROM telemetry_gpus WHERE {_route_sql(lay, s.number, 'id')}")
        with s.begin() as sconn:
            for t in (*SHARDED, SETS):
                sconn.execute(text(f"DELETE FROM {t}"))
            sconn.execute(text("DELETE FROM telemetry_gpus"))
            with sconn.connection.dbapi_connection.cursor() as cur, cur.copy(
                    f"COPY telemetry_gpus ({_GPU_COLS}) FROM STDIN (FORMAT BINARY)") as cp:
                cp.write(gpus)
            partitions.ensure_weeks(sconn, [w + d for w in weeks for d in (0, 604799)])
            with conn.connection.dbapi_connection.cursor() as src_cur, src_cur.copy(
                    f"COPY (SELECT {names} FROM {old} WHERE {mine}) TO STDOUT (FORMAT BINARY)") as src, \
                    sconn.connection.dbapi_connection.cursor() as dst_cur, dst_cur.copy(
                    f"COPY gpu_buckets ({names}) FROM STDIN (FORMAT BINARY)") as dst:
                for chunk in src:
                    dst.write(chunk)
            total += int(sconn.execute(text("SELECT count(*) FROM gpu_buckets")).scalar() or 0)
            sconn.execute(text("ANALYZE gpu_buckets"))
            sconn.execute(text("ANALYZE telemetry_gpus"))
    return total


def upgrade(store: Store, revision: str = "head") -> None:
    """`db upgrade` of a sharded store: the shards first (their real tables), then the coordinator (whose
    foreign partitions follow a column added to their parent), then any per-GPU table a migration added."""
    with store.engine.connect() as conn:
        rows = listed(conn)
        lay = _load(conn, rows) if rows else None
    for s in lay.shards if lay else ():
        try:
            s.store.upgrade(revision)
        except StoreError as exc:
            raise StoreError(f"{s}: {_strip_store(str(exc))}") from None
        finally:
            s.store.engine.dispose()
    store.upgrade(revision)
    if lay is not None and revision == "head":
        with store.begin() as conn:
            conn.execute(text(f"SELECT pg_advisory_xact_lock({_LOCK})"))
            _convert(conn, lay.n)
    forget(store.engine)


def sizes(store: Store) -> list[dict[str, Any]]:
    """Per server (the coordinator, then each shard): the rows of the per-GPU tables and the bytes of every
    table of the store's schema there (exact counts: for `db shards` and the bench)."""
    q = ("SELECT COALESCE(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c WHERE c.relnamespace = "
         "current_schema()::regnamespace AND c.relkind IN ('r', 'm')")
    out = []
    with store.engine.connect() as conn:
        lay = layout(conn)
        out.append({"server": "coordinator", "location": store.redacted_url(), "bytes": int(conn.execute(text(q))
                                                                                             .scalar() or 0)})
        if lay is None:
            out[0].update({t: int(conn.execute(text(f"SELECT count(*) FROM {t}")).scalar() or 0) for t in SHARDED})
            return out
    for s in lay.shards:
        with s.begin() as sconn:
            row = {"server": f"shard {s.number}", "location": s.location,
                   "bytes": int(sconn.execute(text(q)).scalar() or 0)}
            row.update({t: int(sconn.execute(text(f"SELECT count(*) FROM {t}")).scalar() or 0) for t in SHARDED})
            row["gpus"] = int(sconn.execute(text("SELECT count(*) FROM telemetry_gpus")).scalar() or 0)
            out.append(row)
    return out
