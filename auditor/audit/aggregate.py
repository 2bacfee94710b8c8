"""The judged aggregate (``judged_hours``): each clock hour of each GPU judged once, read by every audit.

Per (threshold set, GPU, hour, job key) the store keeps the verdict sums (:data:`auditor.audit.judge.SUMS`)
of the hour's buckets, each bucket judged by the one verdict SQL (:func:`auditor.audit.judge._judged_cols`)
as an allocation holding the whole bucket sees it. Job key ``''`` holds the unlabelled rows of buckets that
have no labelled sibling, any other key the rows with exactly that label, so an allocation with job key
``k`` reads ``''`` and ``k``: the rows :func:`auditor.audit.judge.judged_rows` applies to it, as long as the
hour holds no comma-joined label (one row per bucket then, nothing to combine).

Upkeep: writes mark the hours they touch (:mod:`auditor.store.judged`); :func:`refresh`, at the start of an
official audit, re-judges the marked hours set-wise (``INSERT ... SELECT`` from the buckets) and clears the
marks it read. A first audit, or one under new thresholds, builds the set from its window's first hour on
(one set is kept: what-if audits under other thresholds judge from the buckets).

Reading (:func:`judge_whole_hours`): an allocated GPU with at least one whole clock hour inside its reserved
interval, on a GPU without infrastructure intervals in the audit and without a marked hour among its whole
hours, takes those hours' sums from ``judged_hours`` and judges only its partial edge hours from the
buckets; every other allocated GPU is judged from the buckets as before. Marked hours that stay marked
(``unfit``: a bucket crossing the hour's end, or a comma-joined job label) are always judged from buckets.
"""

from __future__ import annotations

import hashlib
from typing import Any

from sqlalchemy import Connection, text

from auditor.audit import infra, verdict
from auditor.audit.judge import LOOKBACK, SUMS, _judged_cols, judged_rows
from auditor.config import Thresholds
from auditor.store.sqlfuncs import greatest_least
from auditor.timeutil import utcnow

H = 3600
KEYS = tuple(SUMS)
#: sums combined by MAX (peak frame buffer), the others by SUM
MAXED = ("peak_fb", "idle_fb")
_ALONE = ("NOT EXISTS (SELECT 1 FROM {src} s WHERE s.gpu_id = b.gpu_id AND s.bucket_ts = b.bucket_ts "
          "AND s.job <> '')")
_UNFIT = f"(b.bucket_ts % {H} + b.bucket_s > {H} OR b.job LIKE '%,%')"


def hour_rows(dialect: str, th: Thresholds, frm: str, src: str = "gpu_buckets", lab: str = "1") -> str:
    """Per (GPU, hour, job key) the SUMS of the buckets of ``frm`` (binds ``b``, ends in a WHERE clause),
    each judged whole; buckets crossing their hour's end and comma-joined labels are left out (their hours
    stay marked, :func:`refresh`). ``src``: the table holding every row of those buckets (their siblings);
    ``lab`` = 0 says the GPU never had a labelled row (telemetry_gpus.has_jobs), skipping the sibling probe."""
    cols = _judged_cols(th, verdict.prefixed("b"), "b.bucket_ts", "b.bucket_ts + b.bucket_s", dialect)
    rows = (f"SELECT b.gpu_id AS gpu_id, b.bucket_ts / {H} AS hour, b.job AS job, {cols} {frm} AND b.bucket_s > 0 "
            f"AND NOT {_UNFIT} AND (b.job <> '' OR {lab} = 0 OR {_ALONE.format(src=src)})")
    sums = ", ".join(f"{sql} AS {k}" for k, sql in SUMS.items())
    return f"SELECT j.gpu_id, j.hour, j.job, {sums} FROM ({rows}) j GROUP BY j.gpu_id, j.hour, j.job"


def set_hash(th: Thresholds) -> str:
    """The threshold set's key: a hash of the verdict SQL itself (thresholds and rules: a change of either is
    a new set)."""
    return hashlib.sha256(hour_rows("sqlite", th, "FROM gpu_buckets b WHERE 1 = 1").encode()).hexdigest()[:16]


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
                          f"b.bucket_ts / {H} FROM _jb b WHERE {_UNFIT})"))
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
    conn.execute(text("DELETE FROM judged_hours WHERE ths = :ths AND hour >= :lo AND hour < :hi"), rng)
    within = f"b.bucket_ts >= :lo * {H} AND b.bucket_ts < :hi * {H}"
    # CROSS JOIN: telemetry_gpus the outer loop, each GPU's buckets one index range (SQLite)
    conn.execute(text(_insert(conn.dialect.name, th, "FROM telemetry_gpus tg CROSS JOIN gpu_buckets b WHERE "
                              f"b.gpu_id = tg.id AND {within}", "gpu_buckets")), rng)
    conn.execute(text(f"DELETE FROM judged_dirty WHERE {_MINE}"))
    conn.execute(text("INSERT INTO judged_dirty (gpu_id, hour, mark, unfit) SELECT DISTINCT b.gpu_id, "
                      f"b.bucket_ts / {H}, 0, 1 FROM gpu_buckets b WHERE {within} AND {_UNFIT} "
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


def usable(conn: Connection, th: Thresholds, since: int) -> str | None:
    """The set hash of ``th`` when ``judged_hours`` holds it for every hour from ``since``'s on, else None."""
    ths = set_hash(th)
    frm = conn.execute(text("SELECT from_hour FROM judged_sets WHERE ths = :ths"), {"ths": ths}).scalar()
    return ths if frm is not None and int(frm) <= int(since) // H else None


_TAIL = " AND b.bucket_ts + b.bucket_s > {a}.a_s AND b.bucket_s > 0"
_WHOLE = ("h.ths = :ths AND h.gpu_id = {a}.gpu_id AND h.hour >= g.h0 AND h.hour < g.h1 AND (h.job = '' OR "
          "({a}.lab = 1 AND h.job = {a}.jkey))")


def _edges(dialect: str, a: str) -> tuple[str, str]:
    """The buckets of judging target ``a`` outside its whole hours [g.h0, g.h1) as two bucket conditions (two
    index ranges: one range with an OR between them is read whole); with h0 = h1 they hold every bucket."""
    _g, le = greatest_least(dialect)
    return (f"b.bucket_ts >= {a}.a_s - {LOOKBACK} AND b.bucket_ts < {le}({a}.a_e, g.h0 * {H})",
            f"b.bucket_ts >= g.h1 * {H} AND b.bucket_ts < {a}.a_e")


def _merged(k: str, a: str) -> str:
    """Sums of ``a`` over rows, as they add up (peak frame buffer: the maximum)."""
    return f"{'MAX' if k in MAXED else 'SUM'}({a}.{k})"


def sums_sql(dialect: str, th: Thresholds, src: str, key: str, skip: str = "", *, hourly: bool = False,
             keys: tuple[str, ...] = KEYS) -> str:
    """The judging: per row of ``src`` (a table of judging targets: ``key``, gpu_id, a_s, a_e, jkey, lab),
    planned by :func:`plan` into ``_agg``, its ``id`` and the sums ``keys`` (:data:`auditor.audit.judge.SUMS`)
    of the buckets of its GPU that overlap [a_s, a_e): its whole hours [h0, h1) read from judged_hours, every
    other bucket judged by :func:`auditor.audit.judge.judged_rows`. ``hourly``: per target and clock hour (the
    buckets' start hour) instead, with a column ``hour``. ``skip``: the infrastructure condition
    (:func:`auditor.audit.infra.skip`; a target on a GPU with infrastructure intervals has no whole hours).
    Absent sums are NULL; a target without a judged row has no row (hourly) or NULL sums."""
    sums = ", ".join(f"{SUMS[k]} AS {k}" for k in keys)
    agg = ", ".join(f"{_merged(k, 'h')} AS {k}" for k in keys)
    if dialect == "postgresql":  # per target: LATERAL index range scans of its edges and of its hours
        tk = [("t.a_s", "a_s"), ("t.a_e", "a_e")]
        parts = [judged_rows(dialect, th, tk, f"FROM gpu_buckets b WHERE b.gpu_id = t.gpu_id AND {rng}"
                             + _TAIL.format(a="t") + infra.clip(skip, dialect, "t"), "t.jkey", lab="t.lab",
                             correlated=True) for rng in _edges(dialect, "t")]
        edges = f"({parts[0]} UNION ALL {parts[1]}) j"
        whole = f"FROM judged_hours h WHERE {_WHOLE.format(a='t')}"
        frm = f"FROM {src} t JOIN _agg g ON g.id = t.{key} "
        if hourly:
            return (f"SELECT t.{key} AS id, x.* {frm}CROSS JOIN LATERAL (SELECT j.bucket_ts / {H} AS hour, {sums} "
                    f"FROM {edges} GROUP BY j.bucket_ts / {H} UNION ALL SELECT h.hour, {agg} {whole} "
                    "GROUP BY h.hour) x")
        big, _le = greatest_least(dialect)
        both = ", ".join(f"{big}(e.{k}, hh.{k}) AS {k}" if k in MAXED else
                         f"COALESCE(e.{k}, 0) + COALESCE(hh.{k}, 0) AS {k}" for k in keys)
        return (f"SELECT t.{key} AS id, {both} {frm}CROSS JOIN LATERAL (SELECT {sums} FROM {edges}) e "
                f"CROSS JOIN LATERAL (SELECT {agg} {whole}) hh")
    # SQLite: CROSS JOIN keeps _agg the outer loop; the buckets and hours are read through their keys
    tk = [(f"t.{key}", "tid"), ("t.a_s", "a_s"), ("t.a_e", "a_e")]
    frm = f"FROM _agg g CROSS JOIN {src} t CROSS JOIN {{}} WHERE t.{key} = g.id AND "
    parts = [judged_rows(dialect, th, tk, frm.format("gpu_buckets b") + f"b.gpu_id = t.gpu_id AND {rng}"
                         + _TAIL.format(a="t") + infra.clip(skip, dialect, "t"), "t.jkey", lab="t.lab")
             for rng in _edges(dialect, "t")]
    hour = f"j.bucket_ts / {H}"
    edges = (f"SELECT j.tid AS id, {hour + ' AS hour, ' if hourly else ''}{sums} "
             f"FROM ({parts[0]} UNION ALL {parts[1]}) j GROUP BY j.tid{', ' + hour if hourly else ''}")
    hours = (f"SELECT t.{key} AS id, {'h.hour AS hour, ' if hourly else ''}{agg} "
             f"{frm.format('judged_hours h')}{_WHOLE.format(a='t')} GROUP BY t.{key}{', h.hour' if hourly else ''}")
    if hourly:  # an hour is either whole or an edge hour, never both
        return f"{edges} UNION ALL {hours}"
    per = ", ".join(f"{_merged(k, 'p')} AS {k}" for k in keys)
    return f"SELECT p.id AS id, {per} FROM ({edges} UNION ALL {hours}) p GROUP BY p.id"


def plan(conn: Connection, src: str, key: str, skip: str, ths: str | None) -> int:
    """``_agg`` (id, h0, h1): for every target of ``src`` (``key``, gpu_id, a_s, a_e) the whole clock hours
    [h0, h1) that :func:`sums_sql` reads from judged_hours (set ``ths``; None: no set is usable): at least one
    whole hour inside [a_s, a_e), on a GPU without infrastructure intervals in the audit (``skip``) and
    without a marked hour among them; every other target gets h0 = h1 = its last hour (every bucket judged
    from gpu_buckets). Returns the targets with whole hours."""
    conn.execute(text("DROP TABLE IF EXISTS _agg"))
    conn.execute(text("CREATE TEMPORARY TABLE _agg (id INTEGER PRIMARY KEY, h0 INTEGER, h1 INTEGER)"))
    clean = " AND NOT EXISTS (SELECT 1 FROM _infra i WHERE i.gpu_id = t.gpu_id)" if skip else ""
    h0, h1 = f"(t.a_s + {H - 1}) / {H}", f"t.a_e / {H}"
    whole = "0 = 1" if ths is None else (
        f"t.gpu_id IS NOT NULL AND t.a_s >= 0 AND {h1} > {h0}{clean} AND NOT EXISTS (SELECT 1 FROM judged_dirty d "
        f"WHERE d.gpu_id = t.gpu_id AND d.hour >= {h0} AND d.hour < {h1})")
    conn.execute(text(f"INSERT INTO _agg SELECT t.{key}, CASE WHEN {whole} THEN {h0} ELSE {h1} END, {h1} FROM {src} t"))
    n = conn.execute(text("SELECT COUNT(*) FROM _agg WHERE h1 > h0")).scalar() or 0
    if conn.dialect.name == "postgresql":
        conn.execute(text("ANALYZE _agg"))
    return int(n)
