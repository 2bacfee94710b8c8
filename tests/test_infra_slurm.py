"""Slurm node events (drained or down, with the reason): the parser on `sacctmgr -n -P show event` output
recorded from the testbed (tests/fixtures/slurm/sacctmgr-show-event.txt), and a live test that drains a
REAL testbed node, collects, sees the event with its reason, and resumes the node."""

from __future__ import annotations

import subprocess
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlalchemy import text
from test_slurm_live import CLUSTER, sh, slurm_ready

from auditor.records import NodeEvent
from connectors import build
from connectors.base import Context, Problems, Window
from connectors.slurm.events import event_kind, parse_events
from tests.conftest import need

FIX = Path(__file__).parent / "fixtures" / "slurm" / "sacctmgr-show-event.txt"


def test_recorded_sacctmgr_events() -> None:
    p = Problems()
    evs = list(parse_events(FIX.read_text(), "lab", p, "sacctmgr"))
    assert p.total == 0
    assert [(e.node, e.kind, e.end is None) for e in evs] == [
        ("gpu-node-01", "drain", False), ("gpu-node-01", "down", False), ("gpu-node-02", "drain", False),
        ("gpu-node-02", "drain", True)]
    # the reason is the last column: a '|' inside it stays in it
    assert evs[1].reason == "infra fixture: GPU fell off the bus | XID 79"
    assert evs[0].start == datetime(2026, 11, 30, 10, 35, 44, tzinfo=UTC)
    assert evs[0].end == datetime(2026, 11, 30, 10, 35, 46, tzinfo=UTC)
    assert all(e.gpu is None and e.source == "sacctmgr" and e.cluster == "lab" for e in evs)


def test_saved_sacctmgr_events_file() -> None:
    """The same recorded output as a saved file (file connector, format sacctmgr-events)."""
    src = build("file", "allocations", {"paths": [FIX.name], "format": "sacctmgr-events"},
                Context("lab", FIX.parent))
    p = Problems()
    evs = list(src.collect(Window(datetime(2026, 11, 1, tzinfo=UTC), datetime(2026, 12, 1, tzinfo=UTC)), p))
    assert p.total == 0 and [(e.node, e.kind) for e in evs] == [
        ("gpu-node-01", "drain"), ("gpu-node-01", "down"), ("gpu-node-02", "drain"), ("gpu-node-02", "drain")]


def test_states_and_bad_lines() -> None:
    assert [event_kind(s) for s in ("DOWN", "DOWN*", "IDLE+DRAIN", "DRAIN", "MIXED+DRAIN", "FAIL", "MAINT",
                                    "IDLE+POWERED_DOWN", "REBOOT_REQUESTED")] == \
        ["down", "down", "drain", "drain", "drain", "drain", None, None, None]
    p = Problems()
    text_ = ("n1|2026-11-30T10:00:00|Unknown|DRAIN|ok\n"
             "n2|not a time|Unknown|DRAIN|bad start\n"
             "n3|2026-11-30T10:00:00\n"
             "n4|2026-11-30T10:00:00|2026-11-30T09:00:00|DOWN|ends before it starts\n"
             "n[5-6]|2026-11-30T10:00:00|Unknown|MAINT|not a fault\n"
             "n[7-8]|2026-11-30T10:00:00|Unknown|DOWN|a hostlist\n")
    evs = list(parse_events(text_, "lab", p, "sacctmgr"))
    assert [e.node for e in evs] == ["n1", "n7", "n8"]
    assert p.total == 3 and {loc for _s, loc, _r, _e in p.items} == {"line 2", "line 3", "line 4"}


def _events(conn_opts: dict | None = None) -> list[NodeEvent]:
    conn = build("slurm", "allocations", conn_opts or {}, Context(CLUSTER))
    now = datetime.now(UTC)
    p = Problems()
    out = [r for r in conn.collect(Window(now - timedelta(hours=1), now + timedelta(minutes=1), 300), p)
           if isinstance(r, NodeEvent)]
    assert p.total == 0, p.items
    return out


def test_live_drained_node_is_collected_with_its_reason(store) -> None:  # noqa: ANN001 - fixture
    need(slurm_ready(), "no running Slurm (run: bash scripts/testbed-slurm.sh up)")
    node, reason = "gpu-node-02", f"gpu-audit infra test {uuid.uuid4().hex[:8]}"
    try:
        sh("scontrol", "update", f"nodename={node}", "state=drain", f"reason={reason}")
        deadline = time.monotonic() + 30
        while not (mine := [e for e in _events() if e.reason == reason]):
            assert time.monotonic() < deadline, "the drain never reached slurmdbd's events"
            time.sleep(1)
        (ev,) = mine
        assert ev.node == node and ev.kind == "drain" and ev.end is None and ev.gpu is None
        store.ingest(mine, seen_at_ts=1)
    finally:
        subprocess.run(["scontrol", "update", f"nodename={node}", "state=resume"],  # noqa: S603
                       capture_output=True, timeout=30, check=False)
    deadline = time.monotonic() + 30
    while (ended := [e for e in _events() if e.reason == reason])[0].end is None:
        assert time.monotonic() < deadline, "the resume never closed the event"
        time.sleep(1)
    assert ended[0].end >= ended[0].start
    store.ingest(ended, seen_at_ts=2)
    with store.engine.connect() as c:
        rows = c.execute(text("SELECT node, kind, end_ts, reason FROM node_events WHERE reason = :r"),
                         {"r": reason}).all()
    assert len(rows) == 1 and rows[0].end_ts is not None and rows[0].kind == "drain" and rows[0].node == node
    assert "DRAIN" not in sh("scontrol", "-o", "show", "node", node).upper()
