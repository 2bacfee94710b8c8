"""Prompt-cache hit rate (issue 48 §4; docs/definitions.md "Inference services", "Prompt-cache hit rate"): vLLM's
prefix-cache counters and SGLang's hit-rate gauge read from a private Prometheus backfilled from the fixture
pages' series (tests/fixtures/inference, PROVENANCE.md), stored and audited on SQLite and PostgreSQL, per
service beside cost per million tokens, a low rate flagged; and the demo's chat-vllm, by hand.

By hand, per 5-minute bucket, 24 buckets (2 hours):
- chat-7d9f (vLLM): ``vllm:prefix_cache_queries_total`` rises 2,000 tokens/s, ``..._hits_total`` 160/s:
  600,000 looked up and 48,000 found a bucket; the service's rate 24 x 48,000 / (24 x 600,000) = 8 % < 20 %:
  flagged.
- sglang-0 (SGLang, data parallel 2, tensor parallel 2): ``sglang:cache_hit_rate`` 0.42 on dp_rank 0 and 0.30
  on dp_rank 1, each copied on tp_rank 1 (not read): the pod's rate per bucket the mean of its two ranks,
  (0.42 + 0.30) / 2 = 0.36: not flagged.
- TGI and Triton export no prefix-cache figure (their services: "n/a", tests/test_demo.py's other services).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from test_inference import HOURS, NOW, STEPS, T0, _allocations, _gpu_buckets, _labels, _pod, one, pages, window

from auditor.audit.inference import LOW_CACHE_HIT_RATE
from auditor.audit.run import run_audit
from auditor.config import Config
from auditor.records import InferenceBucket
from connectors.base import Context, Problems
from connectors.inference import InferenceTelemetry

QUERIES, HITS = 2000.0, 160.0  # vLLM, tokens per second
SGLANG_RATES = {"0": 0.42, "1": 0.30}  # dp_rank -> hit rate


def openmetrics() -> str:
    vllm, _tgi, sglang, _trt, _tvllm = pages()
    fams: dict[str, list[str]] = {}

    def series(name: str, labels: str, values: list[float]) -> None:
        fams.setdefault(name, []).extend(f"{name}{{{labels}}} {v:.3f} {T0 + i * 30}" for i, v in enumerate(values))

    vl, q0 = one(vllm, "vllm:prefix_cache_queries_total")
    _, h0 = one(vllm, "vllm:prefix_cache_hits_total")
    chat = f"{_pod('chat-7d9f', '10.0.0.7:8000')},{_labels(vl)}"
    series("vllm:prefix_cache_queries_total", chat, [q0 + QUERIES * 30 * i for i in range(STEPS)])
    series("vllm:prefix_cache_hits_total", chat, [h0 + HITS * 30 * i for i in range(STEPS)])
    sg = _pod("sglang-0", "10.0.0.9:30000")
    for labels, _v in sglang["sglang:cache_hit_rate"]:  # the page's tp_rank 0 and 1 copies, per dp rank
        for dp, rate in SGLANG_RATES.items():
            series("sglang:cache_hit_rate", f"{sg},{_labels({**labels, 'dp_rank': dp})}", [rate] * STEPS)
    return "".join(f"# TYPE {n} gauge\n" + "\n".join(lines) + "\n" for n, lines in fams.items()) + "# EOF\n"


@pytest.fixture(scope="module")
def prom(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from test_infra_prometheus import private_prometheus

    with private_prometheus(tmp_path_factory.mktemp("prompt-cache"), openmetrics()) as url:
        yield url


def collected(url: str) -> list[InferenceBucket]:
    src = InferenceTelemetry(Context("c"), InferenceTelemetry.Options(url=url, retries=0))
    return list(src.collect(window(), Problems()))


@pytest.mark.service
def test_connector_reads_the_cache_counters_and_the_rate(prom: str) -> None:
    rows = collected(prom)
    chat = [b for b in rows if b.job == "serve/chat-7d9f"]
    sg = [b for b in rows if b.job == "serve/sglang-0"]
    assert len(chat) == len(sg) == 24
    assert [(b.cache_queries, b.cache_hits, b.cache_hit_rate) for b in chat] == [
        (pytest.approx(600000.0), pytest.approx(48000.0), None)] * 24
    assert [b.cache_hit_rate for b in sg] == [pytest.approx(0.36)] * 24  # the mean of its dp ranks, not 0.72
    assert all(b.cache_queries is None for b in sg)


@pytest.mark.service
def test_service_hit_rate_beside_cost_and_the_low_one_flagged(prom: str, store: Any) -> None:
    store.ingest([*_allocations(), *_gpu_buckets(), *collected(prom)], seen_at_ts=NOW)
    start = datetime.fromtimestamp(T0, UTC)
    rid = run_audit(store, Config(), start, start + timedelta(hours=HOURS)).run_id
    from auditor.report.context import build_context

    inf = build_context(store, Config(), rid)["inference"]
    by = {r["service"]: r for r in inf["rows"]}
    assert set(by) == {"Deployment/chat", "StatefulSet/sglang"}  # the pods with inference buckets here
    chat, sg = by["Deployment/chat"], by["StatefulSet/sglang"]
    assert (chat["cache_hit_rate"], chat["cache_measured"], chat["low_cache_hit_rate"]) == (
        pytest.approx(0.08), "tokens", True)
    assert (chat["cache_queries"], chat["cache_hits"]) == (pytest.approx(24 * 600000.0), pytest.approx(24 * 48000.0))
    assert chat["cost_per_million"] is None  # no token counter in this Prometheus: the cost still beside it
    assert (sg["cache_hit_rate"], sg["cache_measured"], sg["low_cache_hit_rate"]) == (pytest.approx(0.36), "gauge",
                                                                                       False)
    assert chat["cache_text"] == "8 %" and sg["cache_text"] == "36 % (gauge)"
    assert inf["totals"]["low_cache"] == 1 and LOW_CACHE_HIT_RATE == 0.2
    from starlette.testclient import TestClient

    from auditor.web.app import create_app

    page = TestClient(create_app(store, Config())).get("/services").text
    assert '<strong class="low-cache">low</strong>' in page and "36 % (gauge)" in page


def test_a_hit_rate_above_one_is_refused(store: Any) -> None:
    bad = InferenceBucket("c", "sglang", "serve/x", datetime.fromtimestamp(T0, UTC), 300, cache_hit_rate=1.5)
    good = InferenceBucket("c", "vllm", "serve/y", datetime.fromtimestamp(T0, UTC), 300, cache_queries=5e9,
                           cache_hits=1e9)
    stats = store.ingest([bad, good], seen_at_ts=NOW)
    assert stats.inference == 1  # token counts have no request bound; a share above 1 is no share


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path]:
    from auditor.cli import main

    out = tmp_path_factory.mktemp("demo")
    res = CliRunner().invoke(main, ["--json", "demo", "--out", str(out), "--now", "2026-11-29T00:00"])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout), out


def test_demo_chat_vllm_cache_hit_rate_is_low(demo: tuple[dict, Path]) -> None:
    """By hand (auditor/demo.py PREFIX_CACHE): 2,000 prompt tokens looked up a second, 160 found, over its 48
    hours: 8 %, flagged; its cost per million generated tokens beside it (tests/test_demo.py: 23.15)."""
    data, out = demo
    rid = data["run_id"]
    doc = json.loads((out / "reports" / f"report-{rid}.json").read_text())
    (chat,) = [s for s in doc["inference"]["rows"] if s["service"] == "Deployment/chat-vllm"]
    assert chat["cache_hit_rate"] == pytest.approx(160 / 2000) and chat["low_cache_hit_rate"] is True
    assert chat["cache_queries"] == pytest.approx(2000 * 48 * 3600)
    txt = (out / "reports" / f"report-{rid}.txt").read_text()
    assert "USD 23.15 per million tokens, 108,000 tokens per GPU-hour, mean concurrency 1.0, prompt-cache hit " \
        "rate 8 % [BATCHING HEADROOM] [LOW CACHE HIT RATE]" in txt
    md = (out / "reports" / f"report-{rid}.md").read_text()
    assert "| yes | 8 % (low) |" in md
    html = (out / "reports" / f"report-{rid}.html").read_text()
    assert "low cache hit rate</span>" in html and "prompt-cache hit rate 8 %" in html
