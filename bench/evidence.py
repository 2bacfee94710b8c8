"""The findings' evidence, the shipped path next to the one it replaced, on one kept audit run, in one process,
alternating, best of ``--repeat`` (whole-audit seconds on a busy 2-core machine varied by half; a path timed
against its predecessor in one process does not): each stored finding's evidence without its sparkline,
encoded as the audit writes it now (the sparkline's store text spliced in, ``jsonsafe.with_member``) vs as
before (the sparkline's 96 values parsed to floats and the run's thresholds copied into the evidence, then
``jsonsafe.dumps``); both must parse to the same sparklines (checked), and the bytes of each are printed.

Run: python -m bench.evidence URL --gpus N [--days 7] [--seed 1] [--repeat 3]   (a store of bench.fleet)
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import text


def legacy_bins(packed: str, bins: int, hours: int) -> dict[str, Any]:
    """The sparkline as before: the packed ``bin:sm:util;...`` text parsed to floats."""
    sm: list[float | None] = [None] * bins
    util: list[float | None] = [None] * bins
    for item in packed.split(";"):
        if item:
            b, s_sm, s_util = item.split(":")
            k = int(b)
            if 0 <= k < bins:
                sm[k] = float(s_sm) if s_sm else None
                util[k] = float(s_util) if s_util else None
    return {"sm": sm, "util": util, "bin_hours": hours}


def measure(url: str, gpus: int, days: float, seed: int, repeat: int) -> dict[str, Any]:
    from auditor import jsonsafe
    from auditor.audit.run import run_audit
    from auditor.audit.sparklines import sparkline_json
    from auditor.config import Config
    from auditor.simulate import FleetSpec
    from auditor.store.engine import Store

    spec = FleetSpec(gpus=gpus, days=days, seed=seed)
    store = Store.open(url)
    cfg = Config()
    run = run_audit(store, cfg, spec.start, spec.end)
    best: dict[str, float] = {}

    def timed(name: str, fn: Callable[[], Any]) -> Any:
        t = time.perf_counter()
        out = fn()
        best[name] = min(best.get(name, float("inf")), time.perf_counter() - t)
        return out

    try:
        with store.begin() as conn:
            evs = [json.loads(e) if isinstance(e, str) else e for (e,) in conn.execute(text(
                "SELECT evidence FROM findings WHERE run_id = :r AND allocation_id IS NOT NULL"), {"r": run.run_id})]
            # the packed text the store returns, rebuilt from each stored sparkline (3 decimals)
            packed = [(";".join(f"{i}:{'' if s is None else f'{s:.3f}'}:{'' if u is None else f'{u:.3f}'}"
                                for i, (s, u) in enumerate(zip(e["sparkline"]["sm"], e["sparkline"]["util"],
                                                               strict=True))),
                       len(e["sparkline"]["sm"]), e["sparkline"]["bin_hours"]) if "sparkline" in e else None
                      for e in evs]
            for e in evs:
                e.pop("sparkline", None)
            th = cfg.thresholds.model_dump()

            def legacy_evidence() -> list[str]:
                out = []
                for e, p in zip(evs, packed, strict=True):
                    d = dict(e)
                    if p is not None:
                        d["sparkline"] = legacy_bins(*p)
                    d["thresholds"] = th
                    out.append(jsonsafe.dumps(d))
                return out

            def evidence() -> list[str]:
                return [jsonsafe.with_member(jsonsafe.dumps(e), "sparkline", sparkline_json(*p)) if p is not None
                        else jsonsafe.dumps(e) for e, p in zip(evs, packed, strict=True)]

            for _ in range(repeat):
                old = timed("evidence, floats and thresholds (before)", legacy_evidence)
                new = timed("evidence, sparkline text spliced", evidence)
            same = all(json.loads(a).get("sparkline") == json.loads(b).get("sparkline") for a, b in zip(old, new,
                                                                                                        strict=True))
            if not same:
                raise SystemExit("bench.evidence: the spliced sparklines differ from the parsed ones")
            sizes = {"evidence bytes (before)": sum(map(len, old)), "evidence bytes": sum(map(len, new))}
    finally:
        with store.begin() as conn:
            for table in ("findings", "usage_gpu", "usage_allocation"):
                conn.execute(text(f"DELETE FROM {table} WHERE run_id = :r"), {"r": run.run_id})
            conn.execute(text("DELETE FROM audit_runs WHERE id = :r"), {"r": run.run_id})
        store.engine.dispose()
    return {"gpus": gpus, "allocations": run.summary.get("allocations"), "findings": len(evs), "seconds": best, **sizes}


def main(argv: list[str] | None = None) -> None:
    from bench.audit import fleet_parser

    ap = fleet_parser(__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3, help="Alternating rounds; the best of each is kept.")
    args = ap.parse_args(argv)
    r = measure(args.url, args.gpus, args.days, args.seed, args.repeat)
    for name, s in r["seconds"].items():
        print(f"{s:8.2f} s  {name}")
    print(f"{r['evidence bytes (before)'] / r['findings']:8.0f} B   evidence per finding (before)")
    print(f"{r['evidence bytes'] / r['findings']:8.0f} B   evidence per finding")
    print(json.dumps(r), flush=True)


if __name__ == "__main__":
    sys.exit(main())
