"""A GPU starved by its own job's input is not idle (docs/definitions.md "A starved GPU is not idle").

A job that reads its data (a dataset from a busy disk, NFS or Lustre; a CPU-bound input pipeline) can keep
its GPU at SM ~0 while it works: the verdict of such a bucket is "idle" (SM below idle_sm), and the waiting
classes (:mod:`auditor.audit.waiting`) take idle first. This pass looks at the host before that verdict is
billed, acted on or nudged:

- a bucket judged **idle** by SM activity (verdict code ``IDLE``; not idle-by-util, which has no SM reading,
  nor mirage, which reads busy) whose node host row reads the job's input busy: the storage rule or the
  pegged-cores rule of :func:`auditor.audit.waiting.host_case` (``storage`` or ``host``);
- **the evidence is the job's own** when, in that bucket, the allocation holds the whole node: every GPU the
  node has (its telemetry GPUs and the scheduler's inventory) is one of the allocation's whole GPUs, no other
  allocation holds a GPU there, and the allocation's CPUs, where the scheduler says, are all the node's
  cores. Those seconds are **input/storage wait (GPU starved)**: moved from ``idle_s`` to ``input_wait_s``
  of usage_gpu (so reserved = idle + input wait + mirage + low + working + busy-unverified + unknown + infra),
  priced as reserved time that did no math (never idle cost), never an enforcement target and never nudged;
- otherwise (the node is shared: the I/O or the cores could be another job's) the seconds stay idle and are
  counted in ``host_busy_idle_s``: the reports say so, and enforcement does not act on them.

Per-job cgroup I/O and CPU counters, the other evidence the definitions name, are not collected by any
connector yet: on a shared node nothing tells the job's own input apart, so nothing is concluded.

Like :mod:`auditor.audit.hostwait` it reads again only the buckets of the allocated GPUs that can have such
seconds (SM-verified idle seconds on a node with host rows), after the judging wrote usage_gpu, because the
whole-node rule needs the allocation's GPUs and the other allocations on the node.
"""

from __future__ import annotations

from sqlalchemy import Connection, text

from auditor.audit import infra, judging, verdict, waiting
from auditor.config import Thresholds
from auditor.store.sqlfuncs import greatest_least

#: the judged rows' columns this pass carries along (:func:`auditor.audit.judging.rows_of`)
_NAMES = ["agid", "aid", "share", "node", "cluster", "node_gpus", "cpus"]
#: the host classes of :func:`auditor.audit.waiting.host_case` that say the job's input is busy
INPUT_BUSY = ("storage", "host")


def own_node(dialect: str, j: str = "j", n: str = "n") -> str:
    """The allocation of judged row ``j`` held the whole node in the row's bucket (the host row ``n`` is the
    job's own): all the node's GPUs are its whole GPUs, no other allocation held a GPU there meanwhile, and
    its CPUs (when the scheduler says, and the exporter reports the node's) are all the node's cores."""
    g, _le = greatest_least(dialect)
    node_total = (f"{g}((SELECT COUNT(*) FROM telemetry_gpus t WHERE t.cluster = {j}.cluster AND t.host = {j}.node"
                  " AND t.gpu_instance = ''), (SELECT COUNT(*) FROM gpu_inventory i WHERE i.cluster = "
                  f"{j}.cluster AND i.host = {j}.node))")
    mine = (f"(SELECT COUNT(*) FROM allocated_gpus m WHERE m.allocation_id = {j}.aid AND m.node = {j}.node"
            " AND m.share >= 1)")
    others = (f"NOT EXISTS (SELECT 1 FROM allocated_gpus o JOIN allocations oa ON oa.id = o.allocation_id"
              f" WHERE o.node = {j}.node AND oa.cluster = {j}.cluster AND oa.id <> {j}.aid"
              f" AND oa.start_ts IS NOT NULL AND oa.start_ts < {j}.bucket_ts + {j}.bucket_s"
              f" AND (oa.end_ts IS NULL OR oa.end_ts > {j}.bucket_ts))")
    cores = f"({j}.cpus IS NULL OR {n}.cpus IS NULL OR {j}.cpus >= {n}.cpus - 0.5)"
    return f"({mine} >= {node_total} AND {others} AND {cores})"


def input_busy(th: Thresholds, j: str = "j", n: str = "n") -> str:
    """The node host row ``n`` reads the input of judged row ``j``'s job busy (storage or pegged cores)."""
    hc = waiting.host_case(th, n, f"{j}.node_gpus")
    return f"({hc}) IN ({', '.join(repr(x) for x in INPUT_BUSY)})"


def is_starved(dialect: str, th: Thresholds, j: str = "j", n: str = "n") -> str:
    """Judged row ``j`` (carrying aid, node, cluster, node_gpus and cpus, joined to its node's host row ``n``
    by :func:`auditor.audit.waiting.node_join`) is input/storage wait: 1, else 0 (never NULL)."""
    return (f"CASE WHEN {j}.v = {verdict.IDLE} AND {input_busy(th, j, n)} AND {own_node(dialect, j, n)}"
            " THEN 1 ELSE 0 END")


def candidates_cols(dialect: str) -> str:
    """The columns of an allocated GPU row (``u`` usage_gpu, ``ag`` allocated_gpus, ``a`` allocations) that
    :func:`is_starved` reads from its judged rows: node, cluster, cpus, node_gpus."""
    return ("ag.node, a.cluster, a.cpus, (SELECT COUNT(*) FROM allocated_gpus x WHERE x.allocation_id = "
            "u.allocation_id AND x.node = ag.node) AS node_gpus")


#: the names :func:`candidates_cols` adds to a candidate row (for :func:`auditor.audit.judging.rows_of`)
CANDIDATE_NAMES = ["node", "cluster", "cpus", "node_gpus"]


def starved_sql(dialect: str, th: Thresholds, skip: str = "") -> str:
    """Per allocated GPU of run ``:run`` with SM-verified idle seconds on a node with host rows: the seconds
    (not yet times share) of its idle buckets whose node read the input busy, held as the whole node
    (``own``) or shared (``shared``)."""
    g, le = greatest_least(dialect)
    rows = judging.rows_of(dialect, th, "s", "cc", _NAMES, skip)
    return f"""WITH c AS (
  SELECT u.allocated_gpu_id AS agid, u.allocation_id AS aid, u.gpu_id, ag.share, {candidates_cols(dialect)},
   {g}(a.start_ts, :since) AS a_s, {le}(COALESCE(a.end_ts, :horizon), :horizon) AS a_e, {judging.JOB_KEY} AS jkey,
   tg.has_jobs AS lab
  FROM usage_gpu u JOIN allocated_gpus ag ON ag.id = u.allocated_gpu_id JOIN telemetry_gpus tg ON tg.id = u.gpu_id
  JOIN allocations a ON a.id = u.allocation_id
  WHERE u.run_id = :run AND u.gpu_id IS NOT NULL AND u.idle_s - u.idle_by_util_s - u.idle_by_counters_s > 0
   AND EXISTS (SELECT 1 FROM node_buckets nb WHERE nb.cluster = a.cluster AND nb.node = ag.node
    AND nb.start_ts < {le}(COALESCE(a.end_ts, :horizon), :horizon)
    AND nb.start_ts + nb.seconds > {g}(a.start_ts, :since))),
 s AS (SELECT * FROM c WHERE c.a_e > c.a_s)
SELECT j.agid, SUM(CASE WHEN {own_node(dialect)} THEN j.obs ELSE 0 END) AS own,
 SUM(CASE WHEN {own_node(dialect)} THEN 0 ELSE j.obs END) AS shared
FROM {rows}{waiting.node_join("j", "j.cluster", "j.node", "n")}
WHERE j.v = {verdict.IDLE} AND j.obs > 0 AND {input_busy(th)}
GROUP BY j.agid"""


def refine(conn: Connection, run_id: int, th: Thresholds, p: dict[str, float | int]) -> int:
    """Move the input/storage-wait seconds of run ``run_id``'s usage_gpu out of ``idle_s`` into
    ``input_wait_s``, and count the shared-node ones in ``host_busy_idle_s`` (in place, before the
    per-allocation totals are written). Returns the allocated GPUs changed."""
    if not conn.execute(text("SELECT 1 FROM node_buckets LIMIT 1")).first():
        return 0  # no node telemetry at all: no host reads busy
    sql = starved_sql(conn.dialect.name, th, infra.skip(conn))
    got = [(agid, float(own or 0.0), float(shared or 0.0))
           for agid, own, shared in conn.execute(text(sql), {**p, "run": run_id})]
    g, _le = greatest_least(conn.dialect.name)
    share = "(SELECT ag.share FROM allocated_gpus ag WHERE ag.id = :agid)"
    upd = text(f"UPDATE usage_gpu SET input_wait_s = {share} * :own, host_busy_idle_s = {share} * :shared, "
               # idle_s holds SM-verified idle plus idle-by-util and idle-by-counters, and only the first moves:
               # never below the others by a last-digit rounding
               f"idle_s = {g}(idle_by_util_s + idle_by_counters_s, idle_s - {share} * :own) "
               "WHERE run_id = :run AND allocated_gpu_id = :agid")
    for agid, own, shared in got:
        conn.execute(upd, {"agid": agid, "own": own, "shared": shared, "run": run_id})
    return len(got)
