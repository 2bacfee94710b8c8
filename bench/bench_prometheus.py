"""Benchmark: pull 1,024 GPUs x 7 days x 8 metrics as 5-min buckets from a real Prometheus, convert and
ingest them, against the parse-only floor (json + conversion of the same saved responses, no HTTP).

Needs the bench testbed: ``bash scripts/testbed-prometheus.sh up bench`` (127.0.0.1:19091; 1,024 GPUs,
7 days, one raw sample per 5 min: 30 s raw samples, 165 M of them, are too heavy to backfill on 2 cores;
the server-side buckets pulled here have the same size either way).

Run: python -m bench.bench_prometheus [--url http://127.0.0.1:19091] [--days 7] [--store sqlite:///...]
     [--no-ingest]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from connectors.base import Context, Problems, Window
from connectors.prometheus import Merge, PrometheusTelemetry

STATE = Path("/var/lib/gpu-audit-testbed/bench/state.json")


class Recording(PrometheusTelemetry):
    """The real connector, keeping each query_range answer (and its form) for the parse-only floor."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.saved: list[tuple[dict[str, Any], bytes]] = []

    def request(self, path: str, data: dict[str, Any], method: str = "POST") -> bytes:
        body = super().request(path, data, method)
        if path.endswith("query_range"):
            self.saved.append((data, body))
        return body


def floor(src: Recording, window: Window) -> tuple[float, int]:
    """Time decode + merge + bucket building of the saved answers, chunk by chunk, as collect does."""
    have = src.existing_names(window, Problems())
    what = {q: (kind, w) for kind, w, q in src.plan(have, window.bucket_seconds)}
    problems = Problems()
    t0 = time.perf_counter()
    n = 0
    merged: Merge | None = None
    chunk = None
    for data, body in src.saved:
        if data["start"] != chunk:
            if merged is not None:
                n += sum(1 for _ in merged.buckets())
            merged, chunk = Merge(src, window.bucket_seconds, problems), data["start"]
        kind, w = what[data["query"]]
        assert merged is not None
        merged.add(kind, w, src.decode(body, "/api/v1/query_range", problems))
    if merged is not None:
        n += sum(1 for _ in merged.buckets())
    return time.perf_counter() - t0, n


def main() -> None:
    ap = argparse.ArgumentParser(description="Prometheus pull + ingest vs parse-only floor")
    ap.add_argument("--url", default="http://127.0.0.1:19091")
    ap.add_argument("--days", type=float, default=7.0)
    ap.add_argument("--store", default=None, help="SQLAlchemy URL (default: a temporary SQLite file)")
    ap.add_argument("--no-ingest", action="store_true")
    ap.add_argument("--gzip", action="store_true", help="ask for gzip answers (off: loopback)")
    a = ap.parse_args()
    if not STATE.exists():
        raise SystemExit("bench data missing: run `bash scripts/testbed-prometheus.sh up bench` first")
    state = json.loads(STATE.read_text())
    start = datetime.fromtimestamp(state["start"], UTC)
    window = Window(start, start + timedelta(days=a.days), 300)
    src = Recording(Context("bench"), PrometheusTelemetry.Options(url=a.url, timeout_s=300, compression=a.gzip,
                                                                  recording_rules="off"))  # the raw path

    problems = Problems()
    t0 = time.perf_counter()
    buckets = list(src.collect(window, problems))
    t_pull = time.perf_counter() - t0
    size = sum(len(body) for _, body in src.saved)
    t_floor, n_floor = floor(src, window)
    assert n_floor == len(buckets), (n_floor, len(buckets))

    print(f"data: {state['gpus']} GPUs x {a.days:g} days x 8 metrics, raw every {state['interval']} s, "
          f"gzip {'on' if a.gzip else 'off'}; "
          f"{len(buckets):,} buckets from {len(src.saved)} query_range answers ({size / 1e6:.0f} MB JSON)")
    print(f"pull+convert  {t_pull:7.2f} s  {len(buckets) / t_pull:10,.0f} buckets/s")
    print(f"parse floor   {t_floor:7.2f} s  {len(buckets) / t_floor:10,.0f} buckets/s")
    print(f"ratio floor/(pull+convert) = {t_floor / t_pull:.2f}")
    if a.no_ingest:
        return
    try:
        from auditor.store.engine import Store
    except ImportError:
        print("auditor.store.engine not available: ingest not measured")
        return
    with tempfile.TemporaryDirectory() as tmp:
        store = Store.open(a.store or f"sqlite:///{tmp}/bench.db")
        store.upgrade()
        t1 = time.perf_counter()
        stats = store.ingest(buckets)
        t_ingest = time.perf_counter() - t1
        store.engine.dispose()
    total = t_pull + t_ingest
    print(f"ingest        {t_ingest:7.2f} s  {stats.buckets / t_ingest:10,.0f} buckets/s  "
          f"({store.dialect})")
    print(f"pull+ingest   {total:7.2f} s  ratio floor/(pull+convert+ingest) = {t_floor / total:.2f}")


if __name__ == "__main__":
    main()
