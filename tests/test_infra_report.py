"""The "nodes that cost us" table and the infrastructure column in every report format, with node
reasons (typed by admins, written by kubelets) escaped like any user text."""

from __future__ import annotations

import json
from pathlib import Path

from test_findings_extra import W0, W1
from test_infra_audit import fleet, minutes
from test_report import md_columns

from auditor.audit.run import run_audit
from auditor.config import Config
from auditor.records import NodeEvent
from auditor.report import context as report
from auditor.report import render
from auditor.store.engine import Store

EVIL = "<script>alert(1)</script> | *psu*"


def test_nodes_table_in_every_format(store: Store, tmp_path: Path) -> None:
    recs = fleet() + [NodeEvent("c", "n3", "down", minutes(0), minutes(10), reason=EVIL, source="sacctmgr")]
    store.ingest(recs, seen_at_ts=0)
    cfg = Config()
    run_id = run_audit(store, cfg, W0, W1).run_id
    ctx = report.build_context(store, cfg, run_id)
    nodes = ctx["nodes"]
    # n1 (2 events, 86 min of A) costs most; n2 is the lemon (3 XIDs, 15 min of B); n3 held nothing
    assert [r["node"] for r in nodes["rows"]] == ["n1", "n2", "n3"]
    assert [r["lemon"] for r in nodes["rows"]] == [False, True, False]
    assert nodes["totals"]["faults"] == 6 and nodes["totals"]["lemons"] == 1
    assert abs(nodes["totals"]["infra_gpu_hours"] - 101 / 60) < 1e-9
    assert nodes["rows"][1]["kinds"] == "3 x XID error"
    assert abs(ctx["headline"]["infra_gpu_hours"] - 101 / 60) < 1e-9
    paths = render.write_reports(store, cfg, run_id, tmp_path / "out", render.FORMATS)
    body = {p.suffix: p.read_text(encoding="utf-8") for p in paths}
    html, md, txt = body[".html"], body[".md"], body[".txt"]
    assert 'id="nodes"' in html and "lemon" in html and "<script>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "## Nodes that cost us" in md and "\\<script\\>" in md and "\\| \\*psu\\*" in md
    section = md.split("## Nodes that cost us")[1].split("\n## ")[0]
    table = [ln for ln in section.splitlines() if ln.startswith("|")]
    assert len(table) == 5 and {md_columns(ln) for ln in table} == {8}
    assert "NODES THAT COST US" in txt and "n2 [LEMON]: 3 events (3 x XID error)" in txt
    assert "Total: 6 events, 1 lemon node, " in txt  # a count of one takes the singular (not "1 lemon nodes")
    assert "Infrastructure:       " + render.fmt_hours(101 / 60) + " GPU-h" in txt
    data = json.loads(body[".json"])
    assert data["nodes"]["rows"][1]["faults_by_kind"] == {"xid": 3}
    csv = body[".csv"]
    assert "lemon_node" in csv
