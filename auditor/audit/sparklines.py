"""Sparklines: mean SM activity and GPU-Util of a flagged allocation in 48 time bins, the evidence a reader
sees first. Read set-wise for a block of allocations (one packed string per allocation from the store) and
kept as JSON text: formatting ~100 floats per finding was most of the time it took to write the findings.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, text

from auditor.audit.judge import JOB_KEY, job_match
from auditor.store.sqlfuncs import greatest_least

SPARK_BINS = 48


def _number(s: str) -> str:
    """A bin's value as the store wrote it (3 decimals) in the form Python's json writes that float
    ("0.120" -> "0.12", "1.000" -> "1.0": reports that re-encode the evidence and reports that copy its text
    read the same), or null where the bin had none; a non-finite reading (NaN, Infinity: no JSON number)
    is null too."""
    if not s or not s[-1].isdigit():
        return "null"
    if "." not in s or len(s) > 16:  # no fixed-point text of a short float: let Python write it
        return repr(float(s))
    s = s.rstrip("0")
    return s + "0" if s.endswith(".") else s


def sparkline_json(packed: str | None) -> str:
    """``{"sm": [...], "util": [...]}`` (48 bins each, null where no data) as JSON text, from the packed
    ``bin:sm:util;...`` string of :func:`sparkline_texts`: the store's decimal text goes in as it is."""
    sm = ["null"] * SPARK_BINS
    util = ["null"] * SPARK_BINS
    for item in (packed or "").split(";"):
        if not item:
            continue
        b, s_sm, s_util = item.split(":")
        k = int(b)
        if 0 <= k < SPARK_BINS:
            sm[k] = _number(s_sm)
            util[k] = _number(s_util)
    return '{"sm": [' + ", ".join(sm) + '], "util": [' + ", ".join(util) + "]}"


def sparkline_texts(conn: Connection, run_id: int, ids: list[int], since: int, horizon: int) -> dict[int, str]:
    """Per allocation: mean SM activity and GPU-Util in up to 48 time bins, as JSON text
    (:func:`sparkline_json`). The bins of one allocation come back as one packed string (one row per
    allocation, not per bin)."""
    out: dict[int, str] = {}
    pg = conn.dialect.name == "postgresql"
    g, le = greatest_least(conn.dialect.name)
    fmt = (lambda x: f"COALESCE(CAST(ROUND(CAST({x} AS NUMERIC), 3) AS TEXT), '')") if pg else \
        (lambda x: f"CASE WHEN {x} IS NULL THEN '' ELSE printf('%.3f', {x}) END")  # printf: NULL -> 0.000
    agg = "string_agg({}, ';')" if pg else "group_concat({}, ';')"
    rng = "b.gpu_id = u.gpu_id AND b.bucket_ts >= w.s0 AND b.bucket_ts < w.e0"

    def block_sqlite(c: Connection, marks: str) -> list[Any]:
        # one grouping per allocation (a correlated subquery; SQLite's planner uses the time range by itself):
        # grouping the whole block's rows by (allocation, bin) took one temporary B-tree of every row read
        # (2.7 M for the 4,096-GPU week's findings: 3.47 -> 2.69 s, the same texts); an allocation without a
        # sampled row gets NULL here and is left out, as the grouped form leaves it out
        sql = f"""SELECT w.id AS aid, (SELECT {agg.format("CAST(x.bin AS TEXT) || ':' || " + fmt("x.sm") + " || ':' || "
                                                 + fmt("x.util"))} FROM (
          SELECT CAST((b.bucket_ts - w.s0) * {SPARK_BINS} / (w.e0 - w.s0) AS INTEGER) AS bin,
           AVG(b.sm_active) AS sm, AVG(b.gpu_util) AS util
          FROM usage_gpu u JOIN gpu_buckets b ON {rng}
          WHERE u.run_id = :run AND u.allocation_id = w.id AND b.samples > 0
           AND (b.job = '' OR {job_match(c.dialect.name, "b.job", "w.jkey")})
          GROUP BY 1) x) AS packed
        FROM (SELECT a.id, {g}(a.start_ts, :since) AS s0, {le}(COALESCE(a.end_ts, :horizon), :horizon) AS e0,
               {JOB_KEY} AS jkey FROM allocations a WHERE a.id IN ({marks})) w WHERE w.e0 > w.s0"""
        rows = c.execute(text(sql), {"since": since, "horizon": horizon, "run": run_id}).fetchall()
        return [r for r in rows if r[1] is not None]

    # PostgreSQL: a LATERAL scan (OFFSET 0 keeps it from being flattened back into a join), so the time range
    # is part of the index condition (as a join it read each GPU's whole week and filtered 90 % of it away)
    buckets = f"CROSS JOIN LATERAL (SELECT * FROM gpu_buckets b WHERE {rng} OFFSET 0) b"

    def block_pg(c: Connection, marks: str) -> list[Any]:
        sql = f"""SELECT aid, {agg.format("CAST(bin AS TEXT) || ':' || " + fmt("sm") + " || ':' || " + fmt("util"))}
        AS packed FROM (
         SELECT u.allocation_id AS aid,
          CAST((b.bucket_ts - w.s0) * {SPARK_BINS} / (w.e0 - w.s0) AS INTEGER) AS bin,
          AVG(b.sm_active) AS sm, AVG(b.gpu_util) AS util
         FROM (SELECT a.id, {g}(a.start_ts, :since) AS s0, {le}(COALESCE(a.end_ts, :horizon), :horizon) AS e0,
                {JOB_KEY} AS jkey FROM allocations a WHERE a.id IN ({marks})) w
         JOIN usage_gpu u ON u.run_id = :run AND u.allocation_id = w.id
         {buckets}
         WHERE b.samples > 0 AND w.e0 > w.s0 AND (b.job = '' OR {job_match(c.dialect.name, "b.job", "w.jkey")})
         GROUP BY u.allocation_id, CAST((b.bucket_ts - w.s0) * {SPARK_BINS} / (w.e0 - w.s0) AS INTEGER)) bins
        GROUP BY aid"""
        return c.execute(text(sql), {"since": since, "horizon": horizon, "run": run_id}).fetchall()

    blocks = [", ".join(str(int(x)) for x in ids[i:i + 500]) for i in range(0, len(ids), 500)]
    block = block_pg if pg else block_sqlite
    for marks in blocks:
        for aid, packed in block(conn, marks):
            out[aid] = sparkline_json(packed)
    return out
