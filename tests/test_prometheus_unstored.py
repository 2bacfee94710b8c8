"""A GPU whose series in Prometheus are all of metrics gpu-audit does not store (temperatures, clocks) is
warned about per GPU (host, index, UUID, the names seen), through a REAL Prometheus this test starts
(tests/test_infra_prometheus.py's private_prometheus) over real dcgm-exporter lines (tests/fixtures/dcgm:
the A100 scrape of NVIDIA's docs and the GKE T4 scrape, see PROVENANCE.md there), each repeated every 30 s
for 10 minutes."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from test_infra_prometheus import T0, private_prometheus
from test_scrape import A100_UNSTORED, DCGM

from connectors import build
from connectors.base import Context, Problems, Window

A100 = "a100-mig-nvidia-docs.txt"


def real_lines(name: str) -> list[tuple[str, str, str]]:
    """(metric, '{labels}', value) of every sample line of a real scrape file."""
    out = []
    for ln in (DCGM / name).read_text().splitlines():
        ln = ln.strip()
        if ln and not ln.startswith("#") and "{" in ln:
            head, value = ln.rsplit(" ", 1)
            out.append((head[:head.index("{")], head[head.index("{"):], value))
    return out


def openmetrics(lines: list[tuple[str, str, str]], step: int = 30, n: int = 20) -> str:
    out = []
    for name in dict.fromkeys(m for m, _, _ in lines):
        out.append(f"# TYPE {name} gauge")
        out += [f"{m}{labels} {v} {T0 + i * step}" for m, labels, v in lines if m == name for i in range(n)]
    return "\n".join(out) + "\n# EOF\n"


@pytest.fixture(scope="module")
def prom(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    a100 = real_lines(A100)
    lines = [x for x in a100 if x[0] in A100_UNSTORED and "GPU_I_ID" not in x[1]]  # temps and clocks only
    # the whole scrape again as a second node's (stored and unstored metrics): never warned about
    lines += [(m, labels.replace('Hostname="ub20-a100-k8s"', 'Hostname="ub20-a100-k8s-2"'), v) for m, labels, v in a100]
    lines += real_lines("t4-gke-k8s-prof.prom")
    with private_prometheus(tmp_path_factory.mktemp("prom"), openmetrics(lines)) as url:
        yield url


@pytest.mark.service
def test_prometheus_warns_per_gpu_with_only_unstored_metrics(prom: str, caplog: pytest.LogCaptureFixture) -> None:
    src = build("prometheus", "telemetry", {"url": prom, "sample_interval_s": 30}, Context("c1"))
    win = Window(datetime.fromtimestamp(T0, UTC), datetime.fromtimestamp(T0 + 600, UTC), 300)
    with caplog.at_level(logging.WARNING, "gpu_audit"):
        buckets = list(src.collect(win, Problems()))
    assert sorted({(b.host, b.gpu) for b in buckets}) == [
        ("gke-test-dcgm-default-pool-fed1e979-tt7p", 0), ("gke-test-dcgm-default-pool-fed1e979-tt7p", 1),
        ("ub20-a100-k8s-2", 0)]
    want = ("GPU ub20-a100-k8s/0 (UUID GPU-34319582-d595-d1c7-d1d2-179bcfa61660) has only metrics gpu-audit does "
            f"not store: {', '.join(sorted(A100_UNSTORED)[:8])} and 1 more; no bucket for it")
    assert src.notes == [want]  # before: no word about ub20-a100-k8s at all
    assert [r.getMessage() for r in caplog.records if "does not store" in r.getMessage()] == [
        f"{src.source}: {want}"]


def test_fixture_lines_are_the_real_files() -> None:
    """The helper reads every sample line (the A100 file has 17 whole-GPU and 4 MIG lines)."""
    assert len(real_lines(A100)) == 21 and Path(DCGM / A100).exists()
