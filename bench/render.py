"""Rendering the report of a large audit run, each format timed, with the peak RSS of the rendering process.

The fleet store (:mod:`bench.fleet`) is audited once in a child process (the run is kept until the end), then
rendered in two more children, each its own peak RSS:

- ``new``: what ``gpu-audit report`` does (:func:`auditor.report.render.write_reports`): the report context
  built once, HTML, text and Markdown rendered from it, the full JSON export and the findings CSV streamed
  from the store in one pass (:mod:`auditor.report.export`);
- ``legacy``: the in-memory path it replaced: the context built again with every row (``full=True``) and
  dumped whole, the CSV written from a list of every finding.

Both write with the same ``now``, so their files must be byte-identical (checked; a difference fails).
The audit run is deleted afterwards, leaving the cached store as generated.

Run: python -m bench.render [--gpus 12288] [--days 7] [--out DIR]     (12,288 GPUs x 7 days ~ 200k allocations)
     python -m bench.render URL --run ID --mode new|legacy --dir DIR    (one rendering child)
"""

from __future__ import annotations

import argparse
import filecmp
import json
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import text

from bench.audit import peak_rss_kib

NOW = datetime(2026, 1, 1, tzinfo=UTC)  # "generated" in both renderings
TARGET_S = 5.0


def render_child(url: str, run_id: int, mode: str, out: Path) -> dict[str, Any]:
    """Time each format of one rendering of ``run_id`` into ``out`` (this process)."""
    from auditor.config import Config
    from auditor.report import context as report
    from auditor.report import render
    from auditor.store.engine import Store

    store, cfg = Store.open(url), Config()
    out.mkdir(parents=True, exist_ok=True)
    spent: dict[str, float] = {}

    def timed(name: str, fn: Any, *args: Any, **kw: Any) -> Any:
        t = time.perf_counter()
        value = fn(*args, **kw)
        spent[name] = spent.get(name, 0.0) + time.perf_counter() - t
        return value

    ctx = timed("context", report.build_context, store, cfg, run_id, now=NOW)
    for fmt in ("html", "text", "md"):
        data = timed(fmt, render.render, ctx, fmt)
        timed(fmt, (out / f"report-{run_id}.{render.EXT[fmt]}").write_text, data, encoding="utf-8")
    csv_path, json_path = out / f"findings-{run_id}.csv", out / f"report-{run_id}.json"
    if mode == "new":
        from auditor.report.export import write_exports

        timed("json+csv", write_exports, store, cfg, run_id, ctx, csv_path=csv_path, cell=render.csv_cell,
              json_path=json_path)
    else:
        full = timed("json", report.build_context, store, cfg, run_id, full=True, now=NOW)
        timed("json", json_path.write_text, render.render_json(full, compact=True), encoding="utf-8")
        timed("csv", render.write_csv, timed("csv", report.findings_csv_rows, store, cfg, run_id), csv_path)
    store.engine.dispose()
    return {"mode": mode, "seconds": spent, "total_s": sum(spent.values()), "rss_mib": peak_rss_kib() / 1024,
            "json_bytes": json_path.stat().st_size, "csv_bytes": csv_path.stat().st_size}


def _child(args: list[str]) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, "-m", "bench.render", *args], capture_output=True, text=True,
                          check=False, timeout=3600)
    if proc.returncode != 0:
        raise SystemExit(f"bench.render {' '.join(args[1:3])} failed:\n{proc.stderr.strip()[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def measure(url: str, gpus: int, days: float, seed: int = 1, *, legacy: bool = True) -> dict[str, Any]:
    """Audit the fleet at ``url`` once, render it ``new`` (and ``legacy``), compare, clean up."""
    from auditor.store.engine import Store

    audit = _child([url, "--audit", "--gpus", str(gpus), "--days", str(days), "--seed", str(seed)])
    rid = int(audit["run_id"])
    try:
        with tempfile.TemporaryDirectory(prefix="gpu-audit-bench-render-") as tmp:
            res: dict[str, Any] = {"gpus": gpus, "allocations": audit["allocations"], "findings": audit["findings"],
                                   "new": _child([url, "--run", str(rid), "--mode", "new", "--dir", f"{tmp}/new"])}
            if legacy:
                res["legacy"] = _child([url, "--run", str(rid), "--mode", "legacy", "--dir", f"{tmp}/legacy"])
                # the reports; not the manifest of written files (auditor/owned.py), which names its own folder
                names = sorted(p.name for p in Path(tmp, "new").iterdir() if not p.name.startswith("."))
                same = filecmp.cmpfiles(f"{tmp}/new", f"{tmp}/legacy", names, shallow=False)[0]
                res["identical"] = same == names
                if not res["identical"]:
                    raise SystemExit(f"bench.render: new and legacy output differ: {sorted(set(names) - set(same))}")
    finally:
        store = Store.open(url)
        with store.begin() as conn:
            for table in ("findings", "usage_gpu", "usage_allocation"):
                conn.execute(text(f"DELETE FROM {table} WHERE run_id = :r"), {"r": rid})
            conn.execute(text("DELETE FROM audit_runs WHERE id = :r"), {"r": rid})
        store.engine.dispose()
    res["render_s"] = res["new"]["total_s"]
    return res


def _audit(url: str, gpus: int, days: float, seed: int) -> dict[str, Any]:
    from auditor.audit.run import run_audit
    from auditor.config import Config
    from auditor.simulate import FleetSpec
    from auditor.store.engine import Store

    spec = FleetSpec(gpus=gpus, days=days, seed=seed)
    store = Store.open(url)
    t = time.perf_counter()
    r = run_audit(store, Config(), spec.start, spec.end)
    store.engine.dispose()
    return {"run_id": r.run_id, "audit_s": time.perf_counter() - t, "allocations": r.summary.get("allocations"),
            "findings": sum(r.summary.get("findings", {}).values())}


def report(r: dict[str, Any]) -> str:
    """Per-format seconds, new vs legacy, as printed by ``python -m bench``."""
    new, old = r["new"], r.get("legacy")
    lines = [f"render of the {r['gpus']:,}-GPU run ({r['allocations']:,} allocations, {r['findings']:,} findings):"]
    for label, s in (("new (one context, JSON+CSV streamed)", new), ("legacy (context twice, in memory)", old)):
        if s:
            parts = " | ".join(f"{k} {v:.2f}s" for k, v in s["seconds"].items())
            lines.append(f"  {label}: {parts} | total {s['total_s']:.2f}s | peak RSS {s['rss_mib']:.0f} MiB")
    if old:
        lines.append(f"  outputs byte-identical: {r['identical']}; speed-up {old['total_s'] / new['total_s']:.1f}x")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("url", nargs="?", default=None, help="Store URL (default: the cached fleet store).")
    ap.add_argument("--gpus", type=int, default=12288)
    ap.add_argument("--days", type=float, default=7)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default=None, help="Fleet cache directory (default bench.fleet.OUT).")
    ap.add_argument("--no-legacy", action="store_true", help="Skip the legacy rendering.")
    ap.add_argument("--audit", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--run", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--mode", choices=["new", "legacy"], default="new", help=argparse.SUPPRESS)
    ap.add_argument("--dir", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.audit:
        print(json.dumps(_audit(a.url, a.gpus, a.days, a.seed)), flush=True)
        return
    if a.run is not None:
        print(json.dumps(render_child(a.url, a.run, a.mode, Path(a.dir))), flush=True)
        return
    url = a.url
    if url is None:
        from auditor.simulate import FleetSpec
        from bench import fleet

        path, _, _ = fleet.cached(FleetSpec(gpus=a.gpus, days=a.days, seed=a.seed),
                                  Path(a.out) if a.out else fleet.OUT)
        url = f"sqlite:///{path}"
    r = measure(url, a.gpus, a.days, a.seed, legacy=not a.no_legacy)
    print(report(r), flush=True)
    print(json.dumps(r), flush=True)


if __name__ == "__main__":
    main()
