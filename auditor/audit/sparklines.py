"""Sparklines: mean SM activity and GPU-Util of a flagged allocation in up to 48 bins of whole clock hours,
the evidence a reader sees first (docs/definitions.md "Sparklines").

Each bin is ``bin_hours`` clock hours (as many as it takes to fit the allocation's hours in 48 bins; the last
one may be cut by the allocation's end). Its values are the means the audit itself takes: SM activity and
GPU-Util weighted by observed seconds (and share), over the applicable rows of the allocation's GPUs inside
the reserved interval, infrastructure-affected buckets left out. They come from the judging's per-hour sums
(:func:`auditor.audit.judging.sums_sql`, hourly): whole hours from the judged aggregate, the partial hours
at the edges from the buckets. Read set-wise for a block of allocations (one packed string per allocation from
the store) and kept as JSON text: formatting ~100 floats per finding was most of the time it took to write
the findings.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, text

from auditor.audit import infra
from auditor.audit.judging import DEFAULT, JOB_KEY, Judging, aggregate_set, plan, sums_sql
from auditor.config import Thresholds
from auditor.store.sqlfuncs import greatest_least

SPARK_BINS = 48
H = 3600


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


def bin_hours(s0: int, e0: int) -> tuple[int, int]:
    """(hours per bin, bins) of an allocation's clipped interval [s0, e0): the clock hours it touches, in at
    most :data:`SPARK_BINS` bins of whole hours."""
    hours = (e0 - 1) // H - s0 // H + 1 if e0 > s0 else 0
    k = max(1, -(-hours // SPARK_BINS))
    return k, -(-hours // k)


def sparkline_json(packed: str | None, bins: int = SPARK_BINS, hours: int = 1) -> str:
    """``{"sm": [...], "util": [...], "bin_hours": k}`` (``bins`` bins each, null where no data) as JSON text,
    from the packed ``bin:sm:util;...`` string of :func:`sparkline_texts`: the store's decimal text goes in as
    it is."""
    sm = ["null"] * bins
    util = ["null"] * bins
    for item in (packed or "").split(";"):
        if not item:
            continue
        b, s_sm, s_util = item.split(":")
        k = int(b)
        if 0 <= k < bins:
            sm[k] = _number(s_sm)
            util[k] = _number(s_util)
    return '{"sm": [' + ", ".join(sm) + '], "util": [' + ", ".join(util) + f'], "bin_hours": {hours}}}'


#: The targets of one block: the run's attributed GPUs of the allocations asked for, clipped to the window
_TARGETS = """INSERT INTO _spark_t SELECT u.allocated_gpu_id, u.allocation_id, u.gpu_id, {G}(a.start_ts, :since),
 {L}(COALESCE(a.end_ts, :horizon), :horizon), """ + JOB_KEY + """, tg.has_jobs, ag.share FROM usage_gpu u
JOIN allocations a ON a.id = u.allocation_id JOIN allocated_gpus ag ON ag.id = u.allocated_gpu_id
JOIN telemetry_gpus tg ON tg.id = u.gpu_id
WHERE u.run_id = :run AND u.gpu_id IS NOT NULL AND u.allocation_id IN ({ids})"""


#: Per (allocation, bin): the sums whose ratios are the bin's means
_PARTS = ("aid", "bin", "sm_n", "sm_d", "util_n", "util_d")
_KEYS = ("sm", "sm_observed", "gpu_util", "util_observed")


def _parts_table(conn: Connection) -> None:
    conn.execute(text("DROP TABLE IF EXISTS _spark_parts"))
    conn.execute(text("CREATE TEMPORARY TABLE _spark_parts (aid INTEGER, bin INTEGER, sm_n FLOAT, sm_d FLOAT, "
                      "util_n FLOAT, util_d FLOAT)"))


def parts_here(conn: Connection, th: Thresholds, since: int, skip: str, judging: Judging = DEFAULT) -> None:
    """The per-bin sums of the targets in ``_spark_t`` into ``_spark_parts``: whole hours from the judged
    aggregate where it holds the run's thresholds (and ``judging`` reads it), the edges from the buckets."""
    dialect = conn.dialect.name
    ths = aggregate_set(conn, th, since, judging)
    hourly = sums_sql(dialect, th, "_spark_t", "id", skip, hourly=True, keys=_KEYS)
    big, _le = greatest_least(dialect)
    # the bin of an hour: (hour - the allocation's first hour) / hours per bin (bin_hours); an edge bucket that
    # started in the hour before (one crossing its hour's end) goes to the first bin
    k = f"(((t.a_e - 1) / {H} - t.a_s / {H} + {SPARK_BINS}) / {SPARK_BINS})"
    b = f"{big}(0, (x.hour - t.a_s / {H}) / {k})"
    _parts_table(conn)
    plan(conn, "_spark_t", "id", skip, ths)
    conn.execute(text(f"""INSERT INTO _spark_parts ({", ".join(_PARTS)})
SELECT t.aid, {b}, SUM(t.share * x.sm), SUM(t.share * x.sm_observed), SUM(t.share * x.gpu_util),
 SUM(t.share * x.util_observed)
FROM ({hourly}) x JOIN _spark_t t ON t.id = x.id GROUP BY t.aid, {b}"""), {"ths": ths or ""})
    conn.execute(text("DROP TABLE _agg"))


def sparkline_texts(conn: Connection, run_id: int, ids: list[int], since: int, horizon: int,
                    judging: Judging = DEFAULT) -> dict[int, str]:
    """Per allocation: mean SM activity and GPU-Util per bin of whole hours, as JSON text
    (:func:`sparkline_json`); an allocation without an observed reading gets none. The bins of one allocation
    come back as one packed string (one row per allocation, not per bin). Whole hours come from the judged
    aggregate of the run's thresholds where it holds them and ``judging`` reads it
    (:func:`auditor.audit.judging.aggregate_set`)."""
    from auditor.audit.usage import run_thresholds

    out: dict[int, str] = {}
    dialect = conn.dialect.name
    pg = dialect == "postgresql"
    g, le = greatest_least(dialect)
    fmt = (lambda x: f"COALESCE(CAST(ROUND(CAST({x} AS NUMERIC), 3) AS TEXT), '')") if pg else \
        (lambda x: f"CASE WHEN {x} IS NULL THEN '' ELSE printf('%.3f', {x}) END")  # printf: NULL -> 0.000
    agg = "string_agg({}, ';')" if pg else "group_concat({}, ';')"
    th = run_thresholds(conn, run_id)
    pack = agg.format("CAST(bin AS TEXT) || ':' || " + fmt("sm") + " || ':' || " + fmt("util"))
    sql = f"""SELECT aid, {pack} AS packed FROM (
 SELECT aid, bin, SUM(sm_n) / NULLIF(SUM(sm_d), 0) AS sm, SUM(util_n) / NULLIF(SUM(util_d), 0) AS util
 FROM _spark_parts GROUP BY aid, bin) bins
WHERE sm IS NOT NULL OR util IS NOT NULL GROUP BY aid"""
    windows: dict[int, tuple[int, int]] = {}

    def block(c: Connection, marks: str) -> list[Any]:
        skip = infra.skip(c)
        c.execute(text("DROP TABLE IF EXISTS _spark_t"))
        c.execute(text("CREATE TEMPORARY TABLE _spark_t (id INTEGER PRIMARY KEY, aid INTEGER, gpu_id INTEGER, "
                       "a_s INTEGER, a_e INTEGER, jkey TEXT, lab INTEGER, share FLOAT)"))
        c.execute(text(_TARGETS.format(G=g, L=le, ids=marks)), {"since": since, "horizon": horizon, "run": run_id})
        if pg:
            c.execute(text("ANALYZE _spark_t"))
        parts_here(c, th, since, skip, judging)
        rows = c.execute(text(sql)).fetchall()
        for aid, s0, e0 in c.execute(text("SELECT aid, MIN(a_s), MAX(a_e) FROM _spark_t GROUP BY aid")):
            windows[aid] = (int(s0), int(e0))
        c.execute(text("DROP TABLE _spark_parts"))
        c.execute(text("DROP TABLE _spark_t"))
        return rows

    blocks = [", ".join(str(int(x)) for x in ids[i:i + 500]) for i in range(0, len(ids), 500)]
    for marks in blocks:
        for aid, packed in block(conn, marks):
            if packed:
                hours, bins = bin_hours(*windows[aid])
                out[aid] = sparkline_json(packed, bins, hours)
    return out
