"""GPU faults through a REAL Prometheus (Debian's package): fault series written as OpenMetrics, backfilled
with promtool into a private TSDB, served by a prometheus process this test starts on a free port and stops;
the connector's PromQL must find the same faulty buckets as worked out by hand (as test_infra_telemetry does
for scrape files)."""

from __future__ import annotations

import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from helpers import free_port

from auditor.records import NodeEvent
from connectors import build
from connectors.base import Context, Problems, Window
from tests.conftest import need

LABELS = 'gpu="{g}",UUID="GPU-{g}",device="nvidia{g}",Hostname="node-f"'
NOW = int(time.time())
T0 = (NOW - 2 * 86400) // 3600 * 3600  # two days ago, a whole hour


def openmetrics(series: dict[tuple[str, int], list[float]], step: int = 30) -> str:
    out = []
    for name in sorted({n for n, _g in series}):
        out.append(f"# TYPE {name} gauge")
        for (n, g), vals in series.items():
            if n == name:
                out += [f"{name}{{{LABELS.format(g=g)}}} {v:g} {T0 + i * step}" for i, v in enumerate(vals)]
    return "\n".join(out) + "\n# EOF\n"


def per_minute(values: list[float]) -> list[float]:
    """A value a minute -> a sample every 30 s (each value twice)."""
    return [v for v in values for _ in (0, 1)]


SERIES = {("DCGM_FI_DEV_XID_ERRORS", 0): per_minute([0] * 7 + [79] * 10 + [48] * 3),
          ("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", 0): per_minute([1, 1] + [4] * 8 + [0x48] * 3 + [1] * 7),
          ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", 1): per_minute([0] * 12 + [2] * 8),
          ("DCGM_FI_DEV_ROW_REMAP_FAILURE", 1): per_minute([0] * 16 + [1] * 4),
          ("DCGM_FI_DEV_GPU_UTIL", 0): per_minute([0] * 20), ("DCGM_FI_DEV_GPU_UTIL", 1): per_minute([0] * 20)}


@contextmanager
def private_prometheus(d: Path, openmetrics_text: str) -> Iterator[str]:
    """A prometheus process of this test's own on a free port, over ``openmetrics_text`` backfilled with
    promtool into ``d``; stopped when the block ends."""
    need(bool(shutil.which("prometheus") and shutil.which("promtool")), "prometheus and promtool not installed")
    (d / "data.om").write_text(openmetrics_text)
    subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", str(d / "data.om"), str(d / "tsdb")],
                   check=True, capture_output=True, timeout=120)
    (d / "prometheus.yml").write_text("global: {}\n")
    port = free_port()
    proc = subprocess.Popen(["prometheus", f"--config.file={d / 'prometheus.yml'}",  # noqa: S603
                             f"--storage.tsdb.path={d / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}",
                             "--storage.tsdb.retention.time=100y"],
                            stdout=subprocess.DEVNULL, stderr=(d / "log").open("w"))
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if urllib.request.urlopen(url + "/-/ready", timeout=2).status == 200:  # noqa: S310
                    break
            except OSError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, (d / "log").read_text()[-2000:]
            time.sleep(0.3)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture(scope="module")
def prom(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with private_prometheus(tmp_path_factory.mktemp("prom"), openmetrics(SERIES)) as url:
        yield url


def ev(a: int, b: int) -> tuple[datetime, datetime]:
    base = datetime.fromtimestamp(T0, UTC)
    return base + timedelta(minutes=a), base + timedelta(minutes=b)


@pytest.mark.service
def test_prometheus_finds_the_faulty_buckets(prom: str) -> None:
    src = build("prometheus", "telemetry", {"url": prom, "sample_interval_s": 30}, Context("c1"))
    p = Problems()
    win = Window(datetime.fromtimestamp(T0, UTC), datetime.fromtimestamp(T0 + 3600, UTC), 300)
    recs = list(src.collect(win, p))
    assert p.total == 0, p.items
    events = sorted(((e.gpu, e.kind, e.start, e.end, e.reason) for e in recs if isinstance(e, NodeEvent)),
                    key=lambda x: (x[0], x[1], x[2]))
    # XID 0 -> 79 at 7 min (bucket 5-10), 79 -> 48 at 17 min (15-20); throttle bits 0x48 at 10-12 min;
    # ECC DBE +2 at 12 min (10-15); row remap failure from 16 min (15-20)
    assert events == [
        (0, "throttle", *ev(10, 15), "throttle: HW slowdown; throttle: HW thermal slowdown"),
        (0, "xid", *ev(5, 10), "XID 79"), (0, "xid", *ev(15, 20), "XID 48"),
        (1, "ecc_dbe", *ev(10, 15), "ECC double-bit errors +2"),
        (1, "row_remap", *ev(15, 20), "row remap failure")]
    assert all(e.node == "node-f" and e.source == "prometheus" for e in recs if isinstance(e, NodeEvent))
