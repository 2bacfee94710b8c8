"""`gpu-audit db shard`, `db shards` and a sharded store's `db upgrade`: setting up and looking after the
layout :mod:`auditor.store.shards` describes (docs/scale-out.md)."""

from __future__ import annotations

import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from sqlalchemy import Connection, text
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import SQLAlchemyError

from auditor.errors import StoreError
from auditor.store.engine import Store
from auditor.store.messages import first_line
from auditor.store.shards import (
    GPU_COLS,
    LOCK,
    SERVER_OPTS,
    SETS,
    SHARDED,
    Layout,
    copy_out,
    engine,
    fdw_options,
    forget,
    ident,
    layout,
    listed,
    lit,
    load_layout,
    route_sql,
    strip_store,
)


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
    ident(schema)
    return Target(u, schema)


def _tables(sconn: Connection, schema: str) -> int:
    return int(sconn.execute(text("SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                                  "WHERE n.nspname = :s AND c.relkind IN ('r', 'p', 'v', 'f')"),
                             {"s": schema}).scalar() or 0)


def _inspect(t: Target, k: int, store_id: str) -> str:
    """Whether the database of ``t`` can be shard ``k`` of the store, changing nothing: "created" for an empty
    schema, "already shard of this store" for one marked as shard ``k``; anything else is refused."""
    from auditor.store import meta

    eng = engine(t.url)
    name = f"shard {k} ({t.location})"
    try:
        with eng.connect() as c:
            has_meta = c.execute(text("SELECT to_regclass('store_meta') IS NOT NULL")).scalar()
            mark = meta.get(c, "shard_of") if has_meta else None
            schema_exists = c.execute(text("SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = :s)"),
                                      {"s": t.schema}).scalar()
            others = _tables(c, t.schema) if schema_exists else 0
            owner = meta.get(c, "store_id") if has_meta else None
    except SQLAlchemyError as exc:
        raise StoreError(f"{name}: {first_line(exc)}") from None
    finally:
        eng.dispose()
    if mark == f"{store_id}:{k}":
        return "already shard of this store"
    if others:
        why = (f"it is shard {mark.split(':')[-1]} of {'this' if mark.startswith(store_id) else 'another'} store"
               if mark else "it is a gpu-audit store of its own" if owner or has_meta
               else f"schema {t.schema} holds {others} tables gpu-audit did not make")
        raise StoreError(f"{name}: refused: {why}; a shard must be an empty database or schema, or one "
                         f"`gpu-audit db shard` made as shard {k} of this store")
    if not schema_exists:
        raise StoreError(f"{name}: schema {t.schema} does not exist (create it, empty, first)")
    return "created"


def _prepare_shard(t: Target, k: int, store_id: str) -> None:
    """Migrate the (inspected) database of ``t`` to the coordinator's revision and mark it shard ``k``."""
    from auditor.store import meta

    s = Store(engine(t.url))
    try:
        s.upgrade()
        with s.begin() as c:
            meta.put(c, "shard_of", f"{store_id}:{k}")
    except StoreError as exc:
        raise StoreError(f"shard {k} ({t.location}): {strip_store(str(exc))}") from None
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
    states = [_inspect(t, k, store_id) for k, t in enumerate(targets, 1)]  # every shard, before one is changed
    for k, (t, state) in enumerate(zip(targets, states, strict=True), 1):
        _prepare_shard(t, k, store_id)
        report["shards"].append({"shard": k, "location": t.location, "state": state})
    forget(store.engine)
    with store.begin() as conn:
        conn.execute(text(f"SELECT pg_advisory_xact_lock({LOCK})"))
        try:  # in public where there is one: an extension dies with its schema, and takes every server with it
            public = conn.execute(text("SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = 'public')")).scalar()
            conn.execute(text("CREATE EXTENSION IF NOT EXISTS postgres_fdw" + (" SCHEMA public" if public else "")))
        except SQLAlchemyError as exc:
            raise StoreError(f"CREATE EXTENSION postgres_fdw on the coordinator: {first_line(exc)} (a superuser "
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
            **{k: str(v) for k, v in u.query.items() if k in SERVER_OPTS},
            "fetch_size": "10000", "async_capable": "true", "batch_size": "1000", "use_remote_estimate": "true"}
    exists = conn.execute(text("SELECT srvoptions FROM pg_foreign_server WHERE srvname = :s"), {"s": server}).first()
    if exists is None:
        conn.execute(text(f"CREATE SERVER {ident(server)} FOREIGN DATA WRAPPER postgres_fdw OPTIONS ("
                          + ", ".join(f"{k} {lit(v)}" for k, v in opts.items()) + ")"))
    else:
        have = fdw_options(exists[0])
        sets = [f"{'SET' if k in have else 'ADD'} {k} {lit(v)}" for k, v in opts.items() if have.get(k) != v]
        if sets:
            conn.execute(text(f"ALTER SERVER {ident(server)} OPTIONS ({', '.join(sets)})"))
    um = {"user": u.username or ""}
    if u.password:
        um["password"] = str(u.password)
    mapped = conn.execute(text("SELECT umoptions FROM pg_user_mappings WHERE srvname = :s AND usename = "
                               "current_user"), {"s": server}).first()
    # the password goes into the statement as a literal (DDL takes no parameters); statements are never logged
    if mapped is None:
        conn.exec_driver_sql(f"CREATE USER MAPPING FOR CURRENT_USER SERVER {ident(server)} OPTIONS ("
                             + ", ".join(f"{k} {lit(v)}" for k, v in um.items()) + ")")
    else:
        have = fdw_options(mapped[0])
        sets = [f"{'SET' if k in have else 'ADD'} {k} {lit(v)}" for k, v in um.items() if have.get(k) != v]
        if sets:
            conn.exec_driver_sql(f"ALTER USER MAPPING FOR CURRENT_USER SERVER {ident(server)} OPTIONS "
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
    the next audit), and judged_sets into a view. Idempotent, and it repairs: a foreign partition or the view
    that is missing (a foreign server dropped with its dependants) is made again. Returns the rows moved."""
    rows = listed(conn)
    lay = load_layout(conn, rows, check=False)
    moved = 0
    for table in SHARDED:
        old = None
        if _strategy(conn, table) != "h":
            old = f"{table}_unsharded"
            conn.execute(text(f"ALTER TABLE {table} RENAME TO {old}"))
            conn.execute(text(f"CREATE TABLE {table} (LIKE {old} INCLUDING DEFAULTS INCLUDING COMMENTS) "
                              "PARTITION BY HASH (gpu_id)"))
            comment = conn.execute(text("SELECT obj_description(to_regclass(:t), 'pg_class')"), {"t": old}).scalar()
            if comment:
                conn.execute(text(f"COMMENT ON TABLE {table} IS {lit(comment)}"))
        for s, r in zip(lay.shards, rows, strict=True):
            conn.execute(text(
                f"CREATE FOREIGN TABLE IF NOT EXISTS {table}_s{s.number} PARTITION OF {table} FOR VALUES WITH "
                f"(MODULUS {n}, REMAINDER {s.number - 1}) SERVER {ident(s.server)} OPTIONS (schema_name "
                f"{lit(r.schema_name)}, table_name {lit(table)})"))
        if old is not None:
            if table == "gpu_buckets":
                moved = _move_buckets(conn, lay, old)
            conn.execute(text(f"DROP TABLE {old} CASCADE"))
    if _strategy(conn, SETS) is None:  # still the plain table of one server
        conn.execute(text(f"DROP TABLE {SETS}"))
    for s, r in zip(lay.shards, rows, strict=True):
        conn.execute(text(f"CREATE FOREIGN TABLE IF NOT EXISTS {SETS}_s{s.number} (ths VARCHAR(16) NOT NULL, "
                          f"from_hour INTEGER NOT NULL, built_ts INTEGER NOT NULL) SERVER {ident(s.server)} OPTIONS "
                          f"(schema_name {lit(r.schema_name)}, table_name {lit(SETS)})"))
    union = " UNION ALL ".join(f"SELECT * FROM {SETS}_s{s.number}" for s in lay.shards)
    conn.execute(text(f"CREATE OR REPLACE VIEW {SETS} AS SELECT ths, MAX(from_hour) AS from_hour, MIN(built_ts) AS "
                      f"built_ts FROM ({union}) s GROUP BY ths HAVING COUNT(*) = {n}"))
    conn.execute(text(f"COMMENT ON VIEW {SETS} IS {lit('The threshold set every shard holds (sharded store).')}"))
    for s in lay.shards:
        s.engine.dispose()
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
        mine = route_sql(lay, s.number, "gpu_id")
        weeks = [w for (w,) in conn.execute(text(f"SELECT DISTINCT bucket_ts / 604800 * 604800 FROM {old} "
                                                 f"WHERE {mine}"))]
        gpus = copy_out(conn, f"SELECT {GPU_COLS} FROM telemetry_gpus WHERE {route_sql(lay, s.number, 'id')}")
        with s.begin() as sconn:
            for t in (*SHARDED, SETS):
                sconn.execute(text(f"DELETE FROM {t}"))
            sconn.execute(text("DELETE FROM telemetry_gpus"))
            with sconn.connection.dbapi_connection.cursor() as cur, cur.copy(
                    f"COPY telemetry_gpus ({GPU_COLS}) FROM STDIN (FORMAT BINARY)") as cp:
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
        lay = load_layout(conn, rows, check=False) if rows else None
    for s in lay.shards if lay else ():
        try:
            Store(s.engine).upgrade(revision)
        except StoreError as exc:
            raise StoreError(f"{s}: {strip_store(str(exc))}") from None
        finally:
            s.engine.dispose()
    store.upgrade(revision)
    if lay is not None and revision == "head":
        with store.begin() as conn:
            conn.execute(text(f"SELECT pg_advisory_xact_lock({LOCK})"))
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
