"""Benchmark: samples the TSDB reads per collect with and without gpu-audit's recording rules.

Needs the rules testbeds: ``bash scripts/testbed-prometheus.sh up rules`` (127.0.0.1:19094) and
``bash scripts/testbed-victoriametrics.sh up rules`` (127.0.0.1:19095): the test profile's 6 GPUs x 6 h of
30 s samples plus the series of deploy/prometheus-recording-rules.yml from hour 1 on. Per server and mode
(``recording_rules = off`` / ``on``) one collect of the window, repeated: the samples the server read
(Prometheus: ``totalQueryableSamples`` of each answer's ``stats=all``; VictoriaMetrics: the samples its
``trace=1`` query trace says were fetched from storage, whole blocks), in all and in the bucket queries
(``query_range``) alone, client CPU (this process) and server CPU (its ``process_cpu_seconds_total``) beside
wall seconds, and whether the buckets are identical (VictoriaMetrics: values to its 12 stored digits).

``--gpus N`` instead builds a larger pair of its own in a temporary directory (the generator's bench profile:
N GPUs x ``--hours`` of 30 s samples, 8 metrics; promtool and vmalert backfill the rules over all of it),
on free ports, and stops them afterwards: the testbeds are not touched.

Run: python -m bench.bench_recording [--from-hour 1] [--repeat 3] [--gpus 64 --hours 6]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
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


ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "deploy" / "prometheus-recording-rules.yml"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait(url: str, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            if urllib.request.urlopen(url, timeout=2).status == 200:  # noqa: S310 - our own server
                return
        if proc.poll() is not None:
            break
        time.sleep(0.3)
    raise SystemExit(f"{url} did not come up: {log.read_text()[-1500:]}")


def _run(*cmd: str) -> None:
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)  # noqa: S603 - fixed commands
    if out.returncode:
        raise SystemExit(f"{cmd[0]} failed: {(out.stdout + out.stderr)[-1500:]}")


@contextlib.contextmanager
def private_servers(gpus: int, hours: float) -> Iterator[tuple[dict[str, tuple[str, Path]], dict]]:
    """A Prometheus and a VictoriaMetrics of this run's own over generated data with the rules backfilled."""
    for tool in ("prometheus", "promtool", "victoria-metrics", "vmalert"):
        if not shutil.which(tool):
            raise SystemExit(f"{tool} not installed (Debian packages prometheus, victoria-metrics)")
    procs: list[subprocess.Popen] = []
    with tempfile.TemporaryDirectory(prefix="gpu-audit-bench-rules-") as tmp:
        d = Path(tmp)
        start = (int(time.time()) - 3 * 86400) // 3600 * 3600
        _run(sys.executable, str(ROOT / "scripts" / "gen_dcgm_openmetrics.py"), "--out", str(d), "--profile", "bench",
             "--gpus", str(gpus), "--hours", str(hours), "--interval", "30", "--start", str(start))
        state = json.loads((d / "state.json").read_text())
        t0, t1 = start + 137, start + int(hours * 3600) + 900  # rules evaluated off the grid, over it all

        def prometheus(port: int) -> subprocess.Popen:
            (d / "prometheus.yml").write_text("global: {}\n")
            proc = subprocess.Popen(["prometheus", f"--config.file={d / 'prometheus.yml'}",  # noqa: S607
                                     f"--storage.tsdb.path={d / 'tsdb'}", "--storage.tsdb.retention.time=100y",
                                     f"--web.listen-address=127.0.0.1:{port}", "--query.max-samples=100000000"],
                                    stdout=subprocess.DEVNULL, stderr=(d / "prometheus.log").open("w"))
            procs.append(proc)
            _wait(f"http://127.0.0.1:{port}/-/ready", proc, d / "prometheus.log")
            return proc

        try:
            _run("promtool", "tsdb", "create-blocks-from", "openmetrics", "--max-block-duration=24h",
                 str(d / "data.om"), str(d / "tsdb"))
            port = _free_port()
            prom = f"http://127.0.0.1:{port}"
            first = prometheus(port)
            _run("promtool", "tsdb", "create-blocks-from", "rules", f"--url={prom}", f"--start={t0}", f"--end={t1}",
                 f"--output-dir={d / 'rule-blocks'}", str(RULES))
            first.terminate()
            first.wait(timeout=60)
            for block in (d / "rule-blocks").iterdir():
                block.rename(d / "tsdb" / block.name)
            prometheus(port)

            vport = _free_port()
            vm = f"http://127.0.0.1:{vport}"
            proc = subprocess.Popen(["victoria-metrics", f"-httpListenAddr=127.0.0.1:{vport}",  # noqa: S607
                                     f"-storageDataPath={d / 'vm'}", "-retentionPeriod=100y",
                                     "-search.latencyOffset=0s", "-search.disableCache"],
                                    stdout=subprocess.DEVNULL, stderr=(d / "vm.log").open("w"))
            procs.append(proc)
            _wait(f"{vm}/health", proc, d / "vm.log")
            batch: list[str] = []

            def post() -> None:
                req = urllib.request.Request(vm + "/api/v1/import/prometheus", data="".join(batch).encode(),
                                             method="POST")
                urllib.request.urlopen(req, timeout=300).read()  # noqa: S310 - our own server
                batch.clear()

            with (d / "data.om").open(encoding="utf-8") as fh:
                for line in fh:
                    if line.startswith("#") or not line.strip():
                        continue
                    head, value, ts = line.rsplit(" ", 2)
                    batch.append(f"{head} {value} {int(ts) * 1000}\n")  # exposition format: milliseconds
                    if len(batch) >= 50_000:
                        post()
            if batch:
                post()
            urllib.request.urlopen(vm + "/internal/force_flush", timeout=60).read()  # noqa: S310
            iso = lambda t: datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")  # noqa: E731
            _run("vmalert", f"-rule={RULES}", f"-datasource.url={vm}", f"-remoteWrite.url={vm}",
                 f"-replay.timeFrom={iso(t0)}", f"-replay.timeTo={iso(t1)}", "-replay.rulesDelay=0s",
                 "-replay.disableProgressBar", "-httpListenAddr=127.0.0.1:0")
            urllib.request.urlopen(vm + "/internal/force_flush", timeout=60).read()  # noqa: S310
            yield {"prometheus": (prom, d), "victoriametrics": (vm, d)}, state
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.terminate()
                    proc.wait(timeout=60)


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
    ap.add_argument("--gpus", type=int, help="build a private pair of servers over this many GPUs instead")
    ap.add_argument("--hours", type=float, default=6.0, help="hours of data of the private pair")
    a = ap.parse_args()
    if a.gpus:
        t = time.perf_counter()
        with private_servers(a.gpus, a.hours) as (servers, state):
            print(f"private servers built in {time.perf_counter() - t:.0f} s")
            measure(servers, {k: state for k in servers}, 0.0, a.repeat)
        return
    states = {}
    for kind, (_url, directory) in SERVERS.items():
        if not (directory / "gpu-audit-testbed").exists() or not (directory / "state.json").exists():
            print(f"{kind}: no rules testbed in {directory} (run scripts/testbed-*.sh up rules)")
            continue
        states[kind] = json.loads((directory / "state.json").read_text())
    measure({k: v for k, v in SERVERS.items() if k in states}, states, a.from_hour, a.repeat)


def measure(servers: dict[str, tuple[str, Path]], states: dict[str, dict], from_hour: float, repeat: int) -> None:
    """Collect the window per server and mode, print samples read, CPU and wall seconds, and the verdict."""
    for kind, (url, _directory) in servers.items():
        state = states[kind]
        start = datetime.fromtimestamp(state["start"], UTC) + timedelta(hours=from_hour)
        window = Window(start, datetime.fromtimestamp(state["start"], UTC) + timedelta(hours=state["hours"]), 300)
        out: dict[str, tuple[list, dict[str, float]]] = {}
        for mode in ("off", "on"):
            runs = [collect(url, window, mode) for _ in range(max(1, repeat))]
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
