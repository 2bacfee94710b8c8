"""Attribution: which telemetry GPU each allocated GPU of the window is, as the temporary table ``_attr``.

One row per allocated GPU, tried in this order: by the scheduler's GPU index on the node; by the GPU's UUID
(a Kubernetes DRA device's, docs/kubernetes.md) on the node; by whole node (an
allocation holding every GPU of the node, count-only); by telemetry job labels (``hpc_job``/pod labels that
name the allocation, for count-only Kubernetes GPUs); else unattributed (its reserved time is unknown).
Each row carries the reserved interval clipped to the window (``a_s``, ``a_e``), the GPU's share, the
allocation's job key and whether its telemetry GPU ever carried job labels (``lab``). The judging
(:mod:`auditor.audit.usage`) reads ``_attr``; the statements here fill it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from sqlalchemy import Connection, text

from auditor.audit.judging import JOB_KEY, LOOKBACK, job_match, list_match
from auditor.store.ingest_pg import copy_tuples
from auditor.store.sqlfuncs import sql_names

# "not yet in _attr" is NOT EXISTS, never NOT IN (SELECT ...): PostgreSQL runs NOT IN as a hashed subplan only
# while the hash fits in work_mem, and otherwise scans the whole of _attr once per candidate row (308,497 x
# 72,398 rows: 734 s for one query at 16,384 GPUs with the default 4 MB); NOT EXISTS is an anti-join that
# probes _attr's primary key or spills to disk. Same rows: allocated_gpu_id is never NULL.
ATTR_DDL = """CREATE TEMPORARY TABLE _attr (allocated_gpu_id INTEGER PRIMARY KEY, allocation_id INTEGER,
 gpu_id INTEGER, gpu_index INTEGER, attribution VARCHAR(16), a_s INTEGER, a_e INTEGER, share FLOAT,
 jkey TEXT, lab INTEGER)"""

_IN_WINDOW = """a.start_ts IS NOT NULL AND a.start_ts < :until AND COALESCE(a.end_ts, :horizon) > :since
 AND a.start_ts < :horizon {cluster_filter}"""
_CLIP = "{GREATEST}(a.start_ts, :since), {LEAST}(COALESCE(a.end_ts, :horizon), :horizon)"
_TAIL = ", ag.share, " + JOB_KEY

ATTR_BY_INDEX = """INSERT INTO _attr SELECT ag.id, a.id, tg.id, ag.gpu_index, 'index',
 """ + _CLIP + _TAIL + """, COALESCE(tg.has_jobs, 0) FROM allocations a
JOIN allocated_gpus ag ON ag.allocation_id = a.id
LEFT JOIN telemetry_gpus tg ON tg.cluster = a.cluster AND tg.host = ag.node AND tg.gpu_index = ag.gpu_index
 AND tg.gpu_instance = ''
WHERE ag.gpu_index IS NOT NULL AND """ + _IN_WINDOW

# a count-only GPU whose UUID the scheduler gave (a DRA device's, from its ResourceSlice): the node's telemetry GPU
# of that UUID (the lowest id when a GPU was renumbered and is known under two indices); MIG devices (their
# parent's UUID) are ATTR_BY_MIG's
ATTR_BY_UUID = """INSERT INTO _attr SELECT ag.id, a.id, tg.id, tg.gpu_index, 'uuid',
 """ + _CLIP + _TAIL + """, COALESCE(tg.has_jobs, 0) FROM allocations a
JOIN allocated_gpus ag ON ag.allocation_id = a.id
JOIN (SELECT cluster, host, uuid, MIN(id) AS id FROM telemetry_gpus WHERE gpu_instance = '' AND uuid IS NOT NULL
      GROUP BY cluster, host, uuid) u ON u.cluster = a.cluster AND u.host = ag.node AND u.uuid = ag.uuid
JOIN telemetry_gpus tg ON tg.id = u.id
WHERE ag.gpu_index IS NULL AND ag.uuid IS NOT NULL AND ag.mig_profile IS NULL AND """ + _IN_WINDOW

# a DRA MIG device (its ResourceSlice's parentUUID and profile): the node's MIG instance telemetry reports under
# that parent UUID (dcgm-exporter's UUID label on a MIG series is the parent's) whose GPU_I_PROFILE is the device's
# profile (telemetry_gpus.model ends " MIG <profile>", connectors.prometheus/scrape) when it is the only instance
# of that profile on the parent; with several of one profile (seven 1g slices) which one is the device's is not
# in these labels, so they are left to the pod labels (never a guess)
ATTR_BY_MIG = """INSERT INTO _attr SELECT ag.id, a.id, tg.id, tg.gpu_index, 'uuid',
 """ + _CLIP + _TAIL + """, COALESCE(tg.has_jobs, 0) FROM allocations a
JOIN allocated_gpus ag ON ag.allocation_id = a.id
JOIN (SELECT cluster, host, uuid, model, MIN(id) AS id FROM telemetry_gpus
      WHERE gpu_instance <> '' AND uuid IS NOT NULL AND model IS NOT NULL
      GROUP BY cluster, host, uuid, model HAVING COUNT(*) = 1) u
  ON u.cluster = a.cluster AND u.host = ag.node AND u.uuid = ag.uuid
  AND (u.model = 'MIG ' || ag.mig_profile
       OR substr(u.model, length(u.model) - length(ag.mig_profile) - 4) = ' MIG ' || ag.mig_profile)
JOIN telemetry_gpus tg ON tg.id = u.id
WHERE ag.gpu_index IS NULL AND ag.uuid IS NOT NULL AND ag.mig_profile IS NOT NULL
 AND NOT EXISTS (SELECT 1 FROM _attr x WHERE x.allocated_gpu_id = ag.id) AND """ + _IN_WINDOW

ATTR_BY_NODE = """INSERT INTO _attr SELECT ag.id, a.id, tg.id, tg.gpu_index, 'node',
 """ + _CLIP + _TAIL + """, tg.has_jobs FROM allocations a JOIN allocated_gpus ag ON ag.allocation_id = a.id
JOIN (SELECT allocation_id, node, COUNT(*) AS n FROM allocated_gpus WHERE gpu_index IS NULL AND share >= 1
      GROUP BY allocation_id, node) held ON held.allocation_id = a.id AND held.node = ag.node
JOIN (SELECT cluster, host, MAX(n) AS n FROM (
        SELECT cluster, host, COUNT(*) AS n FROM gpu_inventory GROUP BY cluster, host
        UNION ALL SELECT cluster, host, COUNT(*) AS n FROM telemetry_gpus WHERE gpu_instance = ''
        GROUP BY cluster, host) caps GROUP BY cluster, host) cap
  ON cap.cluster = a.cluster AND cap.host = ag.node AND held.n >= cap.n
JOIN telemetry_gpus tg ON tg.cluster = a.cluster AND tg.host = ag.node AND tg.gpu_instance = ''
 AND tg.gpu_index = ag.slot
WHERE ag.gpu_index IS NULL AND ag.share >= 1
 AND NOT EXISTS (SELECT 1 FROM _attr x WHERE x.allocated_gpu_id = ag.id) AND """ + _IN_WINDOW

# telemetry GPUs of the node with a row that overlaps the reserved interval and names the allocation exactly,
# once per (allocation, node) still unresolved (not once per count-only GPU). Two steps: the job labels each
# labelled GPU carried in the window, with their first and last bucket (one grouped pass over those GPUs'
# rows), keep the GPUs whose label names the allocation within its interval; a probe that stops at the first
# matching row then checks each of those few exactly (PostgreSQL: LATERAL ... LIMIT 1, which it cannot turn
# into a hash semi-join over the whole bucket table; SQLite: EXISTS through the bucket index). Probing every
# GPU of the node instead scanned the whole interval of each GPU without the label: 16 s of a 16,384-GPU audit.
# SQLite: CROSS JOIN keeps telemetry_gpus the outer loop, so only the labelled GPUs' buckets are read through
# the key (as a plain JOIN the planner scanned every bucket of the store: 4.5 of the 5.2 s this step took at
# 16,384 GPUs, 13 % of them labelled; 0.58 -> 0.23 s at 4,096)
_LABELS_SEEN = """SELECT b.gpu_id, b.job, MIN(b.bucket_ts) AS t0, MAX(b.bucket_ts + b.bucket_s) AS t1
FROM telemetry_gpus tg0 CROSS JOIN gpu_buckets b ON b.gpu_id = tg0.id
WHERE tg0.has_jobs = 1 AND b.job <> '' AND b.bucket_ts >= :since - """ + str(LOOKBACK) + """ AND b.bucket_ts < :horizon
GROUP BY b.gpu_id, b.job"""
# PostgreSQL: one index range scan per labelled GPU (LATERAL), not a scan of every bucket of the window
# filtered on job <> '' (at 16,384 GPUs, 13 % of them labelled, the whole-table scan read 33 M rows in each
# judging connection: 1.6 s of the 2.1-second candidate query)
_LABELS_SEEN_PG = """SELECT tg0.id AS gpu_id, x.job, x.t0, x.t1 FROM telemetry_gpus tg0
CROSS JOIN LATERAL (SELECT b.job, MIN(b.bucket_ts) AS t0, MAX(b.bucket_ts + b.bucket_s) AS t1 FROM gpu_buckets b
  WHERE b.gpu_id = tg0.id AND b.job <> '' AND b.bucket_ts >= :since - """ + str(LOOKBACK) + """
  AND b.bucket_ts < :horizon GROUP BY b.job) x
WHERE tg0.has_jobs = 1"""
# jkey CAST to TEXT: with a text affinity SQLite's automatic index on q takes the label equality as well as
# the node (each labelled bucket range was compared with every pair of its node: 3.0 -> 2.0 s at 16,384 GPUs)
_LABEL_PAIRS = """SELECT DISTINCT k.allocation_id, k.node, a.cluster, CAST(""" + JOB_KEY + """ AS TEXT) AS jkey,
 {GREATEST}(a.start_ts, :since) AS s0, {LEAST}(COALESCE(a.end_ts, :horizon), :horizon) AS e0
FROM (SELECT DISTINCT ag.allocation_id, ag.node FROM allocated_gpus ag
      WHERE ag.gpu_index IS NULL AND NOT EXISTS (SELECT 1 FROM _attr x WHERE x.allocated_gpu_id = ag.id)) k
JOIN allocations a ON a.id = k.allocation_id WHERE """ + _IN_WINDOW
# the label equal to the job key (an equality the engine can hash), or a comma-joined label listing it
_LABEL_PART = """SELECT q.allocation_id, q.node, tg.id AS gpu_id, tg.gpu_index, q.jkey, q.s0, q.e0
FROM q JOIN telemetry_gpus tg ON tg.cluster = q.cluster AND tg.host = q.node AND tg.has_jobs = 1
JOIN l ON l.gpu_id = tg.id AND l.t0 < q.e0 AND l.t1 > q.s0 AND {LCOND}"""
_LABEL_ROW = """SELECT 1 FROM gpu_buckets b WHERE b.gpu_id = c.gpu_id
 AND b.bucket_ts >= c.s0 - """ + str(LOOKBACK) + """ AND b.bucket_ts < c.e0 AND b.bucket_ts + b.bucket_s > c.s0
 AND {COND}"""


def label_candidates(dialect: str) -> str:
    """(allocation, node, telemetry GPU, index) for every count-only allocation whose node's telemetry
    rows name it (:func:`attribute_by_labels`)."""
    parts = (_LABEL_PART.replace("{LCOND}", "l.job = q.jkey") + " UNION " + _LABEL_PART.replace(
        "{LCOND}", list_match(dialect, "l.job", "q.jkey")))
    row = _LABEL_ROW.replace("{COND}", job_match(dialect, "b.job", "c.jkey"))
    probe = (f"CROSS JOIN LATERAL ({row} LIMIT 1) m" if dialect == "postgresql" else f"WHERE EXISTS ({row})")
    seen = _LABELS_SEEN_PG if dialect == "postgresql" else _LABELS_SEEN
    return (f"WITH q AS ({_LABEL_PAIRS}), l AS ({seen}) SELECT c.allocation_id, c.node, c.gpu_id, "
            f"c.gpu_index FROM ({parts}) c {probe} ORDER BY c.allocation_id, c.node, c.gpu_index, c.gpu_id")


UNRESOLVED = """SELECT ag.id, a.id AS allocation_id, ag.node, ag.slot FROM allocations a
JOIN allocated_gpus ag ON ag.allocation_id = a.id
WHERE NOT EXISTS (SELECT 1 FROM _attr x WHERE x.allocated_gpu_id = ag.id) AND """ + _IN_WINDOW + \
    " ORDER BY ag.allocation_id, ag.node, ag.slot"

ATTR_REST = """INSERT INTO _attr SELECT ag.id, a.id, NULL, ag.gpu_index, 'unattributed', """ + _CLIP + _TAIL + """,
 0 FROM allocations a JOIN allocated_gpus ag ON ag.allocation_id = a.id
WHERE NOT EXISTS (SELECT 1 FROM _attr x WHERE x.allocated_gpu_id = ag.id) AND """ + _IN_WINDOW

def attribute_by_labels(conn: Connection, sql: str, params: dict[str, Any]) -> int:
    """Tie count-only allocated GPUs to telemetry GPUs whose hpc_job/pod labels name the allocation."""
    found: dict[tuple[int, str], list[tuple[int, int]]] = defaultdict(list)
    for r in conn.execute(text(sql), params):
        found[(r.allocation_id, r.node)].append((r.gpu_id, r.gpu_index))
    if not found:
        return 0
    names = sql_names(conn.dialect.name)
    rows = []
    for r in conn.execute(text(UNRESOLVED.format(**names, cluster_filter=params["_cf"])), params):
        cands = found.get((r.allocation_id, r.node))
        if cands and r.slot < len(cands):
            rows.append({"g": r.id, "gpu": cands[r.slot][0], "idx": cands[r.slot][1]})
    if rows:  # one set-based insert (a statement per GPU cost 8 s at 16,384 GPUs on PostgreSQL)
        conn.execute(text("DROP TABLE IF EXISTS _lab"))
        conn.execute(text("CREATE TEMPORARY TABLE _lab (g INTEGER PRIMARY KEY, gpu INTEGER, idx INTEGER)"))
        if conn.dialect.name == "postgresql":
            copy_tuples(conn, "_lab", ["g", "gpu", "idx"], [(r["g"], r["gpu"], r["idx"]) for r in rows])
        else:
            conn.exec_driver_sql("INSERT INTO _lab (g, gpu, idx) VALUES (?, ?, ?)",
                                 [(r["g"], r["gpu"], r["idx"]) for r in rows])
        conn.execute(text(
            "INSERT INTO _attr SELECT ag.id, a.id, l.gpu, l.idx, 'label', " + _CLIP.format(**names)
            + _TAIL + ", 1 FROM _lab l JOIN allocated_gpus ag ON ag.id = l.g JOIN allocations a ON "
            "a.id = ag.allocation_id"), {"since": params["since"], "horizon": params["horizon"]})
        conn.execute(text("DROP TABLE _lab"))
    return len(rows)


def attribute(conn: Connection, fn: dict[str, str], p: dict[str, Any], cluster_filter: str,
              step: Callable[[str], AbstractContextManager[None]]) -> None:
    """Fill ``_attr`` (created afresh) for the allocations ``fn["cluster_filter"]`` keeps, timing each way
    of attributing under ``step``."""
    conn.execute(text("DROP TABLE IF EXISTS _attr"))
    conn.execute(text(ATTR_DDL))
    with step("attribute by index and node"):
        conn.execute(text(ATTR_BY_INDEX.format(**fn)), p)
        conn.execute(text(ATTR_BY_UUID.format(**fn)), p)
        conn.execute(text(ATTR_BY_MIG.format(**fn)), p)
        conn.execute(text(ATTR_BY_NODE.format(**fn)), p)
        if conn.dialect.name == "postgresql":
            conn.execute(text("ANALYZE _attr"))  # a temporary table has no statistics: plans go wrong
    with step("attribute by labels"):
        attribute_by_labels(conn, label_candidates(conn.dialect.name).format(**fn), {**p, "_cf": cluster_filter})
        conn.execute(text(ATTR_REST.format(**fn)), p)
