"""Stragglers (docs/definitions.md "Stragglers", finding kind ``straggler``): the unit of a lockstep job that
computes while its peers wait, found by comparing the units of an allocation bucket by bucket. Only the
allocations whose units can lead and wait at all (:data:`CANDIDATES`, from the judging's sums) are read; the
rules of busy and waiting are :mod:`auditor.audit.waiting`'s.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any

from sqlalchemy import Connection, text

from auditor.audit import fabric, infra, judging, verdict
from auditor.audit.waiting import busy, waits
from auditor.config import Thresholds
from auditor.store.sqlfuncs import greatest_least
from auditor.timeutil import H

# straggler's reporting constants (docs/definitions.md; `[thresholds]` settings until issue 45).
#: reported when a node (or GPU) held its peers up for at least this share of its observed time...
STRAGGLER_MIN_SHARE = 0.5
#: ...and its peers waited at least this many GPU-hours on it
STRAGGLER_MIN_GPU_HOURS = 1.0

#: Allocations whose units can lead and wait at all (2+ GPUs). A unit leads a bucket only where one of its GPUs
#: is busy there (the judging's ``lead_s``: a mean reaches a threshold only where a member does), and another
#: unit waits: a unit of one GPU where that GPU waits (``waits_s``), a unit of several (a node, or MIG
#: instances of one GPU, or GPUs of unknown index) where one reads SM below straggler_peer_sm (``waitable_s``)
#: and one at least idle_sm (the verdict low or working). The others have no straggler and their buckets are
#: not read again.
CANDIDATES = """SELECT u.allocation_id FROM usage_gpu u JOIN allocated_gpus ag ON ag.id = u.allocated_gpu_id
WHERE u.run_id = :run AND u.gpu_id IS NOT NULL
GROUP BY u.allocation_id HAVING COUNT(*) >= 2 AND SUM(u.lead_s) > 0 AND (SUM(u.waits_s) > 0
 OR ((COUNT(DISTINCT ag.node) >= 2 OR COUNT(*) > COUNT(DISTINCT u.gpu_index)) AND SUM(u.waitable_s) > 0
     AND SUM(u.low_s + u.working_s) > 0))"""


def rows_sql(dialect: str, th: Thresholds, skip: str = "") -> str:
    """Per (allocated GPU of a candidate allocation (``_strag``, :data:`CANDIDATES`), bucket): the judged row
    of its applicable rows (:func:`auditor.audit.judging.rows_of`: observed seconds inside the reserved
    interval, SM activity, PCIe + NVLink bytes/s), with the GPU's share, node and index."""
    g, le = greatest_least(dialect)
    rows = judging.rows_of(dialect, th, "c", "cc", ["aid", "gid", "share", "node", "gpu_index"], skip)
    return f"""WITH c AS (
  SELECT u.allocation_id AS aid, u.allocated_gpu_id AS gid, u.gpu_id, ag.share, ag.node, u.gpu_index,
   {g}(a.start_ts, :since) AS a_s, {le}(COALESCE(a.end_ts, :horizon), :horizon) AS a_e, {judging.JOB_KEY} AS jkey,
   tg.has_jobs AS lab
  FROM _strag x JOIN usage_gpu u ON u.run_id = :run AND u.allocation_id = x.aid
  JOIN allocated_gpus ag ON ag.id = u.allocated_gpu_id JOIN telemetry_gpus tg ON tg.id = u.gpu_id
  JOIN allocations a ON a.id = u.allocation_id WHERE u.gpu_id IS NOT NULL)
SELECT j.aid, j.gid, j.share, j.node, j.gpu_index, j.bucket_ts, j.obs, j.sm_active AS sm, j.io_bps AS io
FROM {rows}"""


def straggler_sql(dialect: str, th: Thresholds, skip: str = "") -> str:
    """Per unit of a lockstep allocation (a node when the allocation spans 2+ nodes, else a GPU): the seconds
    it led and what its peers did meanwhile. A unit is busy in a bucket when it computes (mean SM >=
    working_sm) or its link runs saturated (mean PCIe + NVLink bytes/s per GPU >= straggler_link_bps); it
    leads when it is the one busy unit and every other unit waits (SM below straggler_peer_sm, yet not idle:
    idle GPUs wait on nothing, idle_gpus reports them). Units are compared bucket by bucket, over buckets
    where 2+ units reported SM."""
    unit = "CASE WHEN n.nodes >= 2 THEN r.node ELSE r.node || ':' || CAST(r.gpu_index AS TEXT) END"
    computes = verdict.at_least("s.sm", th.working_sm)  # the verdict's "working" (one definition, verdict.py)
    lead = "(t.is_busy = 1 AND t.busy = 1 AND t.waiting = t.units - 1)"
    return f"""WITH r AS ({rows_sql(dialect, th, skip)}),
 n AS (SELECT aid, COUNT(DISTINCT node) AS nodes, COUNT(DISTINCT gid) AS gpus FROM r GROUP BY aid),
 s AS (SELECT r.aid, {unit} AS unit, r.bucket_ts, SUM(r.obs * r.sm) / NULLIF(SUM(r.obs), 0) AS sm,
        SUM(r.obs * r.io) / NULLIF(SUM(r.obs), 0) AS io, SUM(r.share * r.obs) AS obs,
        SUM(r.share * r.obs * r.sm) AS smo
       FROM r JOIN n ON n.aid = r.aid WHERE n.gpus >= 2 AND r.sm IS NOT NULL AND r.obs > 0
       GROUP BY r.aid, {unit}, r.bucket_ts),
 f AS (SELECT s.*, CASE WHEN {busy(th, 's.sm', 's.io')} THEN 1 ELSE 0 END AS is_busy,
        CASE WHEN {waits(th, 's.sm', 's.io')} THEN 1 ELSE 0 END AS is_waiting,
        CASE WHEN {computes} THEN 0 ELSE 1 END AS by_link FROM s),
 t AS (SELECT f.*, COUNT(*) OVER w AS units, SUM(f.is_busy) OVER w AS busy, SUM(f.is_waiting) OVER w AS waiting,
        SUM(f.obs) OVER w AS all_obs, SUM(f.smo) OVER w AS all_smo
       FROM f WINDOW w AS (PARTITION BY f.aid, f.bucket_ts))
SELECT t.aid, t.unit, SUM(t.obs) AS unit_obs, SUM(CASE WHEN {lead} THEN t.obs ELSE 0 END) AS lead_obs,
 SUM(CASE WHEN {lead} AND t.by_link = 1 THEN t.obs ELSE 0 END) AS link_obs,
 SUM(CASE WHEN {lead} THEN t.all_obs - t.obs ELSE 0 END) AS held_obs,
 SUM(CASE WHEN {lead} THEN t.smo ELSE 0 END) AS lead_smo,
 SUM(CASE WHEN {lead} THEN t.all_smo - t.smo ELSE 0 END) AS held_smo
FROM t WHERE t.units >= 2 GROUP BY t.aid, t.unit ORDER BY t.aid, t.unit"""


def stragglers(conn: Connection, run_id: int, rows_of: Callable[[Iterable[int]], dict[int, dict[str, Any]]],
               th: Thresholds, p: dict[str, Any]) -> list[dict[str, Any]]:
    """straggler findings (for operations): a unit that led >= straggler_min_share of its observed time in a
    lockstep allocation and held its peers up for >= straggler_min_gpu_hours GPU-hours. ``rows_of`` reads the
    run's per-allocation rows of some ids (:meth:`auditor.audit.totals.AllocationRows.get`)."""
    from auditor.audit.evidence import _finding

    rows: dict[int, list[Any]] = defaultdict(list)
    conn.execute(text("DROP TABLE IF EXISTS _strag"))
    conn.execute(text("CREATE TEMPORARY TABLE _strag (aid INTEGER PRIMARY KEY)"))
    if conn.execute(text(f"INSERT INTO _strag {CANDIDATES}"), {"run": run_id}).rowcount:
        if conn.dialect.name == "postgresql":
            conn.execute(text("ANALYZE _strag"))
        for x in conn.execute(text(straggler_sql(conn.dialect.name, th, infra.skip(conn))), {**p, "run": run_id}):
            rows[x.aid].append(x)
    conn.execute(text("DROP TABLE _strag"))
    if not rows:
        return []
    gpus: dict[int, list[tuple[str, int | None]]] = defaultdict(list)
    ids = ", ".join(str(int(a)) for a in sorted(rows))
    for aid, node, idx in conn.execute(text(
            f"SELECT u.allocation_id, ag.node, u.gpu_index FROM usage_gpu u JOIN allocated_gpus ag ON ag.id = "
            f"u.allocated_gpu_id WHERE u.run_id = :run AND u.allocation_id IN ({ids}) ORDER BY u.allocation_id, "
            "ag.node, u.gpu_index"), {"run": run_id}):
        gpus[aid].append((node, idx))
    by_id = rows_of(rows)
    out = []
    for aid, units in rows.items():
        r = by_id.get(aid)
        if r is None:
            continue
        for x in units:
            unit_obs, lead = float(x.unit_obs or 0.0), float(x.lead_obs or 0.0)
            held_h = float(x.held_obs or 0.0) / H
            if unit_obs <= 0 or lead / unit_obs < STRAGGLER_MIN_SHARE - verdict.EPS:
                continue
            if held_h < STRAGGLER_MIN_GPU_HOURS - verdict.EPS:
                continue
            node, _, gpu = str(x.unit).partition(":")
            mine = [(n, i) for n, i in gpus[aid] if n == node and (not gpu or str(i) == gpu)]
            peers = [(n, i) for n, i in gpus[aid] if (n, i) not in mine]
            lead_sm = float(x.lead_smo or 0.0) / lead
            held_sm = float(x.held_smo or 0.0) / float(x.held_obs) if x.held_obs else 0.0
            what = f"node {node}" if not gpu else _name((node, gpu))
            link = float(x.link_obs or 0.0)
            doing = (f"computed (SM {lead_sm:.0%})" if link <= 0 else
                     f"computed or ran its link saturated (SM {lead_sm:.0%}; link saturated {link / lead:.0%} "
                     "of that time)")
            held = ", ".join(_name(g) for g in peers[:8]) + (f" and {len(peers) - 8} more" if len(peers) > 8 else "")
            ports = [] if gpu else fabric.port_waits(
                conn, r["cluster"], [node], max(int(r["start_ts"] or p["since"]), p["since"]),
                min(int(r["end_ts"] or p["horizon"]), p["horizon"]))
            port = next((w for w in ports if w["wait_share"] is not None), None)
            ev = {"rule": (f"{what} {doing} while its {len(peers)} peer GPUs ({held}) waited (SM "
                           f"{held_sm:.0%}) for {lead / unit_obs:.0%} of its observed time: {held_h:.1f} GPU-hours "
                           "held up" + (f"; {what}, port {port['port']} "
                                        + fabric.congestion_words(port["wait_share"], port["signal"])
                                        + (f" ({port['link_errors']:,.0f} link errors)" if port["link_errors"] else "")
                                        if port else "")),
                  "ports": [{k: w[k] for k in ("port", "wait_share", "signal", "waited_s", "link_errors")}
                            for w in ports],
                  "straggler_node": node, "straggler_gpus": [_name(g) for g in mine],
                  "held_up_gpus": [_name(g) for g in peers], "lead_share": lead / unit_obs,
                  "lead_gpu_hours": lead / H, "held_up_gpu_hours": held_h, "straggler_mean_sm": lead_sm,
                  "held_up_mean_sm": held_sm, "held_up_cost": held_h * r["price"], "link_saturated_share": link / lead}
            out.append(_finding(run_id, "straggler", r, ev, 0.0, p["since"], p["horizon"]))
    return out


def _name(g: tuple[str, Any]) -> str:
    """ "node GPU i" (i unknown: "?")."""
    return f"{g[0]} GPU {g[1] if g[1] is not None else '?'}"
