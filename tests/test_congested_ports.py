"""The congested link (issue 48 §2; auditor/audit/fabric.py, docs/definitions.md "Congested ports"): per
InfiniBand port its transmit-wait share and link errors, read from node_exporter (connectors/node_exporter.py,
names and provenance in tests/fixtures/node_exporter), stored in ib_port_buckets, quoted by the straggler finding
and ranked by the multi-node GPU-hours each port held up, on SQLite and PostgreSQL, in every report format.

By hand (window T0 - 1 d .. T0 + 1 d; buckets of 5 minutes):
- job "lock" holds 2 GPUs on each of a1 and a2 for hours 0-2 (4 GPUs); a2 computes (SM 0.9) while a1 waits (SM
  0.1) for the first 1.5 h: a2 is the straggler (tests/test_waiting.py's case).
- a2 port mlx5_2/1 waits 0.4 of each bucket in hour 0 (2 link errors a bucket) and 0.1 in hour 1, 0.5 in hours
  2-4 (after the job). Over lock's interval: 12 x 300 x 0.4 + 12 x 300 x 0.1 = 1,440 + 360 = 1,800 s waited of
  7,200 s measured: 25 %, 24 link errors. Held up: 4 GPUs x 1,800 s = 2.0 GPU-h. Over the window: (1,800 + 24 x
  300 x 0.5 = 3,600) / (48 x 300 = 14,400) = 0.375.
- a2 port mlx5_0/1 waits 0 (never listed: nothing held up); a1 port mlx5_0/1 waits 0.05 in hours 0-2: 360 s,
  4 x 360 s = 0.4 GPU-h held up.
- job "solo" holds 1 GPU of a3 for 2 h, its port a3 mlx5_0/1 waits 0.9: a single node, no lockstep peers across
  the fabric: not in the fleet view.
So the straggler finding on a2 says "node a2, port mlx5_2/1 waited 25% of the time (24 link errors)"; the fleet
view lists a2 mlx5_2/1 (2.0 GPU-h) then a1 mlx5_0/1 (0.4), 2.4 GPU-h in all, 4 ports measured.

The wait share from the counters (connectors.node_exporter.wait_share): a 400 Gb/s port (5e10 bytes/s, as
procfs parses "400 Gb/sec") whose transmit-wait counter rises 1.875e9 ticks/s: 1.875e9 x 8 bytes / 5e10 = 0.3.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from test_waiting import T0, W0, W1, findings, job, lock_job, series

from auditor.audit.run import run_audit
from auditor.config import Config
from auditor.records import AllocatedGpu, PortBucket
from auditor.report import render
from auditor.report.context import build_context
from connectors.base import Context, Problems, Window
from connectors.node_exporter import (
    BYTES_PER_TICK,
    ECN_MARKED,
    PORT_QUERIES,
    TRANSMIT_WAIT,
    NodeTelemetry,
    ecn_share,
    wait_share,
)

FIX = Path(__file__).resolve().parent / "fixtures" / "node_exporter"


def ports(node: str, dev: str, shares: list[tuple[float, float, float, float]]) -> list[PortBucket]:
    """Port buckets of ``node`` ``dev``/1: per (from hour, to hour, wait share, link errors a bucket)."""
    out = []
    for h0, h1, share, errors in shares:
        for i in range(int(h0 * 12), int(h1 * 12)):
            out.append(PortBucket("c", node, dev, "1", T0 + timedelta(minutes=5 * i), 300, share, errors))
    return out


def fleet() -> list[Any]:
    recs = lock_job()
    recs += [job("solo", [AllocatedGpu("a3", 0)]), *series("a3", 0, sm_active=0.8)]
    recs += ports("a2", "mlx5_2", [(0, 1, 0.4, 2.0), (1, 2, 0.1, 0.0), (2, 4, 0.5, 0.0)])
    recs += ports("a2", "mlx5_0", [(0, 4, 0.0, 0.0)])
    recs += ports("a1", "mlx5_0", [(0, 2, 0.05, 0.0)])
    recs += ports("a3", "mlx5_0", [(0, 2, 0.9, 0.0)])
    return recs


def test_congested_ports_by_hand(store: Any) -> None:
    stats = store.ingest(fleet())
    assert stats.ports == 48 + 48 + 24 + 24
    c = Config()
    rid = run_audit(store, c, W0, W1).run_id
    (f,) = findings(store, rid, "straggler")
    assert f["straggler_node"] == "a2"
    assert f["rule"].endswith("; node a2, port mlx5_2/1 waited 25% of the time (24 link errors)"), f["rule"]
    assert f["ports"] == [
        {"port": "mlx5_2/1", "wait_share": pytest.approx(0.25), "signal": "transmit_wait",
         "waited_s": pytest.approx(1800.0), "link_errors": pytest.approx(24.0)},
        {"port": "mlx5_0/1", "wait_share": 0.0, "signal": "transmit_wait", "waited_s": 0.0, "link_errors": 0.0}]
    ctx = build_context(store, c, rid)
    cp = ctx["congested_ports"]
    assert (cp["ports_measured"], cp["ports_total"]) == (4, 2)
    assert cp["held_gpu_hours"] == pytest.approx(2.4)
    assert [(x["node"], x["port"], x["jobs"]) for x in cp["ports"]] == [("a2", "mlx5_2/1", ["lock"]),
                                                                        ("a1", "mlx5_0/1", ["lock"])]
    a2, a1 = cp["ports"]
    assert a2["held_gpu_hours"] == pytest.approx(2.0) and a2["wait_share"] == pytest.approx(0.375)
    assert a2["link_errors"] == pytest.approx(24.0)
    assert a1["held_gpu_hours"] == pytest.approx(0.4) and a1["wait_share"] == pytest.approx(0.05)
    txt = render.render_text(ctx)
    assert ("c node a2 port mlx5_2/1: 2.0 GPU-h held up (jobs lock); waited 38% of the time (the window), "
            "24 link errors") in txt
    assert "| c | a2 | mlx5\\_2/1 | 2.0 | lock | 38% | 24 |" in render.render_md(ctx)
    assert 'id="congested-ports"' in render.render_html(ctx)[0]


def roce_fleet() -> list[Any]:
    """The lockstep job of :func:`fleet` on a RoCE fabric (the module docstring's "lock" job): a2 computes while
    a1 waits. By hand:
    - a2's RoCE port mlx5_1/1 reports no transmit wait, only ECN: 0.2 of its received packets marked in hours 0-2
      (24 buckets): 24 x 300 x 0.2 = 1,440 s congested of 7,200 s, 20 %; held up 4 GPUs x 1,440 s = 1.6 GPU-h.
    - a1's port mlx5_0/1 reports both in hour 0 (wait 0.05, ECN 0.1: the greater, 0.1) and only the wait 0.05 in
      hour 1: 12 x 300 x 0.1 + 12 x 300 x 0.05 = 360 + 180 = 540 s; 4 x 540 s = 0.6 GPU-h; ECN ruled 3,600 of
      7,200 measured seconds, not most of them: its signal is the transmit wait.
    The straggler finding on a2 says "port mlx5_1/1 had 20% of its received packets ECN-marked"; the fleet view
    lists a2 mlx5_1/1 (1.6) then a1 mlx5_0/1 (0.6), 2.2 GPU-h."""
    recs = lock_job()
    for i in range(24):
        t = T0 + timedelta(minutes=5 * i)
        recs.append(PortBucket("c", "a2", "mlx5_1", "1", t, 300, ecn_share=0.2))
        recs.append(PortBucket("c", "a1", "mlx5_0", "1", t, 300, wait_share=0.05, ecn_share=0.1 if i < 12 else None))
    return recs


def test_roce_port_congestion_by_hand(store: Any) -> None:
    store.ingest(roce_fleet())
    c = Config()
    rid = run_audit(store, c, W0, W1).run_id
    (f,) = findings(store, rid, "straggler")
    assert f["straggler_node"] == "a2"
    assert f["rule"].endswith("; node a2, port mlx5_1/1 had 20% of its received packets ECN-marked"), f["rule"]
    assert f["ports"] == [{"port": "mlx5_1/1", "wait_share": pytest.approx(0.2), "signal": "ecn_marked",
                           "waited_s": pytest.approx(1440.0), "link_errors": None}]
    ctx = build_context(store, c, rid)
    cp = ctx["congested_ports"]
    assert cp["held_gpu_hours"] == pytest.approx(2.2)
    a2, a1 = cp["ports"]
    assert (a2["node"], a2["port"], a2["signal"]) == ("a2", "mlx5_1/1", "ecn_marked")
    assert a2["held_gpu_hours"] == pytest.approx(1.6) and a2["wait_share"] == pytest.approx(0.2)
    assert (a1["node"], a1["signal"]) == ("a1", "transmit_wait")
    assert a1["held_gpu_hours"] == pytest.approx(0.6) and a1["wait_share"] == pytest.approx(540 / 7200)
    txt = render.render_text(ctx)
    assert ("c node a2 port mlx5_1/1: 1.6 GPU-h held up (jobs lock); had 20% of its received packets "
            "ECN-marked (the window)") in txt
    assert "| c | a2 | mlx5\\_1/1 | 1.6 | lock | 20% ECN-marked |  |" in render.render_md(ctx)
    assert "20% ECN-marked" in render.render_html(ctx)[0]


def test_ecn_share_from_the_counters() -> None:
    """1,200 marked of 10,000 received packets a second: 0.12; none received: no share (not 0)."""
    assert ecn_share(1200.0, 10000.0) == pytest.approx(0.12)
    assert ecn_share(3.0, 2.0) == 1.0  # a counter read between the two scrapes: clipped
    assert ecn_share(None, 1e4) is None and ecn_share(5.0, 0.0) is None and ecn_share(0.0, None) is None


def test_wait_share_from_the_counters() -> None:
    assert BYTES_PER_TICK == 8
    assert wait_share(1.875e9, 5e10) == pytest.approx(0.3)
    assert wait_share(1e10, 5e10) == 1.0  # more ticks than the port's time: clipped
    assert wait_share(None, 5e10) is None and wait_share(1e6, 0.0) is None and wait_share(1e6, None) is None


def test_fixture_carries_every_port_name_the_connector_reads() -> None:
    """Every per-port family the connector queries is in the written exposition (PROVENANCE.md), labelled
    device and port, a counter but for the port rate (a gauge)."""
    from prometheus_client.parser import text_string_to_metric_families

    fams = [f for p in ("node-exporter-ib-ports.prom", "node-exporter-roce-ports.prom")
            for f in text_string_to_metric_families((FIX / p).read_text())]
    types = {f.name: f.type for f in fams}
    for _fn, name in PORT_QUERIES.values():
        base = name.removesuffix("_total")
        assert types.get(base) == ("gauge" if name.endswith("_per_second") else "counter"), name
    assert TRANSMIT_WAIT == "node_infiniband_port_transmit_wait_total"
    assert ECN_MARKED == "node_infiniband_np_ecn_marked_roce_packets_received_total"
    assert all(set(s.labels) == {"device", "port"} for f in fams for s in f.samples)


def test_port_queries_per_node_device_and_port() -> None:
    src = NodeTelemetry(Context("c"), NodeTelemetry.Options(url="http://prometheus:9090"))
    assert src.port_promql("xmit_wait", 300) == (
        "sum by (instance, device, port) (max without (job) "
        "(rate(node_infiniband_port_transmit_wait_total{}[300s] offset 1ms)))")
    assert src.port_promql("errors:node_infiniband_symbol_error_total", 300).startswith(
        "sum by (instance, device, port) (max without (job) (increase(node_infiniband_symbol_error_total{}[300s]")


def test_port_rows_from_files(tmp_path: Path) -> None:
    (tmp_path / "nodes.csv").write_text("start,node,cpus\n2026-11-20T00:00:00Z,a2,64\n")
    (tmp_path / "ports.csv").write_text(
        "start,node,device,port,wait_share,link_errors,ecn_share\n"
        "2026-11-20T00:00:00Z,a2,mlx5_2,1,0.3,3,\n"
        "2026-11-20T00:05:00Z,a2,mlx5_2,1,1.5,0,\n"  # not a share: skipped with one line
        "2026-11-20T00:10:00Z,a2,,1,0.1,0,\n"  # no device: skipped
        "2026-11-20T00:15:00Z,a2,mlx5_2,1,,,\n"  # not measured
        "2026-11-20T00:20:00Z,a2,mlx5_1,1,,,0.12\n"  # a RoCE port: ECN only
        "2026-11-20T00:25:00Z,a2,mlx5_1,1,,,2\n")  # not a share: skipped
    src = NodeTelemetry(Context("c", base_dir=tmp_path), NodeTelemetry.Options(
        paths=["nodes.csv"], port_paths=["ports.csv"]))
    problems = Problems()
    w = Window(datetime(2026, 11, 20, tzinfo=UTC), datetime(2026, 11, 21, tzinfo=UTC), 300)
    got = [r for r in src.collect(w, problems) if isinstance(r, PortBucket)]
    assert [(r.node, r.device, r.port, r.start.minute, r.wait_share, r.link_errors, r.ecn_share) for r in got] == [
        ("a2", "mlx5_2", "1", 0, 0.3, 3.0, None), ("a2", "mlx5_2", "1", 15, None, None, None),
        ("a2", "mlx5_1", "1", 20, None, None, 0.12)]
    assert problems.total == 3


def test_bad_port_buckets_are_refused_and_the_rest_stored(store: Any) -> None:
    from sqlalchemy import text

    t = T0
    stats = store.ingest([PortBucket("c", "a2", "mlx5_2", "1", t, 300, 0.3, 1.0),
                          PortBucket("c", "a2", "mlx5_2", "1", t + timedelta(minutes=5), 300, 1.7, 0.0),
                          PortBucket("c", "a2", "mlx5_2", "1", t + timedelta(minutes=10), 300, 0.2, -1.0)])
    assert (stats.ports, stats.quarantined) == (1, 2)
    with store.engine.connect() as conn:
        assert conn.execute(text("SELECT wait_share, link_errors FROM ib_port_buckets")).all() == [(0.3, 1.0)]


# -- the API path: node_exporter's per-port series in a private Prometheus ---------------------------------------
#: two hours of samples every 30 s from two days ago (a whole hour), as tests/test_node_telemetry.py does
NOW_TS = int(datetime.now(UTC).timestamp())
P0 = (NOW_TS - 2 * 86400) // 3600 * 3600
PSTEP, PSTEPS = 30, 2 * 3600 // 30


#: per fixture: the device whose counters rise, and their rates a second
RISING = {"node-exporter-ib-ports.prom": ("mlx5_2", {"node_infiniband_port_transmit_wait_total": 1.875e9,
                                                    "node_infiniband_symbol_error_total": 0.01}),
          "node-exporter-roce-ports.prom": ("mlx5_1", {
              "node_infiniband_np_ecn_marked_roce_packets_received_total": 1200.0,
              "node_infiniband_port_packets_received_total": 10000.0})}


def port_openmetrics(fixture: str = "node-exporter-ib-ports.prom") -> str:
    """The written exposition (node-exporter-ib-ports.prom) on n1:9100, each counter rising from its value:
    mlx5_2/1's transmit wait at 1.875e9 ticks/s and its symbol errors at 0.01/s; mlx5_0/1's held (0/s); the
    rate gauge held at 5e10. By hand per 300 s bucket: mlx5_2/1 wait share 1.875e9 x 8 / 5e10 = 0.3, link
    errors 0.01 x 300 = 3; mlx5_0/1 0.0 and 0. The RoCE one (node-exporter-roce-ports.prom): mlx5_1/1 receives
    10,000 packets/s of which 1,200 are ECN-marked: 0.12; mlx5_0/1 held: no packets, no share."""
    from prometheus_client.parser import text_string_to_metric_families

    dev, rates = RISING[fixture]
    fams: dict[str, list[str]] = {}
    for fam in text_string_to_metric_families((FIX / fixture).read_text()):
        for smp in fam.samples:
            r = rates.get(smp.name, 0.0) if smp.labels["device"] == dev else 0.0
            lab = ",".join(f'{k}="{v}"' for k, v in sorted({**smp.labels, "instance": "n1:9100"}.items()))
            fams.setdefault(smp.name, []).extend(f"{smp.name}{{{lab}}} {smp.value + r * PSTEP * i!r} {P0 + i * PSTEP}"
                                                 for i in range(PSTEPS))
    return "".join(f"# TYPE {n} gauge\n" + "\n".join(lines) + "\n" for n, lines in fams.items()) + "# EOF\n"


@pytest.mark.service
def test_connector_reads_each_port_per_bucket(tmp_path: Path) -> None:
    from test_infra_prometheus import private_prometheus

    with private_prometheus(tmp_path, port_openmetrics()) as url:
        src = NodeTelemetry(Context("c"), NodeTelemetry.Options(url=url, retries=0))
        problems = Problems()
        start = datetime.fromtimestamp(P0, UTC)
        got = list(src.collect(Window(start, start + timedelta(hours=2), 300), problems))
    assert problems.total == 0, problems.items
    assert all(isinstance(r, PortBucket) for r in got)  # no node field's series: only ports
    by: dict[tuple[str, str], list[PortBucket]] = {}
    for r in got:
        by.setdefault((r.node, f"{r.device}/{r.port}"), []).append(r)
    assert sorted(by) == [("n1", "mlx5_0/1"), ("n1", "mlx5_2/1")]
    hot, quiet = by[("n1", "mlx5_2/1")], by[("n1", "mlx5_0/1")]
    assert len(hot) == len(quiet) == 24 and hot[0].start == start
    assert all(r.wait_share == pytest.approx(0.3) and r.link_errors == pytest.approx(3.0) for r in hot)
    assert all(r.wait_share == 0.0 and r.link_errors == 0.0 for r in quiet)


@pytest.mark.service
def test_connector_reads_a_roce_ports_ecn_marks(tmp_path: Path) -> None:
    """A RoCE port with no transmit-wait family: the connector queries its ECN marks and received packets."""
    from test_infra_prometheus import private_prometheus

    with private_prometheus(tmp_path, port_openmetrics("node-exporter-roce-ports.prom")) as url:
        src = NodeTelemetry(Context("c"), NodeTelemetry.Options(url=url, retries=0))
        problems = Problems()
        start = datetime.fromtimestamp(P0, UTC)
        got = list(src.collect(Window(start, start + timedelta(hours=2), 300), problems))
    assert problems.total == 0, problems.items
    hot = [r for r in got if isinstance(r, PortBucket) and r.device == "mlx5_1"]
    quiet = [r for r in got if isinstance(r, PortBucket) and r.device == "mlx5_0"]
    assert len(hot) == len(quiet) == 24
    assert all(r.ecn_share == pytest.approx(0.12) and r.wait_share is None and r.link_errors is None for r in hot)
    assert all(r.ecn_share is None for r in quiet)  # nothing received: no share of nothing


def test_prune_rolls_port_buckets_up_with_the_node_buckets(store: Any) -> None:
    """Two hours of 5-minute rows of one port, 10 weeks old, beside its node's rows: pruned at 8 weeks they
    become 2 hourly rows. Hour 1: 6 buckets waiting 0.2 and 6 waiting 0.4, 1 link error each: mean (6 x 0.2 +
    6 x 0.4) / 12 = 0.3, 12 errors. Hour 2: the wait share in half its buckets (0.1), errors not measured:
    0.1, NULL. The waited seconds of the hours stay: 0.3 x 3,600 = 1,080 s as 12 x 300 x 0.3. The RoCE ECN
    share alike: hour 1 has none (NULL), hour 2 has 0.2 in its first 3 buckets and 0.6 in the next 3 (the rest
    unmeasured): (3 x 0.2 + 3 x 0.6) / 6 = 0.4."""
    from sqlalchemy import text

    from auditor.records import NodeBucket
    from auditor.store.retention import prune

    now = NOW_TS
    h0 = (now - 10 * 7 * 86400) // 86400 * 86400
    t0 = datetime.fromtimestamp(h0, UTC)
    recs: list[Any] = [NodeBucket("c", "n1", t0 + timedelta(minutes=5 * i), 300, 10, 300.0, cpus=8.0)
                       for i in range(24)]
    recs += [PortBucket("c", "n1", "mlx5_2", "1", t0 + timedelta(minutes=5 * i), 300, 0.2 if i < 6 else 0.4, 1.0)
             for i in range(12)]
    recs += [PortBucket("c", "n1", "mlx5_2", "1", t0 + timedelta(hours=1, minutes=5 * i), 300,
                        0.1 if i % 2 else None, None, ecn_share=(0.2 if i < 3 else 0.6) if i < 6 else None)
             for i in range(12)]
    store.ingest(recs, seen_at_ts=now)
    prune(store, now=now, keep_weeks=8)
    with store.engine.connect() as conn:
        got = conn.execute(text("SELECT start_ts, seconds, wait_share, link_errors, ecn_share FROM ib_port_buckets "
                                "ORDER BY start_ts")).all()
    assert [tuple(r) for r in got] == [(h0, 3600, pytest.approx(0.3), 12.0, None),
                                       (h0 + 3600, 3600, pytest.approx(0.1), None, pytest.approx(0.4))]
