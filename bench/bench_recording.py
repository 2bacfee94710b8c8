"""Benchmark: samples the TSDB reads per collect with and without gpu-audit's recording rules.

Needs the rules testbeds: ``bash scripts/testbed-prometheus.sh up rules`` (127.0.0.1:19094) and
``bash scripts/testbed-victoriametrics.sh up rules`` (127.0.0.1:19095): the test profile's 6 GPUs x 6 h of
30 s samples plus the series of deploy/prometheus-recording-rules.yml from hour 1 on. Per server and mode
(``recording_rules = off`` / ``on``) one collect of the window, repeated: the samples the server read
(Prometheus: ``totalQueryableSamples`` of each answer's ``stats=all``; VictoriaMetrics: the samples its
``trace=1`` query trace says were fetched from storage, whole blocks), in all and in the bucket queries
(``query_range``) alone, client CPU (this process) and server CPU (its ``process_cpu_seconds_total``) beside
wall seconds, and whether the buckets are identical (VictoriaMetrics: values to its 12 stored digits).

Run: python -m bench.bench_recording [--from-hour 1] [--repeat 3]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import re
import time
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from connectors.base import Context, Problems, Window
from connectors.prometheus import PrometheusTelemetry

SERVERS = {"prometheus": ("http://127.0.0.1:19094", Path("/var/lib/gpu-audit-testbed/rules")),
           "victoriametrics": ("http://127.0.0.1:19095", Path("/var/lib/gpu-audit-testbed/victoriametrics-rules"))}
QUERYABLE = re.compile(rb'"totalQueryableSamples":\s*(\d+)')
FETCHED = re.compile(rb'"fetch unique series=\d+, blocks=\d+, samples=(\d+)')


class Counting(PrometheusTelemetry):
    """The real connector, asking for each query's stats (Prometheus) or trace (VictoriaMetrics) and adding up
    the samples the server read."""

    samples = 0
    bucket_samples = 0  # of which in query_range (bucket values, counts, the rules' heartbeat, faults)

    def request(self, path: str, data: dict[str, Any], method: str = "POST") -> bytes:
        if path in ("/api/v1/query_range", "/api/v1/query"):
            data = {**data, "stats": "all", "trace": "1"}
        body = super().request(path, data, method)
        n = sum(int(n) for n in QUERYABLE.findall(body) + FETCHED.findall(body))
        self.samples += n
        self.bucket_samples += n if path == "/api/v1/query_range" else 0
        return body


def server_metric(url: str, name: str) -> float:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as resp:  # noqa: S310 - the testbed's own URL
        for line in resp.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    return math.nan


def collect(url: str, window: Window, mode: str) -> tuple[list, dict[str, float]]:
    src = Counting(Context("bench"), PrometheusTelemetry.Options(url=url, recording_rules=mode, compression=False))
    cpu0, wall0, mine0 = server_metric(url, "process_cpu_seconds_total"), time.perf_counter(), time.process_time()
    buckets = list(src.collect(window, Problems()))
    wall, mine = time.perf_counter() - wall0, time.process_time() - mine0
    server = server_metric(url, "process_cpu_seconds_total") - cpu0
    return buckets, {"samples": float(src.samples), "bucket_samples": float(src.bucket_samples), "wall": wall,
                     "client_cpu": mine, "server_cpu": server,
                     "recorded": float(src.read_recorded)}


def same(a: list, b: list, digits: bool) -> bool:
    """Identical buckets (every field); ``digits``: floats to 1e-11 relative (VictoriaMetrics' decimals)."""
    rows = [{(x.host, x.gpu, x.gpu_instance, x.start, x.job): dataclasses.asdict(x) for x in side} for side in (a, b)]
    if rows[0].keys() != rows[1].keys():
        return False
    for key, row in rows[0].items():
        for f, v in row.items():
            w = rows[1][key][f]
            if digits and isinstance(v, float) and isinstance(w, float):
                if not math.isclose(v, w, rel_tol=1e-11, abs_tol=1e-15):
                    return False
            elif v != w:
                return False
    return True


def main() -> None:
    ap = argparse.ArgumentParser(description="samples read per collect with and without recording rules")
    ap.add_argument("--from-hour", type=float, default=1.0,
                    help="window start, hours into the data (the rules were backfilled from hour 1 on)")
    ap.add_argument("--repeat", type=int, default=3, help="collects per server and mode (the fastest shown)")
    a = ap.parse_args()
    for kind, (url, directory) in SERVERS.items():
        state_file = directory / "state.json"
        if not (directory / "gpu-audit-testbed").exists() or not state_file.exists():
            print(f"{kind}: no rules testbed in {directory} (run scripts/testbed-*.sh up rules)")
            continue
        state = json.loads(state_file.read_text())
        start = datetime.fromtimestamp(state["start"], UTC) + timedelta(hours=a.from_hour)
        window = Window(start, datetime.fromtimestamp(state["start"], UTC) + timedelta(hours=state["hours"]), 300)
        out: dict[str, tuple[list, dict[str, float]]] = {}
        for mode in ("off", "on"):
            runs = [collect(url, window, mode) for _ in range(max(1, a.repeat))]
            out[mode] = min(runs, key=lambda r: r[1]["wall"])
        (raw, r), (rec, c) = out["off"], out["on"]
        hours = (window.until - window.since).total_seconds() / 3600
        print(f"{kind} ({url}): {hours:g} h x {len({(b.host, b.gpu, b.gpu_instance) for b in raw})} GPUs, "
              f"{len(raw)} buckets, raw every {state['interval']} s; {c['recorded']:.0f} of "
              f"{len({b.start for b in raw})} bucket times read recorded")
        for name, m in (("raw series", r), ("recording rules", c)):
            print(f"  {name:16} {m['samples']:>9,.0f} samples read ({m['bucket_samples']:>7,.0f} by bucket queries)"
                  f"   wall {m['wall']:6.3f} s   "
                  f"client CPU {m['client_cpu']:6.3f} s   server CPU {m['server_cpu']:6.2f} s")
        ratio = r["samples"] / c["samples"] if c["samples"] else math.inf
        in_buckets = r["bucket_samples"] / c["bucket_samples"] if c["bucket_samples"] else math.inf
        print(f"  reduction {ratio:.1f}x fewer samples read ({in_buckets:.1f}x in the bucket queries); buckets "
              f"{'identical' if same(raw, rec, kind == 'victoriametrics') else 'DIFFERENT'}"
              f"{' (values to 12 digits)' if kind == 'victoriametrics' else ''}")


if __name__ == "__main__":
    main()
