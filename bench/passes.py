"""The passes of one audit that read ``gpu_buckets``, each timed on its own: wall seconds, this process's CPU
seconds and (PostgreSQL) the server backend's CPU seconds, and each pass's share of the audit.

Each pass is wrapped where the audit calls it (nothing in the audit changes), and the audit runs in one
process and connection (``store.audit_processes = 1``, the default), so every second of the server's work is
on the backend that is measured. The floor (:data:`bench.audit.FLOOR`) and the machine's speed
(:func:`bench.__main__.machine`) are printed beside them.

Run: python -m bench.passes URL --gpus N [--days 7] [--seed 1] [--cold] [--edges]
(``--cold``: empty the judged aggregate first, so the audit builds it; default: one audit builds it, the
timed audit reads it. ``--edges``: instead, the judging's bound: its statement and its parts (the edge buckets
read, the edge buckets judged, the whole hours read) against the floor, CPU, best of 3.)
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import text

from bench.audit import FLOOR, _cpu

#: (module, attribute, pass name): the callables that read gpu_buckets during an audit, where the audit
#: looks them up
PASSES = (
    ("auditor.audit.run", "refresh_aggregate", "judged aggregate upkeep (re-judge marked hours)"),
    ("auditor.audit.attribute", "attribute_by_labels", "attribution by job labels"),
    ("auditor.audit.usage", "judge", "judging (whole hours + edges)"),
    ("auditor.audit.queue", "idle_while_queued", "idle while queued (opportunity)"),
    ("auditor.audit.findings", "idle_episodes", "idle episodes"),
    ("auditor.audit.findings", "idle_reservations", "idle reservations"),
    ("auditor.audit.findings", "unallocated_ghosts", "ghosts on unallocated GPUs"),
    ("auditor.audit.waiting", "class_seconds", "where the waiting goes (classes)"),
    ("auditor.audit.stragglers", "stragglers", "stragglers"),
    ("auditor.audit.findings", "sparkline_texts", "sparklines"),
    ("auditor.audit.capacity", "capacity", "capacity (node first seen)"),
)


class Timer:
    def __init__(self, server: Any) -> None:
        self.rows: dict[str, list[float]] = {}
        self.server = server

    def wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kw: Any) -> Any:
            t, c, s = time.perf_counter(), _cpu(), self.server.seconds()
            try:
                return fn(*args, **kw)
            finally:
                r = self.rows.setdefault(name, [0.0, 0.0, 0.0])
                r[0] += time.perf_counter() - t
                r[1] += _cpu() - c
                r[2] += self.server.seconds() - s
        return timed


def measure(url: str, gpus: int, days: float, seed: int, cold: bool) -> dict[str, Any]:
    import importlib

    from auditor.audit.run import run_audit
    from auditor.config import Config
    from auditor.simulate import FleetSpec
    from auditor.store.engine import Store
    from bench.__main__ import machine
    from bench.audit import ServerCpu, _drop_run, floor_seconds

    spec = FleetSpec(gpus=gpus, days=days, seed=seed)
    store = Store.open(url)
    server = ServerCpu(store)  # before the pool opens a connection
    store.upgrade()
    cfg = Config()
    if cold:
        with store.begin() as conn:
            for t in ("judged_hours", "judged_sets", "judged_dirty"):
                conn.execute(text(f"DELETE FROM {t}"))
    else:  # the aggregate built (and the caches warm) by one audit first
        _drop_run(store, run_audit(store, cfg, spec.start, spec.end).run_id)
    c, sv = _cpu(), server.seconds()
    floor = floor_seconds(store)[0]
    floor_cpu = (_cpu() - c) + (server.seconds() - sv)  # the client's, or the server's
    timer = Timer(server)
    saved = []
    for mod, attr, name in PASSES:
        m = importlib.import_module(mod)
        saved.append((m, attr, getattr(m, attr)))
        setattr(m, attr, timer.wrap(name, getattr(m, attr)))
    try:
        t, c, sv = time.perf_counter(), _cpu(), server.seconds()
        res = run_audit(store, cfg, spec.start, spec.end)
        audit_s, audit_cpu, audit_srv = time.perf_counter() - t, _cpu() - c, server.seconds() - sv
    finally:
        for m, attr, fn in saved:
            setattr(m, attr, fn)
    floor = min(floor, floor_seconds(store)[0])
    _drop_run(store, res.run_id)
    store.engine.dispose()
    return {"engine": store.engine.dialect.name, "gpus": gpus, "days": days, "floor_s": floor,
            "floor_cpu_s": floor_cpu, "audit_s": audit_s, "audit_cpu_s": audit_cpu, "audit_server_cpu_s": audit_srv,
            "machine": machine(),
            "passes": {k: [round(x, 3) for x in v] for k, v in timer.rows.items()},
            "steps": {k: round(v, 3) for k, v in res.steps.items()}}


def edges(url: str, gpus: int, days: float, seed: int) -> dict[str, Any]:
    """The judging's bound (issue 34 item 5): CPU of the judging statement (:func:`auditor.audit.judging.sums_sql`)
    and of its parts on the fleet's attributed GPUs, against the floor; the edge buckets' share of all."""
    from contextlib import nullcontext

    from auditor.audit import infra, judging, usage
    from auditor.audit.attribute import attribute
    from auditor.audit.run import _fn, _params
    from auditor.config import Config
    from auditor.simulate import FleetSpec
    from auditor.store.engine import Store
    from bench.__main__ import machine
    from bench.audit import ServerCpu

    spec = FleetSpec(gpus=gpus, days=days, seed=seed)
    store = Store.open(url)
    server = ServerCpu(store)
    store.upgrade()
    th = Config().thresholds
    s, u = int(spec.start.timestamp()), int(spec.end.timestamp())
    p = _params(s, u, u)
    usage.refresh_aggregate(store, th, s)
    out: dict[str, Any] = {"engine": store.engine.dialect.name, "gpus": gpus, "machine": machine(), "cpu_s": {}}

    def best(conn: Any, name: str, q: str, **kw: Any) -> list[Any]:
        b, rows = float("inf"), []
        for _ in range(3):
            c, sv = _cpu(), server.seconds()
            rows = conn.execute(text(q), {**p, **kw}).fetchall()
            b = min(b, _cpu() - c + server.seconds() - sv)
        out["cpu_s"][name] = b
        return rows

    with store.begin() as conn:
        from auditor.audit.usage import setup_pg

        setup_pg(conn)
        attribute(conn, {**_fn(conn), "cluster_filter": ""}, p, "", lambda _n: nullcontext())
        infra.prepare(conn, th, s, u)
        best(conn, "floor", f"SELECT COUNT(*) FROM ({FLOOR}) x")
        pp = dict(p)
        judging.whole_hour_gpus(conn, pp, th, "")
        d = conn.dialect.name
        ranges = [f"b.gpu_id = t.gpu_id AND {r} AND b.bucket_ts + b.bucket_s > t.a_s AND b.bucket_s > 0"
                  for r in judging._edges(d, "t")]
        if d == "postgresql":  # as the judging reads them: a LATERAL range scan per allocated GPU
            raw = " UNION ALL ".join(
                f"SELECT x.s FROM _attr t JOIN _agg g ON g.id = t.allocated_gpu_id CROSS JOIN LATERAL (SELECT "
                f"b.sm_active AS s FROM gpu_buckets b WHERE {r} OFFSET 0) x" for r in ranges)
        else:
            raw = " UNION ALL ".join(f"SELECT b.sm_active AS s FROM _agg g CROSS JOIN _attr t CROSS JOIN gpu_buckets b "
                                     f"WHERE t.allocated_gpu_id = g.id AND {r}" for r in ranges)
        n_edge = best(conn, "edge buckets read", f"SELECT COUNT(*), SUM(x.s) FROM ({raw}) x")[0][0]
        # the statement itself, its sums forced (SUM over a column: a bare COUNT lets PostgreSQL skip them)
        sums = judging.sums_sql(d, th, "_attr", "allocated_gpu_id", "")
        stmt = f"SELECT COUNT(*), SUM(x.sm), SUM(x.idle) FROM ({sums}) x"
        best(conn, "the judging's statement, edges only (no whole hour read)", stmt, ths="")
        best(conn, "the judging's statement (edges and whole hours)", stmt, ths=pp["ths"])
        c = out["cpu_s"]
        c["whole hours (the difference)"] = c["the judging's statement (edges and whole hours)"] - \
            c["the judging's statement, edges only (no whole hour read)"]
        out["edge_buckets"] = n_edge
        out["buckets"] = conn.execute(text("SELECT COUNT(*) FROM gpu_buckets")).scalar()
        conn.rollback()
    store.engine.dispose()
    return out


def table(r: dict[str, Any]) -> str:
    a = r["audit_s"]
    lines = [f"{r['engine']} {r['gpus']:,} GPUs x {r['days']:g} days: audit {a:.2f} s wall, {r['audit_cpu_s']:.2f} s "
             f"client + {r['audit_server_cpu_s']:.2f} s server CPU; floor {r['floor_s']:.2f} s wall, "
             f"{r['floor_cpu_s']:.2f} s CPU; audit/floor {a / r['floor_s']:.1f}x; machine "
             f"{r['machine']['python_loop_10m_s']} s loop, load {r['machine']['load_avg']}",
             "| pass | wall s | client CPU s | server CPU s | share of audit | / floor |", "|---|---|---|---|---|---|"]
    tot = 0.0
    for k, (w, c, s) in sorted(r["passes"].items(), key=lambda kv: -kv[1][0]):
        tot += w
        lines.append(f"| {k} | {w:.2f} | {c:.2f} | {s:.2f} | {w / a:.0%} | {w / r['floor_s']:.2f}x |")
    lines.append(f"| all bucket-reading passes | {tot:.2f} | | | {tot / a:.0%} | {tot / r['floor_s']:.2f}x |")
    rest = a - tot
    lines.append(f"| the rest of the audit | {rest:.2f} | | | {rest / a:.0%} | {rest / r['floor_s']:.2f}x |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    from bench.audit import fleet_parser

    ap = fleet_parser(__doc__.splitlines()[0])
    ap.add_argument("--cold", action="store_true", help="Empty the judged aggregate first (the audit builds it).")
    ap.add_argument("--edges", action="store_true", help="The judging's bound: its statement and parts vs the floor.")
    args = ap.parse_args(argv)
    if args.edges:
        r = edges(args.url, args.gpus, args.days, args.seed)
        fl = r["cpu_s"]["floor"]
        print(f"{r['engine']} {r['gpus']:,} GPUs: edge buckets {r['edge_buckets']:,} of {r['buckets']:,} "
              f"({r['edge_buckets'] / r['buckets']:.1%}); machine {r['machine']['python_loop_10m_s']} s loop")
        for k, v in r["cpu_s"].items():
            print(f"{v:8.3f} s CPU = {v / fl:5.1f}x floor  {k}")
        print(json.dumps(r), flush=True)
        return
    r = measure(args.url, args.gpus, args.days, args.seed, args.cold)
    print(table(r))
    print(json.dumps(r), flush=True)


if __name__ == "__main__":
    sys.exit(main())
