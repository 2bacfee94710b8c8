"""The judged aggregate (``judged_hours``): each clock hour of each GPU judged once, read by every audit.

Per (threshold set, GPU, hour, job key) the store keeps the verdict sums (:data:`auditor.audit.judging.SUMS`)
of the hour's buckets, each bucket judged by the one verdict SQL (:func:`auditor.audit.judging.hour_rows`)
as an allocation holding the whole bucket sees it. Job key ``''`` holds the unlabelled rows of buckets that
have no labelled sibling, any other key the rows with exactly that label, so an allocation with job key
``k`` reads ``''`` and ``k``: the rows :func:`auditor.audit.judging.judged_rows` applies to it, as long as the
hour holds no comma-joined label (one row per bucket then, nothing to combine).

Upkeep: writes mark the hours they touch (:mod:`auditor.store.judged`); :func:`refresh`, at the start of an
official audit, re-judges the marked hours set-wise (``INSERT ... SELECT`` from the buckets) and clears the
marks it read. A first audit, or one under new thresholds, builds the set from its window's first hour on
(one set is kept: what-if audits under other thresholds judge from the buckets).

Reading (:func:`auditor.audit.judging.sums_sql`): an allocated GPU with at least one whole clock hour inside
its reserved interval, on a GPU without infrastructure intervals in the audit and without a marked hour among its whole
hours, takes those hours' sums from ``judged_hours`` and judges only its partial edge hours from the
buckets; every other allocated GPU is judged from the buckets as before. Marked hours that stay marked
(``unfit``: a bucket crossing the hour's end, or a comma-joined job label) are always judged from buckets.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, text

from auditor.audit.judging import KEYS, UNFIT, H, hour_rows, set_hash
from auditor.config import Thresholds
from auditor.timeutil import utcnow

_COLS = ", ".join(KEYS)


def _insert(dialect: str, th: Thresholds, frm: str, src: str) -> str:
    """``frm`` binds ``b`` and ``tg`` (its telemetry_gpus row)."""
    return (f"INSERT INTO judged_hours (ths, gpu_id, hour, job, {_COLS}) SELECT :ths, x.gpu_id, x.hour, x.job, "
            f"{', '.join(f'x.{k}' for k in KEYS)} FROM ({hour_rows(dialect, th, frm, src, 'tg.has_jobs')}) x")


def _lock(conn: Connection) -> None:
    """One re-judging at a time (PostgreSQL; SQLite has one writer anyway)."""
    if conn.dialect.name == "postgresql":
        conn.execute(text("SELECT pg_advisory_xact_lock(7301530153)"))


#: the marks read by one re-judging (``_jd``), as a row-value list the key indexes answer
_MINE = "(gpu_id, hour, mark) IN (SELECT gpu_id, hour, mark FROM _jd)"


def _drop_edges(conn: Connection) -> None:
    """Delete the kept edges (judged_edges, :func:`auditor.audit.judging.keep_edges`) that read an hour marked
    in ``_jd``: their buckets changed, so the next audit judges them again."""
    conn.execute(text("DELETE FROM judged_edges WHERE gpu_id IN (SELECT gpu_id FROM _jd) AND EXISTS (SELECT 1 FROM "
                      "_jd d WHERE d.gpu_id = judged_edges.gpu_id AND d.hour >= judged_edges.lo_hour AND d.hour <= "
                      "judged_edges.hi_hour)"))


def _judge_marked(conn: Connection, th: Thresholds, ths: str, lo_hour: int) -> int:
    """Re-judge the marked hours from ``lo_hour`` on and clear the marks read (an unfit hour's mark stays,
    flagged); returns the hours re-judged."""
    pg = conn.dialect.name == "postgresql"
    conn.execute(text("DROP TABLE IF EXISTS _jd"))
    conn.execute(text("CREATE TEMPORARY TABLE _jd (gpu_id INTEGER NOT NULL, hour INTEGER NOT NULL, mark BIGINT "
                      "NOT NULL, PRIMARY KEY (gpu_id, hour))"))
    n = conn.execute(text("INSERT INTO _jd SELECT gpu_id, hour, mark FROM judged_dirty WHERE unfit = 0 "
                          "AND hour >= :lo"), {"lo": lo_hour}).rowcount or 0
    if n:
        if pg:
            conn.execute(text("ANALYZE _jd"))
        _drop_edges(conn)
        conn.execute(text("DELETE FROM judged_hours WHERE ths = :ths AND (gpu_id, hour) IN (SELECT gpu_id, hour "
                          "FROM _jd)"), {"ths": ths})
        # the marked hours' buckets, read once (index range scans), for the judging and the unfit check
        rng = f"b.gpu_id = d.gpu_id AND b.bucket_ts >= d.hour * {H} AND b.bucket_ts < d.hour * {H} + {H}"
        conn.execute(text("DROP TABLE IF EXISTS _jb"))
        if pg:  # OFFSET 0: a LATERAL range scan per marked hour, not a join planned over every bucket
            conn.execute(text("CREATE TEMPORARY TABLE _jb AS SELECT b.* FROM _jd d CROSS JOIN LATERAL (SELECT * FROM "
                              f"gpu_buckets b WHERE {rng} OFFSET 0) b"))
        else:
            conn.execute(text(f"CREATE TEMPORARY TABLE _jb AS SELECT b.* FROM _jd d CROSS JOIN gpu_buckets b "
                              f"WHERE {rng}"))
        conn.execute(text("CREATE INDEX _jb_key ON _jb (gpu_id, bucket_ts)"))
        if pg:
            conn.execute(text("ANALYZE _jb"))
        conn.execute(text(_insert(conn.dialect.name, th, "FROM _jb b JOIN telemetry_gpus tg ON tg.id = b.gpu_id "
                                  "WHERE 1 = 1", "_jb")), {"ths": ths})
        conn.execute(text(f"UPDATE judged_dirty SET unfit = 1 WHERE {_MINE} AND (gpu_id, hour) IN (SELECT b.gpu_id, "
                          f"b.bucket_ts / {H} FROM _jb b WHERE {UNFIT})"))
        conn.execute(text("DROP TABLE _jb"))
        conn.execute(text(f"DELETE FROM judged_dirty WHERE unfit = 0 AND {_MINE}"))
    conn.execute(text("DROP TABLE _jd"))
    return n


def _build(conn: Connection, th: Thresholds, ths: str, lo_hour: int, hi_hour: int) -> None:
    """Judge every hour in [lo_hour, hi_hour) in one pass over its buckets (a new set, or an earlier window):
    the marks of the range read first are cleared after, the hours holding unfit buckets marked unfit."""
    rng = {"lo": lo_hour, "hi": hi_hour, "ths": ths}
    conn.execute(text("DROP TABLE IF EXISTS _jd"))
    conn.execute(text("CREATE TEMPORARY TABLE _jd (gpu_id INTEGER NOT NULL, hour INTEGER NOT NULL, mark BIGINT "
                      "NOT NULL, PRIMARY KEY (gpu_id, hour))"))
    conn.execute(text("INSERT INTO _jd SELECT gpu_id, hour, mark FROM judged_dirty WHERE hour >= :lo AND hour < :hi"),
                 rng)
    _drop_edges(conn)
    conn.execute(text("DELETE FROM judged_hours WHERE ths = :ths AND hour >= :lo AND hour < :hi"), rng)
    within = f"b.bucket_ts >= :lo * {H} AND b.bucket_ts < :hi * {H}"
    # CROSS JOIN: telemetry_gpus the outer loop, each GPU's buckets one index range (SQLite)
    conn.execute(text(_insert(conn.dialect.name, th, "FROM telemetry_gpus tg CROSS JOIN gpu_buckets b WHERE "
                              f"b.gpu_id = tg.id AND {within}", "gpu_buckets")), rng)
    conn.execute(text(f"DELETE FROM judged_dirty WHERE {_MINE}"))
    conn.execute(text("INSERT INTO judged_dirty (gpu_id, hour, mark, unfit) SELECT DISTINCT b.gpu_id, "
                      f"b.bucket_ts / {H}, 0, 1 FROM gpu_buckets b WHERE {within} AND {UNFIT} "
                      "ON CONFLICT (gpu_id, hour) DO UPDATE SET unfit = 1"), rng)
    conn.execute(text("DROP TABLE _jd"))


def refresh(conn: Connection, th: Thresholds, since: int) -> dict[str, Any]:
    """Bring the aggregate of ``th`` up to date for an audit from ``since`` on (in ``conn``'s transaction,
    which the caller commits before judging): a new set (dropping the one kept before) or an earlier
    window marks every hour of the range, then the marked hours are re-judged. Returns what it did."""
    _lock(conn)
    ths = set_hash(th)
    lo = int(since) // H
    sets = {r.ths: int(r.from_hour) for r in conn.execute(text("SELECT ths, from_hour FROM judged_sets"))}
    out: dict[str, Any] = {"ths": ths, "built_from_hour": None, "rejudged_hours": 0}
    frm = sets.get(ths)
    if frm is None:
        conn.execute(text("DELETE FROM judged_sets"))
        conn.execute(text("DELETE FROM judged_hours"))  # not TRUNCATE: its lock would wait for every reader
        conn.execute(text("DELETE FROM judged_edges"))
        _build(conn, th, ths, lo, END // H)
        conn.execute(text("INSERT INTO judged_sets (ths, from_hour, built_ts) VALUES (:ths, :lo, :now)"),
                     {"ths": ths, "lo": lo, "now": int(utcnow().timestamp())})
        out["built_from_hour"] = frm = lo
    elif lo < frm:
        _build(conn, th, ths, lo, frm)
        conn.execute(text("UPDATE judged_sets SET from_hour = :lo WHERE ths = :ths"), {"lo": lo, "ths": ths})
        out["built_from_hour"] = frm = lo
    out["rejudged_hours"] = _judge_marked(conn, th, ths, frm)
    return out


#: past every bucket start (hours times 3600 stay inside int4)
END = 2**31 - 1
