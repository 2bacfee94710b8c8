"""Observed seconds of an allocated GPU, bucket by bucket, as SQL (docs/definitions.md).

Which telemetry rows apply: a bucket of one telemetry GPU may hold several sub-rows, one per job label
(``gpu_buckets.job``). If any sub-row of the bucket carries a job, only those naming the allocation apply
(exact match on the comma-separated list, no wildcard); otherwise the unlabelled row applies. Several
applicable rows are combined first (observed seconds summed up to the bucket width, metrics weighted by
observed seconds, spans joined). Then, per (allocated GPU, bucket):

- the bucket counts when it overlaps the reserved interval by its own width (300 s fine, 3600 s rolled up);
- ``obs`` = min(reserved seconds inside the sampled span, observed seconds) (0 without observed seconds);
- ``v`` = the verdict code of :mod:`auditor.audit.verdict` (no observed seconds: unknown). Reserved time without ``obs``
  is unknown: the audit's unknown = reserved - observed.

Used by the audit on both engines, idle episodes and idle reservations, so all read the same rows.
"""

from __future__ import annotations

from auditor.audit import infra, verdict, waiting
from auditor.config import Thresholds
from auditor.store.sqlfuncs import greatest_least

#: Metrics the verdict and the per-GPU sums read; ``io_bps`` is PCIe + NVLink bytes/s of a row.
METRICS = ("sm_active", "dram_active", "tensor_active", "gpu_util", "gr_engine", "power_w", "fb_used_mib",
           "io_bps")
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
             f"{_judged_cols(th, verdict.prefixed('b'), a_s, a_e, dialect)} {frm} AND b.job = ''{alone}")
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
    "gpu_util": "SUM(j.obs * j.gpu_util)",
    "util_observed": "SUM(CASE WHEN j.gpu_util IS NOT NULL THEN j.obs END)",
    "sm": "SUM(j.obs * j.sm_active)",
    "sm_observed": "SUM(CASE WHEN j.sm_active IS NOT NULL THEN j.obs END)",
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
         "idle_power_observed", *waiting.SUMMED, "lead", "waitable", "waits")
OBSERVED = ("idle", "idle_by_util", "mirage", "low", "working", "busy_unverified")


def usage_columns(get: dict[str, str], share: str, reserved: str, infra: str = "0") -> dict[str, str]:
    """usage_gpu column -> SQL, from ``get`` (SUMS name -> an SQL value that is 0 when absent) and ``infra``
    (reserved seconds inside infrastructure intervals, :mod:`auditor.audit.infra`; no bucket that touches
    one is in ``get``): unknown = reserved - observed - infra."""
    observed = "(" + " + ".join(get[k] for k in OBSERVED) + ")"
    out = {"reserved_s": f"{share} * {reserved}", "observed_s": f"{share} * {observed}",
           "infra_s": f"{share} * {infra}",
           "idle_s": f"{share} * ({get['idle']} + {get['idle_by_util']})"}
    for k in ("idle_by_util", "mirage", "low", "working", "busy_unverified"):
        out[f"{k}_s"] = f"{share} * {get[k]}"
    out["unknown_s"] = f"{share} * ({reserved} - {observed} - {infra})"
    for k in ("gpu_util", "util_observed", "sm", "sm_observed", "tensor", "dram", "io_bps"):
        out[f"{k}_s"] = f"{share} * {get[k]}"
    for k in EXTRA:
        out[f"{k}_s"] = f"{share} * {get[k]}"
    out["effective_s"] = f"{share} * {get['sm']}"
    out["max_gpu_mirage_s"] = get["mirage"]
    out["signal"] = (f"CASE WHEN {get['sm_observed']} > 0 THEN 'sm_active' WHEN {get['util_observed']} > 0 "
                     "THEN 'gpu_util' ELSE 'none' END")
    return out


def _obs(c: verdict.Col, a_s: str, a_e: str, g: str, le: str) -> str:
    """Observed seconds of one (combined) row inside [a_s, a_e): min(reserved seconds inside its span,
    observed_s); a row without a span inside the interval is simply its observed seconds."""
    sp_s = f"COALESCE({c('span_start')}, {c('bucket_ts')})"
    sp_e = f"COALESCE({c('span_end')}, {c('bucket_ts')} + {c('bucket_s')})"
    return (f"CASE WHEN NOT {c('observed_s')} > 0 THEN 0 WHEN {c('span_start')} IS NULL AND {c('span_end')} IS NULL "
            f"AND {c('bucket_ts')} >= {a_s} AND {c('bucket_ts')} + {c('bucket_s')} <= {a_e} THEN {c('observed_s')} "
            f"ELSE {le}({g}(0, {le}({sp_e}, {a_e}) - {g}({sp_s}, {a_s})), {c('observed_s')}) END")


def _judged_cols(th: Thresholds, c: verdict.Col, a_s: str, a_e: str, dialect: str = "sqlite", *,
                 combined: bool = False) -> str:
    """obs, the metrics, io_measured and the verdict ``v`` of one row ``c``: a gpu_buckets row, or
    (``combined``) the applicable rows of one bucket combined by :func:`_combine`."""
    g, le = greatest_least(dialect)
    io, measured = (c("io_bps"), c("io_measured")) if combined else (_IO, _IO_MEASURED)
    metrics = [f"{c(m)} AS {m}" for m in METRICS if m != "io_bps"] + [f"{io} AS io_bps", f"{measured} AS io_measured"]
    seen = c("observed_s")  # observed, also a row that holds only cover carried from its series' last sample
    return (f"{_obs(c, a_s, a_e, g, le)} AS obs, {', '.join(metrics)}, "
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
