"""The passes of one audit that read ``gpu_buckets``, each timed on its own: wall seconds, this process's CPU
seconds and (PostgreSQL) the server backend's CPU seconds, and each pass's share of the audit.

Each pass is wrapped where the audit calls it (nothing in the audit changes), and the audit runs with one
connection (``store.judge_connections = 1``), so every second of the server's work is on the backend that is
measured. The floor (:data:`bench.audit.FLOOR`) and the machine's speed (:func:`bench.__main__.machine`) are
printed beside them.

Run: python -m bench.passes URL --gpus N [--days 7] [--seed 1] [--cold]
(``--cold``: empty the judged aggregate first, so the audit builds it; default: one audit builds it, the
timed audit reads it.)
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import text

from bench.audit import _cpu

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
    cfg = cfg.model_copy(update={"store": cfg.store.model_copy(update={"judge_connections": 1})})
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
    args = ap.parse_args(argv)
    r = measure(args.url, args.gpus, args.days, args.seed, args.cold)
    print(table(r))
    print(json.dumps(r), flush=True)


if __name__ == "__main__":
    sys.exit(main())
