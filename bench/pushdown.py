"""What postgres_fdw pushes down to the shards and what it does not, on a sharded store (docs/scale-out.md):
each statement's plan through the coordinator's foreign partitions, EXPLAIN (ANALYZE, VERBOSE), reduced to
its foreign scans, their Remote SQL and loop counts, with rows and milliseconds; and the write paths the
store cannot use through the coordinator, with the error or the rows per second they get.

Run: python -m bench.pushdown URL   (a sharded store with telemetry and allocations, e.g. bench.shards' copy)
"""

from __future__ import annotations

import argparse
import re
import time
from contextlib import nullcontext
from typing import Any

from sqlalchemy import Connection, text

from auditor.store.engine import Store


def plan(conn: Connection, sql: str, params: dict[str, Any], keep: int = 12) -> list[str]:
    """The plan's foreign-scan lines (with Remote SQL shortened) and its execution time."""
    t = time.perf_counter()
    lines = [r[0] for r in conn.execute(text("EXPLAIN (ANALYZE, VERBOSE, COSTS OFF) " + sql), params)]
    out, seen = [], set()
    for line in lines:
        s = line.strip()
        if s.startswith(("Remote SQL:", "Relations:")):
            s = re.sub(r"SELECT (\w+, ){4,}\w+ FROM", "SELECT <columns> FROM", s)
            s = s if len(s) < 230 else s[:227] + "..."
        elif not any(k in s for k in ("Foreign Scan", "Async", "Execution Time")):
            continue
        if s in seen:
            continue
        seen.add(s)
        out.append("    " + s)
    out.append(f"    ({time.perf_counter() - t:.2f} s)")
    return out[:keep] + ([out[-1]] if len(out) > keep else [])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("url")
    a = ap.parse_args(argv)
    from auditor.audit import aggregate, infra
    from auditor.audit.attribute import attribute
    from auditor.audit.usage import judge_sql
    from auditor.config import Config
    from auditor.store import shards
    from auditor.store.sqlfuncs import sql_names

    store = Store.open(a.url)
    th = Config().thresholds
    out: list[str] = []
    with store.engine.connect() as conn:
        lay = shards.layout(conn)
        assert lay is not None, "not a sharded store"
        conn.execute(text("SET jit = off"))
        lo, hi = conn.execute(text("SELECT MIN(start_ts), MAX(COALESCE(end_ts, start_ts)) FROM allocations")).one()
        since = lo // 86400 * 86400
        p = {"since": since, "until": hi, "horizon": hi}
        floor = "SELECT gpu_id, count(*), avg(sm_active) FROM gpu_buckets GROUP BY gpu_id"
        conn.execute(text("SET enable_partitionwise_aggregate = off"))
        out += ["floor (every bucket once, grouped by GPU), enable_partitionwise_aggregate off:",
                *plan(conn, floor, {})]
        conn.execute(text("SET enable_partitionwise_aggregate = on"))
        out += ["the same with enable_partitionwise_aggregate on (what the store sets on the coordinator):",
                *plan(conn, floor, {})]
        out += ["one GPU's interval (the shape of every per-allocated-GPU read):",
                *plan(conn, "SELECT count(*), sum(sm_active) FROM gpu_buckets WHERE gpu_id = 1 AND bucket_ts >= :since "
                            "AND bucket_ts < :since + 86400", p)]
        fn = {**sql_names("postgresql"), "cluster_filter": ""}
        attribute(conn, fn, p, "", lambda _n: nullcontext())
        infra.prepare(conn, th, since, hi)
        n = conn.execute(text("SELECT count(*) FROM _attr")).scalar()
        sel = judge_sql("postgresql", th, "")
        out += [f"the judging's LATERAL form over {n:,} allocated GPUs (one remote query per allocated GPU):",
                *plan(conn, sel[sel.index("SELECT"):], {**p, "run_id": 0})]
        hour = conn.execute(text("SELECT MAX(bucket_ts) / 3600 * 3600 - 86400 FROM gpu_buckets")).scalar()
        frm = f"FROM telemetry_gpus tg CROSS JOIN gpu_buckets b WHERE b.gpu_id = tg.id AND b.bucket_ts >= {hour} " \
              f"AND b.bucket_ts < {hour} + 3600"
        rows = aggregate.hour_rows("postgresql", th, frm, "gpu_buckets", "tg.has_jobs")
        out += ["the judged aggregate's refresh of one hour (grouped verdict CASE, NOT EXISTS sibling probe):",
                *plan(conn, rows, {})]
        conn.rollback()
        t = time.perf_counter()
        try:
            with conn.begin():
                conn.execute(text("INSERT INTO judged_dirty (gpu_id, hour, mark, unfit) VALUES (1, 1, 1, 0) "
                                  "ON CONFLICT (gpu_id, hour) DO UPDATE SET mark = excluded.mark"))
            out.append("INSERT ... ON CONFLICT through the coordinator: accepted (unexpected)")
        except Exception as exc:
            msg = str(getattr(exc, "orig", exc)).splitlines()[0]
            out.append(f"INSERT ... ON CONFLICT DO UPDATE through the coordinator: refused: {msg}")
        # writes routed through the coordinator, rolled back (postgres_fdw rolls the shards' part back too)
        conn.execute(text("CREATE TEMPORARY TABLE _b AS SELECT * FROM gpu_buckets LIMIT 20000"))
        conn.execute(text("UPDATE _b SET job = 'bench-pushdown'"))  # keys no shard holds
        k = conn.execute(text("SELECT count(*) FROM _b")).scalar()
        conn.commit()
        for how, sql in (("INSERT ... SELECT (batch_size 1000)", "INSERT INTO gpu_buckets SELECT * FROM _b"),):
            with conn.begin() as tx:
                t = time.perf_counter()
                conn.execute(text(sql))
                out.append(f"{how} routed to the foreign partitions: {k / (time.perf_counter() - t):,.0f} rows/s")
                tx.rollback()
        with conn.begin() as tx:
            data = bytearray()
            raw = conn.connection.dbapi_connection
            with raw.cursor() as cur, cur.copy("COPY _b TO STDOUT (FORMAT BINARY)") as cp:
                for chunk in cp:
                    data += chunk
            t = time.perf_counter()
            with raw.cursor() as cur, cur.copy("COPY gpu_buckets FROM STDIN (FORMAT BINARY)") as cp:
                cp.write(bytes(data))
            out.append(f"COPY routed to the foreign partitions (one remote INSERT per row on PostgreSQL 15): "
                       f"{k / (time.perf_counter() - t):,.0f} rows/s")
            tx.rollback()
    store.engine.dispose()
    print("\n".join(out))


if __name__ == "__main__":
    main()
