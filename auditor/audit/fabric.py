"""Fabric fit (issue 48 §1; docs/definitions.md "Fabric fit"): GPU-hours on fabric-attached nodes spent by work
that never used the fabric, and what moving it would free.

A node is fabric-attached when its host telemetry in the window reported an InfiniBand or RoCE port
(node_exporter's infiniband collector, which lists both: ``node_infiniband_port_data_received_bytes_total`` /
``..._transmitted_bytes_total``, stored as ``node_buckets.ib_rx_bps`` / ``ib_tx_bps``; a port seen, whatever its
traffic). Per allocation of the
run holding GPUs on such nodes: a single-node allocation never needed the fabric; a multi-node one whose nodes'
InfiniBand traffic (received + transmitted bytes/s, the mean over its nodes' buckets in its interval, weighted
by their seconds) stayed below :data:`FABRIC_QUIET_BPS` did not use it. Their GPU-hours on fabric nodes (and
that share of their reserved cost) are what moving them to nodes without the fabric would free. The reverse: a
multi-node allocation with a node that has no fabric port (placed where the fabric is thin).

The congested link (issue 48 §2; docs/definitions.md "Congested ports"): per InfiniBand port (node, device,
port) the share of the time it had data to send and sent none (``ib_port_buckets.wait_share``, from
node_exporter's transmit-wait counter: :func:`connectors.node_exporter.wait_share`) and its link errors; per
RoCE port the share of its received packets a switch marked congested (``ecn_share``:
:func:`connectors.node_exporter.ecn_share`), read as the share of the time its link was congested.
:func:`port_waits` is the one reading of a port's wait over an interval: the straggler finding quotes it for
its node's ports, and :func:`ports_section` ranks the ports by the multi-node GPU-hours they held up.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from sqlalchemy import Connection, text

from auditor.timeutil import H

#: a multi-node allocation whose nodes moved fewer InfiniBand bytes/s than this (received + transmitted, per
#: node) did not use the fabric: a lockstep all-reduce moves gigabytes a second (100 MB/s)
FABRIC_QUIET_BPS = 1e8

FABRIC_NODES = """SELECT DISTINCT cluster, node FROM node_buckets WHERE start_ts >= :since AND start_ts < :until
AND (ib_rx_bps IS NOT NULL OR ib_tx_bps IS NOT NULL)"""
ALLOCS = """SELECT a.id, a.cluster, a.partition, a.external_id, a.name, a.user_name, a.start_ts, a.end_ts, u.team,
u.reserved_s, u.reserved_cost, g.node, g.share FROM usage_allocation u JOIN allocations a ON a.id = u.allocation_id
JOIN allocated_gpus g ON g.allocation_id = a.id WHERE u.run_id = :run AND u.reserved_s > 0{mine} ORDER BY a.id"""


def _allocs(conn: Connection, run_id: int, user: str | None) -> dict[int, dict[str, Any]]:
    """The run's allocations with reserved time (a viewer's own only, when ``user``), each with its GPU shares
    per node."""
    mine = " AND a.user_name = :viewer" if user is not None else ""
    allocs: dict[int, dict[str, Any]] = {}
    for r in conn.execute(text(ALLOCS.format(mine=mine)), {"run": run_id, "viewer": user}):
        a = allocs.setdefault(r.id, {"r": r, "nodes": defaultdict(float)})
        a["nodes"][r.node] += float(r.share or 0.0)
    return allocs
TRAFFIC = """SELECT SUM(seconds * (COALESCE(ib_rx_bps, 0) + COALESCE(ib_tx_bps, 0))) AS b, SUM(seconds) AS s
FROM node_buckets WHERE cluster = :cluster AND node IN :nodes AND start_ts >= :lo AND start_ts < :hi
AND (ib_rx_bps IS NOT NULL OR ib_tx_bps IS NOT NULL)"""


#: A bucket's congested share: its transmit-wait share, or on a RoCE port its ECN-marked share (the share of its
#: received packets a switch marked congested, taken as the share of the time its link was congested), the
#: greater where a port reports both
CONGESTED = "(CASE WHEN ecn_share IS NULL OR wait_share >= ecn_share THEN wait_share ELSE ecn_share END)"
PORT_WAITS = f"""SELECT node, device, port, SUM(seconds * {CONGESTED}) AS w,
SUM(CASE WHEN {CONGESTED} IS NOT NULL THEN seconds END) AS s,
SUM(CASE WHEN ecn_share IS NOT NULL AND (wait_share IS NULL OR ecn_share > wait_share) THEN seconds END) AS es,
SUM(link_errors) AS e FROM ib_port_buckets
WHERE cluster = :cluster AND node IN :nodes AND start_ts >= :lo AND start_ts < :hi
GROUP BY node, device, port"""
#: how a port's congested share was measured (:data:`CONGESTED`): InfiniBand's transmit wait, RoCE's ECN marks
SIGNALS = ("transmit_wait", "ecn_marked")


def port_waits(conn: Connection, cluster: str, nodes: list[str], lo: int, hi: int) -> list[dict[str, Any]]:
    """Per InfiniBand or RoCE port of ``nodes`` with a bucket starting in [lo, hi): its waited seconds (congested
    share x bucket seconds, summed: :data:`CONGESTED`), the seconds measured, its wait share (waited / measured;
    None when no bucket had it), its signal (``ecn_marked`` where most measured seconds were RoCE's ECN share,
    else ``transmit_wait``) and its link errors; the most waiting first."""
    from sqlalchemy import bindparam

    if not nodes or hi <= lo:
        return []
    stmt = text(PORT_WAITS).bindparams(bindparam("nodes", expanding=True))
    out = [{"node": r.node, "port": f"{r.device}/{r.port}", "waited_s": float(r.w or 0.0),
            "measured_s": float(r.s or 0.0), "wait_share": float(r.w or 0.0) / float(r.s) if r.s else None,
            "signal": SIGNALS[1] if r.es and 2 * float(r.es) > float(r.s or 0) else SIGNALS[0],
            "link_errors": None if r.e is None else float(r.e)}
           for r in conn.execute(stmt, {"cluster": cluster, "nodes": list(nodes), "lo": lo, "hi": hi})]
    out.sort(key=lambda x: (-(x["wait_share"] or 0.0), x["node"], x["port"]))
    return out


def congestion_words(share: float, signal: str) -> str:
    """A port's congested share in words, one phrasing for the straggler finding and every report surface:
    "waited 25% of the time" (InfiniBand), "had 12% of its received packets ECN-marked" (RoCE)."""
    if signal == SIGNALS[1]:
        return f"had {share:.0%} of its received packets ECN-marked"
    return f"waited {share:.0%} of the time"


def ports_section(conn: Connection, run_id: int, *, full: bool, top_n: int,
                  user: str | None = None) -> dict[str, Any]:
    """The ports that held up the most multi-node GPU-hours: per port, over the multi-node allocations (GPUs on
    2+ nodes) of the run with GPUs on its node, the allocation's GPUs x the seconds the port waited in the
    allocation's interval (in the window); with the port's wait share and link errors over the window. With
    ``user`` (a scoped web viewer) only that user's allocations count."""
    since, until = conn.execute(text("SELECT since_ts, until_ts FROM audit_runs WHERE id = :run"),
                                {"run": run_id}).one()
    allocs = _allocs(conn, run_id, user)
    ports: dict[tuple[str, str, str], dict[str, Any]] = {}
    for a in allocs.values():
        r, nodes = a["r"], a["nodes"]
        if len(nodes) < 2:
            continue
        lo, hi = max(int(r.start_ts or since), since), min(int(r.end_ts or until), until)
        gpus = sum(nodes.values())
        for w in port_waits(conn, r.cluster, sorted(nodes), lo, hi):
            if not w["waited_s"]:
                continue
            x = ports.setdefault((r.cluster, w["node"], w["port"]), {
                "cluster": r.cluster, "node": w["node"], "port": w["port"], "held_gpu_hours": 0.0, "jobs": []})
            x["held_gpu_hours"] += gpus * w["waited_s"] / H
            x["jobs"].append(r.external_id)
    for (cluster, node, port), x in ports.items():
        whole = [w for w in port_waits(conn, cluster, [node], since, until) if w["port"] == port]
        x["wait_share"] = whole[0]["wait_share"] if whole else None
        x["signal"] = whole[0]["signal"] if whole else SIGNALS[0]
        x["congestion"] = congestion_words(x["wait_share"], x["signal"]) if x["wait_share"] is not None else None
        x["link_errors"] = whole[0]["link_errors"] if whole else None
        x["jobs"] = sorted(set(x["jobs"]))
    rows = sorted(ports.values(), key=lambda x: (-x["held_gpu_hours"], x["cluster"], x["node"], x["port"]))
    measured = conn.execute(text("SELECT COUNT(*) FROM (SELECT DISTINCT cluster, node, device, port FROM "
                                 "ib_port_buckets WHERE start_ts >= :since AND start_ts < :until) p"),
                            {"since": since, "until": until}).scalar() or 0
    return {"ports_measured": int(measured), "held_gpu_hours": sum(x["held_gpu_hours"] for x in rows),
            "ports": rows if full else rows[:top_n], "ports_total": len(rows)}


def named(cluster: str, node: str, patterns: dict[str, list[str]] | None) -> bool:
    """Whether the config names ``node`` of ``cluster`` a fabric node (``clusters[].fabric_nodes``: shell-style
    patterns, matched case-sensitively)."""
    from fnmatch import fnmatchcase

    return any(fnmatchcase(node, p) for p in (patterns or {}).get(cluster, ()))


def section(conn: Connection, run_id: int, *, full: bool, top_n: int, user: str | None = None,
            fabric_nodes: dict[str, list[str]] | None = None) -> dict[str, Any]:
    """Per (cluster, partition) and per allocation: the fabric GPU-hours and cost of single-node work and of
    multi-node work with a quiet fabric; the multi-node allocations with a node off the fabric. With ``user`` (a
    scoped web viewer) only that user's allocations. ``fabric_nodes``: per cluster, the patterns of the nodes
    the config names fabric nodes (``clusters[].fabric_nodes``), beside those with an InfiniBand port seen."""
    from sqlalchemy import bindparam

    since, until = conn.execute(text("SELECT since_ts, until_ts FROM audit_runs WHERE id = :run"),
                                {"run": run_id}).one()
    fab = {(r.cluster, r.node) for r in conn.execute(text(FABRIC_NODES), {"since": since, "until": until})}
    allocs = _allocs(conn, run_id, None)
    seen = len(fab)
    fab |= {(a["r"].cluster, n) for a in allocs.values() for n in a["nodes"] if named(a["r"].cluster, n, fabric_nodes)}
    if user is not None:
        allocs = {k: a for k, a in allocs.items() if a["r"].user_name == user}
    traffic = text(TRAFFIC).bindparams(bindparam("nodes", expanding=True))
    rows, off = [], []
    for aid, a in allocs.items():
        r, nodes = a["r"], a["nodes"]
        on = [n for n in nodes if (r.cluster, n) in fab]
        if len(nodes) >= 2 and len(on) < len(nodes):
            off.append({"allocation_id": aid, "cluster": r.cluster, "job": r.external_id, "name": r.name,
                        "user": r.user_name, "nodes_off_fabric": sorted(set(nodes) - set(on))})
        if not on:
            continue
        part = sum(nodes[n] for n in on) / sum(nodes.values()) if sum(nodes.values()) > 0 else 0.0
        if len(nodes) == 1:
            why, bps = "single node", None
        else:
            lo, hi = max(int(r.start_ts or since), since), min(int(r.end_ts or until), until)
            t = conn.execute(traffic, {"cluster": r.cluster, "nodes": on, "lo": lo, "hi": hi}).one()
            bps = float(t.b) / float(t.s) if t.s else None
            if bps is None or bps >= FABRIC_QUIET_BPS - 1e-9:
                continue  # used the fabric (or its traffic not measured in its interval: never guessed)
            why = "multi-node, fabric quiet"
        rows.append({"allocation_id": aid, "cluster": r.cluster, "partition": r.partition or "",
                     "job": r.external_id, "name": r.name, "user": r.user_name, "team": r.team,
                     "why": why, "ib_bps": bps, "fabric_gpu_hours": float(r.reserved_s) * part / H,
                     "cost": float(r.reserved_cost or 0.0) * part})
    rows.sort(key=lambda x: (-x["fabric_gpu_hours"], x["allocation_id"]))
    groups: dict[tuple[str, str], dict[str, Any]] = {}
    for x in rows:
        g = groups.setdefault((x["cluster"], x["partition"]), {
            "cluster": x["cluster"], "partition": x["partition"], "allocations": 0, "single_node_gpu_hours": 0.0,
            "quiet_gpu_hours": 0.0, "gpu_hours": 0.0, "cost": 0.0})
        g["allocations"] += 1
        g["single_node_gpu_hours" if x["why"] == "single node" else "quiet_gpu_hours"] += x["fabric_gpu_hours"]
        g["gpu_hours"] += x["fabric_gpu_hours"]
        g["cost"] += x["cost"]
    by = sorted(groups.values(), key=lambda g: (-g["gpu_hours"], g["cluster"], g["partition"]))
    return {"fabric_nodes": len(fab), "named_nodes": len(fab) - seen, "quiet_bps": FABRIC_QUIET_BPS,
            "totals": {"allocations": len(rows), "gpu_hours": sum(x["fabric_gpu_hours"] for x in rows),
                       "cost": sum(x["cost"] for x in rows)},
            "groups": by if full else by[:top_n], "allocations": rows if full else rows[:top_n],
            "allocations_total": len(rows), "off_fabric": off if full else off[:top_n], "off_fabric_total": len(off)}
