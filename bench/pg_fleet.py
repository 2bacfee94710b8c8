"""A cached SQLite fleet store copied into a persistent PostgreSQL schema, and both engines' audits of the
identical data side by side (see :mod:`bench.pg`).

Functions for ``python -m bench``: :func:`fleet_schema` (the PostgreSQL copy of a cached fleet, made once),
:func:`side_by_side` (per size: SQLite and PostgreSQL audit, floor, judge, peak RSS, and the 4x-GPU time
ratios; a list of dicts) and :func:`report` (the table).
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, text

from auditor.simulate import FleetSpec

# audit output (a run someone is benchmarking on the cached file right now) is not part of the fleet
SKIP = {"alembic_version", "audit_runs", "usage_gpu", "usage_allocation", "findings", "enforcement_log",
        "notifications", "locks"}


def _copy_table(sq: sqlite3.Connection, dbapi: Any, table: Any) -> int:
    from auditor.store.ingest_pg import copy_rows

    cols = [c.name for c in table.columns]
    types = None
    if table.name == "gpu_buckets":  # binary COPY (3x cheaper); the other tables are small
        with dbapi.cursor() as cur:
            cur.execute("SELECT a.attname, t.typname FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid "
                        "WHERE a.attrelid = 'gpu_buckets'::regclass AND a.attnum > 0 AND NOT a.attisdropped")
            got = dict(cur.fetchall())
        types = [got[c] for c in cols]
    cur = sq.execute(f"SELECT {', '.join(cols)} FROM {table.name}")
    n = 0
    while rows := cur.fetchmany(200_000):
        copy_rows(dbapi, table.name, cols, rows, types)
        n += len(rows)
    return n


def load(sqlite_path: Path, url: str, schema: str) -> dict[str, Any]:
    """Copy every table of the SQLite fleet store into a fresh PostgreSQL schema (upgraded to head)."""
    from auditor.store import partitions
    from auditor.store.engine import Store
    from auditor.store.schema import metadata
    from bench.pg import _with_schema

    admin = create_engine(url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f"DROP SCHEMA IF EXISTS {schema} CASCADE"))
        conn.execute(text(f"CREATE SCHEMA {schema}"))
    admin.dispose()
    surl = _with_schema(url, schema)
    store = Store.open(surl)
    store.upgrade()
    t = time.perf_counter()
    sq = sqlite3.connect(f"file:{sqlite_path}?mode=ro", uri=True)
    counts = {}
    with store.begin() as conn:
        lo, hi = sq.execute("SELECT min(bucket_ts), max(bucket_ts) FROM gpu_buckets").fetchone()
        if lo is not None:
            partitions.ensure_weeks(conn, range(lo, hi + 1, partitions.DAY))
            partitions.ensure_weeks(conn, [hi])
        dbapi = conn.connection.dbapi_connection
        for table in metadata.sorted_tables:
            if table.name not in SKIP:
                counts[table.name] = _copy_table(sq, dbapi, table)
        for table in metadata.sorted_tables:  # serial ids continue after the copied ones
            if "id" in table.c and table.c.id.autoincrement is True:
                conn.execute(text(f"SELECT setval(pg_get_serial_sequence('{table.name}', 'id'), "
                                  f"COALESCE((SELECT max(id) FROM {table.name}), 0) + 1, false)"))
    sq.close()
    with store.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        for table in metadata.sorted_tables:  # this schema's tables only: a bare ANALYZE takes the whole
            conn.execute(text(f"ANALYZE {table.name}"))  # database's, and waits behind others' long queries
    store.engine.dispose()
    return {"schema": schema, "load_s": round(time.perf_counter() - t, 1), "rows": counts}


def fleet_schema(spec: FleetSpec, url: str, src: Path) -> tuple[str, Path, dict[str, Any]]:
    """(PostgreSQL URL, SQLite path, load info) of the cached fleet ``spec``; copied into PostgreSQL once
    (a JSON sidecar ``pg-<key>.json`` next to the SQLite store marks a complete copy)."""
    from bench import fleet
    from bench.pg import _with_schema

    path, _info, _reused = fleet.cached(spec, src)
    schema = f"fleet_{spec.key().replace('-', '_')}"
    mark = src / f"pg-{spec.key()}.json"
    if mark.exists():
        info = json.loads(mark.read_text())
        eng = create_engine(url)
        with eng.connect() as conn:
            ok = conn.execute(text("SELECT to_regclass(:t) IS NOT NULL"), {"t": f"{schema}.audit_runs"}).scalar()
        eng.dispose()
        if ok and info.get("schema") == schema and info.get("head") == _head():
            return _with_schema(url, schema), path, info
    info = load(path, url, schema)
    info["head"] = _head()  # a copy made under an older migration head is made again
    mark.write_text(json.dumps(info, indent=1))
    return _with_schema(url, schema), path, info


def _head() -> str:
    """The store's migration head (alembic)."""
    from alembic.script import ScriptDirectory

    from auditor.store.engine import Store

    return str(ScriptDirectory.from_config(Store.open("sqlite://").alembic_config()).get_current_head())


def _audit(url: str, spec: FleetSpec) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "bench.audit", url, "--gpus", str(spec.gpus), "--days", str(spec.days),
           "--seed", str(spec.seed)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=3600)
    if proc.returncode != 0:
        raise RuntimeError(f"audit of {spec.gpus} GPUs failed: {proc.stderr.strip()[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def side_by_side(url: str, sizes: list[int], days: float = 7, src: Path = Path("bench/out"),
                 seed: int = 1) -> list[dict[str, Any]]:
    """Per size, the SQLite audit and the PostgreSQL audit of the identical fleet, one after the other
    (each in its own process); ratios between consecutive sizes; the load average when each ran."""
    out: list[dict[str, Any]] = []
    for n in sizes:
        spec = FleetSpec(gpus=n, days=days, seed=seed)
        pg_url, path, info = fleet_schema(spec, url, src)
        for engine, u in (("sqlite", f"sqlite:///{path}"), ("postgresql", pg_url)):
            load = os.getloadavg()[0]
            r = _audit(u, spec)
            r.update(engine=engine, load_avg=round(load, 1), pg_load_s=info.get("load_s"))
            r["audit_floor"] = r["audit_s"] / r["floor_s"] if r["floor_s"] else None
            r["judge_floor"] = r["judge_s"] / r["floor_s"] if r["floor_s"] else None
            prev = [p for p in out if p["engine"] == engine]
            if prev:
                r["time_ratio"] = r["audit_s"] / prev[-1]["audit_s"]
                r["gpu_ratio"] = n / prev[-1]["gpus"]
            out.append(r)
    return out


def report(rows: list[dict[str, Any]]) -> str:
    lines = [f"{'engine':<10} {'GPUs':>6} {'rows':>11} {'audit s':>8} {'floor s':>8} {'audit/floor':>11} "
             f"{'judge s':>8} {'judge/floor':>11} {'RSS MiB':>8} {'x time':>7} {'load':>5}"]
    for r in rows:
        ratio = f"{r['time_ratio']:.2f}" if "time_ratio" in r else "-"
        lines.append(f"{r['engine']:<10} {r['gpus']:>6} {r['rows']:>11,} {r['audit_s']:>8.1f} {r['floor_s']:>8.2f} "
                     f"{r['audit_floor']:>11.1f} {r['judge_s']:>8.1f} {r['judge_floor']:>11.1f} "
                     f"{r['rss_mib']:>8.0f} {ratio:>7} {r['load_avg']:>5}")
    return "\n".join(lines)
