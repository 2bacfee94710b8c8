"""Infrastructure-affected time (docs/definitions.md "Infrastructure-affected time").

A node event (:class:`~auditor.records.NodeEvent`: a GPU's XID error, fault clock throttling, ECC double-bit
error or row remapping; a node Slurm drained or marked down; a Kubernetes node NotReady or cordoned) marks
an interval of a GPU (or of every GPU of the node) as infrastructure-affected. During an audit:

- ``_infra`` (temporary): per telemetry GPU, the merged intervals of its events and its node's events.
  Buckets whose reserved part overlaps one are judged by no verdict (:data:`SKIP`): neither idle nor
  working, in no user finding (idle episodes, idle reservations skip them too);
- ``_attr_infra`` (temporary): per allocated GPU, the seconds of its reserved interval inside its events
  (exact, not rounded to buckets): the usage column ``infra_s``. Unknown = reserved - observed - infra.

Events are few (a handful per node and week), so the merging is done here in Python, bounded by them.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from sqlalchemy import Connection, text

from auditor.config import Thresholds
from auditor.store.sqlfuncs import sql_names
from auditor.timeutil import H

#: lemon_node: a node with at least this many infrastructure events (distinct intervals, any of its GPUs) in the
#: audit window: three faults in a week is a pattern, not bad luck (a `[thresholds]` setting until issue 45)
LEMON_MIN_FAULTS = 3

WHOLE_NODE = -1
#: Bucket condition (``b`` = gpu_buckets, ``{a}`` the allocated interval a_s, a_e): the part of the bucket
#: inside the reserved interval overlaps no infrastructure interval of its GPU. An event outside the
#: reserved part (a drain that ended before the job started) leaves the bucket judged.
SKIP = (" AND NOT EXISTS (SELECT 1 FROM _infra i WHERE i.gpu_id = b.gpu_id"
        " AND i.s < {L}(b.bucket_ts + b.bucket_s, {a}.a_e) AND i.e > {G}(b.bucket_ts, {a}.a_s))")
_FLAG = "gpu_audit_infra"

EVENTS = """SELECT cluster, node, gpu_index, kind, start_ts, end_ts FROM node_events
WHERE start_ts < :horizon AND COALESCE(end_ts, :horizon) > :since AND kind IN ({kinds})"""


def merge(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The union of [s, e) intervals as disjoint sorted intervals (touching ones joined)."""
    out: list[list[int]] = []
    for s, e in sorted(i for i in intervals if i[1] > i[0]):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def overlap(intervals: list[tuple[int, int]], a_s: int, a_e: int) -> int:
    """Seconds of [a_s, a_e) inside the disjoint ``intervals``."""
    return sum(max(0, min(e, a_e) - max(s, a_s)) for s, e in intervals)


def skip(conn: Connection) -> str:
    """:data:`SKIP` (a template: :func:`clip` fills it in) when this audit has infrastructure intervals on a
    telemetry GPU, else "" (no cost)."""
    return SKIP if conn.info.get(_FLAG) else ""


def clip(skip: str, dialect: str, alias: str) -> str:
    """The bucket condition ``skip`` (:func:`skip`) for the allocated interval of ``alias`` (a_s, a_e)."""
    if not skip:
        return ""
    return skip.format(a=alias, **sql_names(dialect))


def _events(conn: Connection, th: Thresholds, since: int, horizon: int) -> dict[tuple[str, str], dict[int, list]]:
    """(cluster, node) -> GPU index (-1 = whole node) -> [(s, e)] clipped to [since, horizon)."""
    kinds = [k for k in th.infra_kinds]
    out: dict[tuple[str, str], dict[int, list]] = defaultdict(lambda: defaultdict(list))
    if not kinds:
        return out
    p: dict[str, Any] = {"since": since, "horizon": horizon, **{f"k{i}": k for i, k in enumerate(kinds)}}
    sql = EVENTS.format(kinds=", ".join(f":k{i}" for i in range(len(kinds))))
    for r in conn.execute(text(sql), p):
        s, e = max(int(r.start_ts), since), min(int(r.end_ts) if r.end_ts is not None else horizon, horizon)
        if e > s:
            out[(r.cluster, r.node)][int(r.gpu_index)].append((s, e))
    return out


def _of_gpu(per: dict[int, list], idx: int | None) -> list[tuple[int, int]]:
    """Merged intervals of one GPU: its own events and its node's (count-only GPU: the node's only)."""
    own = per.get(idx, []) if idx is not None and idx != WHOLE_NODE else []
    return merge([*per.get(WHOLE_NODE, []), *own])


def prepare(conn: Connection, th: Thresholds, since: int, horizon: int, *, allocated: bool = True) -> int:
    """Fill ``_infra`` and ``_attr_infra`` for the allocated GPUs in ``_attr``; returns the allocated GPUs
    with infrastructure-affected time. ``allocated=False``: ``_infra`` only (a connection that judged
    nothing itself and runs the finding rules)."""
    conn.execute(text("DROP TABLE IF EXISTS _infra"))
    conn.execute(text("DROP TABLE IF EXISTS _attr_infra"))
    conn.execute(text("CREATE TEMPORARY TABLE _infra (gpu_id INTEGER, s INTEGER, e INTEGER)"))
    conn.execute(text("CREATE TEMPORARY TABLE _attr_infra (allocated_gpu_id INTEGER PRIMARY KEY, infra INTEGER)"))
    conn.info[_FLAG] = False
    ev = _events(conn, th, since, horizon)
    if not ev:
        return 0
    nodes = sorted({n for _c, n in ev})
    rows: list[dict[str, int]] = []
    attr: list[dict[str, int]] = []
    for i in range(0, len(nodes), 500):
        p = {f"n{j}": n for j, n in enumerate(nodes[i:i + 500])}
        names = ", ".join(f":n{j}" for j in range(len(p)))
        for r in conn.execute(text(f"SELECT id, cluster, host, gpu_index FROM telemetry_gpus WHERE host IN ({names})"),
                              p):
            per = ev.get((r.cluster, r.host))
            if per:
                rows += [{"g": r.id, "s": s, "e": e} for s, e in _of_gpu(per, r.gpu_index)]
        for r in ([] if not allocated else conn.execute(text(
                "SELECT at.allocated_gpu_id AS gid, at.gpu_index, at.a_s, at.a_e, a.cluster, ag.node FROM _attr at"
                " JOIN allocated_gpus ag ON ag.id = at.allocated_gpu_id JOIN allocations a ON a.id = at.allocation_id"
                f" WHERE ag.node IN ({names})"), p)):
            per = ev.get((r.cluster, r.node))
            if per and (x := overlap(_of_gpu(per, r.gpu_index), int(r.a_s), int(r.a_e))) > 0:
                attr.append({"g": r.gid, "x": x})
    if rows:
        conn.execute(text("INSERT INTO _infra (gpu_id, s, e) VALUES (:g, :s, :e)"), rows)
        conn.execute(text("CREATE INDEX temp._infra_gpu ON _infra (gpu_id, s)" if conn.dialect.name == "sqlite"
                          else "CREATE INDEX ON _infra (gpu_id, s)"))
        conn.info[_FLAG] = True
    if attr:
        conn.execute(text("INSERT INTO _attr_infra (allocated_gpu_id, infra) VALUES (:g, :x)"), attr)
    return len(attr)


def finish(conn: Connection) -> None:
    conn.info.pop(_FLAG, None)
    conn.execute(text("DROP TABLE IF EXISTS _infra"))
    conn.execute(text("DROP TABLE IF EXISTS _attr_infra"))


NODE_INFRA = """SELECT a.cluster, ag.node, SUM(u.infra_s) AS infra_s, SUM(u.infra_s * ua.price_per_gpu_hour) AS cost_s,
 COUNT(DISTINCT u.allocation_id) AS allocations
FROM usage_gpu u JOIN allocated_gpus ag ON ag.id = u.allocated_gpu_id JOIN allocations a ON a.id = u.allocation_id
JOIN usage_allocation ua ON ua.run_id = u.run_id AND ua.allocation_id = u.allocation_id
WHERE u.run_id = :run AND u.infra_s > 0 GROUP BY a.cluster, ag.node"""

REASONS_KEPT = 5


def nodes_that_cost(conn: Connection, run_id: int, th: Thresholds, since: int, horizon: int,
                    clusters: list[str] | None = None) -> list[dict[str, Any]]:
    """The "nodes that cost us" table: per node with events in [since, horizon), its faults by kind (distinct
    intervals: touching intervals of one GPU and kind are one fault), the reasons given, the reserved
    GPU-hours they made infrastructure-affected and what those cost; ``lemon`` when the faults reach
    ``lemon_min_faults``. Most expensive first, then most faults."""
    kinds = list(th.infra_kinds)
    if not kinds:
        return []
    p: dict[str, Any] = {"since": since, "horizon": horizon, **{f"k{i}": k for i, k in enumerate(kinds)}}
    sql = EVENTS.format(kinds=", ".join(f":k{i}" for i in range(len(kinds)))).replace(
        "SELECT cluster, node, gpu_index, kind, start_ts, end_ts", "SELECT cluster, node, gpu_index, kind, start_ts, "
        "end_ts, reason")
    raw: dict[tuple[str, str], dict[tuple[int, str], list]] = defaultdict(lambda: defaultdict(list))
    reasons: dict[tuple[str, str], dict[str, None]] = defaultdict(dict)
    for r in conn.execute(text(sql + " ORDER BY start_ts"), p):
        if clusters and r.cluster not in clusters:
            continue
        s, e = max(int(r.start_ts), since), min(int(r.end_ts) if r.end_ts is not None else horizon, horizon)
        raw[(r.cluster, r.node)][(int(r.gpu_index), r.kind)].append((s, max(e, s)))
        if r.reason and len(reasons[(r.cluster, r.node)]) < REASONS_KEPT:
            reasons[(r.cluster, r.node)][str(r.reason)] = None
    cost = {(r.cluster, r.node): r for r in conn.execute(text(NODE_INFRA), {"run": run_id})}
    out = []
    for (cluster, node), per in raw.items():
        faults: dict[str, int] = defaultdict(int)
        first, last = horizon, since
        gpus = set()
        for (gpu, kind), ivs in per.items():
            merged = _merge_touching(ivs)
            faults[kind] += len(merged)
            first, last = min(first, merged[0][0]), max(last, merged[-1][1])
            if gpu != WHOLE_NODE:
                gpus.add(gpu)
        c = cost.get((cluster, node))
        n = sum(faults.values())
        out.append({"cluster": cluster, "node": node, "faults": n, "faults_by_kind": dict(sorted(faults.items())),
                    "gpus": sorted(gpus), "reasons": list(reasons[(cluster, node)]), "start_ts": first,
                    "end_ts": max(last, first), "allocations": int(c.allocations) if c else 0,
                    "infra_gpu_hours": float(c.infra_s or 0) / H if c else 0.0,
                    "cost": float(c.cost_s or 0) / H if c else 0.0, "lemon": n >= LEMON_MIN_FAULTS})
    return sort_nodes(out)


def sort_nodes(nodes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The "nodes that cost us" order: most expensive first, then most faults."""
    nodes.sort(key=lambda r: (-r["cost"], -r["faults"], r["cluster"], r["node"]))
    return nodes


def _merge_touching(ivs: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Like :func:`merge`, but an instantaneous event (end = start) counts as one too."""
    out: list[list[int]] = []
    for s, e in sorted(ivs):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def lemon_findings(run_id: int, nodes: list[dict[str, Any]], th: Thresholds) -> list[dict[str, Any]]:
    """One ``lemon_node`` finding per node with repeated faults: for operations (the hardware or the node,
    not a user's job). Its GPU-hours and cost are the infrastructure-affected reserved time on the node."""
    out = []
    for n in nodes:
        if not n["lemon"]:
            continue
        out.append({"run_id": run_id, "kind": "lemon_node", "cluster": n["cluster"], "allocation_id": None,
                    "reservation_id": None, "account": "", "user_name": "", "team": "", "start_ts": n["start_ts"],
                    "end_ts": n["end_ts"], "gpu_hours": n["infra_gpu_hours"], "idle_gpu_hours": 0.0,
                    "cost": n["cost"],
                    "evidence": {"recipient": "operations", "node": n["node"], "faults": n["faults"],
                                 "faults_by_kind": n["faults_by_kind"], "gpus": n["gpus"], "reasons": n["reasons"],
                                 "infra_gpu_hours": n["infra_gpu_hours"], "allocations": n["allocations"],
                                 "why": f"{n['faults']} infrastructure events >= lemon_min_faults "
                                        f"{LEMON_MIN_FAULTS}"}})
    return out
