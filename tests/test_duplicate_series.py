"""Issue 44 "Series counted twice": one source scraped by two Prometheus jobs (the same target, a different
``job`` label) is one series read twice, merged, never added, for every connector that reads Prometheus
(node_exporter's CPU cores, an inference engine's tokens, dcgm-exporter's GPU samples); ``scrape_labels``
names the labels that tell the copies apart; ``config check --probe`` says when it sees such copies.

The series live in a Prometheus of this test's own (promtool backfill, tests/test_infra_prometheus.py), at 30 s:

- node ``n1:9100``: 4 cores, each busy 50 % (user 0.5 s and idle 0.5 s per second), scraped by jobs ``node``
  and ``node-again``: 2.0 cores busy, 4 cores, 0 pegged (it read 4.0 busy and 8 cores, 4 pegged at 2x);
- vLLM pod ``serve/chat-0``: 20 tokens/s, scraped by jobs ``pods`` and ``vllm``: 6,000 tokens per 5-minute
  bucket (it read 12,000);
- dcgm-exporter GPU 0 of ``n1``: SM activity 0.4, scraped by jobs ``dcgm`` and ``dcgm-again``: 10 samples per
  bucket, 300 s observed (it read 20 samples).

The series run from T0 (a whole hour, 3 to 4 hours ago) to two minutes ago; the collections read 40 minutes of
the first hour.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from connectors.base import Context, Problems, Window

NOW = int(time.time())
T0 = (NOW - 3 * 3600) // 3600 * 3600
STEPS = (NOW - 120 - T0) // 30  # up to two minutes ago at 30 s (the probe looks at the last hour)
B = 300
JOBS = {"node": ("node", "node-again"), "vllm": ("pods", "vllm"), "dcgm": ("dcgm", "dcgm-again")}


def openmetrics() -> str:
    fams: dict[str, list[str]] = {}

    def series(name: str, labels: str, values: list[float]) -> None:
        fams.setdefault(name, []).extend(f"{name}{{{labels}}} {v:g} {T0 + i * 30}" for i, v in enumerate(values))

    for job in JOBS["node"]:
        for cpu in range(4):
            for mode in ("user", "idle"):
                series("node_cpu_seconds_total", f'cpu="{cpu}",instance="n1:9100",job="{job}",mode="{mode}"',
                       [1000.0 + 15.0 * i for i in range(STEPS)])  # 0.5 s a second in each mode
    for job in JOBS["vllm"]:
        series("vllm:generation_tokens_total", f'instance="10.0.0.7:8000",job="{job}",model_name="m",'
               f'namespace="serve",pod="chat-0"', [5000.0 + 600.0 * i for i in range(STEPS)])  # 20 tokens/s
        series("vllm:num_requests_running", f'instance="10.0.0.7:8000",job="{job}",model_name="m",'
               f'namespace="serve",pod="chat-0"', [3.0] * STEPS)
    for job in JOBS["dcgm"]:
        labels = f'Hostname="n1",gpu="0",UUID="GPU-0",instance="10.0.0.1:9400",job="{job}",modelName="NVIDIA A100"'
        series("DCGM_FI_PROF_SM_ACTIVE", labels, [0.4] * STEPS)
        series("DCGM_FI_DEV_GPU_UTIL", labels, [90.0] * STEPS)
    return "".join(f"# TYPE {n} gauge\n" + "\n".join(lines) + "\n" for n, lines in fams.items()) + "# EOF\n"


@pytest.fixture(scope="module")
def prom(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from test_infra_prometheus import private_prometheus

    with private_prometheus(tmp_path_factory.mktemp("dupes"), openmetrics()) as url:
        yield url


def window() -> Window:
    start = datetime.fromtimestamp(T0, UTC)
    return Window(start + timedelta(minutes=10), start + timedelta(minutes=50), B)


@pytest.mark.service
def test_node_exporter_scraped_twice_counts_each_core_once(prom: str) -> None:
    from connectors.node_exporter import NodeTelemetry

    src = NodeTelemetry(Context("c"), NodeTelemetry.Options(url=prom, retries=0))
    rows = list(src.collect(window(), Problems()))
    assert len(rows) == 8 and {r.node for r in rows} == {"n1"}
    for r in rows:
        assert (r.cpus, r.cpu_pegged) == (4, 0), r
        assert r.cpu_busy == pytest.approx(2.0), r  # four cores at 50 %: two cores' worth, not four
    # a site whose copies differ in another label too names it: without it they are two sources again
    loose = NodeTelemetry(Context("c"), NodeTelemetry.Options(url=prom, retries=0, scrape_labels=[]))
    assert {r.cpus for r in loose.collect(window(), Problems())} == {8}


@pytest.mark.service
def test_an_inference_pod_scraped_twice_counts_its_tokens_once(prom: str) -> None:
    from connectors.inference import InferenceTelemetry

    src = InferenceTelemetry(Context("c"), InferenceTelemetry.Options(url=prom, retries=0, engines=["vllm"]))
    rows = list(src.collect(window(), Problems()))
    assert len(rows) == 8 and {r.job for r in rows} == {"serve/chat-0"}
    assert all(r.generated_tokens == pytest.approx(6000.0) for r in rows), [r.generated_tokens for r in rows]
    assert all(r.running_mean == pytest.approx(3.0) for r in rows)  # 3 requests, not 6


@pytest.mark.service
def test_a_gpu_scraped_twice_counts_its_samples_once(prom: str) -> None:
    from connectors.prometheus import PrometheusTelemetry

    src = PrometheusTelemetry(Context("c"), PrometheusTelemetry.Options(url=prom, retries=0,
                                                                        recording_rules="off"))
    rows = [r for r in src.collect(window(), Problems()) if hasattr(r, "samples")]
    assert len(rows) == 8 and {(r.host, r.gpu) for r in rows} == {("n1", 0)}
    for r in rows:
        assert r.samples == 10 and r.observed_s == pytest.approx(300.0), (r.samples, r.observed_s)
        assert r.sm_active == pytest.approx(0.4) and r.gpu_util == pytest.approx(0.9)


@pytest.mark.service
def test_the_probe_says_when_it_sees_series_read_twice(prom: str, tmp_path: Path) -> None:
    from auditor.config import SourceConfig
    from auditor.probe import probe_source

    for kind, opts in (("prometheus", {"url": prom}), ("node_exporter", {"url": prom}),
                       ("inference", {"url": prom, "engines": ["vllm"]})):
        p = probe_source("c", "telemetry", 0, SourceConfig.model_validate({"kind": kind, **opts}), tmp_path)
        assert p.ok, (kind, p.detail)
        assert "read twice" in p.detail and "scrape_labels" in p.detail, (kind, p.detail)
