"""Slurm node events (drained or down, with the reason): the parser on `sacctmgr -n -P show event` output
recorded from the testbed (tests/fixtures/slurm/sacctmgr-show-event.txt), and a live test that drains a
REAL testbed node, collects, sees the event with its reason, and resumes the node."""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import text
from test_slurm_live import CLUSTER, sh

from auditor.records import NodeEvent
from connectors import build
from connectors.base import Context, Problems, Window
from connectors.slurm.events import event_kind, parse_events
from tests.conftest import need, need_slurm, port_open

FIX = Path(__file__).parent / "fixtures" / "slurm" / "sacctmgr-show-event.txt"
REST_DRAINED = Path(__file__).parent / "fixtures" / "slurm" / "slurmrestd-v0.0.38-nodes-drained.json"


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


def test_slurmrestd_node_states() -> None:
    """slurmrestd v0.0.38 (recorded from the testbed with gpu-node-02 drained) and the v0.0.42 list form."""
    import copy
    import json

    from connectors.slurm.events import from_json_node

    now = datetime(2026, 12, 1, tzinfo=UTC)
    nodes = json.loads(REST_DRAINED.read_text())["nodes"]
    evs = [from_json_node(n, "lab", now) for n in nodes]
    assert evs[0] is None
    assert (evs[1].node, evs[1].kind, evs[1].reason, evs[1].end, evs[1].source) == (
        "gpu-node-02", "drain", "infra fixture: rest drain", None, "slurmrestd")
    assert evs[1].start == datetime.fromtimestamp(1796036612, UTC)
    real = json.loads((FIX.parent / "24.11" / "rest" / "slurm_v0.0.42_nodes.json").read_text())["nodes"][0]
    assert from_json_node(real, "lab", now) is None
    down = copy.deepcopy(real)
    down.update(state=["DOWN", "NOT_RESPONDING"], reason="Not responding", reason_changed_at={"set": True,
                                                                                               "number": 0})
    ev = from_json_node(down, "lab", now)
    assert ev is not None and ev.kind == "down" and ev.start == now  # no time given: since this sighting


def test_states_and_bad_lines() -> None:
    assert [event_kind(s) for s in ("DOWN", "DOWN*", "IDLE+DRAIN", "DRAIN", "MIXED+DRAIN", "FAIL", "MAINT",
                                    "IDLE+POWERED_DOWN", "REBOOT_REQUESTED", "IDLE+NOT_RESPONDING",
                                    "IDLE+DRAIN+NOT_RESPONDING")] == \
        ["down", "down", "drain", "drain", "drain", "drain", None, None, None, None, "drain"]
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


def _rest_opts() -> dict:
    token = sh("scontrol", "token", "username=root", "lifespan=600").strip().split("=", 1)[1]
    os.environ["GPU_AUDIT_TEST_SLURM_JWT"] = token
    return {"backend": "rest", "rest_url": "http://127.0.0.1:6820", "rest_token": {"env": "GPU_AUDIT_TEST_SLURM_JWT"}}


@pytest.mark.service
@pytest.mark.serial
def test_live_rest_backend_sees_the_drain_and_a_listing_ends_it(store) -> None:  # noqa: ANN001 - fixture
    """slurmrestd's node list shows the drain (since reason_changed_at, with the reason); after the resume the
    next listing's snapshot ends the stored event at its last sighting."""
    need_slurm()
    need(port_open("127.0.0.1", 6820), "no slurmrestd of the Slurm testbed on 127.0.0.1:6820")
    node, reason = "gpu-node-01", f"gpu-audit infra rest test {uuid.uuid4().hex[:8]}"
    opts = _rest_opts()
    try:
        conn = build("slurm", "allocations", opts, Context(CLUSTER))
        now = datetime.now(UTC)
        win = Window(now - timedelta(hours=1), now + timedelta(minutes=1), 300)
        try:
            sh("scontrol", "update", f"nodename={node}", "state=drain", f"reason={reason}")
            p = Problems()
            recs = list(conn.collect(win, p))
        finally:
            subprocess.run(["scontrol", "update", f"nodename={node}", "state=resume"],  # noqa: S603
                           capture_output=True, timeout=30, check=False)
        (ev,) = [r for r in recs if isinstance(r, NodeEvent) and r.reason == reason]
        assert ev.kind == "drain" and ev.end is None and ev.source == "slurmrestd" and p.total == 0
        t1 = int(time.time())
        store.ingest(recs, seen_at_ts=t1)
        recs2 = list(conn.collect(win, Problems()))
        assert not [r for r in recs2 if isinstance(r, NodeEvent) and r.reason == reason]
        store.ingest(recs2, seen_at_ts=t1 + 1)
    finally:
        os.environ.pop("GPU_AUDIT_TEST_SLURM_JWT", None)
    with store.engine.connect() as c:
        row = c.execute(text("SELECT end_ts, last_seen_ts FROM node_events WHERE reason = :r"), {"r": reason}).one()
    assert row.end_ts == row.last_seen_ts == t1


@pytest.mark.service
@pytest.mark.serial
def test_live_drained_node_is_collected_with_its_reason(store) -> None:  # noqa: ANN001 - fixture
    need_slurm()  # its reason names why (a foreign Slurm: "no Slurm testbed: ...")
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
