"""Idle episodes: contiguous idle spans on a GPU of an allocation that otherwise worked (gaps and
islands over the idle buckets)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any

from sqlalchemy import Connection, text

from auditor.audit import infra, judging, starved, verdict, waiting
from auditor.config import Thresholds
from auditor.store.sqlfuncs import greatest_least
from auditor.timeutil import H

CHUNK = 500



_IDLE = verdict.in_codes("j.v", verdict.IDLE_CODES)


def episodes_sql(dialect: str, th: Thresholds, ids: str, skip: str = "") -> str:
    """Gaps and islands over the idle buckets (idle, idle-by-util or mirage, :mod:`auditor.audit.verdict`) of the
    candidate GPUs: a new island starts where the previous idle bucket of the same GPU ended before this
    one began (a working or missing bucket in between); a bucket its own job's input starved is no idle
    bucket (:mod:`auditor.audit.starved`). Seconds are observed seconds. ``skip``: buckets of
    infrastructure-affected time are left out (:mod:`auditor.audit.infra`): never a user's idle episode."""
    g, le = greatest_least(dialect)
    rows = judging.rows_of(dialect, th, "c", "cc", ["gid", "aid", "gpu_index", "share", *starved.CANDIDATE_NAMES],
                         skip)
    return f"""WITH c AS (
  SELECT u.allocated_gpu_id AS gid, u.allocation_id AS aid, u.gpu_id, u.gpu_index, ag.share,
   {starved.candidates_cols(dialect)},
   {g}(a.start_ts, :since) AS a_s, {le}(COALESCE(a.end_ts, :horizon), :horizon) AS a_e, {judging.JOB_KEY} AS jkey,
   tg.has_jobs AS lab
  FROM usage_gpu u JOIN allocated_gpus ag ON ag.id = u.allocated_gpu_id JOIN telemetry_gpus tg ON tg.id = u.gpu_id
  JOIN allocations a ON a.id = u.allocation_id
  WHERE u.run_id = :run AND u.gpu_id IS NOT NULL AND u.allocation_id IN ({ids})
   AND u.idle_s + u.mirage_s >= ag.share * :episode_s
   AND u.idle_s + u.mirage_s < :gpu_frac * u.observed_s),
 i AS (
  SELECT j.gid, j.aid, j.gpu_index, j.share, j.a_s, j.a_e, j.bucket_ts AS t0, j.bucket_ts + j.bucket_s AS t1,
   j.obs AS ov, CASE WHEN j.v = {verdict.MIRAGE} THEN 1 ELSE 0 END AS m
  FROM {rows}{waiting.node_join("j", "j.cluster", "j.node", "n")}
  WHERE {_IDLE} AND {starved.is_starved(dialect, th)} = 0),
 f AS (SELECT i.*, CASE WHEN LAG(i.t1) OVER (PARTITION BY i.gid ORDER BY i.t0) >= i.t0 THEN 0 ELSE 1 END
        AS brk FROM i),
 g AS (SELECT f.*, SUM(f.brk) OVER (PARTITION BY f.gid ORDER BY f.t0 ROWS UNBOUNDED PRECEDING) AS isl
       FROM f)
SELECT gid, aid, gpu_index, share, {g}(MIN(t0), MIN(a_s)) AS s, {le}(MAX(t1), MIN(a_e)) AS e,
 SUM(ov) AS ov, SUM(m * ov) AS mirage_ov
FROM g GROUP BY gid, aid, gpu_index, share, isl HAVING SUM(ov) >= :episode_s ORDER BY aid, s, gid"""


def idle_episodes(conn: Connection, run_id: int, candidates: list[int],
                  rows_of: Callable[[Iterable[int]], dict[int, dict[str, Any]]], th: Thresholds,
                  p: dict[str, Any]) -> list[dict[str, Any]]:
    """Contiguous idle spans >= episode_hours on a GPU of an allocation that otherwise worked (``candidates``:
    the ids of those that did work and were idle some of the time; ``rows_of``: their per-allocation rows,
    :meth:`auditor.audit.totals.AllocationRows.get`, read for the allocations that have an episode). A GPU
    idle for idle_gpus_fraction of its judged time is no episode (idle_gpus / idle_allocation report it).
    Overlapping spans on several GPUs of one allocation merge into one episode (GPU-hours summed)."""
    from auditor.audit.evidence import _finding

    ep_s = th.episode_hours * H
    spans: dict[int, list[Any]] = defaultdict(list)
    ids = sorted(candidates)
    for i in range(0, len(ids), CHUNK):
        sql = episodes_sql(conn.dialect.name, th, ", ".join(str(int(x)) for x in ids[i:i + CHUNK]),
                           infra.skip(conn))
        for s in conn.execute(text(sql), {**p, "episode_s": ep_s, "gpu_frac": th.idle_gpus_fraction}):
            spans[s.aid].append(s)
    cands = rows_of(spans)
    out = []
    for aid, rows in spans.items():
        r = cands[aid]
        for group in _merge(sorted(rows, key=lambda s: (s.s, s.e))):
            start, end = int(min(s.s for s in group)), int(max(s.e for s in group))
            idle_h = sum(float(s.share) * float(s.ov) for s in group) / H
            mirage_h = sum(float(s.share) * float(s.mirage_ov or 0) for s in group) / H
            gpus = sorted({s.gpu_index for s in group if s.gpu_index is not None})
            ev = {"rule": f"idle for {(end - start) / H:.1f} h in a row >= {th.episode_hours:g} h "
                          f"inside an allocation that otherwise worked",
                  "episode_hours": (end - start) / H, "episode_gpu_hours": idle_h,
                  "episode_mirage_gpu_hours": mirage_h, "episode_gpu_indices": gpus,
                  "episode_gpus": len({s.gid for s in group}),
                  "ongoing": r["end_ts"] is None and end >= p["horizon"]}
            f = _finding(run_id, "idle_episode", r, ev, idle_h, p["since"], p["horizon"])
            # the card's means and sparkline are the whole job's: say which window they cover
            f["evidence"].update(job_start_ts=f["start_ts"], job_end_ts=f["end_ts"])
            f.update(start_ts=int(start), end_ts=int(end), gpu_hours=idle_h)
            out.append(f)
    return out


def _merge(rows: list[Any]) -> list[list[Any]]:
    """Group time-sorted spans whose intervals overlap or touch."""
    groups: list[list[Any]] = []
    end = None
    for s in rows:
        if groups and end is not None and s.s <= end:
            groups[-1].append(s)
            end = max(end, s.e)
        else:
            groups.append([s])
            end = s.e
    return groups
