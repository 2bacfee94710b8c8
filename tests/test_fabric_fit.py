"""Fabric fit (issue 48 §1; auditor/audit/fabric.py, docs/definitions.md "Fabric fit"): GPU-hours on
InfiniBand nodes spent by work that never used the fabric, per cluster and partition and per allocation, on
SQLite and PostgreSQL, in every report format.

Fleet (price 2.0 per GPU-hour; node buckets of 5 minutes over T0 .. T0 + 8 h):
- n1 and n2 report InfiniBand (a port seen): fabric nodes; n3's host reports no InfiniBand; n4 has no host
  telemetry. n1 and n2 move 10 MB/s received + 10 MB/s transmitted in hours 0-4, 1 GB/s each way after.
- job A: n1, 2 GPUs, hours 0-3, single node: 2 x 3 = 6 GPU-h on the fabric, USD 12.
- job B: n1 + n2, 1 GPU each, hours 0-2: the fabric at 20 MB/s a node < 100 MB/s: quiet, 2 x 2 = 4 GPU-h, USD 8.
- job C: n1 + n2, 1 GPU each, hours 5-7: 2 GB/s a node: used the fabric, not listed.
- job D: n2 + n3, 1 GPU each, hours 5-7: n3 is off the fabric (listed as placed where the fabric is thin); n2
  at 2 GB/s: used, not listed as fabric waste.
- job E: n4, 1 GPU, hours 0-2: no fabric node, not listed.
Totals: 2 allocations, 6 + 4 = 10 GPU-h, USD 20; partition gpu: single-node 6, quiet 4.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from test_findings_extra import T0, W0, W1, job

from auditor.audit.fabric import FABRIC_QUIET_BPS
from auditor.audit.run import run_audit
from auditor.config import Config, PriceCard
from auditor.records import AllocatedGpu, NodeBucket
from auditor.report import render
from auditor.report.context import build_context

H = timedelta(hours=1)


def fleet() -> list[Any]:
    out: list[Any] = []
    for i in range(96):
        quiet = i < 48
        for node in ("n1", "n2"):
            out.append(NodeBucket("c", node, T0 + i * timedelta(minutes=5), 300, samples=10, cpus=64.0,
                                  ib_rx_bps=1e7 if quiet else 1e9, ib_tx_bps=1e7 if quiet else 1e9))
        out.append(NodeBucket("c", "n3", T0 + i * timedelta(minutes=5), 300, samples=10, cpus=64.0))
    return out + [
        job("A", [AllocatedGpu("n1", 0), AllocatedGpu("n1", 1)], 3, start=T0, partition="gpu"),
        job("B", [AllocatedGpu("n1", 2), AllocatedGpu("n2", 2)], 2, start=T0, partition="gpu"),
        job("C", [AllocatedGpu("n1", 3), AllocatedGpu("n2", 3)], 2, start=T0 + 5 * H, partition="gpu"),
        job("D", [AllocatedGpu("n2", 4), AllocatedGpu("n3", 4)], 2, start=T0 + 5 * H, partition="gpu"),
        job("E", [AllocatedGpu("n4", 0)], 2, start=T0, partition="gpu"),
    ]


def test_fabric_fit_by_hand(store: Any) -> None:
    store.ingest(fleet())
    c = Config(prices=PriceCard(default=2.0))
    rid = run_audit(store, c, W0, W1).run_id
    ctx = build_context(store, c, rid)
    f = ctx["fabric"]
    assert f["fabric_nodes"] == 2 and FABRIC_QUIET_BPS == 1e8
    assert f["totals"] == pytest.approx({"allocations": 2, "gpu_hours": 10.0, "cost": 20.0})
    assert [(a["job"], a["why"], a["fabric_gpu_hours"], a["cost"]) for a in f["allocations"]] == [
        ("A", "single node", pytest.approx(6.0), pytest.approx(12.0)),
        ("B", "multi-node, fabric quiet", pytest.approx(4.0), pytest.approx(8.0))]
    assert f["allocations"][1]["ib_bps"] == pytest.approx(2e7)
    assert f["groups"] == [pytest.approx({"cluster": "c", "partition": "gpu", "allocations": 2,
                                          "single_node_gpu_hours": 6.0, "quiet_gpu_hours": 4.0, "gpu_hours": 10.0,
                                          "cost": 20.0})]
    assert [(a["job"], a["nodes_off_fabric"]) for a in f["off_fabric"]] == [("D", ["n3"])]
    txt = render.render_text(ctx)
    assert "c partition gpu: 10.0 GPU-h (6.0 single-node, 4.0 multi-node with the fabric quiet)" in txt
    assert "c job D (" in txt and "multi-node with n3 off the fabric" in txt
    assert "| c | gpu | 2 | 6.0 | 4.0 | 10.0 |" in render.render_md(ctx)
    assert 'id="fabric"' in render.render_html(ctx)[0]


def test_fabric_nodes_named_in_the_config(store: Any) -> None:
    """Cluster c's ``fabric_nodes = ["n[4-9]"]``: n4 is a fabric node too (named, no port seen: 1 of 3). Job E
    (n4, 1 GPU x 2 h, single node) is now single-node work on the fabric: 2 GPU-h, USD 4. Totals: 3
    allocations, 6 + 4 + 2 = 12 GPU-h, USD 24. Cluster d's pattern ``n3`` names no node of cluster c: job D
    (n2 + n3) still has n3 off the fabric."""
    from auditor.config import ClusterConfig

    store.ingest(fleet())
    c = Config(prices=PriceCard(default=2.0),
               clusters=[ClusterConfig(name="c", fabric_nodes=["n[4-9]"]),
                         ClusterConfig(name="d", fabric_nodes=["n3"])])
    rid = run_audit(store, c, W0, W1).run_id
    f = build_context(store, c, rid)["fabric"]
    assert (f["fabric_nodes"], f["named_nodes"]) == (3, 1)
    assert f["totals"] == pytest.approx({"allocations": 3, "gpu_hours": 12.0, "cost": 24.0})
    assert [(a["job"], a["why"], a["fabric_gpu_hours"]) for a in f["allocations"]][-1] == (
        "E", "single node", pytest.approx(2.0))
    assert [(a["job"], a["nodes_off_fabric"]) for a in f["off_fabric"]] == [("D", ["n3"])]
    assert "on 3 fabric nodes (1 named in the config)" in render.render_text(build_context(store, c, rid))
