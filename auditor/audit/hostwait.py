"""What a starved GPU waited on (docs/definitions.md "Where the waiting goes"): the host side of the waiting
classes, from node telemetry (``node_buckets``).

The judging sums every bucket's GPU-side class (:func:`auditor.audit.waiting.class_case`): a quiet GPU with DRAM
and links measured and quiet is ``starved``. What its host did meanwhile decides which host class those
seconds are (:func:`auditor.audit.waiting.host_case`: storage, InfiniBand, host-bound, else still starved), and
the host-bound rule counts pegged cores per GPU the allocation holds on the node, so it cannot be kept in the
per-(GPU, hour) aggregate. Only the allocated GPUs with starved seconds (``usage_gpu.starved_s`` > 0, an
exact filter) have their buckets read again here, each bucket joined to its node's host row
(:func:`auditor.audit.waiting.node_join`).
"""

from __future__ import annotations

import math
from collections import defaultdict

from sqlalchemy import Connection, text

from auditor.audit import infra, judging, waiting
from auditor.config import Thresholds
from auditor.store.sqlfuncs import greatest_least

#: the judged rows' columns the host split carries along (:func:`auditor.audit.judging.rows_of`)
_NAMES = ["aid", "share", "node", "cluster", "node_gpus"]


def host_sql(dialect: str, th: Thresholds, skip: str = "", one: bool = False) -> str:
    """Per allocation and host class: the starved seconds (times share) of its GPUs, split by what their node
    did in each bucket; ``one``: only the allocation ``:aid`` (its job view)."""
    g, le = greatest_least(dialect)
    rows = judging.rows_of(dialect, th, "s", "cc", _NAMES, skip)
    return f"""WITH c AS (
  SELECT u.allocation_id AS aid, u.gpu_id, ag.share, ag.node, a.cluster, u.starved_s,
   COUNT(*) OVER (PARTITION BY u.allocation_id, ag.node) AS node_gpus,
   {g}(a.start_ts, :since) AS a_s, {le}(COALESCE(a.end_ts, :horizon), :horizon) AS a_e, {judging.JOB_KEY} AS jkey,
   tg.has_jobs AS lab
  FROM usage_gpu u JOIN allocated_gpus ag ON ag.id = u.allocated_gpu_id JOIN telemetry_gpus tg ON tg.id = u.gpu_id
  JOIN allocations a ON a.id = u.allocation_id
  WHERE u.run_id = :run AND u.gpu_id IS NOT NULL{" AND u.allocation_id = :aid" if one else ""}),
 s AS (SELECT * FROM c WHERE c.starved_s > 0)
SELECT x.aid, x.hc, SUM(x.secs) AS secs FROM (
 SELECT j.aid AS aid, {waiting.host_case(th, "n", "j.node_gpus")} AS hc, j.share * j.obs AS secs
 FROM {rows}{waiting.node_join("j", "j.cluster", "j.node", "n")}
 WHERE j.cls = 'starved') x
GROUP BY x.aid, x.hc"""


def refine(conn: Connection, run_id: int, th: Thresholds, p: dict[str, float | int],
           seconds: dict[int, dict[str, float]], allocation_id: int | None = None) -> None:
    """Move the starved seconds of :func:`auditor.audit.waiting.class_seconds` that the host explains into
    their host class (in place). A node without host rows, or whose counters show no cause, leaves them
    starved. ``allocation_id``: that allocation only (outside the audit: no infrastructure buckets are left
    out then, and the starved seconds it may move are capped by the judged ones)."""
    if not conn.execute(text("SELECT 1 FROM node_buckets LIMIT 1")).first():
        return  # no node telemetry at all: nothing can be told apart
    moved: dict[int, dict[str, float]] = defaultdict(dict)
    sql = host_sql(conn.dialect.name, th, infra.skip(conn), one=allocation_id is not None)
    for aid, hc, secs in conn.execute(text(sql), {**p, "run": run_id, "aid": allocation_id}):
        if hc != "starved":
            moved[aid][hc] = moved[aid].get(hc, 0.0) + float(secs or 0.0)
    for aid, by in moved.items():
        got = seconds.setdefault(aid, {})
        over = sum(by.values()) / got.get("starved", 0.0) if got.get("starved") else math.inf
        if allocation_id is not None and over > 1:  # infrastructure buckets read again: capped
            by = {hc: secs / over for hc, secs in by.items()} if math.isfinite(over) else {}
        for hc, secs in by.items():
            got[hc] = got.get(hc, 0.0) + secs
        # never below 0: the judging summed share x seconds per GPU, this pass per bucket (last-digit rounding)
        got["starved"] = max(0.0, got.get("starved", 0.0) - sum(by.values()))
