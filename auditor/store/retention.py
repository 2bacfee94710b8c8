"""Retention (``gpu-audit db prune``): keep fine buckets for N weeks, hourly roll-ups after; drop old runs.

Telemetry older than the cutoff (now - ``keep_weeks``, floored to the hour) is rolled up into hourly
buckets (``bucket_s`` = 3600), one per GPU, hour and job (per-job sub-rows stay apart): samples and observed
seconds summed (observed seconds at most 3600: an hour with 5 minutes of samples stays 5 minutes observed),
the span the hull of the spans of the rows with observed seconds (a row without them covers nothing),
every metric the observed-seconds-weighted mean of the buckets that had it, ``fb_used_mib`` the maximum,
labels the greatest value seen. Pruning twice changes nothing. The store
records how far it is rolled up (``store_meta.rolled_up_before``); a fine bucket ingested later for an hour
that already has an hourly row is DROPPED at ingest (logged with a count): the hourly row holds that hour,
and folding a re-collected copy in would count it twice. Work goes a day at a time, one transaction per
day, so memory and locks stay bounded.

PostgreSQL (weekly partitions): a week wholly before the cutoff is rolled up by exchanging its partition
for a rolled-up copy, the old partition dropped (:mod:`auditor.store.retention_pg`); the days of a partial
week go row-wise as above.

Node buckets (host telemetry) older than the cutoff are rolled up to hourly rows the same way
(:func:`auditor.store.node.roll_up`), so GPU and node rows of one hour stay side by side.
Inference buckets (``inference_buckets``, vLLM/TGI/SGLang/Triton per pod) older than the same cutoff are rolled
up to one row per cluster, engine, pod and hour (:func:`roll_inference`): tokens summed, the means weighted by
bucket seconds, ``observed_s`` the seconds of the buckets, ``span_start``/``span_end`` the first bucket's
start and the last one's end (the audit shares a rolled-up row among the allocations of its pod key by the
time each overlaps that span: auditor/audit/inference.py). A bucket ingested later for a rolled-up hour is
dropped at ingest (auditor/store/inference.py).

Audit runs older than ``keep_runs_days`` are deleted with their usage and findings; the newest official
(non what-if) run is always kept so reports and chargeback keep a base.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, text

from auditor.records import LABEL_FIELDS, METRIC_FIELDS
from auditor.store import judged, meta, node
from auditor.store.engine import Store
from auditor.store.ingest import EXACT_FIELDS

HOUR = 3600
DAY = 86400
WEEK = 7 * DAY
_MEANS = [m for m in (*METRIC_FIELDS, *EXACT_FIELDS) if m != "fb_used_mib"]

_W = "b.observed_s"
ROLLUP = ("INSERT INTO _rollup SELECT b.gpu_id, (b.bucket_ts / 3600) * 3600, b.job, SUM(b.samples), "
          "{least}(3600, SUM(b.observed_s)), "
          "MIN(CASE WHEN b.observed_s > 0 THEN COALESCE(b.span_start, b.bucket_ts) END), "
          "MAX(CASE WHEN b.observed_s > 0 THEN COALESCE(b.span_end, b.bucket_ts + b.bucket_s) END), "
          + ", ".join(f"SUM(CASE WHEN b.{m} IS NOT NULL THEN {_W} * b.{m} END) / NULLIF(SUM(CASE WHEN b.{m} IS NOT "
                      f"NULL THEN {_W} END), 0)" for m in _MEANS)
          + ", MAX(b.fb_used_mib), " + ", ".join(f"MAX(b.{label})" for label in LABEL_FIELDS)
          + " FROM telemetry_gpus tg JOIN gpu_buckets b ON b.gpu_id = tg.id"
            " AND b.bucket_ts >= :lo AND b.bucket_ts < :hi"
            " GROUP BY b.gpu_id, (b.bucket_ts / 3600) * 3600, b.job HAVING MIN(b.bucket_s) < 3600")
ROLLUP_DDL = ("CREATE TEMPORARY TABLE _rollup (gpu_id INTEGER NOT NULL, bucket_ts INTEGER NOT NULL, "
              "job VARCHAR(512) NOT NULL, samples INTEGER NOT NULL, observed_s FLOAT NOT NULL, span_start INTEGER, "
              "span_end INTEGER, " + ", ".join(f"{m} FLOAT" for m in _MEANS) + ", fb_used_mib FLOAT, "
              + ", ".join(f"{label} VARCHAR(255)" for label in LABEL_FIELDS)
              + ", PRIMARY KEY (gpu_id, bucket_ts, job))")
DELETE_ROLLED = ("DELETE FROM gpu_buckets WHERE gpu_id IN (SELECT DISTINCT gpu_id FROM _rollup) "
                 "AND bucket_ts >= :lo AND bucket_ts < :hi AND EXISTS (SELECT 1 FROM _rollup r "
                 "WHERE r.gpu_id = gpu_buckets.gpu_id AND r.bucket_ts = (gpu_buckets.bucket_ts / 3600) * 3600)")
_COLS = ["gpu_id", "bucket_ts", "job", "samples", "observed_s", "span_start", "span_end", *_MEANS, "fb_used_mib",
         *LABEL_FIELDS]
INSERT_ROLLED = (f"INSERT INTO gpu_buckets (bucket_s, {', '.join(_COLS)}) "
                 f"SELECT 3600, {', '.join(_COLS)} FROM _rollup")


#: inference buckets as collected (no span) older than the day's end, per cluster, engine, pod and hour
_INF_KEY = "ib.cluster, ib.engine, ib.job, (ib.start_ts / 3600) * 3600"
_INF_MEAN = "SUM(CASE WHEN ib.{f} IS NOT NULL THEN ib.{f} * ib.seconds END) / " \
            "NULLIF(SUM(CASE WHEN ib.{f} IS NOT NULL THEN ib.seconds END), 0)"
_INF_COLS = ("cluster, engine, job, start_ts, seconds, observed_s, span_start, span_end, instance, model, "
             "generated_tokens, running_mean, waiting_mean, batch_mean, cache_queries, cache_hits, cache_hit_rate")
INF_ROLLUP_DDL = ("CREATE TEMPORARY TABLE _inf_rollup (cluster VARCHAR(128) NOT NULL, engine VARCHAR(16) NOT NULL, "
                  "job VARCHAR(255) NOT NULL, start_ts INTEGER NOT NULL, seconds INTEGER NOT NULL, observed_s FLOAT, "
                  "span_start INTEGER, span_end INTEGER, instance TEXT NOT NULL, model TEXT NOT NULL, "
                  "generated_tokens FLOAT, running_mean FLOAT, waiting_mean FLOAT, batch_mean FLOAT, "
                  "cache_queries FLOAT, cache_hits FLOAT, cache_hit_rate FLOAT)")
ROLL_INFERENCE = (f"INSERT INTO _inf_rollup ({_INF_COLS}) "
                  f"SELECT {_INF_KEY}, 3600, SUM(ib.seconds), MIN(ib.start_ts), MAX(ib.start_ts + ib.seconds), "
                  "MAX(ib.instance), MAX(ib.model), SUM(ib.generated_tokens), "
                  + ", ".join(_INF_MEAN.format(f=f) for f in ("running_mean", "waiting_mean", "batch_mean"))
                  + ", SUM(ib.cache_queries), SUM(ib.cache_hits), " + _INF_MEAN.format(f="cache_hit_rate")
                  + " FROM inference_buckets ib WHERE ib.cluster = :cluster AND ib.span_start IS NULL "
                    "AND ib.seconds < 3600 AND ib.start_ts >= :lo AND ib.start_ts < :hi "
                    "AND NOT EXISTS (SELECT 1 FROM inference_buckets r "
                    "WHERE r.cluster = ib.cluster AND r.engine = ib.engine AND r.job = ib.job "
                    "AND r.start_ts = (ib.start_ts / 3600) * 3600 AND r.span_start IS NOT NULL) "
                  f"GROUP BY {_INF_KEY}")
_INF_FINE = ("FROM inference_buckets WHERE span_start IS NULL AND seconds < 3600 AND start_ts >= :lo "
             "AND start_ts < :hi")
#: one cluster's: (cluster, start_ts) leads an index, so a day is read, not the table
_INF_FINE_OF = _INF_FINE.replace("WHERE ", "WHERE cluster = :cluster AND ", 1)


@dataclass
class PruneResult:
    cutoff_ts: int
    fine_rows_rolled: int = 0
    hourly_rows_written: int = 0
    node_rows_rolled: int = 0  # host telemetry (node_buckets), rolled up on the same cutoff
    runs_deleted: int = 0
    inference_rows_rolled: int = 0
    inference_hourly_rows_written: int = 0
    dry_run: bool = False

    def as_dict(self) -> dict[str, Any]:
        return dict(vars(self))


def _oldest_fine(conn: Connection, cutoff: int) -> int | None:
    return conn.execute(text("SELECT MIN(bucket_ts) FROM gpu_buckets WHERE bucket_s < 3600 AND bucket_ts < :c"),
                        {"c": cutoff}).scalar()


def _old_runs(conn: Connection, before: int) -> list[int]:
    keep = conn.execute(text("SELECT MAX(id) FROM audit_runs WHERE status = 'ok' AND what_if = :f"),
                        {"f": False}).scalar()
    return [r[0] for r in conn.execute(text("SELECT id FROM audit_runs WHERE started_ts < :b ORDER BY id"),
                                       {"b": before}) if r[0] != keep]


def prune(store: Store, *, now: int, keep_weeks: float = 8, keep_runs_days: float = 42,
          dry_run: bool = False) -> PruneResult:
    """Roll fine buckets older than ``keep_weeks`` up to hourly ones; delete runs older than
    ``keep_runs_days``. ``dry_run`` only counts."""
    cutoff = int(now - keep_weeks * WEEK) // HOUR * HOUR
    res = PruneResult(cutoff_ts=cutoff, dry_run=dry_run)
    with store.engine.connect() as conn:
        runs = _old_runs(conn, int(now - keep_runs_days * DAY))
        inf_oldest = conn.execute(text("SELECT MIN(start_ts) " + _INF_FINE), {"lo": 0, "hi": cutoff}).scalar()
        if dry_run:
            res.inference_rows_rolled = int(conn.execute(text("SELECT COUNT(*) " + _INF_FINE),
                                                         {"lo": 0, "hi": cutoff}).scalar() or 0)
            res.node_rows_rolled = node.count_fine(conn, cutoff)
    if dry_run:
        res.runs_deleted = len(runs)
        with store.engine.connect() as conn:
            res.fine_rows_rolled = int(conn.execute(text(
                "SELECT COUNT(*) FROM gpu_buckets WHERE bucket_s < 3600 AND bucket_ts < :c"), {"c": cutoff}).scalar()
                or 0)
        return res
    _roll_nodes(store, cutoff, res)
    _roll_up(store, cutoff, res)
    if inf_oldest is not None:
        lo = int(inf_oldest) // DAY * DAY
        while lo < cutoff:
            hi = min(lo + DAY, cutoff)
            with store.begin() as conn:
                rolled, written = roll_inference(conn, lo, hi)
            res.inference_rows_rolled += rolled
            res.inference_hourly_rows_written += written
            lo = hi
    for i in range(0, len(runs), 500):
        chunk = runs[i:i + 500]
        with store.begin() as conn:
            marks = ", ".join(str(int(r)) for r in chunk)
            for table in ("findings", "usage_gpu", "usage_allocation"):
                conn.execute(text(f"DELETE FROM {table} WHERE run_id IN ({marks})"))
            conn.execute(text(f"DELETE FROM audit_runs WHERE id IN ({marks})"))
        res.runs_deleted += len(chunk)
    return res


def _roll_up(store: Store, cutoff: int, res: PruneResult) -> PruneResult:
    """The GPU buckets older than ``cutoff`` rolled up to hourly ones."""
    with store.engine.connect() as conn:
        oldest = _oldest_fine(conn, cutoff)
    if oldest is not None:
        oldest = _roll_weeks(store, cutoff, res)
    if oldest is not None:
        lo = oldest // DAY * DAY
        while lo < cutoff:
            hi = min(lo + DAY, cutoff)
            with store.begin() as conn:
                rolled, written = _roll(conn, lo, hi)
                judged.mark_range(conn, lo, hi)  # the judged aggregate re-judges the rolled-up hours
                before = meta.rolled_up_before(conn)
                if before is None or hi > before:
                    meta.put(conn, "rolled_up_before", str(hi))
            res.fine_rows_rolled += rolled
            res.hourly_rows_written += written
            lo = hi
    return res


def _roll_nodes(store: Store, cutoff: int, res: PruneResult) -> None:
    """Node buckets before the cutoff to hourly rows, a day per transaction (:func:`auditor.store.node.roll_up`),
    so the waiting rule finds a node's hour beside its GPUs' rolled-up hours."""
    with store.engine.connect() as conn:
        oldest = node.oldest_fine(conn, cutoff)
    if oldest is None:
        return
    lo = oldest // DAY * DAY
    while lo < cutoff:
        hi = min(lo + DAY, cutoff)
        with store.begin() as conn:
            res.node_rows_rolled += node.roll_up(conn, lo, hi)[0]
        lo = hi


def _roll_weeks(store: Store, cutoff: int, res: PruneResult) -> int | None:
    """PostgreSQL: whole weeks before the cutoff by exchanging their partitions (one transaction each,
    :mod:`auditor.store.retention_pg`); returns the oldest fine row left for the row-wise days."""
    from auditor.store import partitions, retention_pg

    with store.engine.connect() as conn:
        if not partitions.partitioned(conn):
            return _oldest_fine(conn, cutoff)
        weeks = retention_pg.whole_weeks(conn, cutoff)
    for lo, rel in weeks:
        with store.begin() as conn:
            rolled, written = retention_pg.roll_week(conn, lo, rel, ROLLUP_DDL, ROLLUP, _COLS)
            judged.mark_range(conn, lo, lo + WEEK)
            before = meta.rolled_up_before(conn)
            if before is None or lo + WEEK > before:
                meta.put(conn, "rolled_up_before", str(lo + WEEK))
        res.fine_rows_rolled += rolled
        res.hourly_rows_written += written
    with store.engine.connect() as conn:
        return _oldest_fine(conn, cutoff)


def _roll(conn: Connection, lo: int, hi: int) -> tuple[int, int]:
    """One day: aggregate, replace the fine (and any earlier hourly) rows by the hourly ones."""
    conn.execute(text("DROP TABLE IF EXISTS _rollup"))
    conn.execute(text(ROLLUP_DDL))
    p = {"lo": lo, "hi": hi}
    conn.execute(text(ROLLUP.format(least="LEAST" if conn.dialect.name == "postgresql" else "min")), p)
    fine = conn.execute(text(
        "SELECT COUNT(*) FROM gpu_buckets WHERE gpu_id IN (SELECT DISTINCT gpu_id FROM _rollup) "
        "AND bucket_ts >= :lo AND bucket_ts < :hi AND bucket_s < 3600"), p).scalar() or 0
    conn.execute(text(DELETE_ROLLED), p)
    written = conn.execute(text(INSERT_ROLLED)).rowcount or 0
    conn.execute(text("DROP TABLE _rollup"))
    return int(fine), int(written)


def roll_inference(conn: Connection, lo: int, hi: int) -> tuple[int, int]:
    """The inference buckets as collected that start in [lo, hi) (``hi`` on an hour) become one row per
    cluster, engine, pod and hour; a bucket of an hour that already has a rolled-up row is deleted, the
    hourly row holds it. (buckets removed, hourly rows written)."""
    fine = written = 0
    clusters = [r[0] for r in conn.execute(text("SELECT name FROM clusters ORDER BY name"))]
    for cluster in clusters:  # every ingest names its clusters in `clusters`
        p = {"lo": lo, "hi": hi, "cluster": cluster}
        n = int(conn.execute(text("SELECT COUNT(*) " + _INF_FINE_OF), p).scalar() or 0)
        if not n:
            continue
        conn.execute(text("DROP TABLE IF EXISTS _inf_rollup"))
        conn.execute(text(INF_ROLLUP_DDL))
        conn.execute(text(ROLL_INFERENCE), p)
        # the buckets rolled up, and any of an hour rolled up before (its hourly row holds it); then their hours
        conn.execute(text("DELETE " + _INF_FINE_OF), p)
        written += conn.execute(text(f"INSERT INTO inference_buckets ({_INF_COLS}) SELECT {_INF_COLS} "
                                     "FROM _inf_rollup")).rowcount or 0
        conn.execute(text("DROP TABLE _inf_rollup"))
        fine += n
    return fine, int(written)
