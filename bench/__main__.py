"""``python -m bench``: every figure of issues 9 and 20 measured in one run and printed as one table
(figure, value, target, ratio = value / target, met or MISSED).

Benchmarks (each a callable in :data:`BENCHMARKS`, run in that order, skipped with ``--only``):

- ``ingest``: bucket ingest through Store.ingest vs raw sqlite3 executemany (:mod:`bench.ingest`);
- ``pg_ingest``: PostgreSQL ingest, COPY + merge vs a raw COPY of the same rows (:mod:`bench.pg_ingest`);
- ``audit``: the audit of simulated fleets (GPUs x days at 5-min buckets) on each engine, each in its own
  process: seconds, the engine's floor (a bare grouped scan), audit/floor, judge/floor, peak RSS, the
  scaling between sizes (:mod:`bench.audit`, :mod:`bench.pg`, SQLite stores cached by :mod:`bench.fleet`);
- ``render``: the report of a ~200k-allocation run (12,288 GPUs x 7 days), each format, new vs legacy,
  outputs compared byte for byte (:mod:`bench.render`);
- ``collect``: several file-based clusters collected one after another vs in worker processes
  (:mod:`bench.collect`).

A module may take over its rows: when ``bench.pg``, ``bench.pg_ingest`` or ``bench.audit`` defines
``rows(args, figures) -> list[Row]`` (``from bench.table import Row``), that function is called instead of
the default here (``args``: the parsed flags, e.g. ``args.pg_gpus``, ``args.pg_url``, ``args.days``;
``figures``: the dict written by ``--json``, add your raw numbers to it). :func:`audit_rows` turns the
per-size dicts of :mod:`bench.audit` into the audit rows (seconds, audit/floor, judge/floor, RSS, scaling).

Full run:  python -m bench          (1,024 / 4,096 / 16,384 GPUs x 7 days on SQLite and PostgreSQL, render
                                     of 12,288 GPUs, 4 clusters collected; hours on 2 cores)
Partial:   python -m bench --gpus 1024,4096 --engines sqlite --only audit,render
Smoke:     python -m bench --quick [--engines sqlite,postgresql]       (tests/test_bench_smoke.py)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench import fleet
from bench.table import Row, table

# the targets of issue 20 (and issue 9's SQLite ingest)
AUDIT_S_16384 = 60.0  # seconds for the 16,384-GPU week
FLOOR_RATIO, FLOOR_GOAL = 10.0, 3.0  # audit / the engine's own grouped scan
RSS_MIB = 1024.0
SCALING_4X = 4.5  # 4x the GPUs -> at most 4.5x the time (other steps: the same 1.125x per data ratio)
INGEST_ROWS_S, INGEST_RATIO = 500_000.0, 0.5  # SQLite Store.ingest (issue 9)
PG_INGEST_ROWS_S, PG_INGEST_RATIO = 300_000.0, 0.5  # PostgreSQL COPY + merge, and vs a raw COPY
RENDER_S = 5.0  # all formats of the ~200k-allocation run
OTHER = ("bench_slurm", "bench_kubernetes", "bench_prometheus", "bench_recording", "bench_jobstats", "bench_web")


Bench = Callable[[argparse.Namespace, dict[str, Any]], list[Row]]


def say(text: str) -> None:
    print(text, flush=True)


def _hook(module: str) -> Bench | None:
    """``rows`` of ``bench.<module>`` when it defines one (the owner's own benchmark rows)."""
    import importlib

    try:
        return getattr(importlib.import_module(f"bench.{module}"), "rows", None)
    except ImportError:
        return None


# --- the benchmarks -------------------------------------------------------------------------------------


def bench_ingest(args: argparse.Namespace, figures: dict[str, Any]) -> list[Row]:
    if not args.ingest_gpus or "sqlite" not in args.engines:
        return []
    from bench import ingest as ingest_bench

    r = ingest_bench.measure(args.ingest_gpus, args.ingest_days)
    figures["ingest"] = r
    say(f"ingest {r['rows']:,} buckets: Store.ingest {r['store_rows_s']:,.0f} rows/s | raw sqlite3 executemany "
        f"{r['raw_rows_s']:,.0f} rows/s | ratio {r['ratio']:.2f}x")
    return [Row("SQLite ingest: Store.ingest", r["store_rows_s"], "rows/s", INGEST_ROWS_S, True),
            Row("SQLite ingest / raw executemany", r["ratio"], "x", INGEST_RATIO, True)]


def bench_pg_ingest(args: argparse.Namespace, figures: dict[str, Any]) -> list[Row]:
    if not args.ingest_gpus or "postgresql" not in args.engines:
        return []
    hook = _hook("pg_ingest")
    if hook is not None:
        return hook(args, figures)
    from bench import pg_ingest

    r = pg_ingest.measure(args.pg_url, args.ingest_gpus, min(args.ingest_days, 2))
    figures["pg_ingest"] = r
    say(pg_ingest.report(r))
    # end to end (records -> tuples in Python -> COPY + merge), and the COPY + merge step alone on the built
    # tuples (the part the database does), each against the same raw COPY
    return [Row("PostgreSQL ingest: Store.ingest", r["copy_rows_s"], "rows/s", PG_INGEST_ROWS_S, True),
            Row("PostgreSQL Store.ingest / raw COPY", r["copy_vs_raw"], "x", PG_INGEST_RATIO, True),
            Row("PostgreSQL COPY + merge of built rows", r["merge_only_rows_s"], "rows/s", PG_INGEST_ROWS_S, True),
            Row("PostgreSQL COPY + merge / raw COPY", r["merge_only_vs_raw"], "x", PG_INGEST_RATIO, True),
            # the Python part alone (records -> tuples) and the ceiling it puts on Store.ingest / raw COPY
            Row("  records -> row tuples alone (Python)", r["build_rows_s"], "rows/s"),
            Row("  Store.ingest / raw COPY bound by it", r["build_bound_vs_raw"], "x",
                note="raw / (raw + building): one thread builds and encodes"),
            # the raw COPY straight into gpu_buckets: its key's share of the gap, apart from gpu-audit's own work
            Row("  raw COPY into gpu_buckets itself (its key)", r["raw_keyed_rows_s"], "rows/s"),
            Row("  Store.ingest / that keyed raw COPY", r["copy_vs_raw_keyed"], "x",
                note="not the target's reference (the bare table is)")]


def audit_child(url: str, gpus: int, days: float, seed: int) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "bench.audit", url, "--gpus", str(gpus), "--days", str(days), "--seed", str(seed)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=4 * 3600)
    if proc.returncode != 0:
        raise SystemExit(f"bench: audit of {gpus} GPUs failed:\n{proc.stderr.strip()[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _per_gpu_week(size: float, gpus: int, days: float) -> str:
    return f"{size / gpus / (days / 7) / 1024:,.0f} KiB per GPU-week"


def audit_rows(engine: str, results: list[dict[str, Any]]) -> list[Row]:
    """Seconds, audit/floor, judge/floor and peak RSS per size, and the scaling between sizes."""
    label = {"sqlite": "SQLite", "pg": "PostgreSQL"}[engine]
    rows: list[Row] = []
    for r in results:
        n = r["gpus"]
        rows += [Row(f"{label} audit {n:,} GPUs", r["audit_s"], "s", AUDIT_S_16384 if n == 16384 else None),
                 Row(f"{label} audit/floor {n:,} GPUs", r["audit_s"] / r["floor_s"], "x", FLOOR_RATIO,
                     note=f"goal {FLOOR_GOAL:g}x"),
                 Row(f"{label} judge/floor {n:,} GPUs", r["judge_s"] / r["floor_s"], "x"),
                 # what audit/floor would be with judging free: the bound that no judging speed-up moves
                 Row(f"{label} audit less judging / floor {n:,} GPUs", (r["audit_s"] - r["judge_s"]) / r["floor_s"],
                     "x", note="the per-allocation stage alone"),
                 Row(f"{label} peak RSS {n:,} GPUs", r["rss_mib"], "MiB", RSS_MIB)]
    for a, b in zip(results, results[1:], strict=False):
        data = b["gpus"] / a["gpus"]
        rows.append(Row(f"{label} scaling {a['gpus']:,} -> {b['gpus']:,} GPUs ({data:g}x data)",
                        b["audit_s"] / a["audit_s"], "x", SCALING_4X / 4 * data))
    return rows


def _audit_line(r: dict[str, Any]) -> str:
    """One audit's figures, and on a second line its slowest steps (auditor.audit.timing)."""
    steps = sorted((r.get("steps") or {}).items(), key=lambda kv: -kv[1])
    split = "" if not steps else ("\n          steps: " + ", ".join(f"{k} {v:.1f}s" for k, v in steps[:8])
                                  + (f", {len(steps) - 8} more {sum(v for _k, v in steps[8:]):.1f}s"
                                     if len(steps) > 8 else ""))
    cpu = (f" (CPU {r['audit_cpu_s']:.2f}s client + {r.get('audit_server_cpu_s') or 0:.2f}s server)"
           if "audit_cpu_s" in r else "")
    return (f"{r['gpus']:>7,} GPUs {r['rows']:>12,} rows {r['allocations']:>8,} allocs "
            f"| audit {r['audit_s']:.2f}s{cpu} "
            f"| floor {r['floor_s']:.2f}s | audit/floor {r['audit_s'] / r['floor_s']:.1f}x | judge "
            f"{r['judge_s']:.2f}s = {r['judge_s'] / r['floor_s']:.1f}x floor | peak RSS {r['rss_mib']:.0f} MiB"
            + split)


def machine() -> dict[str, Any]:
    """What the figures were measured on: absolute seconds differ between machines (the same audit code took
    21 s for the 4,096-GPU week on one 2-core machine, 2026-11-30 12:25 UTC, and 53 s on another at 13:40),
    the ratios much less. The calibration is a fixed pure-Python loop, so two runs' machines can be compared."""
    import os
    import platform

    model = ""
    try:
        model = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                      if ln.startswith("model name")), "")
    except OSError:
        pass
    t = time.perf_counter()
    acc = 0
    for i in range(10_000_000):
        acc += i
    return {"cpu": model or platform.processor(), "cores": os.cpu_count(),
            "python_loop_10m_s": round(time.perf_counter() - t, 3), "load_avg": round(os.getloadavg()[0], 2)}


def bench_audit(args: argparse.Namespace, figures: dict[str, Any]) -> list[Row]:
    if "sqlite" not in args.engines or not args.gpus:
        return []
    hook = _hook("audit")
    if hook is not None:
        return hook(args, figures)
    say("SQLite audit (each in its own process)")
    for n in args.gpus:
        spec = fleet.FleetSpec(gpus=n, days=args.days, seed=args.seed)
        path, info, reused = fleet.cached(spec, Path(args.out), log=say)
        r = audit_child(f"sqlite:///{path}", n, args.days, args.seed)
        r.update(generate=info, reused=reused)
        figures["sqlite"].append(r)
        gen = f"generate+ingest {info['generate_s']:.0f}+{info['ingest_s']:.0f}s" + (" (cached)" if reused else "")
        say(f"{_audit_line(r)} | {gen} | store {info['bytes'] / 2**20:,.0f} MiB = "
            f"{_per_gpu_week(info['bytes'], n, args.days)}")
    return audit_rows("sqlite", figures["sqlite"])


def bench_pg_audit(args: argparse.Namespace, figures: dict[str, Any]) -> list[Row]:
    if "postgresql" not in args.engines or not args.pg_gpus:
        return []
    hook = _hook("pg")
    if hook is not None:
        return hook(args, figures)
    from bench import pg, pg_fleet

    for n in args.pg_gpus:
        if args.quick:  # smoke: a throw-away schema, dropped after
            say(f"PostgreSQL audit, {n:,} GPUs (schema bench_<pid>, dropped after) ...")
            r = pg.measure(args.pg_url, n, args.days, args.seed)
            figures["pg"].append(r)
            say(f"{_audit_line(r)} | ingest {r['ingest_rows'] / r['ingest_s']:,.0f} rows/s | gpu_buckets "
                f"{_per_gpu_week(r['bucket_bytes'], n, args.days)}")
            continue
        # the identical fleet the SQLite rows audit, copied into a kept schema fleet_<key> once
        spec = fleet.FleetSpec(gpus=n, days=args.days, seed=args.seed)
        say(f"PostgreSQL audit, {n:,} GPUs (the cached SQLite fleet, copied once into schema fleet_{spec.key()}) ...")
        url, _, info = pg_fleet.fleet_schema(spec, args.pg_url, Path(args.out))
        r = audit_child(url, n, args.days, args.seed)
        r.update(pg_load=info)
        figures["pg"].append(r)
        say(f"{_audit_line(r)} | copied into PostgreSQL in {info.get('load_s', 0):.0f}s")
    return audit_rows("pg", figures["pg"])


def bench_render(args: argparse.Namespace, figures: dict[str, Any]) -> list[Row]:
    if "sqlite" not in args.engines or not args.render_gpus:
        return []
    from bench import render

    spec = fleet.FleetSpec(gpus=args.render_gpus, days=args.days, seed=args.seed)
    path, _, _ = fleet.cached(spec, Path(args.out), log=say)
    r = render.measure(f"sqlite:///{path}", args.render_gpus, args.days, args.seed, legacy=not args.no_legacy)
    figures["render"] = r
    say(render.report(r))
    new, old = r["new"], r.get("legacy")
    what = f"{r['allocations']:,} allocations"
    rows = [Row(f"render all formats, {what}", new["total_s"], "s", RENDER_S,
                note="" if r["allocations"] >= 150_000 else "target is for ~200k allocations")]
    rows += [Row(f"  render {k}", v, "s") for k, v in new["seconds"].items()]
    rows.append(Row("  render peak RSS", new["rss_mib"], "MiB"))
    if old:
        rows += [Row("  legacy render all formats (before)", old["total_s"], "s"),
                 Row("  legacy render peak RSS (before)", old["rss_mib"], "MiB"),
                 Row("  render speed-up vs legacy", old["total_s"] / new["total_s"], "x",
                     note="outputs byte-identical" if r.get("identical") else "")]
    return rows


def bench_start(args: argparse.Namespace, figures: dict[str, Any]) -> list[Row]:
    """The fixed cost of a run (issue 46): CLI start, `gpu-audit job` on the demo, a new store's creation."""
    from bench import start

    pg = args.pg_url if "postgresql" in args.engines else None
    r = start.measure(Path(args.out), repeat=2 if args.quick else 5, pg_url=pg, job=not args.quick)
    figures["start"] = r
    say(start.report(r))
    return start.rows(r)


def bench_jobstats(args: argparse.Namespace, figures: dict[str, Any]) -> list[Row]:
    """gpu-audit against Job Defense Shield on the same saved sacct with jobstats summaries (issue 46 rows);
    JDS (the bench extra) at up to 10,000 jobs, gpu-audit alone above."""
    from bench import bench_jobstats as js

    if not args.jobstats_jobs:
        return []
    jds = js.jds_installed()
    if not jds:
        say("Job Defense Shield is not installed (pip install -e '.[bench]'): gpu-audit alone")
    res = js.run(args.jobstats_jobs, 3600, jds=jds, jds_max=10_000)
    figures["jobstats"] = res
    return js.table_rows(res) + [
        # issue 46's one-server figure: hours of the machine, never part of this run
        Row("100,000 GPUs x 7 days on one PostgreSQL server: audit wall", None, "s", 1200.0,
            note="not run here: python -m bench.fleet --sizes 100000 --days 7 --clusters 10, then python -m "
                 "bench.clusters <its PostgreSQL copy> --gpus 100000 --days 7 --clusters 10 --processes 4"),
        Row("100,000 GPUs x 7 days: peak RSS per audit process", None, "MiB", 2048.0, note="not run here")]


def bench_collect(args: argparse.Namespace, figures: dict[str, Any]) -> list[Row]:
    if not args.collect_clusters:
        return []
    from bench import collect

    rows: list[Row] = []
    figures["collect"] = []
    for engine in args.engines:
        url = "sqlite" if engine == "sqlite" else args.pg_url
        r = collect.measure(args.collect_clusters, args.collect_gpus, args.collect_hours, url)
        figures["collect"].append(r)
        say(collect.report(r))
        label = {"sqlite": "SQLite", "postgresql": "PostgreSQL"}[engine]
        rows += [Row(f"{label} collect {r['clusters']} clusters sequential", r["sequential_s"], "s"),
                 Row(f"{label} collect {r['clusters']} clusters, {r['workers']} workers", r["parallel_s"], "s"),
                 Row(f"{label} collect speed-up (sequential / parallel)", r["speedup"], "x")]
    return rows


#: The benchmarks in run order: (name for --only, callable). Add a row here for a new benchmark.
BENCHMARKS: list[tuple[str, Bench]] = [
    ("ingest", bench_ingest),
    ("pg_ingest", bench_pg_ingest),
    ("audit", bench_audit),
    ("pg_audit", bench_pg_audit),
    ("render", bench_render),
    ("collect", bench_collect),
    ("start", bench_start),
    ("jobstats", bench_jobstats),
]


def run(args: argparse.Namespace) -> dict[str, Any]:
    figures: dict[str, Any] = {"sqlite": [], "pg": [], "args": {k: v for k, v in vars(args).items()}}
    rows: list[Row] = []
    say(f"gpu-audit bench ({time.strftime('%Y-%m-%d %H:%M')} UTC): {args.days:g} days at 5-min buckets; "
        f"engines {', '.join(args.engines)}")
    figures["machine"] = m = machine()
    say(f"machine: {m['cpu']}, {m['cores']} cores; a 10-million-step Python loop takes {m['python_loop_10m_s']:.2f}s "
        f"(compare runs by it); load average {m['load_avg']}")
    for name, fn in BENCHMARKS:
        if args.only and name not in args.only:
            continue
        say(f"\n[{name}]")
        t = time.monotonic()
        rows += fn(args, figures)
        say(f"[{name}: {time.monotonic() - t:.0f}s]")
    say("\ntargets (ratio = value / target)\n" + table(rows))
    missed = [r.name for r in rows if r.status == "MISSED"]
    say(f"\n{len(rows)} figures, {sum(r.status == 'met' for r in rows)} met, {len(missed)} missed"
        + (f": {'; '.join(missed)}" if missed else ""))
    say("command: python -m bench " + " ".join(args.argv))
    others = [m for m in OTHER if (Path(__file__).parent / f"{m}.py").exists()]
    if others:
        say("connector benchmarks (run separately): " + "; ".join(f"python -m bench.{m}" for m in others))
    figures["rows"] = [{**asdict(r), "ratio": r.ratio, "status": r.status} for r in rows]
    return figures


def _list(text: str | None) -> list[int]:
    return [int(x) for x in (text or "").split(",") if x.strip()]


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench", description="gpu-audit benchmarks (issues 9 and 20)")
    ap.add_argument("--quick", action="store_true", help="Smoke run at a tiny scale (32,64 GPUs x 1 day; the "
                    "other sizes shrink too): checks every figure is measured, not how fast.")
    ap.add_argument("--gpus", "--sizes", dest="gpus", default=None,
                    help="Fleet sizes (GPUs) audited, comma-separated (default 1024,4096,16384).")
    ap.add_argument("--pg-gpus", "--pg-sizes", dest="pg_gpus", default=None,
                    help="Sizes audited on PostgreSQL (default: --gpus).")
    ap.add_argument("--engines", default=None, help="sqlite, postgresql or both (default both; --quick: sqlite).")
    ap.add_argument("--only", default="", help="Only these benchmarks: " + ", ".join(n for n, _ in BENCHMARKS))
    ap.add_argument("--days", type=float, default=None, help="Days of telemetry per fleet (default 7).")
    ap.add_argument("--seed", type=int, default=1, help="Simulation seed (part of the cache key).")
    ap.add_argument("--pg-url", default="postgresql+psycopg://postgres@127.0.0.1:5432/test")
    ap.add_argument("--ingest-gpus", type=int, default=None, help="GPUs of the ingest benchmarks (0 to skip).")
    ap.add_argument("--ingest-days", type=float, default=None)
    ap.add_argument("--render-gpus", type=int, default=None,
                    help="Fleet rendered (default 12,288 GPUs: ~200k allocations over 7 days; 0 to skip).")
    ap.add_argument("--no-legacy", action="store_true", help="Skip the legacy (before) rendering.")
    ap.add_argument("--collect-clusters", type=int, default=None, help="Clusters collected (0 to skip).")
    ap.add_argument("--collect-gpus", type=int, default=None, help="GPUs per collected cluster.")
    ap.add_argument("--collect-hours", type=float, default=None, help="Hours of minute telemetry per cluster.")
    ap.add_argument("--jobstats-jobs", default=None, help="Job counts of the jobstats benchmark against Job "
                    "Defense Shield, comma-separated (default 1000,10000,100000; JDS up to 10,000; empty to skip).")
    ap.add_argument("--out", default=str(fleet.OUT), help="Cache directory of generated fleet stores.")
    ap.add_argument("--json", dest="json_out", default=None, help="Also write every figure to this JSON file.")
    args = ap.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    q = args.quick
    args.gpus = _list(args.gpus if args.gpus is not None else ("32,64" if q else "1024,4096,16384"))
    args.pg_gpus = _list(args.pg_gpus) if args.pg_gpus is not None else args.gpus
    args.engines = [e.strip() for e in (args.engines or ("sqlite" if q else "sqlite,postgresql")).split(",")
                    if e.strip()]
    for e in args.engines:
        if e not in ("sqlite", "postgresql"):
            ap.error(f"--engines: unknown engine {e!r} (sqlite, postgresql)")
    args.jobstats_jobs = _list(args.jobstats_jobs if args.jobstats_jobs is not None
                               else ("100,200" if q else "1000,10000,100000"))
    args.only = [x.strip() for x in args.only.split(",") if x.strip()]
    for name in args.only:
        if name not in dict(BENCHMARKS):
            ap.error(f"--only: unknown benchmark {name!r} ({', '.join(n for n, _ in BENCHMARKS)})")
    defaults = {"days": (1, 7), "ingest_gpus": (16, 256), "ingest_days": (1, 7),
                "render_gpus": (max(args.gpus, default=64), 12288), "collect_clusters": (2, 4),
                "collect_gpus": (8, 32), "collect_hours": (2, 24)}
    for key, (quick, full) in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, quick if q else full)
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    figures = run(args)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(figures, indent=1, default=str))


if __name__ == "__main__":
    main()
