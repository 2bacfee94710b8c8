"""The judging, in one module: which telemetry rows apply to an allocated GPU, their observed seconds and
verdict (:mod:`auditor.audit.verdict` keeps the one verdict), the sums per allocated GPU, and the one
statement that writes them into ``usage_gpu`` (docs/definitions.md).

Which telemetry rows apply: a bucket of one telemetry GPU may hold several sub-rows, one per job label
(``gpu_buckets.job``). If any sub-row of the bucket carries a job, only those naming the allocation apply
(exact match on the comma-separated list, no wildcard); otherwise the unlabelled row applies. Several
applicable rows are combined first (observed seconds summed up to the bucket width, metrics weighted by
observed seconds, spans joined). Then, per (allocated GPU, bucket):

- the bucket counts when it overlaps the reserved interval by its own width (300 s fine, 3600 s rolled up);
- ``obs`` = min(reserved seconds inside the sampled span, observed seconds) for rows naming the allocation;
  for an unlabelled row only the observed seconds that must lie inside the reservation (observed seconds less
  the span's seconds outside it, at least 0): a free GPU's samples before the job or after it are no job's
  seconds (0 without observed seconds);
- ``v`` = the verdict code of :mod:`auditor.audit.verdict` (no observed seconds: unknown). Reserved time
  without ``obs`` is unknown: the audit's unknown = reserved - observed.

The statement (:func:`sums_sql`, :func:`judge_sql`) reads each allocated GPU's whole clock hours from the
judged aggregate (``judged_hours``, kept by :mod:`auditor.audit.aggregate`) where it holds them, and judges
every other bucket (the edges: partial hours) from ``gpu_buckets``; :class:`Judging` says which parts a run
reads (``whole_hours`` off: every bucket judged afresh, the reference the tests and the bench compare with).
Idle episodes, idle reservations, stragglers and the job view read the same judged rows (:func:`rows_of`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, text

from auditor.audit import infra, verdict, waiting
from auditor.config import Thresholds
from auditor.store.sqlfuncs import greatest_least


@dataclass(frozen=True)
class Judging:
    """What the judging statement of an audit run reads: ``whole_hours``, whole clock hours from the judged
    aggregate where it holds the run's thresholds (off: every bucket judged from ``gpu_buckets``, the
    reference path), and with them (``edges``) the partial hours at either end judged once and kept; the
    figures are the same either way."""

    whole_hours: bool = True
    #: an allocated GPU's partial edge hours judged once and kept (``judged_edges``, :func:`keep_edges`), read
    #: by later audits while they still apply (off: judged from ``gpu_buckets`` by every audit)
    edges: bool = True


#: the judging of every run unless a caller asks otherwise
DEFAULT = Judging()

#: Metrics the verdict and the per-GPU sums read; ``io_bps`` is PCIe + NVLink bytes/s of a row.
METRICS = ("sm_active", "dram_active", "tensor_active", "gpu_util", "gr_engine", "power_w", "fb_used_mib",
           "io_bps", "sm_exact")
_IO = ("(COALESCE(b.pcie_tx_bps, 0) + COALESCE(b.pcie_rx_bps, 0) + COALESCE(b.nvlink_tx_bps, 0)"
       " + COALESCE(b.nvlink_rx_bps, 0))")
#: 1 when a row read any PCIe or NVLink counter (a class of "where the waiting goes" needs the links measured)
_IO_MEASURED = ("CASE WHEN b.pcie_tx_bps IS NOT NULL OR b.pcie_rx_bps IS NOT NULL OR b.nvlink_tx_bps IS NOT NULL"
                " OR b.nvlink_rx_bps IS NOT NULL THEN 1 ELSE 0 END")
#: Widest bucket the store can hold (a roll-up): how far before an interval a bucket may start and reach it
LOOKBACK = 3600

#: The allocation's job key in telemetry labels: Slurm job id, else "namespace/pod"
JOB_KEY = "CASE WHEN a.source = 'slurm' THEN a.external_id ELSE a.account || '/' || a.name END"


def list_match(dialect: str, job: str, key: str) -> str:
    """The comma-joined job list ``job`` (two jobs or more) names ``key`` exactly: ``123_4`` never matches
    ``12314``, nor ``1`` the list ``11,2``."""
    pos = "strpos" if dialect == "postgresql" else "instr"
    return f"({job} LIKE '%,%' AND {pos}(',' || {job} || ',', ',' || {key} || ',') > 0)"


def job_match(dialect: str, job: str, key: str) -> str:
    """The job label ``job`` (one job, or a comma-separated list) names ``key`` exactly."""
    # equality first (the common single-job label), the list search only for comma-joined labels
    return f"({job} <> '' AND ({job} = {key} OR {list_match(dialect, job, key)}))"


def _raw(name: str) -> str:
    return _IO if name == "io_bps" else f"b.{name}"


def judged_rows(dialect: str, th: Thresholds, keys: list[tuple[str, str]], frm: str, jkey: str, *,
                lab: str = "1", correlated: bool = False) -> str:
    """Per (keys, bucket): ``bucket_ts``, ``bucket_s``, ``obs``, the metrics and the verdict ``v`` of the
    applicable rows, for buckets of ``frm`` (which binds ``b`` to gpu_buckets and must keep only buckets
    that overlap [a_s, a_e); ``keys`` name the output columns ``a_s`` and ``a_e`` among others).

    Two parts: the unlabelled row of each bucket that has no labelled sibling (``lab`` = 0 says the GPU
    never had one, skipping the check), and the rows naming the allocation (``jkey``) combined per bucket
    (rarely more than one). ``correlated``: ``keys`` come from an outer query (SQLite cannot group by
    them)."""
    ks = dict((a, e) for e, a in keys)
    a_s, a_e = ks["a_s"], ks["a_e"]
    k = ", ".join(f"{e} AS {a}" for e, a in keys)
    alone = (f" AND ({lab} = 0 OR NOT EXISTS (SELECT 1 FROM gpu_buckets s WHERE s.gpu_id = b.gpu_id"
             " AND s.bucket_ts = b.bucket_ts AND s.job <> ''))")
    plain = (f"SELECT {k}, b.bucket_ts AS bucket_ts, b.bucket_s AS bucket_s, "
             f"{_judged_cols(th, verdict.prefixed('b'), a_s, a_e, dialect, own=False)} {frm} AND b.job = ''{alone}")
    group = ", ".join(([] if correlated else [e for e, _a in keys]) + ["b.bucket_ts"])
    x = verdict.prefixed("x")
    matched = (f"SELECT {', '.join(f'x.{a} AS {a}' for _e, a in keys)}, x.bucket_ts AS bucket_ts, x.bucket_s AS "
               f"bucket_s, {_judged_cols(th, x, 'x.a_s', 'x.a_e', dialect, combined=True)} FROM (SELECT {k}, "
               f"{', '.join(_combine(dialect))} {frm} AND {lab} = 1 AND {job_match(dialect, 'b.job', jkey)} "
               f"GROUP BY {group}) x")
    return f"{plain} UNION ALL {matched}"


def _combine(dialect: str) -> list[str]:
    """Aggregates that combine the applicable rows of one bucket (definitions.md): observed seconds summed
    up to the bucket width, metrics weighted by observed seconds (one row: its own values), span hull."""
    _g, le = greatest_least(dialect)
    agg = ["b.bucket_ts AS bucket_ts", "MAX(b.bucket_s) AS bucket_s", "SUM(b.samples) AS samples",
           f"{le}(MAX(b.bucket_s), SUM(b.observed_s)) AS observed_s",
           "MIN(COALESCE(b.span_start, b.bucket_ts)) AS span_start",
           "MAX(COALESCE(b.span_end, b.bucket_ts + b.bucket_s)) AS span_end"]
    for x in METRICS:
        r = _raw(x)
        agg.append(f"CASE WHEN COUNT(*) = 1 THEN MAX({r}) ELSE SUM(b.observed_s * {r}) / NULLIF(SUM(CASE WHEN {r} "
                   f"IS NOT NULL THEN b.observed_s END), 0) END AS {x}")
    agg.append(f"MAX({_IO_MEASURED}) AS io_measured")  # the links were measured when any row read them
    return agg


_V = verdict
#: Per allocated GPU: the sums over its judged rows ``j`` (seconds not yet times share). A row without
#: samples has obs = 0, so it adds nothing to any sum; SM-verified rows are exactly those with SM activity,
#: so effective seconds (SM-verified obs x SM activity) are the SM sum (one aggregate, see usage_columns).
SUMS: dict[str, str] = {
    "idle": f"SUM(CASE WHEN j.v = {_V.IDLE} THEN j.obs END)",
    "idle_by_util": f"SUM(CASE WHEN j.v = {_V.IDLE_BY_UTIL} THEN j.obs END)",
    "mirage": f"SUM(CASE WHEN j.v = {_V.MIRAGE} THEN j.obs END)",
    "low": f"SUM(CASE WHEN j.v = {_V.LOW} THEN j.obs END)",
    "working": f"SUM(CASE WHEN j.v = {_V.WORKING} THEN j.obs END)",
    "busy_unverified": f"SUM(CASE WHEN j.v = {_V.BUSY_UNVERIFIED} THEN j.obs END)",
    "idle_by_counters": f"SUM(CASE WHEN j.v = {_V.IDLE_BY_COUNTERS} THEN j.obs END)",
    "busy_by_counters": f"SUM(CASE WHEN j.v = {_V.BUSY_BY_COUNTERS} THEN j.obs END)",
    "engine_spin": f"SUM(CASE WHEN j.v = {_V.ENGINE_SPIN} THEN j.obs END)",
    "gpu_util": "SUM(j.obs * j.gpu_util)",
    "util_observed": "SUM(CASE WHEN j.gpu_util IS NOT NULL THEN j.obs END)",
    "sm": "SUM(j.obs * j.sm_active)",
    "sm_observed": "SUM(CASE WHEN j.sm_active IS NOT NULL THEN j.obs END)",
    # of those, the seconds whose SM activity came from the cycle counters (gpu_buckets.sm_exact: 1, 0 or a share)
    "sm_exact": "SUM(j.obs * j.sm_exact)",
    "tensor": "SUM(j.obs * j.tensor_active)",
    "dram": "SUM(j.obs * j.dram_active)",
    "io_bps": "SUM(j.obs * j.io_bps)",
    "peak_fb": "MAX(CASE WHEN j.obs > 0 THEN j.fb_used_mib END)",
    "idle_fb": f"MAX(CASE WHEN j.obs > 0 AND {_V.in_codes('j.v', _V.IDLE_CODES)} THEN j.fb_used_mib END)",
    # what a mirage looked like (hung collective vs ghost vs spinning process) and energy (power telemetry)
    "mirage_util": f"SUM(CASE WHEN j.v = {_V.MIRAGE} THEN j.obs * j.gpu_util END)",
    "mirage_power": f"SUM(CASE WHEN j.v = {_V.MIRAGE} THEN j.obs * j.power_w END)",
    "mirage_power_observed": f"SUM(CASE WHEN j.v = {_V.MIRAGE} AND j.power_w IS NOT NULL THEN j.obs END)",
    "energy": "SUM(j.obs * j.power_w)",
    "power_observed": "SUM(CASE WHEN j.power_w IS NOT NULL THEN j.obs END)",
    "idle_energy": f"SUM(CASE WHEN {_V.in_codes('j.v', _V.IDLE_CODES)} THEN j.obs * j.power_w END)",
    "idle_power_observed": f"SUM(CASE WHEN {_V.in_codes('j.v', _V.IDLE_CODES)} AND j.power_w IS NOT NULL "
                           "THEN j.obs END)",
}

#: the observed seconds of the classes of "where the waiting goes" that are no verdict sum (the judged row's
#: class ``cls``: :func:`auditor.audit.waiting.class_case`), and of the rows that could lead a lockstep job
#: (``lead``: :func:`auditor.audit.waiting.busy`, the straggler rule's "busy") or wait on it (``waitable``, ``waits``)
SUMS.update({k: f"SUM(CASE WHEN j.cls = '{k}' THEN j.obs END)" for k in waiting.SUMMED})
SUMS["lead"] = "SUM(CASE WHEN j.lead = 1 THEN j.obs END)"
SUMS["waitable"] = "SUM(CASE WHEN j.waitable = 1 THEN j.obs END)"
SUMS["waits"] = "SUM(CASE WHEN j.waits = 1 THEN j.obs END)"
#: SUMS that become a usage column ``<name>_s`` as they are, times share
EXTRA = ("mirage_util", "mirage_power", "mirage_power_observed", "energy", "power_observed", "idle_energy",
         "idle_power_observed", *waiting.SUMMED, "lead", "waitable", "waits", "sm_exact")
OBSERVED = ("idle", "idle_by_util", "mirage", "low", "working", "busy_unverified", "idle_by_counters",
            "busy_by_counters", "engine_spin")
#: the verdict sums of each evidence tier (:data:`auditor.audit.verdict.TIERS`)
TIER_SUMS = {"sm_active": ("idle", "mirage", "low", "working"),
             "counters": ("idle_by_counters", "busy_by_counters", "engine_spin"),
             "gpu_util": ("idle_by_util", "busy_unverified")}


def usage_columns(get: dict[str, str], share: str, reserved: str, infra: str = "0") -> dict[str, str]:
    """usage_gpu column -> SQL, from ``get`` (SUMS name -> an SQL value that is 0 when absent) and ``infra``
    (reserved seconds inside infrastructure intervals, :mod:`auditor.audit.infra`; no bucket that touches
    one is in ``get``): unknown = reserved - observed - infra."""
    observed = "(" + " + ".join(get[k] for k in OBSERVED) + ")"
    out = {"reserved_s": f"{share} * {reserved}", "observed_s": f"{share} * {observed}",
           "infra_s": f"{share} * {infra}",
           "idle_s": f"{share} * ({get['idle']} + {get['idle_by_util']} + {get['idle_by_counters']})"}
    for k in ("idle_by_util", "mirage", "low", "working", "busy_unverified", "idle_by_counters", "busy_by_counters",
              "engine_spin"):
        out[f"{k}_s"] = f"{share} * {get[k]}"
    out["unknown_s"] = f"{share} * ({reserved} - {observed} - {infra})"
    for k in ("gpu_util", "util_observed", "sm", "sm_observed", "tensor", "dram", "io_bps"):
        out[f"{k}_s"] = f"{share} * {get[k]}"
    for k in EXTRA:
        out[f"{k}_s"] = f"{share} * {get[k]}"
    out["effective_s"] = f"{share} * {get['sm']}"
    out["max_gpu_mirage_s"] = get["mirage"]
    counters = f"({' + '.join(get[k] for k in TIER_SUMS['counters'])})"
    out["signal"] = (f"CASE WHEN {get['sm_observed']} > 0 THEN 'sm_active' WHEN {counters} > 0 THEN 'counters' "
                     f"WHEN {get['util_observed']} > 0 THEN 'gpu_util' ELSE 'none' END")
    return out


def _obs(c: verdict.Col, a_s: str, a_e: str, g: str, le: str, *, own: bool = True) -> str:
    """Observed seconds of one (combined) row inside [a_s, a_e); a row without a span inside the interval is
    simply its observed seconds. ``own``: the row's samples are the allocation's (its job label names it):
    min(reserved seconds inside its span, observed_s). Otherwise (an unlabelled row: a free GPU's samples
    before the job started or after it ended may be among them) only the observed seconds that must lie inside
    the reservation: observed_s less the span's seconds outside it, at least 0, at most the span's reserved
    seconds (issue 44: a bucket without a span, observed 150 s of 300, the job holding its last 150 s: 0 s)."""
    sp_s = f"COALESCE({c('span_start')}, {c('bucket_ts')})"
    sp_e = f"COALESCE({c('span_end')}, {c('bucket_ts')} + {c('bucket_s')})"
    inside = f"{g}(0, {le}({sp_e}, {a_e}) - {g}({sp_s}, {a_s}))"
    clip = (f"{le}({inside}, {c('observed_s')})" if own else
            f"{le}({inside}, {g}(0, {c('observed_s')} - ({sp_e} - {sp_s} - {inside})))")
    return (f"CASE WHEN NOT {c('observed_s')} > 0 THEN 0 WHEN {c('span_start')} IS NULL AND {c('span_end')} IS NULL "
            f"AND {c('bucket_ts')} >= {a_s} AND {c('bucket_ts')} + {c('bucket_s')} <= {a_e} THEN {c('observed_s')} "
            f"ELSE {clip} END")


def _judged_cols(th: Thresholds, c: verdict.Col, a_s: str, a_e: str, dialect: str = "sqlite", *,
                 combined: bool = False, own: bool = True) -> str:
    """obs, the metrics, io_measured and the verdict ``v`` of one row ``c``: a gpu_buckets row, or
    (``combined``) the applicable rows of one bucket combined by :func:`_combine`; ``own``: the row names the
    allocation (:func:`_obs`)."""
    g, le = greatest_least(dialect)
    io, measured = (c("io_bps"), c("io_measured")) if combined else (_IO, _IO_MEASURED)
    metrics = [f"{c(m)} AS {m}" for m in METRICS if m != "io_bps"] + [f"{io} AS io_bps", f"{measured} AS io_measured"]
    seen = c("observed_s")  # observed, also a row that holds only cover carried from its series' last sample
    return (f"{_obs(c, a_s, a_e, g, le, own=own)} AS obs, {', '.join(metrics)}, "
            f"{verdict.case(th, c, observed=f'{seen} > 0', working_first=True)} AS v, "
            f"{waiting.class_case(th, c, observed=f'{seen} > 0', io=io, io_measured=measured)} AS cls, "
            f"CASE WHEN {c('sm_active')} IS NOT NULL AND {waiting.busy(th, c('sm_active'), io)} THEN 1 ELSE 0 END "
            f"AS lead, CASE WHEN {waiting.waitable(th, c('sm_active'))} THEN 1 ELSE 0 END AS waitable, "
            f"CASE WHEN {waiting.waits(th, c('sm_active'), io)} THEN 1 ELSE 0 END AS waits")


def rows_of(dialect: str, th: Thresholds, src: str, alias: str, names: list[str], skip: str = "") -> str:
    """A FROM item ``j``: the judged rows of every candidate row of ``src`` (aliased ``alias``, with
    columns gpu_id, a_s, a_e, jkey, lab and ``names``, which j carries along). PostgreSQL reads each
    candidate's buckets through a LATERAL index scan (a join of a handful of candidates was planned as a
    scan of the whole bucket table); SQLite's planner walks the index by itself. ``skip``: a further
    bucket condition (:data:`auditor.audit.infra.SKIP`: buckets of infrastructure-affected time)."""
    a = alias
    cond = (f"b.gpu_id = {a}.gpu_id AND b.bucket_ts >= {a}.a_s - {LOOKBACK} AND b.bucket_ts < {a}.a_e"
            f" AND b.bucket_ts + b.bucket_s > {a}.a_s{infra.clip(skip, dialect, a)}")
    keys = [(f"{a}.{k}", k) for k in (*names, "a_s", "a_e")]
    if dialect == "postgresql":
        rows = judged_rows(dialect, th, keys, f"FROM gpu_buckets b WHERE {cond}", f"{a}.jkey", lab=f"{a}.lab",
                           correlated=True)
        return f"{src} {a} CROSS JOIN LATERAL ({rows}) j"
    rows = judged_rows(dialect, th, keys, f"FROM {src} {a} JOIN gpu_buckets b ON {cond}", f"{a}.jkey",
                       lab=f"{a}.lab")
    return f"({rows}) j"


H = 3600
KEYS = tuple(SUMS)
#: sums combined by MAX (peak frame buffer), the others by SUM
MAXED = ("peak_fb", "idle_fb")
_ALONE = ("NOT EXISTS (SELECT 1 FROM {src} s WHERE s.gpu_id = b.gpu_id AND s.bucket_ts = b.bucket_ts "
          "AND s.job <> '')")
UNFIT = f"(b.bucket_ts % {H} + b.bucket_s > {H} OR b.job LIKE '%,%')"


def hour_rows(dialect: str, th: Thresholds, frm: str, src: str = "gpu_buckets", lab: str = "1") -> str:
    """Per (GPU, hour, job key) the SUMS of the buckets of ``frm`` (binds ``b``, ends in a WHERE clause),
    each judged whole; buckets crossing their hour's end and comma-joined labels are left out (their hours
    stay marked, :func:`auditor.audit.aggregate.refresh`). ``src``: the table holding every row of those
    buckets (their siblings); ``lab`` = 0 says the GPU never had a labelled row (telemetry_gpus.has_jobs),
    skipping the sibling probe."""
    cols = _judged_cols(th, verdict.prefixed("b"), "b.bucket_ts", "b.bucket_ts + b.bucket_s", dialect)
    rows = (f"SELECT b.gpu_id AS gpu_id, b.bucket_ts / {H} AS hour, b.job AS job, {cols} {frm} AND b.bucket_s > 0 "
            f"AND NOT {UNFIT} AND (b.job <> '' OR {lab} = 0 OR {_ALONE.format(src=src)})")
    sums = ", ".join(f"{sql} AS {k}" for k, sql in SUMS.items())
    return f"SELECT j.gpu_id, j.hour, j.job, {sums} FROM ({rows}) j GROUP BY j.gpu_id, j.hour, j.job"


def set_hash(th: Thresholds) -> str:
    """The threshold set's key: a hash of the verdict SQL itself (thresholds and rules: a change of either is
    a new set)."""
    return hashlib.sha256(hour_rows("sqlite", th, "FROM gpu_buckets b WHERE 1 = 1").encode()).hexdigest()[:16]


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
             keys: tuple[str, ...] = KEYS, stored: bool = False) -> str:
    """The judging: per row of ``src`` (a table of judging targets: ``key``, gpu_id, a_s, a_e, jkey, lab),
    planned by :func:`plan` into ``_agg``, its ``id`` and the sums ``keys`` (:data:`auditor.audit.judging.SUMS`)
    of the buckets of its GPU that overlap [a_s, a_e): its whole hours [h0, h1) read from judged_hours, every
    other bucket judged by :func:`auditor.audit.judging.judged_rows`. ``hourly``: per target and clock hour (the
    buckets' start hour) instead, with a column ``hour``. ``skip``: the infrastructure condition
    (:func:`auditor.audit.infra.skip`; a target on a GPU with infrastructure intervals has no whole hours).
    ``stored`` (``src`` is ``_attr``): the edges of a target planned with ``g.eb = 0`` are read from
    judged_edges (:func:`keep_edges`), not from the buckets. Absent sums are NULL; a target without a judged
    row has no row (hourly) or NULL sums."""
    sums = ", ".join(f"{SUMS[k]} AS {k}" for k in keys)
    agg = ", ".join(f"{_merged(k, 'h')} AS {k}" for k in keys)
    kept = " AND g.eb = 1" if stored else ""  # the edges kept in judged_edges are not read from the buckets
    if dialect == "postgresql":  # per target: LATERAL index range scans of its edges and of its hours
        tk = [("t.a_s", "a_s"), ("t.a_e", "a_e")]
        parts = [judged_rows(dialect, th, tk, f"FROM gpu_buckets b WHERE b.gpu_id = t.gpu_id AND {rng}"
                             + _TAIL.format(a="t") + infra.clip(skip, dialect, "t") + kept, "t.jkey", lab="t.lab",
                             correlated=True) for rng in _edges(dialect, "t")]
        edges = f"({parts[0]} UNION ALL {parts[1]}) j"
        whole = f"FROM judged_hours h WHERE {_WHOLE.format(a='t')}"
        frm = f"FROM {src} t JOIN _agg g ON g.id = t.{key} "
        if hourly:
            return (f"SELECT t.{key} AS id, x.* {frm}CROSS JOIN LATERAL (SELECT j.bucket_ts / {H} AS hour, {sums} "
                    f"FROM {edges} GROUP BY j.bucket_ts / {H} UNION ALL SELECT h.hour, {agg} {whole} "
                    "GROUP BY h.hour) x")
        big, _le = greatest_least(dialect)
        if stored:
            whole = (f"FROM (SELECT {', '.join(f'h.{k}' for k in keys)} {whole} UNION ALL SELECT "
                     f"{', '.join(f'e.{k}' for k in keys)} FROM judged_edges e WHERE {_KEPT.format(a='t', key=key)}) h")
        both = ", ".join(f"{big}(e.{k}, hh.{k}) AS {k}" if k in MAXED else
                         f"COALESCE(e.{k}, 0) + COALESCE(hh.{k}, 0) AS {k}" for k in keys)
        return (f"SELECT t.{key} AS id, {both} {frm}CROSS JOIN LATERAL (SELECT {sums} FROM {edges}) e "
                f"CROSS JOIN LATERAL (SELECT {agg} {whole}) hh")
    # SQLite: CROSS JOIN keeps _agg the outer loop; the buckets and hours are read through their keys
    tk = [(f"t.{key}", "tid"), ("t.a_s", "a_s"), ("t.a_e", "a_e")]
    frm = f"FROM _agg g CROSS JOIN {src} t CROSS JOIN {{}} WHERE t.{key} = g.id AND "
    parts = [judged_rows(dialect, th, tk, frm.format("gpu_buckets b") + f"b.gpu_id = t.gpu_id AND {rng}"
                         + _TAIL.format(a="t") + infra.clip(skip, dialect, "t") + kept, "t.jkey", lab="t.lab")
             for rng in _edges(dialect, "t")]
    hour = f"j.bucket_ts / {H}"
    edges = (f"SELECT j.tid AS id, {hour + ' AS hour, ' if hourly else ''}{sums} "
             f"FROM ({parts[0]} UNION ALL {parts[1]}) j GROUP BY j.tid{', ' + hour if hourly else ''}")
    hours = (f"SELECT t.{key} AS id, {'h.hour AS hour, ' if hourly else ''}{agg} "
             f"{frm.format('judged_hours h')}{_WHOLE.format(a='t')} GROUP BY t.{key}{', h.hour' if hourly else ''}")
    if hourly:  # an hour is either whole or an edge hour, never both
        return f"{edges} UNION ALL {hours}"
    if stored:
        kept_sums = ", ".join(f"{_merged(k, 'e')} AS {k}" for k in keys)
        hours += (f" UNION ALL SELECT t.{key} AS id, {kept_sums} "
                  f"{frm.format('judged_edges e')}{_KEPT.format(a='t', key=key)} GROUP BY t.{key}")
    per = ", ".join(f"{_merged(k, 'p')} AS {k}" for k in keys)
    return f"SELECT p.id AS id, {per} FROM ({edges} UNION ALL {hours}) p GROUP BY p.id"


def plan(conn: Connection, src: str, key: str, skip: str, ths: str | None) -> int:
    """``_agg`` (id, h0, h1, eb): for every target of ``src`` (``key``, gpu_id, a_s, a_e) the whole clock hours
    [h0, h1) that :func:`sums_sql` reads from judged_hours (set ``ths``; None: no set is usable): at least one
    whole hour inside [a_s, a_e), on a GPU without infrastructure intervals in the audit (``skip``) and
    without a marked hour among them; every other target gets h0 = h1 = its last hour (every bucket judged
    from gpu_buckets). ``eb`` = 1: the edges are judged from the buckets (:func:`keep_edges` sets 0 where they
    are read from judged_edges). Returns the targets with whole hours."""
    conn.execute(text("DROP TABLE IF EXISTS _agg"))
    conn.execute(text("CREATE TEMPORARY TABLE _agg (id INTEGER PRIMARY KEY, h0 INTEGER, h1 INTEGER, eb INTEGER)"))
    clean = " AND NOT EXISTS (SELECT 1 FROM _infra i WHERE i.gpu_id = t.gpu_id)" if skip else ""
    h0, h1 = f"(t.a_s + {H - 1}) / {H}", f"t.a_e / {H}"
    whole = "0 = 1" if ths is None else (
        f"t.gpu_id IS NOT NULL AND t.a_s >= 0 AND {h1} > {h0}{clean} AND NOT EXISTS (SELECT 1 FROM judged_dirty d "
        f"WHERE d.gpu_id = t.gpu_id AND d.hour >= {h0} AND d.hour < {h1})")
    conn.execute(text(f"INSERT INTO _agg SELECT t.{key}, CASE WHEN {whole} THEN {h0} ELSE {h1} END, {h1}, 1 "
                      f"FROM {src} t"))
    n = conn.execute(text("SELECT COUNT(*) FROM _agg WHERE h1 > h0")).scalar() or 0
    if conn.dialect.name == "postgresql":
        conn.execute(text("ANALYZE _agg"))
    return int(n)


#: the kept edges of target ``a`` (judged_edges ``e``) that :func:`keep_edges` made current for this judging
_KEPT = "g.eb = 0 AND e.ths = :ths AND e.allocated_gpu_id = {a}.{key}"


def _spans(g: str) -> list[tuple[str, str, str]]:
    """Per edge (0: head, 1: tail) of a target ``t`` with whole hours [``g``.h0, ``g``.h1): the first and last
    clock hour of the buckets it reads (:func:`_edges`) and the edge time it is judged for."""
    return [(f"(t.a_s - {LOOKBACK}) / {H}", f"{g}.h0 - 1", "t.a_s"), (f"{g}.h1", f"(t.a_e - 1) / {H}", "t.a_e")]


def _edge_sums(dialect: str, th: Thresholds, side: int) -> str:
    """Per target of ``_etodo`` (``id``; its ``_attr`` row ``t``, its ``_agg`` row ``g``): the SUMS of the
    buckets of edge ``side``, judged as :func:`sums_sql` judges them."""
    rng = _edges(dialect, "t")[side] + _TAIL.format(a="t")
    sums = ", ".join(f"{sql} AS {k}" for k, sql in SUMS.items())
    if dialect == "postgresql":
        rows = judged_rows(dialect, th, [("t.a_s", "a_s"), ("t.a_e", "a_e")], "FROM gpu_buckets b WHERE "
                           f"b.gpu_id = t.gpu_id AND {rng}", "t.jkey", lab="t.lab", correlated=True)
        return (f"SELECT x.id AS id, s.* FROM _etodo x JOIN _agg g ON g.id = x.id JOIN _attr t ON "
                f"t.allocated_gpu_id = x.id CROSS JOIN LATERAL (SELECT {sums} FROM ({rows}) j) s")
    rows = judged_rows(dialect, th, [("t.allocated_gpu_id", "tid"), ("t.a_s", "a_s"), ("t.a_e", "a_e")],
                       "FROM _etodo x CROSS JOIN _agg g CROSS JOIN _attr t CROSS JOIN gpu_buckets b WHERE g.id = x.id "
                       f"AND t.allocated_gpu_id = x.id AND b.gpu_id = t.gpu_id AND {rng}", "t.jkey", lab="t.lab")
    return f"SELECT j.tid AS id, {sums} FROM ({rows}) j GROUP BY j.tid"


def keep_edges(conn: Connection, th: Thresholds, ths: str) -> tuple[int, int]:
    """Edges judged once: every allocated GPU of ``_attr`` planned with whole hours (``_agg``) whose edges'
    hours hold no mark (judged_dirty) reads its edges from judged_edges (``eb`` = 0). Those kept for the same
    thresholds, telemetry GPU, edge times, job key and labels are read as they are; the others are judged from
    the buckets now and kept. An edge with a marked hour is judged from the buckets (``eb`` stays 1); the
    re-judging of marked hours deletes the kept edges they touch (:func:`auditor.audit.aggregate.refresh`).
    Returns (edges read as kept, allocated GPUs whose edges were judged now)."""
    pg = conn.dialect.name == "postgresql"
    marked = " OR ".join(f"(d.hour >= {lo} AND d.hour <= {hi})" for lo, hi, _ts in _spans("_agg"))
    conn.execute(text(f"UPDATE _agg SET eb = 0 WHERE h1 > h0 AND EXISTS (SELECT 1 FROM _attr t WHERE "
                      f"t.allocated_gpu_id = _agg.id AND NOT EXISTS (SELECT 1 FROM judged_dirty d WHERE "
                      f"d.gpu_id = t.gpu_id AND ({marked})))"))
    same = ("EXISTS (SELECT 1 FROM judged_edges e WHERE e.ths = :ths AND e.allocated_gpu_id = g.id AND e.side = {s} "
            "AND e.gpu_id = t.gpu_id AND e.edge_ts = {ts} AND e.lab = t.lab AND (e.jkey = t.jkey OR (e.jkey IS NULL "
            "AND t.jkey IS NULL)))")
    spans = _spans("g")
    conn.execute(text("DROP TABLE IF EXISTS _etodo"))
    conn.execute(text("CREATE TEMPORARY TABLE _etodo (id INTEGER PRIMARY KEY)"))
    todo = conn.execute(text(
        "INSERT INTO _etodo SELECT g.id FROM _agg g JOIN _attr t ON t.allocated_gpu_id = g.id WHERE g.eb = 0 AND "
        f"NOT ({same.format(s=0, ts=spans[0][2])} AND {same.format(s=1, ts=spans[1][2])})"), {"ths": ths}).rowcount
    if todo:
        if pg:
            conn.execute(text("ANALYZE _etodo"))
        cols = ", ".join(KEYS)
        for side, (lo, hi, ts) in enumerate(spans):
            conn.execute(text(
                f"INSERT INTO judged_edges (ths, allocated_gpu_id, side, gpu_id, edge_ts, lo_hour, hi_hour, jkey, lab, "
                f"{cols}) SELECT :ths, x.id, {side}, t.gpu_id, {ts}, {lo}, {hi}, t.jkey, t.lab, "
                f"{', '.join(f's.{k}' for k in KEYS)} FROM _etodo x JOIN _agg g ON g.id = x.id JOIN _attr t ON "
                f"t.allocated_gpu_id = x.id LEFT JOIN ({_edge_sums(conn.dialect.name, th, side)}) s ON s.id = x.id "
                "WHERE 1 = 1 ON CONFLICT (ths, allocated_gpu_id, side) DO UPDATE SET "
                + ", ".join(f"{c} = excluded.{c}" for c in ("gpu_id", "edge_ts", "lo_hour", "hi_hour", "jkey", "lab",
                                                             *KEYS))), {"ths": ths})
    conn.execute(text("DROP TABLE _etodo"))
    kept = conn.execute(text("SELECT COUNT(*) FROM _agg WHERE eb = 0")).scalar() or 0
    return int(kept) - int(todo or 0), int(todo or 0)


USAGE_COLS = ("signal", "reserved_s", "observed_s", "idle_s", "idle_by_util_s", "mirage_s", "low_s", "working_s",
              "busy_unverified_s", "idle_by_counters_s", "busy_by_counters_s", "engine_spin_s", "unknown_s", "infra_s",
              "effective_s", "gpu_util_s", "util_observed_s", "sm_s", "sm_observed_s", "tensor_s", "dram_s", "io_bps_s",
              "max_gpu_mirage_s", *(f"{k}_s" for k in EXTRA))
_INSERT = ("INSERT INTO usage_gpu (run_id, allocated_gpu_id, allocation_id, attribution, gpu_index, gpu_id, "
           + ", ".join(USAGE_COLS) + ", peak_fb_mib, idle_peak_fb_mib)\nSELECT :run_id, at.allocated_gpu_id, "
           "at.allocation_id, at.attribution, at.gpu_index, at.gpu_id, ")
_RESERVED = "(at.a_e - at.a_s)"
_INFRA = "COALESCE(ai.infra, 0)"
_JOIN_INFRA = " LEFT JOIN _attr_infra ai ON ai.allocated_gpu_id = at.allocated_gpu_id"


def judge_sql(dialect: str, th: Thresholds, skip: str = "", stored: bool = False) -> str:
    """The INSERT of usage_gpu for every allocated GPU of ``_attr`` (planned into ``_agg`` by :func:`plan`):
    the sums of :func:`sums_sql` (``:ths``, the aggregate's set) made usage columns; ``skip`` leaves out
    buckets of infrastructure-affected intervals (:func:`auditor.audit.infra.skip`), whose seconds come from
    ``_attr_infra``. ``stored``: edges planned so read from judged_edges (:func:`keep_edges`)."""
    get = {k: f"COALESCE(j.{k}, 0)" for k in SUMS}
    cols = usage_columns(get, "at.share", _RESERVED, _INFRA)
    return (_INSERT + ", ".join(cols[c] for c in USAGE_COLS) + ", j.peak_fb, j.idle_fb\nFROM _attr at LEFT JOIN ("
            + sums_sql(dialect, th, "_attr", "allocated_gpu_id", skip, stored=stored)
            + ") j ON j.id = at.allocated_gpu_id" + _JOIN_INFRA)


def aggregate_set(conn: Connection, th: Thresholds, since: int, judging: Judging = DEFAULT) -> str | None:
    """The judged aggregate's set that a judging of ``th`` from ``since`` reads whole hours from: None when
    ``judging.whole_hours`` is off or the aggregate does not hold these thresholds from that hour on."""
    return usable(conn, th, since) if judging.whole_hours else None


def whole_hour_gpus(conn: Connection, params: dict[str, Any], th: Thresholds, skip: str,
                    judging: Judging = DEFAULT) -> int:
    """Plan which allocated GPUs of ``_attr`` read whole hours from the judged aggregate (``_agg``,
    :func:`plan`); returns how many (none with ``judging.whole_hours`` off, or when the aggregate does not
    hold this run's thresholds from its window's first hour on)."""
    ths = aggregate_set(conn, th, params["since"], judging)
    params["ths"] = ths or ""
    return plan(conn, "_attr", "allocated_gpu_id", skip, ths)


def judge(conn: Connection, params: dict[str, Any], th: Thresholds, judging: Judging = DEFAULT) -> None:
    """Judge every bucket of ``_attr`` into usage_gpu in one statement: whole hours from the judged aggregate
    where it is fresh (``judging.whole_hours``), their edges as kept in judged_edges (``judging.edges``,
    :func:`keep_edges`), every other bucket from gpu_buckets; buckets of infrastructure-affected time are left
    out (:mod:`auditor.audit.infra`)."""
    skip = infra.skip(conn)
    p = dict(params)
    whole_hour_gpus(conn, p, th, skip, judging)
    stored = judging.edges and bool(p["ths"])
    if stored:
        keep_edges(conn, th, p["ths"])
    conn.execute(text(judge_sql(conn.dialect.name, th, skip, stored)), p)
    conn.execute(text("DROP TABLE _agg"))
