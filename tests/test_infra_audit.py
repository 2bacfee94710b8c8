"""Infrastructure-affected time (README "Definitions"): reserved time inside a node event is its own class
(infra), judged by no verdict, in no user finding, and the nodes that cost it are listed (lemon nodes).
Hand-computed on 5-minute buckets (12 buckets are one hour), on SQLite and PostgreSQL."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from helpers import gpu_usage
from sqlalchemy import text
from test_findings_extra import IDLE, T0, W0, W1, WORK, findings, job, run

from auditor.audit import infra
from auditor.audit.run import run_audit
from auditor.config import Config, Thresholds
from auditor.records import AllocatedGpu, NodeEvent
from auditor.store.engine import Store

H = 3600.0
M = 60.0


def minutes(m: float) -> Any:
    return T0 + timedelta(minutes=m)


def fleet() -> list[Any]:
    """Job A holds n1 GPUs 0 and 1 for 4 h. GPU 0 works throughout. GPU 1 works 0-1 h, is idle 1 h-3 h 30
    and works again to 4 h; an XID error hit it from 1 h 02 to 1 h 58, then n1 was drained from 3 h 45
    (ongoing past the job's end, to 4 h 15). Job B holds n2 GPU 0 for 3 h, idle; n2's GPU 0 threw three
    separate XID errors of 5 min (a lemon at LEMON_MIN_FAULTS = 3)."""
    recs: list[Any] = [job("A", [AllocatedGpu("n1", 0), AllocatedGpu("n1", 1)], hours=4),
                       job("B", [AllocatedGpu("n2", 0)], hours=3)]
    recs += run("n1", 0, 0, 48, **WORK)
    recs += run("n1", 1, 0, 12, **WORK) + run("n1", 1, 12, 30, **IDLE) + run("n1", 1, 42, 6, **WORK)
    recs += run("n2", 0, 0, 36, **IDLE)
    recs += [NodeEvent("c", "n1", "xid", minutes(62), minutes(118), gpu=1, reason="XID 79", source="dcgm"),
             NodeEvent("c", "n1", "drain", minutes(225), minutes(255), reason="bad psu", source="sacctmgr")]
    recs += [NodeEvent("c", "n2", "xid", minutes(m), minutes(m + 5), gpu=0, reason="XID 48", source="dcgm")
             for m in (10, 60, 120)]
    return recs


def test_infra_time_is_its_own_class_and_out_of_user_findings(store: Store) -> None:
    store.ingest(fleet(), seen_at_ts=0)
    res = run_audit(store, Config(), W0, W1)
    u = gpu_usage(store, res.run_id)
    # A/GPU 0: the drain 3 h 45-4 h is infra (15 min); its 3 buckets judged by no verdict: working 3 h 45
    g0 = u[("A", 0)]
    assert g0["reserved_s"] == 4 * H and g0["infra_s"] == 15 * M
    assert g0["working_s"] == 3.75 * H and g0["unknown_s"] == 0 and g0["idle_s"] == 0
    # A/GPU 1: infra = XID 56 min + drain 15 min = 71 min; the XID's buckets 1 h-2 h are judged by no verdict,
    # their 4 min outside the XID (1 h-1 h 02, 1 h 58-2 h) are unknown; idle 2 h-3 h 30 = 90 min;
    # working 0-1 h + 3 h 30-3 h 45 = 75 min. 71 + 4 + 90 + 75 = 240 min reserved.
    g1 = u[("A", 1)]
    assert g1["infra_s"] == 71 * M and g1["unknown_s"] == 4 * M
    assert g1["idle_s"] == 90 * M and g1["working_s"] == 75 * M and g1["observed_s"] == 165 * M
    # B: 3 h idle less the three 5-min XIDs
    b = u[("B", 0)]
    assert b["infra_s"] == 15 * M and b["idle_s"] == 165 * M and b["unknown_s"] == 0
    # no user finding blames A for the XID: idle 2 h-3 h 30 is 1.5 h < episode_hours 2 (with the XID hour
    # judged idle it would be a 2.5 h episode, see the next test); B's idle finding is 2 h 45, not 3 h
    assert findings(store, res.run_id, "idle_episode") == {}
    (fb,) = findings(store, res.run_id, "idle_allocation")["B"]
    assert abs(fb["idle_gpu_hours"] - 2.75) < 1e-9
    assert abs(fb["evidence"]["infra_gpu_hours"] - 0.25) < 1e-9 and fb["evidence"]["coverage"] == 1.0
    # summary: infra 71 + 15 + 15 min = 101 min, at the default price 2.0/GPU-hour
    s = res.summary
    assert abs(s["infra_gpu_hours"] - 101 / 60) < 1e-9 and abs(s["infra_cost"] - 2 * 101 / 60) < 1e-9
    assert abs(s["idle_only_gpu_hours"] - (90 + 165) / 60) < 1e-9


def test_nodes_that_cost_us_and_the_lemon(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    store.ingest(fleet(), seen_at_ts=0)
    res = run_audit(store, Config(), W0, W1)
    nodes = {n["node"]: n for n in res.summary["infra_nodes"]}
    # n1: 1 XID + 1 drain = 2 faults (< 3: no lemon), infra 86 min of A at 2.0 = 2.866667
    n1 = nodes["n1"]
    assert n1["faults"] == 2 and n1["faults_by_kind"] == {"drain": 1, "xid": 1} and not n1["lemon"]
    assert abs(n1["infra_gpu_hours"] - 86 / 60) < 1e-9 and abs(n1["cost"] - 2 * 86 / 60) < 1e-9
    assert n1["reasons"] == ["XID 79", "bad psu"]
    n2 = nodes["n2"]
    assert n2["faults"] == 3 and n2["lemon"] and n2["gpus"] == [0]
    assert [n["node"] for n in res.summary["infra_nodes"]] == ["n1", "n2"]  # most expensive first
    with store.engine.connect() as conn:
        rows = conn.execute(text("SELECT kind, cluster, allocation_id, gpu_hours, cost, evidence FROM findings "
                                 "WHERE run_id = :r AND kind = 'lemon_node'"), {"r": res.run_id}).all()
    assert len(rows) == 1 and rows[0].allocation_id is None
    ev = rows[0].evidence if isinstance(rows[0].evidence, dict) else json.loads(rows[0].evidence)
    assert ev["recipient"] == "operations" and ev["node"] == "n2" and ev["faults_by_kind"] == {"xid": 3}
    assert abs(rows[0].gpu_hours - 0.25) < 1e-9 and abs(rows[0].cost - 0.5) < 1e-9
    # the constant decides (auditor.audit.infra.LEMON_MIN_FAULTS, a setting until issue 45): at 4 faults n2 is no
    # lemon
    monkeypatch.setattr(infra, "LEMON_MIN_FAULTS", 4)
    res4 = run_audit(store, Config(), W0, W1)
    assert not findings(store, res4.run_id, "lemon_node")
    assert "lemon_node" not in res4.summary["findings"]


def test_kinds_left_out_are_judged_as_usual(store: Store) -> None:
    """infra_kinds without xid: the XID hour is judged (idle), so GPU 1 of A has a 2.5 h idle episode."""
    store.ingest(fleet(), seen_at_ts=0)
    th = Thresholds(infra_kinds=["drain", "down", "not_ready", "cordoned"])
    res = run_audit(store, Config(thresholds=th), W0, W1)
    u = gpu_usage(store, res.run_id)
    assert u[("A", 1)]["infra_s"] == 15 * M and u[("A", 1)]["idle_s"] == 150 * M
    (ep,) = findings(store, res.run_id, "idle_episode")["A"]
    assert abs(ep["idle_gpu_hours"] - 2.5) < 1e-9
    assert u[("B", 0)]["infra_s"] == 0 and u[("B", 0)]["idle_s"] == 3 * H


def test_same_events_twice_and_an_end_once_known_stays(store: Store) -> None:
    ongoing = NodeEvent("c", "n1", "drain", minutes(0), None, reason="fan", source="sacctmgr")
    ended = NodeEvent("c", "n1", "drain", minutes(0), minutes(30), reason="fan", source="sacctmgr")
    store.ingest([ongoing], seen_at_ts=1)
    store.ingest([ended, ended], seen_at_ts=2)
    store.ingest([ongoing], seen_at_ts=3)  # a stale "still drained" sighting does not reopen it
    with store.engine.connect() as conn:
        rows = conn.execute(text("SELECT node, gpu_index, kind, start_ts, end_ts, reason, first_seen_ts, "
                                 "last_seen_ts FROM node_events")).all()
    assert [tuple(r) for r in rows] == [("n1", -1, "drain", int(T0.timestamp()), int(T0.timestamp()) + 1800,
                                         "fan", 1, 3)]


def test_an_event_outside_the_reserved_part_of_a_bucket_leaves_it_judged(store: Store) -> None:
    """n3 was drained 0-1 min; job C starts on it at 2 min (inside the same 5-minute bucket) and holds GPU 0
    for 1 h, idle throughout. The drain touches the bucket but not the job: the bucket's reserved part
    (2-5 min, 3 min) is judged idle, not left unknown. Hand count: idle 3 + 55 (buckets 5-60 min) + 2
    (60-62 min) = 60 min; infra 0, unknown 0. A second drain at 30-31 min, inside the job, still leaves
    its bucket (30-35 min) to no verdict: 1 min infra, 4 min unknown, 55 idle."""
    start = minutes(2)
    store.ingest([job("C", [AllocatedGpu("n3", 0)], hours=1, start=start), *run("n3", 0, 0, 13, **IDLE),
                  NodeEvent("c", "n3", "drain", minutes(0), minutes(1), reason="reboot", source="sacctmgr")],
                 seen_at_ts=0)
    res = run_audit(store, Config(), W0, W1)
    c = gpu_usage(store, res.run_id)[("C", 0)]
    assert c["reserved_s"] == 60 * M and c["infra_s"] == 0
    assert c["idle_s"] == 60 * M and c["unknown_s"] == 0
    store.ingest([NodeEvent("c", "n3", "drain", minutes(30), minutes(31), reason="psu", source="sacctmgr")],
                 seen_at_ts=0)
    res = run_audit(store, Config(), W0, W1)
    c = gpu_usage(store, res.run_id)[("C", 0)]
    assert c["infra_s"] == 1 * M and c["unknown_s"] == 4 * M and c["idle_s"] == 55 * M
