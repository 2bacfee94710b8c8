"""The audit: attribute reserved GPU-intervals to telemetry and judge every bucket, in set-based SQL.

Flow: allocations overlapping the window -> ``_attr`` (one row per allocated GPU: which telemetry GPU it
is, by scheduler index, whole node, or telemetry labels; else unattributed) -> one grouped join with
``gpu_buckets`` that takes each bucket's applicable rows, its observed seconds and its verdict
(:mod:`auditor.audit.judge`, :mod:`auditor.audit.verdict`) and sums seconds per allocated GPU into ``usage_gpu`` -> per
allocation totals and money into ``usage_allocation`` -> findings (:mod:`auditor.audit.findings`). Unknown is never
idle: reserved time without samples, or on a GPU no telemetry can be tied to, counts as unknown; observed
time without profiling fields is judged by GPU-Util (idle-by-util or busy-unverified), never unknown.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from operator import itemgetter
from typing import Any

from sqlalchemy import Connection, insert, select, text, update

from auditor.audit import infra, parallel, timing
from auditor.audit.judge import SUMS, usage_columns
from auditor.audit.money import COST_KEYS, Pricing, costs
from auditor.audit.usage import attribute_and_judge, judge_connections, judge_share, refresh_aggregate, setup_pg
from auditor.config import Config, Thresholds
from auditor.store import cascade, schema
from auditor.store.engine import Store
from auditor.store.ingest_pg import copy_tuples
from auditor.store.sqlfuncs import sql_names
from auditor.timeutil import to_epoch, utcnow

log = logging.getLogger("gpu_audit.audit")


def _fn(conn: Connection) -> dict[str, str]:
    return sql_names(conn.dialect.name)


SUM_COLS = [c for c in schema.usage_allocation.c.keys() if c.endswith("_s")]
#: usage columns an audit's per-allocation row does not carry: effective_s is the SM sum by definition (one
#: expression writes both, checked below), so the row keeps sm_s alone and usage_allocation.effective_s is
#: written from it; max_gpu_mirage_s comes back as its MAX
_NOT_SUMMED = ("max_gpu_mirage_s", "effective_s")
_SAME = usage_columns({k: k for k in SUMS}, "share", "reserved")
assert _SAME["effective_s"] == _SAME["sm_s"], "effective_s is no longer the SM sum: per_allocation_rows needs it"

PER_ALLOCATION = ("SELECT g.*, a.cluster, a.source, a.external_id, a.name, a.user_name, a.account, {team_label}, "
                  "a.gpu_count, a.start_ts, a.end_ts FROM (SELECT u.allocation_id, COUNT(*) AS gpus, "
                  "MAX(u.peak_fb_mib) AS peak_fb_mib, MAX(u.idle_peak_fb_mib) AS idle_peak_fb_mib, "
                  "MAX(u.max_gpu_mirage_s) AS max_gpu_mirage_s_max, "
                  + ", ".join(f"SUM(u.{c}) AS {c}" for c in SUM_COLS if c not in _NOT_SUMMED)
                  + ", MIN(ag.model) AS gpu_model, MIN(ag.mig_profile) AS mig_profile "
                  "FROM usage_gpu u JOIN allocated_gpus ag ON ag.id = u.allocated_gpu_id "
                  "WHERE u.run_id = :run_id GROUP BY u.allocation_id) g "
                  "JOIN allocations a ON a.id = g.allocation_id ORDER BY g.allocation_id")


#: the numbers of a per-allocation row that must be finite (max_gpu_mirage_s comes back as its MAX)
NUMBER_KEYS = [*(c for c in SUM_COLS if c not in _NOT_SUMMED), "max_gpu_mirage_s_max", "gpu_count"]

_TEXT = ("cluster", "source", "account", "user_name", "gpu_model", "mig_profile")
#: the select items of the team label (team_label_sql): read while the row is built, never kept in it
_LABEL = ("label_team", "labels")


def team_label_sql(dialect: str, team_label: str) -> tuple[str, dict[str, str]]:
    """The select item of the team label's value (``label_team``, which :func:`per_allocation_rows` hands
    to :meth:`Pricing.team_for`) and its parameter: read by the server, so the audit does not parse every
    allocation's labels as JSON (1.2 s of the 4,096-GPU week) nor keep them in memory. A label name no JSON
    path can quote falls back to the whole ``labels``."""
    if dialect == "postgresql":  # NULL where labels is not an object or lacks the key
        return "a.labels ->> :team_label AS label_team", {"team_label": team_label}
    if dialect == "sqlite" and '"' not in team_label and "\\" not in team_label:
        return ("CASE WHEN json_valid(a.labels) AND json_type(a.labels) = 'object' THEN "
                "json_extract(a.labels, :team_path) END AS label_team"), {"team_path": f'$."{team_label}"'}
    return "a.labels", {}


def per_allocation_rows(conn: Connection, run_id: int, pricing: Pricing) -> list[dict[str, Any]]:
    """The per-allocation totals as dicts (the audit's one per-allocation structure, ~260 k at 16,384
    GPUs), each with its ``team`` (:meth:`Pricing.team_for`): streamed from the server in batches (the whole
    result is never buffered as well), with the repeated texts interned and every zero sum one shared float.
    A row holds at most 42 keys with its price (:meth:`Pricing.price_rows`): CPython keeps such a dict in
    64 slots (832 bytes) and one of 43-85 keys in 128 (1,584 bytes), 185 MiB more at 16,384 GPUs; so the
    team label is read here and dropped, effective seconds are ``sm_s`` and the costs are computed where
    they are written (:func:`costs`)."""
    from sys import intern

    zero = 0.0
    out = []
    label, lp = team_label_sql(conn.dialect.name, pricing.team_label)
    sql = text(PER_ALLOCATION.format(team_label=label)).execution_options(stream_results=True, yield_per=5000)
    res = conn.execute(sql, {"run_id": run_id, **lp})
    names = tuple(res.keys())
    li = next(i for i, k in enumerate(names) if k in _LABEL)
    parse = names[li] == "labels"  # the whole labels (a label name no JSON path can quote)
    keys = (*names[:li], *names[li + 1:], "team")
    texts = [i for i, k in enumerate(keys) if k in _TEXT]
    src, acct, user = (keys.index(k) for k in ("source", "account", "user_name"))
    for row in res:  # plain rows, not mappings: 3.5 -> 2.8 s for 64,507 allocations on PostgreSQL
        vals = [zero if v.__class__ is float and v == 0.0 else v for v in row]
        value = vals.pop(li)
        for i in texts:
            if vals[i].__class__ is str:
                vals[i] = intern(vals[i])
        team = pricing.team_for(pricing.label_value(value) if parse else value, vals[src], vals[acct], vals[user])
        vals.append(intern(team))
        out.append(dict(zip(keys, vals, strict=True)))
    return out


@dataclass
class AuditResult:
    run_id: int
    since: datetime
    until: datetime
    summary: dict[str, Any] = field(default_factory=dict)
    #: wall-clock seconds per audit step (:mod:`auditor.audit.timing`); with several judging connections a
    #: step they share holds the slowest connection's seconds (the critical path)
    steps: dict[str, float] = field(default_factory=dict)
    #: connections that attributed and judged at once (``store.judge_connections``; 1 on SQLite)
    judge_connections: int = 1


def _params(since: int, until: int, horizon: int) -> dict[str, Any]:
    return {"since": since, "until": until, "horizon": horizon}


def run_audit(store: Store, cfg: Config, since: datetime, until: datetime, *,
              thresholds: Thresholds | None = None, clusters: list[str] | None = None,
              what_if: bool = False, purpose: str | None = None) -> AuditResult:
    """Judge [since, until) and store usage and findings under a new audit run. ``purpose`` (e.g.
    ``"chargeback"``) goes into the run's summary: the web UI shows the newest weekly audit, not a run made
    for another purpose (:func:`auditor.web.data.pick_run`)."""
    from auditor.audit.findings import find_all

    th = thresholds or cfg.thresholds
    s, u = to_epoch(since), to_epoch(until)
    assert s is not None and u is not None
    if u <= s:
        from auditor.errors import GpuAuditError

        raise GpuAuditError(f"empty audit window: until {until.isoformat()} is not after since")
    now = int(utcnow().timestamp())
    horizon = min(u, now)
    params = _params(s, u, horizon)
    cluster_filter = ""
    if clusters:
        cluster_filter = " AND a.cluster IN (" + ", ".join(f":c{i}" for i in range(len(clusters))) + ")"
        params.update({f"c{i}": c for i, c in enumerate(clusters)})
    params["_cf"] = cluster_filter
    pricing = Pricing(cfg)
    steps = timing.start()
    with store.begin() as conn:
        abandoned(conn, now)
        deleted = cascade.deletions(conn)  # before anything is judged (cascade.sweep_run)
        run_id = conn.execute(insert(schema.audit_runs).values(
            started_ts=now, since_ts=s, until_ts=u, status="running", what_if=what_if,
            thresholds=th.model_dump())).inserted_primary_key[0]
    try:
        if not what_if:  # the judged aggregate of this run's thresholds, up to date (what-ifs read it only as is)
            with steps.step("judged aggregate upkeep"):
                refresh_aggregate(store, th, s)
        with store.begin() as conn:
            setup_pg(conn)
            conn.info.pop(parallel.KEY, None)
            fn = {**_fn(conn), "cluster_filter": cluster_filter}
            p = {k: v for k, v in params.items() if not k.startswith("_")}
            n = judge_connections(cfg, conn)
            if n > 1:
                # PostgreSQL runs one query on one core: n connections attribute and judge a share of the
                # allocations each at the same time and commit their usage rows (a failed audit deletes them),
                # so helper connections can read the run's usage later (:mod:`auditor.audit.parallel`)
                with steps.step(f"attribute and judge: wall ({n} connections)"), ThreadPoolExecutor(n) as pool:
                    shares = [f.result() for f in [pool.submit(judge_share, store, cfg, th, fn, p, run_id, s,
                                                               horizon, k, n) for k in range(n)]]
                for name in shares[0]:  # the slowest share's time per step: the critical path
                    steps.seconds[name] = max(x.get(name, 0.0) for x in shares)
                infra.prepare(conn, th, s, horizon, allocated=False)  # _infra, for the finding rules
                conn.info[parallel.KEY] = n
            else:
                attribute_and_judge(conn, th, fn, p, run_id, s, horizon, 0, 1, steps)
            with steps.step("judge buckets"):
                # fresh statistics, so the findings' per-allocation lookups use (run_id, allocation_id) and do
                # not scan the whole run once per chunk of allocations; with helper connections committed
                # (ANALYZE in this transaction would be seen by this connection only, and the helpers'
                # sparkline plans read the whole run per block: 10+ minutes at 16,384 GPUs)
                if n > 1:
                    with store.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as c:
                        c.execute(text("ANALYZE usage_gpu"))
                else:
                    conn.execute(text("ANALYZE usage_gpu"))
            with steps.step("per-allocation totals and money"):
                per_alloc = per_allocation_rows(conn, run_id, pricing)
                per_alloc, refused = pricing.price_rows(per_alloc, NUMBER_KEYS)
                refuse(conn, run_id, refused, now)
                write_usage_allocation(conn, run_id, per_alloc)
            summary = find_all(conn, run_id, per_alloc, th, cfg, since=s, until=u, horizon=horizon,
                               clusters=clusters)
            with steps.step("rows of GPUs deleted meanwhile"):
                swept = cascade.sweep_run(conn, run_id, deleted)
            if swept:
                log.warning("audit run %d: %d row(s) dropped: their GPU or reservation was deleted by an ingest "
                            "while the audit ran", run_id, swept)
            infra.finish(conn)
            log.info("audit run %d steps: %s", run_id,
                     ", ".join(f"{k} {v:.2f} s" for k, v in steps.seconds.items()))
            if refused:
                summary["refused_allocations"] = len(refused)
            if purpose:
                summary["purpose"] = purpose
            conn.info.pop(parallel.KEY, None)  # the pooled connection's info outlives this audit
            conn.execute(update(schema.audit_runs).where(schema.audit_runs.c.id == run_id).values(
                status="ok", finished_ts=int(utcnow().timestamp()), summary=summary))
    except Exception:
        with store.begin() as conn:
            conn.info.pop(parallel.KEY, None)
            # usage rows other judging connections committed (store.judge_connections)
            conn.execute(schema.usage_gpu.delete().where(schema.usage_gpu.c.run_id == run_id))
            conn.execute(update(schema.audit_runs).where(schema.audit_runs.c.id == run_id).values(
                status="failed", finished_ts=int(utcnow().timestamp())))
        raise
    return AuditResult(run_id, since, until, summary, steps.seconds, n)


#: usage_allocation column <- per-allocation row key (run_id aside; the costs: money.costs)
_UA_KEYS = {"allocation_id": "allocation_id", "team": "team", "gpu_model": "gpu_model", "price_per_gpu_hour": "price",
            **{c: c for c in SUM_COLS if c not in _NOT_SUMMED}, "effective_s": "sm_s",
            "max_gpu_mirage_s": "max_gpu_mirage_s_max", "peak_fb_mib": "peak_fb_mib",
            "idle_peak_fb_mib": "idle_peak_fb_mib", "gpus": "gpus"}


def write_usage_allocation(conn: Connection, run_id: int, per_alloc: list[dict[str, Any]]) -> None:
    """The per-allocation totals and money of a run, 5,000 rows at a time (peak RSS at fleet scale): tuples
    taken straight from the rows, by COPY on PostgreSQL and executemany on SQLite."""
    get = itemgetter(*_UA_KEYS.values())
    cols = ["run_id", *_UA_KEYS, *COST_KEYS]
    sql = f"INSERT INTO usage_allocation ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})"
    for i in range(0, len(per_alloc), 5000):
        chunk = [(run_id, *get(r), *costs(r)) for r in per_alloc[i:i + 5000]]
        if conn.dialect.name == "postgresql":
            copy_tuples(conn, schema.usage_allocation.name, cols, chunk)
        else:  # the driver's executemany of tuples (per-allocation step 1.8-2.4 -> 1.1 s at 1,024 GPUs)
            conn.exec_driver_sql(sql, chunk)


#: A run still "running" this long after it started was abandoned (its process killed): no audit takes a day
ABANDONED_S = 86_400


def abandoned(conn: Connection, now: int) -> int:
    """Mark runs left "running" for a day as failed and delete the usage rows their judging connections had
    committed (store.judge_connections > 1: a killed audit leaves them behind; reports read only ok runs,
    so this is space, not numbers). Returns the runs swept."""
    t = schema.audit_runs
    ids = [r for (r,) in conn.execute(select(t.c.id).where(t.c.status == "running",
                                                           t.c.started_ts < now - ABANDONED_S))]
    if ids:
        conn.execute(schema.usage_gpu.delete().where(schema.usage_gpu.c.run_id.in_(ids)))
        conn.execute(update(t).where(t.c.id.in_(ids)).values(status="failed", finished_ts=now))
        log.warning("audit runs %s were left running for over a day: marked failed, their usage rows deleted",
                    ", ".join(map(str, ids)))
    return len(ids)


def refuse(conn: Connection, run_id: int, refused: list[tuple[dict[str, Any], str]], now: int) -> None:
    """Allocations whose money is not finite: kept out of this run (no usage, no findings) and listed in
    quarantined_records, so one corrupt row never fails the audit for everyone."""
    if not refused:
        return
    ids = [r["allocation_id"] for r, _ in refused]
    log.warning("audit run %d: %d allocation(s) refused (not finite), e.g. %s: %s", run_id, len(ids),
                refused[0][0].get("external_id"), refused[0][1])
    conn.execute(schema.usage_gpu.delete().where(schema.usage_gpu.c.run_id == run_id,
                                                 schema.usage_gpu.c.allocation_id.in_(ids)))
    conn.execute(insert(schema.quarantined_records), [
        {"collected_ts": now, "cluster": str(r.get("cluster") or "")[:128], "source": f"audit run {run_id}",
         "location": f"allocation {r['allocation_id']} ({r.get('external_id')})"[:255], "reason": why,
         "excerpt": None} for r, why in refused])


def latest_run(store: Store, *, what_if: bool = False) -> int | None:
    t = schema.audit_runs
    with store.engine.connect() as conn:
        return conn.execute(select(t.c.id).where(t.c.status == "ok", t.c.what_if == what_if)
                            .order_by(t.c.id.desc()).limit(1)).scalar()
