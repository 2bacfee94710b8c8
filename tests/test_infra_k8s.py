"""Kubernetes nodes NotReady or cordoned are infrastructure events (README "Infrastructure-affected time"):
the real ``kubernetes`` client against tests/k8s_server.py replaying the node list recorded from a real
kube-apiserver, with the states edited in (the recorded cluster had every node Ready and schedulable)."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from k8s_server import TOKEN, K8sServer, load
from sqlalchemy import text
from test_kubernetes import TOKEN_ENV, WINDOW, connector

from auditor.records import NodeEvent
from connectors.base import Problems, RunningSnapshot

NODES = load("nodes-all.json")["items"]


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[K8sServer]:
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    with K8sServer() as srv:
        yield srv


def nodes(not_ready: tuple[str, ...] = (), cordoned: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """The recorded nodes with Ready=Unknown (as the node lifecycle controller writes it when a kubelet stops
    posting status) on ``not_ready`` and spec.unschedulable (kubectl cordon) on ``cordoned``."""
    out = copy.deepcopy(NODES)
    for n in out:
        name = n["metadata"]["name"]
        if name in not_ready:
            for c in n["status"]["conditions"]:
                if c["type"] == "Ready":
                    c.update(status="Unknown", reason="NodeStatusUnknown", lastTransitionTime="2026-11-20T08:00:00Z",
                             message="Kubelet stopped posting node status.")
        if name in cordoned:
            n["spec"]["unschedulable"] = True
    return out


def read(srv: K8sServer) -> list[Any]:
    p = Problems()
    recs = list(connector(srv).collect(WINDOW, p))  # a new connector: a full listing every time
    assert p.total == 0, p.items
    return recs


def test_not_ready_and_cordoned_gpu_nodes(server: K8sServer) -> None:
    server.replay.data["nodes"] = nodes(not_ready=("gpu-node-b", "cpu-node-1"), cordoned=("gpu-node-mig",))
    recs = read(server)
    evs = sorted((r for r in recs if isinstance(r, NodeEvent)), key=lambda e: e.node)
    # cpu-node-1 has no GPU: not listed
    assert [(e.node, e.kind, e.end, e.gpu) for e in evs] == [("gpu-node-b", "not_ready", None, None),
                                                            ("gpu-node-mig", "cordoned", None, None)]
    assert evs[0].start == datetime(2026, 11, 20, 8, tzinfo=UTC)
    assert evs[0].reason == "Ready=Unknown (NodeStatusUnknown: Kubelet stopped posting node status.)"
    (snap,) = [r for r in recs if isinstance(r, RunningSnapshot)]
    assert snap.event_kinds == ("not_ready", "cordoned") and snap.event_source == "kubernetes"
    server.replay.data["nodes"] = nodes()
    assert not [r for r in read(server) if isinstance(r, NodeEvent)]


def test_states_continue_and_end_in_the_store(server: K8sServer, store) -> None:  # noqa: ANN001 - fixture
    """Listing 1: b NotReady, mig cordoned. Listing 2: b Ready again, mig still cordoned (the same row,
    its first sighting kept). Listing 3: mig uncordoned. Each ends at its last sighting."""
    def events() -> list[tuple]:
        with store.engine.connect() as c:
            return [tuple(r) for r in c.execute(text(
                "SELECT node, kind, start_ts, end_ts, last_seen_ts FROM node_events ORDER BY node"))]

    t1 = int(datetime.now(UTC).timestamp()) + 60  # collections a minute apart, after the listings
    server.replay.data["nodes"] = nodes(not_ready=("gpu-node-b",), cordoned=("gpu-node-mig",))
    store.ingest(read(server), seen_at_ts=t1)
    first = events()
    assert [(n, k, e, s) for n, k, _st, e, s in first] == [("gpu-node-b", "not_ready", None, t1),
                                                         ("gpu-node-mig", "cordoned", None, t1)]
    cordon_start = first[1][2]
    assert cordon_start <= t1
    server.replay.data["nodes"] = nodes(cordoned=("gpu-node-mig",))
    store.ingest(read(server), seen_at_ts=t1 + 60)
    assert events() == [("gpu-node-b", "not_ready", int(datetime(2026, 11, 20, 8, tzinfo=UTC).timestamp()), t1, t1),
                        ("gpu-node-mig", "cordoned", cordon_start, None, t1 + 60)]
    server.replay.data["nodes"] = nodes()
    store.ingest(read(server), seen_at_ts=t1 + 120)
    assert events()[1] == ("gpu-node-mig", "cordoned", cordon_start, t1 + 60, t1 + 60)
