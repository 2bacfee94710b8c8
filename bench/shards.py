"""The audit of one cached fleet on one PostgreSQL server and on a store sharded over N servers (postgres_fdw,
`gpu-audit db shard`), side by side in one run: identical usage rows and findings (hash), the speed-up, CPU
beside wall seconds, and each server's rows and size (docs/scale-out.md).

Both stores are copies of the same cached SQLite fleet (:mod:`bench.fleet`, generate it first under
``flock /tmp/bench.lock``): the one-server copy in schema ``shardbench_one_<key>``, the sharded one in
``shardbench_sh<N>_<key>`` whose buckets ``db shard`` moves to schema ``shardbench_<key>`` of each shard (the
copy and the move are timed; both are kept for the next run, marked by a sidecar JSON next to the fleet).
Each store is audited twice in a child process: the first audit builds the judged aggregate of the week,
the second reads it (the steady state of a weekly audit). CPU: the audit process's own, and the whole
machine's busy seconds over the audit (/proc/stat: every server's work too, and whatever else runs).

Run: python -m bench.shards --gpus 16384 [--days 7] [--url URL] [--shard-urls-file FILE] [--from DIR]
Without --shard-urls-file the shards are the first N clusters of scripts/testbed-pgshards.sh.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, text

from bench.pg import _with_schema

DEFAULT_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
TESTBED = Path(os.environ.get("TESTBED_ROOT", "/var/lib/gpu-audit-testbed")) / "pgshards"


def testbed_urls(n: int) -> list[str]:
    """The first ``n`` shard clusters of scripts/testbed-pgshards.sh (password from its file)."""
    marker = dict(line.split("=", 1) for line in (TESTBED / "gpu-audit-testbed").read_text().splitlines()
                  if "=" in line and not line.startswith("#"))
    pw = Path(marker["password_file"]).read_text().strip()
    return [f"postgresql+psycopg://{marker['user']}:{pw}@{marker['host']}:{port}/{marker['database']}"
            for port in marker["ports"].split(",")[:n]]


def busy_seconds() -> float:
    """The machine's busy CPU seconds since boot (user + nice + system + irq + softirq + steal)."""
    f = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    ticks = os.sysconf("SC_CLK_TCK")
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in f[:8])
    return (user + nice + system + irq + softirq + steal) / ticks


def _fresh_schema(url: str, schema: str) -> None:
    eng = create_engine(url, isolation_level="AUTOCOMMIT")
    with eng.connect() as conn:
        conn.execute(text(f"DROP SCHEMA IF EXISTS {schema} CASCADE"))
        conn.execute(text(f"CREATE SCHEMA {schema}"))
    eng.dispose()


def _exists(url: str, schema: str) -> bool:
    eng = create_engine(url)
    with eng.connect() as conn:
        ok = bool(conn.execute(text("SELECT to_regclass(:t) IS NOT NULL"), {"t": f"{schema}.store_shards"}).scalar())
    eng.dispose()
    return ok


def prepare(spec: Any, url: str, shard_urls: list[str], src: Path) -> dict[str, Any]:
    """The two stores of ``spec`` (made once, reused while the sidecar matches): URLs and load times."""
    from auditor.store import sharding
    from auditor.store.engine import Store
    from bench import fleet, pg_fleet

    path, _info, _reused = fleet.cached(spec, src)
    key = spec.key().replace("-", "_")
    n = len(shard_urls)
    one, sh, remote = f"shardbench_one_{key}", f"shardbench_sh{n}_{key}", f"shardbench_{key}"
    mark = src / f"shards{n}-{spec.key()}.json"
    info = json.loads(mark.read_text()) if mark.exists() else {}
    targets = [_with_schema(u, remote) for u in shard_urls]
    if info.get("head") == pg_fleet._head() and _exists(url, one) and _exists(url, sh):
        store = Store.open(info["sharded"])
        sharding.setup(store, targets)  # idempotent: checks the shards, brings the servers' options up to date
        store.engine.dispose()
        return info
    info = {"head": pg_fleet._head()}
    info["one_load_s"] = pg_fleet.load(path, url, one)["load_s"]
    info["sharded_load_s"] = pg_fleet.load(path, url, sh)["load_s"]
    for u in shard_urls:
        _fresh_schema(u, remote)
    store = Store.open(_with_schema(url, sh))
    t = time.perf_counter()
    res = sharding.setup(store, targets)
    info["shard_s"] = round(time.perf_counter() - t, 1)
    info["moved_rows"] = res["moved_rows"]
    store.engine.dispose()
    info.update(one=_with_schema(url, one), sharded=_with_schema(url, sh))
    mark.write_text(json.dumps(info, indent=1))
    return info


def audit_child(url: str, since: int, until: int) -> dict[str, Any]:
    """One audit in this process (the child): wall, CPU, steps, peak RSS, the digest; the run is deleted."""
    from datetime import UTC, datetime

    from auditor.audit.run import run_audit
    from auditor.config import Config
    from auditor.store import shards
    from auditor.store.engine import Store
    from bench.audit import _cpu, _drop_run, peak_rss_kib, run_digest

    store = Store.open(url)
    shipped: list[dict[str, Any]] = []
    inner = shards.run_shipped

    def timed(*args: Any, **kw: Any) -> dict[str, Any]:
        out = inner(*args, **kw)
        shipped.append({**out, "into": args[4] if len(args) > 4 else kw.get("out")})
        return out

    shards.run_shipped = timed  # type: ignore[assignment]
    cpu, busy, t = _cpu(), busy_seconds(), time.perf_counter()
    r = run_audit(store, Config(), datetime.fromtimestamp(since, UTC), datetime.fromtimestamp(until, UTC))
    out = {"wall_s": round(time.perf_counter() - t, 2), "cpu_s": round(_cpu() - cpu, 2),
           "machine_busy_s": round(busy_seconds() - busy, 1), "rss_mib": round(peak_rss_kib() / 1024),
           "steps": {k: round(v, 2) for k, v in r.steps.items()}, "digest": run_digest(store, r.run_id),
           "shipped": [{"into": x["into"], "read_s": round(x["read_s"], 2), "gather_s": round(x.get("gather_s", 0), 2),
                        "shards_s": {k: round(v, 2) for k, v in x["shards_s"].items()}} for x in shipped]}
    _drop_run(store, r.run_id)
    store.engine.dispose()
    return out


def _audit(url: str, spec: Any) -> dict[str, Any]:
    child = subprocess.run([sys.executable, "-m", "bench.shards", "--child", url, str(int(spec.start.timestamp())),
                            str(int(spec.end.timestamp()))], capture_output=True, text=True, check=False, timeout=7200)
    if child.returncode != 0:
        raise RuntimeError(f"audit child failed: {child.stderr.strip().splitlines()[-3:]}")
    return json.loads(child.stdout.strip().splitlines()[-1])


def _reset_aggregate(url: str) -> None:
    """No judged aggregate on any server of the store, so the first audit builds it (a copied fleet may
    carry one an earlier audit of the cached file built)."""
    from auditor.store import shards
    from auditor.store.engine import Store

    store = Store.open(url)

    def empty(conn: Any) -> None:
        for t in ("judged_hours", "judged_dirty", "judged_sets"):
            conn.execute(text(f"DELETE FROM {t}"))

    shards.on_each(store, empty)
    store.engine.dispose()


def _servers(url: str) -> list[dict[str, Any]]:
    from auditor.store import sharding
    from auditor.store.engine import Store

    store = Store.open(url)
    try:
        return sharding.sizes(store)
    finally:
        store.engine.dispose()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    ap.add_argument("--url", default=DEFAULT_URL, help="PostgreSQL database of the one-server store and coordinator")
    ap.add_argument("--shard-urls-file", help="one shard URL per line (default: scripts/testbed-pgshards.sh)")
    ap.add_argument("--shards", type=int, default=2)
    ap.add_argument("--gpus", type=int, default=1024)
    ap.add_argument("--days", type=float, default=7)
    ap.add_argument("--from", dest="src", default="bench/out")
    ap.add_argument("--audits", type=int, default=2, choices=(1, 2),
                    help="audits per store: the first builds the judged aggregate, the second reads it")
    ap.add_argument("--json", help="write every figure to this file")
    a = ap.parse_args(argv)
    if a.child:
        print(json.dumps(audit_child(a.child[0], int(a.child[1]), int(a.child[2]))))
        return
    from auditor.simulate import FleetSpec

    spec = FleetSpec(gpus=a.gpus, days=a.days, seed=1)
    urls = ([line.strip() for line in Path(a.shard_urls_file).read_text().splitlines() if line.strip()]
            if a.shard_urls_file else testbed_urls(a.shards))
    info = prepare(spec, a.url, urls[:a.shards], Path(a.src))
    out: dict[str, Any] = {"gpus": a.gpus, "days": a.days, "shards": a.shards, "load": info,
                           "cores": os.cpu_count(), "load_avg_before": os.getloadavg()}
    runs = ("first", "second")[:a.audits]
    for name in ("one", "sharded"):
        _reset_aggregate(info[name])
        out[name] = {k: _audit(info[name], spec) for k in runs}
        out[name]["servers"] = _servers(info[name])
    out["load_avg_after"] = os.getloadavg()
    same = all(out["one"][k]["digest"] == out["sharded"][k]["digest"] for k in runs)
    out["identical"] = same
    print(report(out))
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))


def report(out: dict[str, Any]) -> str:
    lines = [f"{out['gpus']:,} GPUs x {out['days']:g} days: one PostgreSQL server vs {out['shards']} shards "
             f"(postgres_fdw), {out['cores']} cores, load {out['load_avg_before'][0]:.1f} before, "
             f"{out['load_avg_after'][0]:.1f} after"]
    ld = out["load"]
    if "shard_s" in ld:
        lines.append(f"  copies: one server {ld['one_load_s']} s, coordinator {ld['sharded_load_s']} s, then "
                     f"`db shard` moved {ld['moved_rows']:,} bucket rows in {ld['shard_s']} s")
    lines.append(f"  {'audit':<34}{'one server':>22}{'sharded':>22}{'speed-up':>10}")
    for k, what in (("first", "first (builds the aggregate)"), ("second", "second (reads the aggregate)")):
        if k not in out["one"]:
            continue
        o, s = out["one"][k], out["sharded"][k]
        lines.append(f"  {what:<34}{o['wall_s']:>9.1f} s wall{o['cpu_s']:>7.1f} cpu{s['wall_s']:>9.1f} s wall"
                     f"{s['cpu_s']:>7.1f} cpu{o['wall_s'] / s['wall_s']:>9.2f}x")
        lines.append(f"  {'':<34}{o['machine_busy_s']:>12.1f} busy{'':>6}{s['machine_busy_s']:>12.1f} busy"
                     f"   (machine CPU s)")
        lines.append(f"  {'':<34}{o['rss_mib']:>12} MiB{'':>7}{s['rss_mib']:>12} MiB   (audit peak RSS)")
    last = "second" if "second" in out["one"] else "first"
    lines.append(f"  usage rows and findings identical (hash): {out['identical']} {out['one'][last]['digest']}")
    steps = sorted(set(out["one"][last]["steps"]) | set(out["sharded"][last]["steps"]),
                   key=lambda x: -out["one"][last]["steps"].get(x, 0))
    lines.append(f"  steps of the {last} audit (s):{'one server':>26}{'sharded':>8}")
    for st in steps:
        lines.append(f"    {st:<44}{out['one'][last]['steps'].get(st, 0):>8.2f}"
                     f"{out['sharded'][last]['steps'].get(st, 0):>8.2f}")
    passes = {"usage_gpu": "the judging", "_spark_parts": "sparklines"}
    shipped = out["sharded"][last].get("shipped", [])
    for into in dict.fromkeys(x.get("into") for x in shipped):  # each shipped pass, its calls summed
        xs = [x for x in shipped if x.get("into") == into]
        names = sorted({k for x in xs for k in x["shards_s"]})
        per = {k: round(sum(x["shards_s"].get(k, 0) for x in xs), 2) for k in names}
        lines.append(f"  {passes.get(into, into)} shipped ({len(xs)} call{'s' if len(xs) > 1 else ''}): read "
                     f"{sum(x['read_s'] for x in xs):.2f} s, on each shard (at once) "
                     + ", ".join(f"{k}: {v} s" for k, v in per.items())
                     + f", gathered {sum(x['gather_s'] for x in xs):.2f} s")
    lines.append("  servers:")
    for name in ("one", "sharded"):
        for r in out[name]["servers"]:
            counts = ", ".join(f"{t} {r[t]:,}" for t in ("gpu_buckets", "judged_hours", "judged_dirty") if t in r)
            lines.append(f"    {name:<8}{r['server']:<12}{r['bytes'] / 2**20:>10,.0f} MiB  {counts}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
