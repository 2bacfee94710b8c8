"""Inference services (vLLM, TGI) end to end: the engines' own metric names (tests/fixtures/inference,
PROVENANCE.md) backfilled with promtool into a PRIVATE Prometheus this module starts on a free port, read by
the inference connector, stored on both engines, audited; every figure checked against the hand calculation
below (docs/definitions.md "Inference services").

The scenario (two hours from T0, samples every 30 s, price 2.00 per GPU-hour, so 2 GPU-hours cost 4.00):

- ``serve/chat-7d9f`` (vLLM, Deployment/chat, team nlp) on n1 GPU 0: ``vllm:generation_tokens_total`` rises
  20 tokens/s from 96,000 (the fixture's value). Each bucket's ``increase`` sees 10 samples spanning 270 s,
  5,400 tokens, extrapolated to the 300 s bucket: 5,400 x 300 / 270 = 6,000; 24 buckets = 144,000 tokens.
  ``vllm:num_requests_running`` is 1,1,1,1,1,1,1,2,2,2 in every bucket: mean 13 / 10 = 1.3. The GPU's SM
  activity 30 % (not low: >= 25 %), DRAM 60 % (>= hint_dram_high 40 %): memory-bound. So cost per million =
  4.00 / 144,000 x 10^6 = 27.78, tokens per GPU-hour = 144,000 / 2 = 72,000, and batching_headroom:
  "mean concurrency 1.3 on a memory-bound chip".
- ``serve/tgi-0`` (TGI, StatefulSet/tgi, team search) on n2 GPU 0: ``tgi_request_generated_tokens_sum``
  rises 50 tokens/s from 163,840: 13,500 x 300 / 270 = 15,000 a bucket, 360,000 in all; batch size 8,
  queue 3. Cost per million = 4.00 / 360,000 x 10^6 = 11.11; tokens per GPU-hour 180,000; concurrency 8 is
  not below 2: no finding.
- one vLLM series without namespace/pod labels: not tied to any allocation, counted in the source's notes.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from auditor.audit.run import run_audit
from auditor.config import Config
from auditor.records import AllocatedGpu, Allocation, GpuBucket, InferenceBucket
from auditor.report.chargeback import chargeback, totals
from connectors.base import Context, Problems, Window
from connectors.inference import InferenceTelemetry, names_read, parse_page

FIX = Path(__file__).resolve().parent / "fixtures" / "inference"
NOW = int(time.time())
T0 = (NOW - 2 * 86400) // 3600 * 3600  # two days ago, a whole hour
HOURS = 2
STEPS = HOURS * 3600 // 30
RUNNING = [1, 1, 1, 1, 1, 1, 1, 2, 2, 2]  # per bucket of 10 samples: mean 1.3
CHAT = 'namespace="serve",pod="chat-7d9f",instance="10.0.0.7:8000"'
TGI = 'namespace="serve",pod="tgi-0",instance="10.0.0.8:80"'
LOOSE = 'instance="10.9.9.9:8000"'


def page(name: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    return parse_page((FIX / name).read_text())


def test_fixture_pages_carry_the_names_the_queries_read() -> None:
    vllm, tgi = page("vllm-v1-metrics.prom"), page("tgi-router-metrics.prom")
    assert names_read("vllm") <= set(vllm), names_read("vllm") - set(vllm)
    assert names_read("tgi") <= set(tgi), names_read("tgi") - set(tgi)
    # the values the scenario starts from are the pages' own
    assert vllm["vllm:generation_tokens_total"] == [({"engine": "0", "model_name": "unsloth/Llama-3.2-1B-Instruct"},
                                                    96000.0)]
    assert tgi["tgi_request_generated_tokens_sum"] == [({}, 163840.0)]
    assert tgi["tgi_batch_current_size"] == [({}, 8.0)]
    # every TGI name the connector reads is in TGI's own documented list
    documented = (FIX / "tgi-docs-metrics.md").read_text()
    assert all(f"`{n.removesuffix('_sum')}`" in documented for n in names_read("tgi"))


def _series(name: str, labels: str, values: list[float]) -> list[str]:
    return [f"{name}{{{labels}}} {v:g} {T0 + i * 30}" for i, v in enumerate(values)]


def openmetrics() -> str:
    """Two hours of both servers' series, the names and the vLLM labels taken from the fixture pages."""
    vllm = page("vllm-v1-metrics.prom")
    (vl, tokens0), = vllm["vllm:generation_tokens_total"]
    vlabels = ",".join(f'{k}="{v}"' for k, v in sorted(vl.items()))
    tgi0 = page("tgi-router-metrics.prom")["tgi_request_generated_tokens_sum"][0][1]
    fams = {
        "vllm:generation_tokens_total": _series("vllm:generation_tokens_total", f"{CHAT},{vlabels}",
                                                [tokens0 + 20 * 30 * i for i in range(STEPS)])
        + _series("vllm:generation_tokens_total", f"{LOOSE},{vlabels}", [tokens0] * STEPS),
        "vllm:num_requests_running": _series("vllm:num_requests_running", f"{CHAT},{vlabels}",
                                             [RUNNING[i % 10] for i in range(STEPS)]),
        "vllm:num_requests_waiting": _series("vllm:num_requests_waiting", f"{CHAT},{vlabels}", [0] * STEPS),
        "tgi_request_generated_tokens_sum": _series("tgi_request_generated_tokens_sum", TGI,
                                                    [tgi0 + 50 * 30 * i for i in range(STEPS)]),
        "tgi_batch_current_size": _series("tgi_batch_current_size", TGI, [8] * STEPS),
        "tgi_queue_size": _series("tgi_queue_size", TGI, [3] * STEPS),
    }
    return "".join(f"# TYPE {n} gauge\n" + "\n".join(lines) + "\n" for n, lines in fams.items()) + "# EOF\n"


@pytest.fixture(scope="module")
def prom(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from test_infra_prometheus import private_prometheus

    with private_prometheus(tmp_path_factory.mktemp("inference"), openmetrics()) as url:
        yield url


def window() -> Window:
    start = datetime.fromtimestamp(T0, UTC)
    return Window(start, start + timedelta(hours=HOURS), 300)


def collected(url: str) -> tuple[list[InferenceBucket], InferenceTelemetry]:
    src = InferenceTelemetry(Context("c"), InferenceTelemetry.Options(url=url, retries=0))
    return list(src.collect(window(), Problems())), src


@pytest.mark.service
def test_connector_reads_tokens_concurrency_and_batch_per_pod(prom: str) -> None:
    rows, src = collected(prom)
    by = {(b.engine, b.job): [] for b in rows}
    for b in rows:
        by[(b.engine, b.job)].append(b)
    assert set(by) == {("vllm", "serve/chat-7d9f"), ("tgi", "serve/tgi-0")}  # the label-less series: a note
    chat, tgi = by[("vllm", "serve/chat-7d9f")], by[("tgi", "serve/tgi-0")]
    assert len(chat) == len(tgi) == 24
    assert [b.start for b in chat] == [datetime.fromtimestamp(T0 + 300 * i, UTC) for i in range(24)]
    assert all(b.generated_tokens == pytest.approx(6000.0, rel=1e-9) for b in chat)  # 5,400 x 300 / 270
    assert all(b.running_mean == pytest.approx(1.3) and b.waiting_mean == 0 and b.batch_mean is None for b in chat)
    assert {b.model for b in chat} == {"unsloth/Llama-3.2-1B-Instruct"}
    assert all(b.generated_tokens == pytest.approx(15000.0, rel=1e-9) for b in tgi)  # 13,500 x 300 / 270
    assert all(b.running_mean == 8 and b.batch_mean == 8 and b.waiting_mean == 3 for b in tgi)
    assert len(src.notes) == 1 and "1 inference series without namespace/pod labels" in src.notes[0]
    assert "10.9.9.9:8000" in src.notes[0]


def _allocations() -> list[Any]:
    start, end = datetime.fromtimestamp(T0, UTC), datetime.fromtimestamp(T0 + HOURS * 3600, UTC)
    return [Allocation("c", "kubernetes", "uid-chat", name="chat-7d9f", account="serve", user="ana", start=start,
                       end=end, owner_workload="Deployment/chat", labels={"team": "nlp"},
                       gpus=[AllocatedGpu("n1", 0, model="NVIDIA A100")]),
            Allocation("c", "kubernetes", "uid-tgi", name="tgi-0", account="serve", user="bo", start=start,
                       end=end, owner_workload="StatefulSet/tgi", labels={"team": "search"},
                       gpus=[AllocatedGpu("n2", 0, model="NVIDIA A100")])]


def _gpu_buckets() -> list[GpuBucket]:
    return [GpuBucket("c", host, 0, datetime.fromtimestamp(T0 + 300 * i, UTC), 300, 10, gpu_util=0.9,
                      sm_active=0.3, dram_active=0.6 if host == "n1" else 0.3)
            for host in ("n1", "n2") for i in range(24)]


@pytest.mark.service
def test_stored_and_audited_on_both_engines(prom: str, store: Any) -> None:
    rows, _ = collected(prom)
    stats = store.ingest([*_allocations(), *_gpu_buckets(), *rows], seen_at_ts=NOW)
    assert stats.inference == 48
    again = store.ingest(rows, seen_at_ts=NOW)  # idempotent: a re-read replaces
    assert again.inference == 48
    with store.engine.connect() as conn:
        n, tokens = conn.execute(text("SELECT COUNT(*), SUM(generated_tokens) FROM inference_buckets")).one()
    assert n == 48 and tokens == pytest.approx(144000 + 360000, rel=1e-9)
    start = datetime.fromtimestamp(T0, UTC)
    res = run_audit(store, Config(), start, start + timedelta(hours=HOURS))
    services = {s["service"]: s for s in res.summary["inference"]}
    chat, tgi = services["Deployment/chat"], services["StatefulSet/tgi"]
    assert chat["tokens"] == pytest.approx(144000, rel=1e-9) and chat["gpu_hours"] == pytest.approx(2.0)
    assert chat["cost"] == pytest.approx(4.0)
    assert chat["cost_per_million"] == pytest.approx(4.0 / 144000 * 1e6, rel=1e-9)  # 27.78
    assert chat["tokens_per_gpu_hour"] == pytest.approx(72000, rel=1e-9)
    assert chat["concurrency"] == pytest.approx(1.3) and chat["batching_headroom"] is True
    assert tgi["cost_per_million"] == pytest.approx(4.0 / 360000 * 1e6, rel=1e-9)  # 11.11
    assert tgi["concurrency"] == pytest.approx(8.0) and tgi["batching_headroom"] is False
    assert [s["service"] for s in res.summary["inference"]] == ["Deployment/chat", "StatefulSet/tgi"]  # dearest first
    # the chargeback's tokens column: each team's pods' tokens, as the audit counted them
    cb = chargeback(store, Config(), start, start + timedelta(hours=HOURS), "team", run_id=res.run_id)
    assert {(r["owner"], r["tokens"]) for r in cb} == {("nlp", 144000), ("search", 360000)}
    assert totals(cb)["tokens"] == 504000
    with store.engine.connect() as conn:
        found = conn.execute(text("SELECT a.name, f.idle_gpu_hours, f.evidence FROM findings f JOIN allocations a "
                                  "ON a.id = f.allocation_id WHERE f.run_id = :r AND f.kind = 'batching_headroom'"),
                             {"r": res.run_id}).all()
    assert [(f.name, f.idle_gpu_hours) for f in found] == [("chat-7d9f", 0.0)]
    ev = found[0].evidence if isinstance(found[0].evidence, dict) else __import__("json").loads(found[0].evidence)
    assert ev["rule"] == "mean concurrency 1.3 on a memory-bound chip: batching would raise tokens per GPU-hour"
    assert ev["recipient"] == "user" and ev["generated_tokens"] == pytest.approx(144000, rel=1e-9)


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
    assert [r["service"] for r in sec["rows"]] == ["Deployment/chat", "StatefulSet/tgi"]
    assert sec["totals"]["tokens"] == pytest.approx(504000) and sec["totals"]["headroom"] == 1
    # 8.00 / 504,000 x 10^6 = 15.87 for both services together
    assert sec["totals"]["cost_per_million"] == pytest.approx(8.0 / 504000 * 1e6)
    txt, md, (html, _) = render_text(ctx), render_md(ctx), render_html(ctx)
    for body in (txt, md, html):
        assert "27.78" in body and "11.11" in body  # 4.00 / 144,000 and 4.00 / 360,000 per million
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

