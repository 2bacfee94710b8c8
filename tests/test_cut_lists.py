"""Issue 44: every truncated list says how many it left out and where to see them. The report's "jobs that
waited most" and its teams (and the web front page's jobs) were cut without a word: the audit keeps the 20
jobs that waited most (auditor.audit.waiting.TOP_ALLOCATIONS), the report shows report.top_n of them."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from starlette.testclient import TestClient

from auditor.audit.run import run_audit
from auditor.config import Config
from auditor.records import AllocatedGpu, Allocation, GpuBucket
from auditor.report.render import write_reports
from auditor.web.app import create_app

T0 = datetime(2026, 11, 20, tzinfo=UTC)
N = 24  # jobs that waited on memory: more than the 20 the audit keeps


def _fleet() -> list[Any]:
    # job k holds n{k}:0 for one hour, SM 0.3 with DRAM 0.45 (a memory-bound GPU: the "memory" waiting class)
    # in 12 buckets: 1.0 GPU-h of waiting each, 24 jobs, 24.0 GPU-h; the 20 kept hold 20.0, 4 left out 4.0
    out: list[Any] = []
    for k in range(N):
        out.append(Allocation("c", "slurm", str(100 + k), user=f"u{k}", account=f"a{k}", start=T0,
                              end=T0 + timedelta(hours=1), gpus=[AllocatedGpu(f"n{k}", 0)]))
        out += [GpuBucket("c", f"n{k}", 0, T0 + timedelta(minutes=5 * i), 300, 10, sm_active=0.3, dram_active=0.45)
                for i in range(12)]
    return out


def test_jobs_that_waited_most_say_how_many_more(store: Any, tmp_path: Path) -> None:
    store.ingest(_fleet())
    # five teams (accounts a0..a4; the rest unmapped): 6 teams waited, 3 shown, "3 more teams"
    cfg = Config.model_validate({"report": {"top_n": 3},
                                 "teams": [{"name": f"t{k}", "accounts": [f"a{k}"]} for k in range(5)]})
    rid = run_audit(store, cfg, T0 - timedelta(hours=1), T0 + timedelta(hours=2)).run_id
    files = {p.suffix: p for p in write_reports(store, cfg, rid, tmp_path, ["html", "text", "md", "json"])}
    # report: 3 shown of 24: 21 more, 24.0 - 3.0 = 21.0 GPU-h of waiting (before the fix: no line at all)
    line = "21 more jobs waited (21.0 GPU-h of waiting)"
    for ext in (".txt", ".md", ".html"):
        body = files[ext].read_text()
        assert line in body, (ext, body[body.find("aited most"):][:1500])
        assert "lists the 20 that waited most" in body and files[".json"].name in body
    w = json.loads(files[".json"].read_text())["waiting"]
    assert len(w["jobs"]) == 20 and w["jobs_total"] == N  # the JSON: the 20 kept, of 24 that waited
    body = files[".txt"].read_text()
    assert len(w["by_team"]) == 6
    assert f"... 3 more teams in {files['.json'].name}" in body, body  # the waiting teams, cut at top_n too
    # the web front page shows the fleet's top jobs (TOP) and says how many more waited
    page = TestClient(create_app(store, cfg)).get(f"/?run={rid}").text
    assert 'id="waiting-jobs-more"' in page and "more jobs waited" in page, page[page.find("waited most"):][:800]


def test_a_users_jobs_on_the_front_page_say_how_many_more(store: Any) -> None:
    # user u holds 103 one-hour jobs (no telemetry needed: every judged allocation is listed); the page shows
    # the PAGE_ROWS = 100 of most idle cost: "3 more allocations of u" (before: the list stopped without a word)
    from auditor.web.data import PAGE_ROWS

    store.ingest([Allocation("c", "slurm", str(1000 + k), user="u", account="a", start=T0,
                             end=T0 + timedelta(hours=1), gpus=[AllocatedGpu(f"m{k}", 0)]) for k in range(103)])
    cfg = Config()
    rid = run_audit(store, cfg, T0 - timedelta(hours=1), T0 + timedelta(hours=2)).run_id
    page = TestClient(create_app(store, cfg)).get(f"/?run={rid}&user=u").text
    assert PAGE_ROWS == 100
    assert 'id="mine-more"' in page and "3 more allocations of" in page, page[page.find('id="mine"'):][:3000]
    assert "gpu-audit jobs --user u --since" in page


def test_silent_gpus_say_how_many_more(store: Any, tmp_path: Path) -> None:
    # 24 working nodes with telemetry plus 5 inventory GPUs on node s0 that never sent any: top_n 3 lists 3
    # silent GPUs, "... 2 more silent GPUs" (before: the text report listed 3 without a word)
    from auditor.records import GpuInventory

    store.ingest([*_fleet(), *(GpuInventory("c", "s0", g) for g in range(5))])
    cfg = Config.model_validate({"report": {"top_n": 3}})
    rid = run_audit(store, cfg, T0 - timedelta(hours=1), T0 + timedelta(hours=2)).run_id
    files = {p.suffix: p for p in write_reports(store, cfg, rid, tmp_path, ["html", "text", "json"])}
    body = files[".txt"].read_text()
    assert body.count("silent: c s0 GPU") == 3
    assert f"... 2 more silent GPUs in {files['.json'].name}" in body, body[body.find("silent"):][:600]
    assert "Showing the top 3 of 5 rows" in files[".html"].read_text()
