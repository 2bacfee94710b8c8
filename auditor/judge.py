"""Observed seconds of an allocated GPU, bucket by bucket, as SQL (docs/definitions.md).

Which telemetry rows apply: a bucket of one telemetry GPU may hold several sub-rows, one per job label
(``gpu_buckets.job``). If any sub-row of the bucket carries a job, only those naming the allocation apply
(exact match on the comma-separated list, no wildcard); otherwise the unlabelled row applies. Several
applicable rows are combined first (observed seconds summed up to the bucket width, metrics weighted by
observed seconds, spans joined). Then, per (allocated GPU, bucket):

- ``ov`` = reserved seconds inside the bucket (the row's own width: 300 s fine, 3600 s rolled up);
- ``obs`` = min(reserved seconds inside the sampled span, observed seconds) when there were samples;
- ``v`` = the verdict code of :mod:`auditor.verdict` (``obs`` = 0 is unknown).

Used by the audit on both engines, idle episodes and idle reservations, so all read the same rows.
"""

from __future__ import annotations

from auditor import verdict
from auditor.config import Thresholds

#: Metrics the verdict and the per-GPU sums read; ``io_bps`` is PCIe + NVLink bytes/s of a row.
METRICS = ("sm_active", "dram_active", "tensor_active", "gpu_util", "gr_engine", "power_w", "fb_used_mib",
           "io_bps")
_IO = ("(COALESCE(b.pcie_tx_bps, 0) + COALESCE(b.pcie_rx_bps, 0) + COALESCE(b.nvlink_tx_bps, 0)"
       " + COALESCE(b.nvlink_rx_bps, 0))")
#: Widest bucket the store can hold (a roll-up): how far before an interval a bucket may start and reach it
LOOKBACK = 3600

#: The allocation's job key in telemetry labels: Slurm job id, else "namespace/pod"
JOB_KEY = "CASE WHEN a.source = 'slurm' THEN a.external_id ELSE a.account || '/' || a.name END"


def fns(dialect: str) -> tuple[str, str]:
    """(GREATEST, LEAST) of the engine: SQLite spells them as multi-argument max()/min()."""
    return ("GREATEST", "LEAST") if dialect == "postgresql" else ("max", "min")


def job_match(dialect: str, job: str, key: str) -> str:
    """The comma-separated job list ``job`` names ``key`` exactly (``123_4`` never matches ``12314``)."""
    pos = "strpos" if dialect == "postgresql" else "instr"
    return f"({job} <> '' AND {pos}(',' || {job} || ',', ',' || {key} || ',') > 0)"


def _raw(name: str) -> str:
    return _IO if name == "io_bps" else f"b.{name}"


def combined(dialect: str, keys: list[tuple[str, str]], frm: str, jkey: str, *, grouped: bool,
             correlated: bool = False) -> str:
    """One row per (keys, bucket_ts): the applicable sub-rows of ``frm`` (which binds ``b`` to
    gpu_buckets) combined. ``grouped=False`` is the fast path for GPUs known to have only unlabelled rows
    (one row per bucket, nothing to combine). ``correlated``: the keys come from an outer query (constants
    here; SQLite cannot group by them)."""
    k = [f"{e} AS {a}" for e, a in keys]
    if not grouped:
        cols = [*k, "b.bucket_ts AS bucket_ts", "b.bucket_s AS bucket_s", "b.samples AS samples",
                "b.observed_s AS observed_s", "COALESCE(b.span_start, b.bucket_ts) AS sp_s",
                "COALESCE(b.span_end, b.bucket_ts + b.bucket_s) AS sp_e",
                *(f"{_raw(m)} AS {m}" for m in METRICS)]
        return f"SELECT {', '.join(cols)} {frm} AND b.job = ''"
    _g, le = fns(dialect)
    m = job_match(dialect, "b.job", jkey)
    u = "b.job = ''"
    inner = [*k, "b.bucket_ts AS bucket_ts", "MAX(b.bucket_s) AS bucket_s",
             "MAX(CASE WHEN b.job <> '' THEN 1 ELSE 0 END) AS has_lab",
             f"SUM(CASE WHEN {m} THEN 1 ELSE 0 END) AS n_m",
             f"MAX(CASE WHEN {u} THEN b.samples END) AS u_samples",
             f"SUM(CASE WHEN {m} THEN b.samples END) AS m_samples",
             f"MAX(CASE WHEN {u} THEN b.observed_s END) AS u_obs",
             f"SUM(CASE WHEN {m} THEN b.observed_s END) AS m_obs",
             f"MAX(CASE WHEN {u} THEN COALESCE(b.span_start, b.bucket_ts) END) AS u_sps",
             f"MIN(CASE WHEN {m} THEN COALESCE(b.span_start, b.bucket_ts) END) AS m_sps",
             f"MAX(CASE WHEN {u} THEN COALESCE(b.span_end, b.bucket_ts + b.bucket_s) END) AS u_spe",
             f"MAX(CASE WHEN {m} THEN COALESCE(b.span_end, b.bucket_ts + b.bucket_s) END) AS m_spe"]
    for x in METRICS:
        r = _raw(x)
        inner += [f"MAX(CASE WHEN {u} THEN {r} END) AS u_{x}", f"MAX(CASE WHEN {m} THEN {r} END) AS m1_{x}",
                  f"SUM(CASE WHEN {m} THEN b.observed_s * {r} END) / NULLIF(SUM(CASE WHEN {m} AND {r} IS NOT NULL"
                  f" THEN b.observed_s END), 0) AS mw_{x}"]
    group = ", ".join(([] if correlated else [e for e, _a in keys]) + ["b.bucket_ts"])
    pick = "CASE WHEN c.has_lab = 1 THEN {m} ELSE {u} END"
    outer = [*(f"c.{a} AS {a}" for _e, a in keys), "c.bucket_ts AS bucket_ts", "c.bucket_s AS bucket_s",
             pick.format(m="COALESCE(c.m_samples, 0)", u="COALESCE(c.u_samples, 0)") + " AS samples",
             pick.format(m=f"{le}(c.bucket_s, COALESCE(c.m_obs, 0))", u="COALESCE(c.u_obs, 0)") + " AS observed_s",
             pick.format(m="c.m_sps", u="c.u_sps") + " AS sp_s", pick.format(m="c.m_spe", u="c.u_spe") + " AS sp_e",
             *(pick.format(m=f"CASE WHEN c.n_m = 1 THEN c.m1_{x} ELSE c.mw_{x} END", u=f"c.u_{x}") + f" AS {x}"
               for x in METRICS)]
    return (f"SELECT {', '.join(outer)} FROM (SELECT {', '.join(inner)} {frm} GROUP BY {group}) c")


def judged_rows(dialect: str, th: Thresholds, keys: list[tuple[str, str]], frm: str, jkey: str, *,
                grouped: bool, working_first: bool = False, correlated: bool = False) -> str:
    """``combined`` plus ``ov``, ``obs`` and the verdict ``v``, for buckets that overlap the interval
    [a_s, a_e) (``keys`` must name those two)."""
    g, le = fns(dialect)
    ov = f"{le}(x.bucket_ts + x.bucket_s, x.a_e) - {g}(x.bucket_ts, x.a_s)"
    obs = (f"CASE WHEN x.samples > 0 THEN {le}({g}(0, {le}(x.sp_e, x.a_e) - {g}(x.sp_s, x.a_s)), x.observed_s)"
           " ELSE 0 END")
    metrics = ", ".join(f"x.{m} AS {m}" for m in METRICS)
    names = [a for _e, a in keys]
    y = (f"SELECT {', '.join('x.' + a for _e, a in keys)}, x.bucket_ts, x.bucket_s, x.samples, {metrics}, {ov} AS ov,"
         f" {obs} AS obs FROM ({combined(dialect, keys, frm, jkey, grouped=grouped, correlated=correlated)}) x")
    # zero observed seconds add nothing to any sum, so "samples > 0" is enough to tell unknown apart
    v = verdict.case(th, verdict.prefixed("y"), observed="y.samples > 0", working_first=working_first)
    return (f"SELECT {', '.join('y.' + a for a in names)}, y.bucket_ts, y.bucket_s, y.ov, y.obs,"
            f" {', '.join('y.' + m for m in METRICS)}, {v} AS v FROM ({y}) y WHERE y.ov > 0")


_V = verdict
#: Per allocated GPU: the sums over its judged rows ``j`` (seconds not yet times share).
SUMS: dict[str, str] = {
    "idle": f"SUM(CASE WHEN j.v = {_V.IDLE} THEN j.obs END)",
    "idle_by_util": f"SUM(CASE WHEN j.v = {_V.IDLE_BY_UTIL} THEN j.obs END)",
    "mirage": f"SUM(CASE WHEN j.v = {_V.MIRAGE} THEN j.obs END)",
    "low": f"SUM(CASE WHEN j.v = {_V.LOW} THEN j.obs END)",
    "working": f"SUM(CASE WHEN j.v = {_V.WORKING} THEN j.obs END)",
    "busy_unverified": f"SUM(CASE WHEN j.v = {_V.BUSY_UNVERIFIED} THEN j.obs END)",
    "effective": f"SUM(CASE WHEN {_V.in_codes('j.v', _V.VERIFIED_CODES)} THEN j.obs * j.sm_active END)",
    "gpu_util": "SUM(CASE WHEN j.v > 0 THEN j.obs * j.gpu_util END)",
    "util_observed": "SUM(CASE WHEN j.v > 0 AND j.gpu_util IS NOT NULL THEN j.obs END)",
    "sm": "SUM(CASE WHEN j.v > 0 THEN j.obs * j.sm_active END)",
    "sm_observed": f"SUM(CASE WHEN {_V.in_codes('j.v', _V.VERIFIED_CODES)} THEN j.obs END)",
    "tensor": "SUM(CASE WHEN j.v > 0 THEN j.obs * j.tensor_active END)",
    "dram": "SUM(CASE WHEN j.v > 0 THEN j.obs * j.dram_active END)",
    "io_bps": "SUM(CASE WHEN j.v > 0 THEN j.obs * j.io_bps END)",
    "peak_fb": "MAX(CASE WHEN j.obs > 0 THEN j.fb_used_mib END)",
}
OBSERVED = ("idle", "idle_by_util", "mirage", "low", "working", "busy_unverified")


def usage_columns(get: dict[str, str], share: str, reserved: str) -> dict[str, str]:
    """usage_gpu column -> SQL, from ``get`` (SUMS name -> an SQL value that is 0 when absent)."""
    observed = "(" + " + ".join(get[k] for k in OBSERVED) + ")"
    out = {"reserved_s": f"{share} * {reserved}", "observed_s": f"{share} * {observed}",
           "idle_s": f"{share} * ({get['idle']} + {get['idle_by_util']})"}
    for k in ("idle_by_util", "mirage", "low", "working", "busy_unverified"):
        out[f"{k}_s"] = f"{share} * {get[k]}"
    out["unknown_s"] = f"{share} * ({reserved} - {observed})"
    for k in ("effective", "gpu_util", "util_observed", "sm", "sm_observed", "tensor", "dram", "io_bps"):
        out[f"{k}_s"] = f"{share} * {get[k]}"
    out["max_gpu_mirage_s"] = get["mirage"]
    out["signal"] = (f"CASE WHEN {get['sm_observed']} > 0 THEN 'sm_active' WHEN {get['util_observed']} > 0 "
                     "THEN 'gpu_util' ELSE 'none' END")
    return out
