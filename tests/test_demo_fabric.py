"""The demo's fabric cases (issue 48 §1 and §2; auditor/demo.py), found with the figures checked by hand, on
SQLite and PostgreSQL: an inference server on a fabric node (fabric fit) and a congested port under a two-node
job (the straggler finding and "Congested ports")."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest


def test_demo_fabric_cases_by_hand(store_url: str, tmp_path: Path) -> None:
    """The congested port (auditor/demo.py CONGESTED_PORT). By hand: job 1060 holds 4 GPUs on each of
    gpu-node-02 and gpu-node-03 for hours 110-120 (8 GPUs, 120 buckets of 300 s); gpu-node-03's port mlx5_2/1
    waits 0.30 of each bucket then, with 3 link errors a bucket: 120 x 300 x 0.30 = 10,800 s waited of 36,000 s:
    30 %, 360 link errors; held up 8 x 10,800 / 3,600 = 24.0 GPU-h. Every other port (mlx5_0/1 of the three hpc
    nodes, and mlx5_2/1 outside those hours) waits 0.01: mlx5_0/1 of gpu-node-02 and of gpu-node-03 each hold
    1060 up 8 x 120 x 300 x 0.01 / 3,600 = 0.8 GPU-h; gpu-node-01 has no multi-node job. In all 25.6 GPU-h, 4
    ports measured. Over the week (2,016 buckets) mlx5_2/1 waited (120 x 0.30 + 1,896 x 0.01) / 2,016 =
    (36 + 18.96) / 2,016 = 0.027262. The straggler finding on gpu-node-03 ends "node gpu-node-03, port mlx5_2/1
    waited 30% of the time (360 link errors)".

    Fabric fit (FABRIC_K8S_NODE, LOCKSTEP_IB): the k8s node gpu-node-b reports an InfiniBand port, so the
    inference server triton-0 (2 GPUs x 168 h = 336 GPU-h at USD 2.50 = USD 840) and chat-vllm (1 x 48 = 48
    GPU-h, USD 120) are single-node work on the fabric, with feature-extract (2 x 40 = 80 GPU-h, USD 200): k8s
    464 GPU-h, USD 1,160. Job 1060 moved (2e7 on gpu-node-02 + 2e9 on gpu-node-03) / 2 = 1.01 GB/s a node >=
    100 MB/s: it used the fabric and is not listed. 4 fabric nodes (3 hpc, 1 k8s)."""
    from sqlalchemy import text

    from auditor.demo_run import run_demo
    from auditor.report.context import build_context as ctx_of
    from auditor.store.engine import Store

    got = run_demo(tmp_path / "demo", now=datetime(2026, 11, 29, tzinfo=UTC), store_url=store_url)
    s = Store.open(store_url)
    with s.engine.connect() as conn:
        ev = conn.execute(text("SELECT f.evidence FROM findings f WHERE f.run_id = :r AND f.kind = 'straggler'"),
                          {"r": got.run_id}).scalar()
    import json

    import connectors

    ev = json.loads(ev) if isinstance(ev, str) else ev
    assert ev["straggler_node"] == "gpu-node-03"
    assert ev["rule"].endswith("; node gpu-node-03, port mlx5_2/1 waited 30% of the time (360 link errors)")
    assert ev["ports"][0] == {"port": "mlx5_2/1", "wait_share": pytest.approx(0.30), "signal": "transmit_wait",
                              "waited_s": pytest.approx(10800.0), "link_errors": pytest.approx(360.0)}
    cp = ctx_of(s, connectors.load_config(got.config), got.run_id)["congested_ports"]
    assert (cp["ports_measured"], cp["held_gpu_hours"]) == (4, pytest.approx(25.6))
    assert [(x["node"], x["port"], x["held_gpu_hours"], x["jobs"]) for x in cp["ports"]] == [
        ("gpu-node-03", "mlx5_2/1", pytest.approx(24.0), ["1060"]),
        ("gpu-node-02", "mlx5_0/1", pytest.approx(0.8), ["1060"]),
        ("gpu-node-03", "mlx5_0/1", pytest.approx(0.8), ["1060"])]
    assert cp["ports"][0]["wait_share"] == pytest.approx((36 + 18.96) / 2016)
    assert cp["ports"][0]["link_errors"] == pytest.approx(360.0)
    fit = ctx_of(s, connectors.load_config(got.config), got.run_id, full=True)["fabric"]
    assert fit["fabric_nodes"] == 4
    k8s = {a["name"]: (a["why"], a["fabric_gpu_hours"], a["cost"]) for a in fit["allocations"] if a["cluster"] == "k8s"}
    assert k8s == {"triton-0": ("single node", pytest.approx(336.0), pytest.approx(840.0)),
                   "chat-vllm-5f7d9-x2k4p": ("single node", pytest.approx(48.0), pytest.approx(120.0)),
                   "feature-extract-7k2xq": ("single node", pytest.approx(80.0), pytest.approx(200.0))}
    assert [g for g in fit["groups"] if g["cluster"] == "k8s"] == [pytest.approx(
        {"cluster": "k8s", "partition": "", "allocations": 3, "single_node_gpu_hours": 464.0, "quiet_gpu_hours": 0.0,
         "gpu_hours": 464.0, "cost": 1160.0})]
    assert "1060" not in {a["job"] for a in fit["allocations"]}

    from auditor.report import render

    ctx = ctx_of(s, connectors.load_config(got.config), got.run_id)
    txt, html = render.render_text(ctx), render.render_html(ctx)[0]
    # a pod without a user: no empty place for the user ("(triton-0, )", "<br>... &middot; single node")
    assert "k8s job 7e1f-triton (triton-0): single node, 336.0 GPU-h" in txt and ", )" not in txt
    assert '12px;">single node</span>' in html
