"""The report JSON's keys are a checked-in golden list (tests/golden/report_json_keys.txt), not the code's own
idea of itself: dropping or renaming a key a reader uses (a finance number, a table column) fails here."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from test_chargeback import W0, W1, cfg, mixed

from auditor.audit.run import run_audit
from auditor.report import context as report
from auditor.report import render
from auditor.store.engine import Store

GOLDEN = Path(__file__).parent / "golden" / "report_json_keys.txt"
# data-dependent or a plain dump of the config model: not part of the golden list
SKIP = ("headline.findings.", "thresholds.", "nodes.rows[].faults_by_kind.")  # keyed by data (kinds)


def key_paths(o: Any, prefix: str = "") -> set[str]:
    """Every key as a dotted path; list items as ``[]``."""
    out: set[str] = set()
    if isinstance(o, dict):
        for k, v in o.items():
            p = f"{prefix}.{k}" if prefix else k
            out.add(p)
            out |= key_paths(v, p)
    elif isinstance(o, list):
        for v in o:
            out |= key_paths(v, prefix + "[]")
    return out


def test_report_json_keys_are_the_golden_list(tmp_path: Path) -> None:
    store = Store.open(f"sqlite:///{tmp_path / 'a.db'}")
    store.upgrade()
    store.ingest(mixed())
    rid = run_audit(store, cfg(), W0, W1).run_id
    doc = json.loads(render.render_json(report.build_context(store, cfg(), rid, full=True)))
    assert doc["schema"] == "gpu-audit.report/1"
    got = {p for p in key_paths(doc) if not p.startswith(SKIP)}
    want = {x for x in GOLDEN.read_text(encoding="utf-8").splitlines() if x and not x.startswith("#")}
    assert not want - got, f"report JSON lost keys (breaking: bump report.SCHEMA): {sorted(want - got)}"
    assert not got - want, f"new report JSON keys: add them to {GOLDEN.name}: {sorted(got - want)}"
