"""Inference services (vLLM, TGI, SGLang, Triton) end to end: one metrics page per engine, written for these
tests in the Prometheus text format with each engine's own names, types and label names (tests/fixtures/
inference, PROVENANCE.md says where upstream defines each), starts the counters and gauges and gives the
labels; backfilled with promtool into a PRIVATE Prometheus this module starts on a free port, read by the
inference connector, stored on both engines, audited; every figure checked against the hand calculation below
(docs/definitions.md "Inference services").

The scenario (two hours from T0, samples every 30 s, price 2.00 per GPU-hour, so each pod's 2 GPU-hours cost
4.00). A counter rising r tokens/s: each 5-minute bucket's ``increase`` sees 10 samples spanning 270 s,
270 r tokens, extrapolated to the 300 s bucket: 300 r a bucket, 24 buckets = 7,200 r.

- ``serve/chat-7d9f`` (vLLM, Deployment/chat, team nlp) on n1 GPU 0: ``vllm:generation_tokens_total`` rises
  20 tokens/s from 318,420 (vllm.prom's value, labels ``engine`` "0", ``model_name`` "acme/chat-8b-v2"):
  6,000 a bucket, 144,000 in all; ``vllm:num_requests_waiting`` 0 (the page's); ``vllm:num_requests_running``
  is 1,1,1,1,1,1,1,2,2,2 in every bucket: mean 13 / 10 = 1.3. The GPU's SM activity 30 % (not low: >= 25 %),
  DRAM 60 % (>= hint_dram_high 40 %): memory-bound. So cost per million = 4.00 / 144,000 x 10^6 = 27.78,
  tokens per GPU-hour = 144,000 / 2 = 72,000, and batching_headroom: "mean concurrency 1.3 on a memory-bound
  chip".
- ``serve/tgi-0`` (TGI, StatefulSet/tgi, team search) on n2 GPU 0: ``tgi_request_generated_tokens_sum``
  rises 50 tokens/s from 163,840 (tgi.prom: 320 requests of 160 tokens and 320 of 352): 15,000 a bucket,
  360,000 in all; batch size 8, queue 3 (the page's). Cost per million = 4.00 / 360,000 x 10^6 = 11.11;
  tokens per GPU-hour 180,000; concurrency 8 is not below 2: no finding.
- ``serve/sglang-0`` (SGLang, StatefulSet/sglang, team nlp) on n3 GPU 0: ``sglang:generation_tokens_total``
  (the tokenizer manager's, labelled ``model_name`` only) rises 30 tokens/s from 4,210,388 (sglang.prom):
  9,000 a bucket, 216,000 in all; ``sglang:num_running_reqs`` 48 and ``sglang:num_queue_reqs`` 12 (the
  page's), each twice, ``tp_rank`` 0 and 1 (two tensor-parallel schedulers report the same batch): read
  once, not summed (summed they would be 96 and 24). Cost per million = 4.00 / 216,000 x 10^6 = 18.52;
  concurrency 48: no finding.
- ``serve/triton-trt-0`` (Triton, TensorRT-LLM backend, Deployment/triton-trt, team search) on n4 GPU 0:
  ``nv_llm_output_token_len_sum`` rises 10 tokens/s from 61,250 (triton-trtllm.prom, 412 responses): 3,000 a
  bucket, 72,000 in all; ``nv_trt_llm_request_metrics`` (model "chat_trtllm") active 1, scheduled 1, waiting
  0 (context 0 and max 64 not read), Triton's ``nv_inference_pending_request_count`` 0, all the page's: mean
  concurrency 1.0, batch 1.0, waiting 0 + 0 = 0. Memory-bound chip: cost per million 4.00 / 72,000 x
  10^6 = 55.56, batching_headroom "mean concurrency 1.0 on a memory-bound chip".
- ``serve/triton-vllm-0`` (Triton, vLLM backend, Deployment/triton-vllm, team search) on n5 GPU 0: the
  vLLM backend's ``vllm:generation_tokens_total{model="chat_vllm", version="1"}`` rises 5 tokens/s from 20,480
  (triton-vllm-backend.prom): 1,500 a bucket, 36,000 in all, counted for Triton and NOT for vLLM (the version
  label). No running gauge: no concurrency, no finding. Cost per million 4.00 / 36,000 x 10^6 = 111.11.
- one vLLM series without namespace/pod labels: not tied to any allocation, counted in the source's notes.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import text

from auditor.audit.run import run_audit
from auditor.config import Config
from auditor.records import AllocatedGpu, Allocation, GpuBucket, InferenceBucket
from auditor.report.chargeback import chargeback, totals
from connectors.aliases import INFERENCE_ALIASES
from connectors.base import Context, Problems, Window
from connectors.inference import InferenceTelemetry

FIX = Path(__file__).resolve().parent / "fixtures" / "inference"
NOW = int(time.time())
T0 = (NOW - 2 * 86400) // 3600 * 3600  # two days ago, a whole hour
HOURS = 2
STEPS = HOURS * 3600 // 30
RUNNING = [1, 1, 1, 1, 1, 1, 1, 2, 2, 2]  # per bucket of 10 samples: mean 1.3
LOOSE = 'instance="10.9.9.9:8000"'
#: pod -> (engine, workload, team, node); each on GPU 0 of its node
PODS = {"chat-7d9f": ("vllm", "Deployment/chat", "nlp", "n1"), "tgi-0": ("tgi", "StatefulSet/tgi", "search", "n2"),
        "sglang-0": ("sglang", "StatefulSet/sglang", "nlp", "n3"),
        "triton-trt-0": ("triton", "Deployment/triton-trt", "search", "n4"),
        "triton-vllm-0": ("triton", "Deployment/triton-vllm", "search", "n5")}
MEMORY_BOUND = {"n1", "n4"}  # DRAM 60 %; the others 30 %
#: service -> (tokens, cost per million, mean concurrency, batching headroom): the docstring's hand figures
EXPECTED = {"Deployment/triton-vllm": (36000, 4.0 / 36000 * 1e6, None, False),
            "Deployment/triton-trt": (72000, 4.0 / 72000 * 1e6, 1.0, True),
            "Deployment/chat": (144000, 4.0 / 144000 * 1e6, 1.3, True),
            "StatefulSet/sglang": (216000, 4.0 / 216000 * 1e6, 48.0, False),
            "StatefulSet/tgi": (360000, 4.0 / 360000 * 1e6, 8.0, False)}
ALL_TOKENS = sum(e[0] for e in EXPECTED.values())  # 828,000


def parse_page(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Samples of one metrics page by name (the Prometheus text format, prometheus_client's parser):
    what a scrape of the engine gives, for checking that its names are the ones the queries read."""
    out: dict[str, list[tuple[dict[str, str], float]]] = defaultdict(list)
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[s.name].append((dict(s.labels), float(s.value)))
    return dict(out)


def names_read(engine: str) -> set[str]:
    """The metric names the queries of ``engine`` read."""
    return {r.name for reads in INFERENCE_ALIASES[engine].values() for r in reads}


def page(name: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    return parse_page((FIX / name).read_text())


def one(pg: dict[str, list[tuple[dict[str, str], float]]], name: str, **match: str) -> tuple[dict[str, str], float]:
    """The one sample of ``name`` on a fixture page whose labels include ``match``."""
    hits = [(labels, v) for labels, v in pg[name] if all(labels.get(k) == x for k, x in match.items())]
    assert len(hits) == 1, (name, match, pg.get(name))
    return hits[0]


def pages() -> tuple[dict[str, list[tuple[dict[str, str], float]]], ...]:
    """vLLM, TGI, SGLang, Triton's TensorRT-LLM backend, Triton's vLLM backend."""
    return tuple(page(f) for f in ("vllm.prom", "tgi.prom", "sglang.prom", "triton-trtllm.prom",
                                   "triton-vllm-backend.prom"))


def test_fixture_pages_carry_the_names_the_queries_read() -> None:
    vllm, tgi, sglang, trt, tvllm = pages()
    assert names_read("vllm") <= set(vllm), names_read("vllm") - set(vllm)
    assert names_read("tgi") <= set(tgi), names_read("tgi") - set(tgi)
    assert names_read("sglang") <= set(sglang), names_read("sglang") - set(sglang)
    assert names_read("triton") <= set(trt) | set(tvllm), names_read("triton") - set(trt) - set(tvllm)
    # every label value a read selects is one the engine's page carries
    for engine, pgs in (("triton", (trt, tvllm)), ("tgi", (tgi,)), ("vllm", (vllm,)), ("sglang", (sglang,))):
        for reads in INFERENCE_ALIASES[engine].values():
            for r in reads:
                samples = [lab for pg in pgs for lab, _ in pg.get(r.name, [])]
                for m in (x for x in r.matchers.split(",") if x and '="' in x and "!=" not in x):
                    k, v = m.split("=", 1)
                    assert any(s.get(k, "") == v.strip('"') for s in samples), (engine, r)
    # what tells the engines' series apart: native vLLM labels model_name and engine, never version; Triton's
    # vLLM backend labels model and version, never model_name; SGLang's schedulers one copy per tp_rank
    assert all("version" not in lab and {"model_name", "engine"} <= set(lab) for fam in vllm.values()
               for lab, _ in fam)
    assert all({"model", "version"} <= set(lab) and "model_name" not in lab for fam in tvllm.values()
               for lab, _ in fam)
    assert sorted(lab["tp_rank"] for lab, _ in sglang["sglang:num_running_reqs"]) == ["0", "1"]
    # the values the scenario starts from (the docstring's)
    assert one(vllm, "vllm:generation_tokens_total") == ({"engine": "0", "model_name": "acme/chat-8b-v2"}, 318420.0)
    assert one(vllm, "vllm:num_requests_waiting")[1] == 0.0
    assert tgi["tgi_request_generated_tokens_sum"] == [({}, 163840.0)]  # 320 x 160 + 320 x 352
    assert tgi["tgi_batch_current_size"] == [({}, 8.0)] and tgi["tgi_queue_size"] == [({}, 3.0)]
    assert one(sglang, "sglang:generation_tokens_total") == ({"model_name": "acme/support-14b"}, 4210388.0)
    assert {v for _, v in sglang["sglang:num_running_reqs"]} == {48.0}
    assert {v for _, v in sglang["sglang:num_queue_reqs"]} == {12.0}
    assert [one(trt, "nv_trt_llm_request_metrics", request_type=k)[1] for k in ("active", "scheduled", "waiting")] \
        == [1.0, 1.0, 0.0]
    assert one(trt, "nv_llm_output_token_len_sum")[1] == 61250.0
    assert one(trt, "nv_inference_pending_request_count") == ({"model": "chat_trtllm", "version": "1"}, 0.0)
    assert one(tvllm, "vllm:generation_tokens_total") == ({"model": "chat_vllm", "version": "1"}, 20480.0)


def _labels(d: dict[str, str]) -> str:
    return ",".join(f'{k}="{v}"' for k, v in sorted(d.items()))


def _pod(pod: str, instance: str) -> str:
    return f'namespace="serve",pod="{pod}",instance="{instance}"'


def openmetrics() -> str:
    """Two hours of every server's series, starting from and labelled like the fixture pages."""
    vllm, tgi, sglang, trt, tvllm = pages()
    fams: dict[str, list[str]] = {}

    def series(name: str, labels: str, values: Any) -> None:
        fams.setdefault(name, []).extend(f"{name}{{{labels}}} {v:g} {T0 + i * 30}" for i, v in enumerate(values))

    def rising(start: float, per_s: float) -> list[float]:
        return [start + per_s * 30 * i for i in range(STEPS)]

    def flat(v: float) -> list[float]:
        return [v] * STEPS

    vl, tokens0 = one(vllm, "vllm:generation_tokens_total")
    chat = f"{_pod('chat-7d9f', '10.0.0.7:8000')},{_labels(vl)}"
    series("vllm:generation_tokens_total", chat, rising(tokens0, 20))
    series("vllm:generation_tokens_total", f"{LOOSE},{_labels(vl)}", flat(tokens0))
    series("vllm:num_requests_running", chat, [RUNNING[i % 10] for i in range(STEPS)])
    series("vllm:num_requests_waiting", chat, flat(one(vllm, "vllm:num_requests_waiting")[1]))
    tg = _pod("tgi-0", "10.0.0.8:80")
    series("tgi_request_generated_tokens_sum", tg, rising(tgi["tgi_request_generated_tokens_sum"][0][1], 50))
    series("tgi_batch_current_size", tg, flat(tgi["tgi_batch_current_size"][0][1]))
    series("tgi_queue_size", tg, flat(tgi["tgi_queue_size"][0][1]))
    sg = _pod("sglang-0", "10.0.0.9:30000")
    sl, s0 = one(sglang, "sglang:generation_tokens_total")  # the tokenizer manager's: one per server
    series("sglang:generation_tokens_total", f"{sg},{_labels(sl)}", rising(s0, 30))
    for name in ("sglang:num_running_reqs", "sglang:num_queue_reqs"):  # one copy per tensor-parallel rank
        for labels, v in sglang[name]:
            series(name, f"{sg},{_labels(labels)}", flat(v))
    tr = _pod("triton-trt-0", "10.0.0.10:8002")
    tl, t0 = one(trt, "nv_llm_output_token_len_sum")  # model, version, response_metric_type
    series("nv_llm_output_token_len_sum", f"{tr},{_labels(tl)}", rising(t0, 10))
    for name in ("nv_trt_llm_request_metrics", "nv_inference_pending_request_count"):  # every request_type
        for labels, v in trt[name]:
            series(name, f"{tr},{_labels(labels)}", flat(v))
    bl, b0 = one(tvllm, "vllm:generation_tokens_total")  # model, version: Triton's vLLM backend
    series("vllm:generation_tokens_total", f"{_pod('triton-vllm-0', '10.0.0.11:8002')},{_labels(bl)}", rising(b0, 5))
    return "".join(f"# TYPE {n} gauge\n" + "\n".join(lines) + "\n" for n, lines in fams.items()) + "# EOF\n"


@pytest.fixture(scope="module")
def prom(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from test_infra_prometheus import private_prometheus

    with private_prometheus(tmp_path_factory.mktemp("inference"), openmetrics()) as url:
        yield url


def window() -> Window:
    start = datetime.fromtimestamp(T0, UTC)
    return Window(start, start + timedelta(hours=HOURS), 300)


def collected(url: str, engines: list[str] | None = None) -> tuple[list[InferenceBucket], InferenceTelemetry]:
    opts = {"engines": engines} if engines else {}
    src = InferenceTelemetry(Context("c"), InferenceTelemetry.Options(url=url, retries=0, **opts))
    return list(src.collect(window(), Problems())), src


#: pod -> per-bucket (tokens, running, waiting, batch): the docstring's figures
PER_BUCKET = {("vllm", "serve/chat-7d9f"): (6000.0, 1.3, 0.0, None),
              ("tgi", "serve/tgi-0"): (15000.0, 8.0, 3.0, 8.0),
              ("sglang", "serve/sglang-0"): (9000.0, 48.0, 12.0, None),
              ("triton", "serve/triton-trt-0"): (3000.0, 1.0, 0.0, 1.0),
              ("triton", "serve/triton-vllm-0"): (1500.0, None, None, None)}


@pytest.mark.service
def test_connector_reads_tokens_concurrency_and_batch_per_pod(prom: str) -> None:
    rows, src = collected(prom)
    by: dict[tuple[str, str], list[InferenceBucket]] = {}
    for b in rows:
        by.setdefault((b.engine, b.job), []).append(b)
    assert set(by) == set(PER_BUCKET)  # the label-less series: a note; Triton's vLLM counter: not vLLM's
    for key, (tokens, running, waiting, batch) in PER_BUCKET.items():
        bs = by[key]
        assert [b.start for b in bs] == [datetime.fromtimestamp(T0 + 300 * i, UTC) for i in range(24)], key
        assert all(b.generated_tokens == pytest.approx(tokens, rel=1e-9) for b in bs), key  # 270 r x 300 / 270
        for b in bs:
            for got, want in ((b.running_mean, running), (b.waiting_mean, waiting), (b.batch_mean, batch)):
                assert (got is None) if want is None else got == pytest.approx(want), (key, got, want)
    assert {b.model for b in by[("vllm", "serve/chat-7d9f")]} == {"acme/chat-8b-v2"}
    assert {b.model for b in by[("triton", "serve/triton-trt-0")]} == {"chat_trtllm"}
    assert {b.model for b in by[("triton", "serve/triton-vllm-0")]} == {"chat_vllm"}
    assert {b.model for b in by[("sglang", "serve/sglang-0")]} == {"acme/support-14b"}
    assert len(src.notes) == 1 and "1 inference series without namespace/pod labels" in src.notes[0]
    assert "10.9.9.9:8000" in src.notes[0]
    # one engine asked alone reads its own series only
    only, _ = collected(prom, ["triton"])
    assert {(b.engine, b.job) for b in only} == {("triton", "serve/triton-trt-0"), ("triton", "serve/triton-vllm-0")}


def _allocations() -> list[Any]:
    start, end = datetime.fromtimestamp(T0, UTC), datetime.fromtimestamp(T0 + HOURS * 3600, UTC)
    return [Allocation("c", "kubernetes", f"uid-{pod}", name=pod, account="serve", user="ana", start=start, end=end,
                       owner_workload=wl, labels={"team": team}, gpus=[AllocatedGpu(node, 0, model="NVIDIA A100")])
            for pod, (_, wl, team, node) in PODS.items()]


def _gpu_buckets() -> list[GpuBucket]:
    return [GpuBucket("c", host, 0, datetime.fromtimestamp(T0 + 300 * i, UTC), 300, 10, gpu_util=0.9,
                      sm_active=0.3, dram_active=0.6 if host in MEMORY_BOUND else 0.3)
            for host in sorted({p[3] for p in PODS.values()}) for i in range(24)]


@pytest.mark.service
def test_stored_and_audited_on_both_engines(prom: str, store: Any) -> None:
    rows, _ = collected(prom)
    stats = store.ingest([*_allocations(), *_gpu_buckets(), *rows], seen_at_ts=NOW)
    assert stats.inference == 5 * 24
    again = store.ingest(rows, seen_at_ts=NOW)  # idempotent: a re-read replaces
    assert again.inference == 5 * 24
    with store.engine.connect() as conn:
        n, tokens = conn.execute(text("SELECT COUNT(*), SUM(generated_tokens) FROM inference_buckets")).one()
    assert n == 120 and tokens == pytest.approx(ALL_TOKENS, rel=1e-9)
    start = datetime.fromtimestamp(T0, UTC)
    res = run_audit(store, Config(), start, start + timedelta(hours=HOURS))
    services = {s["service"]: s for s in res.summary["inference"]}
    assert list(services) == list(EXPECTED)  # dearest per token first
    for name, (tokens, per_million, conc, headroom) in EXPECTED.items():
        s = services[name]
        assert s["tokens"] == pytest.approx(tokens, rel=1e-9) and s["gpu_hours"] == pytest.approx(2.0), name
        assert s["cost"] == pytest.approx(4.0) and s["cost_per_million"] == pytest.approx(per_million, rel=1e-9)
        assert s["tokens_per_gpu_hour"] == pytest.approx(tokens / 2, rel=1e-9)
        assert (s["concurrency"] is None) if conc is None else s["concurrency"] == pytest.approx(conc), name
        assert s["batching_headroom"] is headroom, name
    assert services["Deployment/triton-trt"]["engine"] == "triton"
    assert services["StatefulSet/sglang"]["engine"] == "sglang"
    # the chargeback's tokens column: each team's pods' tokens, as the audit counted them
    cb = chargeback(store, Config(), start, start + timedelta(hours=HOURS), "team", run_id=res.run_id)
    assert {(r["owner"], r["tokens"]) for r in cb} == {("nlp", 144000 + 216000), ("search", 360000 + 72000 + 36000)}
    assert totals(cb)["tokens"] == ALL_TOKENS
    with store.engine.connect() as conn:
        found = conn.execute(text("SELECT a.name, f.idle_gpu_hours, f.evidence FROM findings f JOIN allocations a "
                                  "ON a.id = f.allocation_id WHERE f.run_id = :r AND f.kind = 'batching_headroom' "
                                  "ORDER BY a.name"), {"r": res.run_id}).all()
    assert [(f.name, f.idle_gpu_hours) for f in found] == [("chat-7d9f", 0.0), ("triton-trt-0", 0.0)]
    ev = {f.name: f.evidence if isinstance(f.evidence, dict) else __import__("json").loads(f.evidence) for f in found}
    assert ev["chat-7d9f"]["rule"] == "mean concurrency 1.3 on a memory-bound chip: batching would raise tokens per " \
                                      "GPU-hour"
    assert ev["triton-trt-0"]["rule"].startswith("mean concurrency 1.0 on a memory-bound chip")
    assert ev["chat-7d9f"]["recipient"] == "user" and ev["chat-7d9f"]["generated_tokens"] == pytest.approx(144000)
    assert ev["triton-trt-0"]["mean_batch"] == pytest.approx(1.0) and ev["triton-trt-0"]["engine"] == "triton"


def test_bad_values_are_refused_one_line_each_and_the_rest_stored(store: Any) -> None:
    start = datetime.fromtimestamp(T0, UTC)
    good = InferenceBucket("c", "vllm", "serve/a", start, 300, generated_tokens=10.0, running_mean=1.0)
    bad = [InferenceBucket("c", "vllm", "serve/b", start, 300, generated_tokens=float("nan")),
           InferenceBucket("c", "vllm", "serve/c", start, 300, running_mean=-1.0),
           InferenceBucket("c", "vllm", "", start, 300, generated_tokens=1.0)]
    refused: list[str] = []
    stats = store.ingest([good, *bad], seen_at_ts=NOW, on_bad=lambda rec, why: refused.append(why))
    assert stats.inference == 1 and stats.quarantined == 3
    assert refused == ["generated_tokens: nan is not a count", "running_mean: -1.0 is not a count",
                       "job: not a namespace/pod key"]


@pytest.mark.service
def test_report_shows_the_same_figures_on_every_surface(prom: str, store: Any) -> None:
    from auditor.report.context import build_context
    from auditor.report.render import render_html, render_json, render_md, render_text

    rows, _ = collected(prom)
    store.ingest([*_allocations(), *_gpu_buckets(), *rows], seen_at_ts=NOW)
    start = datetime.fromtimestamp(T0, UTC)
    res = run_audit(store, Config(), start, start + timedelta(hours=HOURS))
    ctx = build_context(store, Config(), res.run_id)
    sec = ctx["inference"]
    assert [r["service"] for r in sec["rows"]] == list(EXPECTED)
    assert sec["totals"]["tokens"] == pytest.approx(ALL_TOKENS) and sec["totals"]["headroom"] == 2
    # 5 pods x 4.00 = 20.00 / 828,000 x 10^6 = 24.15 for all services together
    assert sec["totals"]["cost_per_million"] == pytest.approx(20.0 / ALL_TOKENS * 1e6)
    txt, md, (html, _) = render_text(ctx), render_md(ctx), render_html(ctx)
    for body in (txt, md, html):
        # 4.00 / 144,000, / 360,000, / 216,000, / 72,000 and / 36,000 per million
        assert all(x in body for x in ("27.78", "11.11", "18.52", "55.56", "111.11")), body[:200]
        assert "144,000" in body and "360,000" in body and "1.3" in body
    assert "[BATCHING HEADROOM]" in txt and "batching headroom" in html
    assert '"cost_per_million"' in render_json(ctx)


def test_csv_files_of_per_bucket_rows(tmp_path: Path) -> None:
    """The file form (a site exporting its recording rules, the demo): one row a bucket; a bad row is one line
    naming file and line, the rest read."""
    (tmp_path / "inf.csv").write_text(
        "start,engine,namespace,pod,generated_tokens,running,waiting,batch,model\n"
        "2026-11-20T00:00:00Z,vllm,serve,chat-1,9000,1.0,0,,llama\n"
        "2026-11-20T00:05:00Z,vllm,serve,chat-1,nan,1.0,0,,llama\n"
        "2026-11-20T00:10:00Z,tgi,serve,tgi-0,15000,8,3,8,\n"
        "2026-11-21T00:00:00Z,tgi,serve,tgi-0,1,1,1,1,\n")  # outside the window
    src = InferenceTelemetry(Context("c", tmp_path), InferenceTelemetry.Options(paths=["*.csv"]))
    problems = Problems()
    start = datetime(2026, 11, 20, tzinfo=UTC)
    rows = list(src.collect(Window(start, start + timedelta(hours=1)), problems))
    assert [(b.engine, b.job, b.start.minute, b.generated_tokens, b.running_mean, b.batch_mean) for b in rows] == [
        ("vllm", "serve/chat-1", 0, 9000.0, 1.0, None), ("tgi", "serve/tgi-0", 10, 15000.0, 8.0, 8.0)]
    assert [(loc, why) for _, loc, why, _ in problems.items] == [
        ("inf.csv:3", "generated_tokens: 'nan' is not a count")]
    with pytest.raises(ValueError, match="either url"):
        InferenceTelemetry.Options()


def test_collect_stores_the_good_rows_and_quarantines_the_bad(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`gpu-audit collect` through the registered kind: a row the file form refuses (not a count) and one the
    store refuses (a concurrency no GPU serves) are quarantined, each naming where it was; the rest stored."""
    import types

    from conftest import run_cli
    from helpers import add_connector

    import connectors
    import connectors.inference as mod

    if "inference" not in connectors.kinds():  # an install from before the kind's entry point was added
        kind = types.ModuleType("inference_kind")
        kind.TELEMETRY = mod.InferenceTelemetry  # type: ignore[attr-defined]
        add_connector(monkeypatch, "inference", kind)
    (tmp_path / "inf.csv").write_text(
        "start,engine,namespace,pod,generated_tokens,running,waiting,batch,model\n"
        "2026-11-20T00:00:00Z,vllm,serve,chat-1,9000,1.0,0,,llama\n"
        "2026-11-20T00:05:00Z,vllm,serve,chat-1,-5,1.0,0,,llama\n"
        "2026-11-20T00:10:00Z,vllm,serve,chat-1,9000,5e9,0,,llama\n")
    db = tmp_path / "s.db"
    (tmp_path / "c.toml").write_text(f'[store]\nurl = "sqlite:///{db}"\n[[clusters]]\nname = "c"\n'
                                     '[[clusters.telemetry]]\nkind = "inference"\npaths = ["inf.csv"]\n')
    res = run_cli("-c", str(tmp_path / "c.toml"), "collect", "--since", "2026-11-20", "--until", "2026-11-21")
    assert res.returncode == 0, res.stderr
    from auditor.store.engine import Store

    with Store.open(f"sqlite:///{db}").engine.connect() as conn:
        stored = conn.execute(text("SELECT job, generated_tokens FROM inference_buckets")).all()
        bad = conn.execute(text("SELECT location, reason FROM quarantined_records ORDER BY id")).all()
    assert [tuple(r) for r in stored] == [("serve/chat-1", 9000.0)]
    assert sorted(tuple(r) for r in bad) == [
        ("inf.csv:3", "generated_tokens: '-5' is not a count"),
        ("vllm inference serve/chat-1 at 2026-11-20T00:10:00+00:00",
         "running_mean: 5e+09 requests is not a concurrency")]

