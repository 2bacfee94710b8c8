"""Inference services (docs/definitions.md "Inference services"): what each million generated tokens cost, and
whether batching would raise tokens per GPU-hour.

A serving pod's inference buckets (vLLM, TGI, SGLang, Triton: :mod:`connectors.inference`) belong to the GPU
allocation whose telemetry job key they carry (namespace/pod; a Slurm job's id), inside its reserved interval.
Per allocation: tokens = the buckets' generated tokens; mean concurrency = requests running weighted by bucket
seconds; cost = the allocation's reserved cost (:func:`auditor.audit.money.costs`); cost per million tokens =
cost / tokens x 10^6; tokens per GPU-hour = tokens / reserved GPU-hours. An hour rolled up by
``gpu-audit db prune`` (``span_start`` set) counts for an allocation by the share of its span (first to last
bucket it was made of) that the allocation's interval overlaps: a pod name reused within the hour (a
StatefulSet's pod restarted) is never counted twice. A service is the pods of one Kubernetes workload
(owner_workload, else the pod's name), per cluster: its figures are the sums (and the seconds-weighted mean
concurrency) of its pods'.

batching_headroom: a pod with mean concurrency < ``batching_concurrency`` over >= ``batching_min_gpu_hours``
reserved GPU-hours with inference metrics, on a chip that is memory-bound (mean DRAM activity >=
``hint_dram_high``) or low (mean SM activity < ``low_efficiency_sm``): decode at batch ~1 reads all the weights
per token, so the chip reads busy while its math waits; more requests per batch raise tokens per GPU-hour.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any

from sqlalchemy import Connection, text

from auditor.audit.money import costs
from auditor.config import Thresholds

H = 3600.0

BUCKETS = """SELECT a.id AS allocation_id, a.owner_workload, a.start_ts AS a_start, a.end_ts AS a_end, ib.engine,
 ib.model, ib.start_ts, ib.seconds, ib.observed_s, ib.span_start, ib.span_end, ib.generated_tokens, ib.running_mean,
 ib.waiting_mean, ib.batch_mean
FROM inference_buckets ib JOIN allocations a ON a.cluster = ib.cluster
 AND ib.job = (CASE WHEN a.source = 'kubernetes' THEN a.account || '/' || a.name ELSE a.external_id END)
WHERE ib.start_ts >= :since_hour AND ib.start_ts < :horizon AND ib.start_ts + ib.seconds > a.start_ts
 AND (a.end_ts IS NULL OR ib.start_ts < a.end_ts)"""


def _mean(num: float, den: float) -> float | None:
    return num / den if den > 0 else None


def service_of(owner_workload: str | None, name: str) -> str:
    """The service a pod belongs to: its Kubernetes workload (``Deployment/chat``), else its own name."""
    return owner_workload or name


def share(b: Any, since: int, horizon: int) -> float:
    """The part of bucket row ``b`` that belongs to its allocation and the audit window [since, horizon): a
    bucket as collected counts whole when it starts in the window (0 otherwise); a rolled-up hour, by the share
    of its span that both the allocation's [start, end or horizon) and the window overlap."""
    if b.span_start is None or b.span_end is None or b.span_end <= b.span_start:
        return 1.0 if b.start_ts >= since else 0.0
    lo = max(b.span_start, since, b.a_start if b.a_start is not None else b.span_start)
    hi = min(b.span_end, horizon, b.a_end if b.a_end is not None else horizon)
    return max(0.0, min(1.0, (hi - lo) / (b.span_end - b.span_start)))


def pods(conn: Connection, rows_of: Callable[[Iterable[int]], dict[int, dict[str, Any]]], since: int,
         horizon: int) -> list[dict[str, Any]]:
    """Per allocation of the run with inference buckets: its inference figures (one row each). ``rows_of``:
    the run's per-allocation rows of some ids (:meth:`auditor.audit.totals.AllocationRows.get`)."""
    acc: dict[int, dict[str, Any]] = {}
    # an hour rolled up from before ``since`` may reach into the window: read from the hour before
    for b in conn.execute(text(BUCKETS), {"since_hour": since - 3600, "horizon": horizon}):
        w = share(b, since, horizon)
        if w <= 0:
            continue
        seconds = w * (b.observed_s if b.observed_s is not None else b.seconds)
        a = acc.setdefault(b.allocation_id, {"workload": b.owner_workload or "", "engines": set(),
                                             "models": set(), "tokens": 0.0, "run_s": 0.0, "run": 0.0,
                                             "wait_s": 0.0, "wait": 0.0, "batch_s": 0.0, "batch": 0.0,
                                             "seconds": 0.0})
        a["engines"].add(b.engine)
        if b.model:
            a["models"].add(b.model)
        a["seconds"] += seconds
        a["tokens"] += w * (b.generated_tokens or 0.0)
        for key, v in (("run", b.running_mean), ("wait", b.waiting_mean), ("batch", b.batch_mean)):
            if v is not None:
                a[key] += v * seconds
                a[key + "_s"] += seconds
    by_id = rows_of(acc)
    out = []
    for aid, a in sorted(acc.items()):
        r = by_id.get(aid)
        if r is None:  # not an allocation of this run
            continue
        gpu_h = r["reserved_s"] / H
        cost = costs(r)[0]
        sm_obs = r["sm_observed_s"]
        out.append({
            "allocation_id": aid, "cluster": r["cluster"], "team": r["team"], "account": r["account"],
            "user_name": r["user_name"], "pod": r["name"],
            "service": service_of(a["workload"], r["name"]), "engine": ",".join(sorted(a["engines"])),
            "model": ",".join(sorted(a["models"])), "tokens": a["tokens"], "gpu_hours": gpu_h, "cost": cost,
            "metric_hours": min(gpu_h, a["seconds"] / H * (r["gpus"] or 1)), "_r": r,
            "run_s": a["run_s"], "run": a["run"],
            "concurrency": _mean(a["run"], a["run_s"]), "waiting": _mean(a["wait"], a["wait_s"]),
            "batch": _mean(a["batch"], a["batch_s"]),
            "cost_per_million": cost / a["tokens"] * 1e6 if a["tokens"] > 0 else None,
            "tokens_per_gpu_hour": a["tokens"] / gpu_h if gpu_h > 0 else None,
            "sm": _mean(r["sm_s"], sm_obs), "dram": _mean(r["dram_s"], sm_obs),
        })
    return out


def chip_state(p: dict[str, Any], th: Thresholds) -> str:
    """memory-bound, low (SM activity) or "" (neither, or no profiling fields)."""
    if p["dram"] is not None and p["dram"] >= th.hint_dram_high - 1e-9:
        return "memory-bound"
    if p["sm"] is not None and p["sm"] < th.low_efficiency_sm - 1e-9:
        return "low"
    return ""


def headroom(p: dict[str, Any], th: Thresholds) -> str:
    """The batching_headroom rule's sentence for one pod, "" when it does not hold."""
    state = chip_state(p, th)
    conc = p["concurrency"]
    if not state or conc is None or conc >= th.batching_concurrency - 1e-9 or \
            p["metric_hours"] < th.batching_min_gpu_hours - 1e-9:
        return ""
    chip = "a memory-bound chip" if state == "memory-bound" else "a chip with low SM activity"
    return f"mean concurrency {conc:.1f} on {chip}: batching would raise tokens per GPU-hour"


def services(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per cluster and service: the sums of its pods, cost per million tokens, tokens per GPU-hour and the
    seconds-weighted mean concurrency; most expensive per token first."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for p in rows:
        groups[(p["cluster"], p["service"])].append(p)
    out = []
    for (cluster, service), ps in groups.items():
        tokens = sum(p["tokens"] for p in ps)
        gpu_h = sum(p["gpu_hours"] for p in ps)
        cost = sum(p["cost"] for p in ps)
        run_s = sum(p["run_s"] for p in ps)
        out.append({"cluster": cluster, "service": service, "team": ps[0]["team"],
                    "engine": ",".join(sorted({p["engine"] for p in ps})),
                    "model": ",".join(sorted({p["model"] for p in ps if p["model"]})), "pods": len(ps),
                    "tokens": tokens, "gpu_hours": gpu_h, "cost": cost,
                    "cost_per_million": cost / tokens * 1e6 if tokens > 0 else None,
                    "tokens_per_gpu_hour": tokens / gpu_h if gpu_h > 0 else None,
                    "concurrency": sum(p["run"] for p in ps) / run_s if run_s > 0 else None,
                    "batching_headroom": any(p.get("headroom") for p in ps)})
    out.sort(key=lambda s: (s["cost_per_million"] is None, -(s["cost_per_million"] or 0.0), s["service"]))
    return out


def tokens_by_allocation(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Generated tokens per allocation id (JSON keys are text): what the chargeback's tokens column sums per
    owner."""
    return {str(p["allocation_id"]): p["tokens"] for p in rows}


def findings(conn: Connection, run_id: int, rows_of: Callable[[Iterable[int]], dict[int, dict[str, Any]]],
             th: Thresholds, since: int, horizon: int, summary: dict[str, Any] | None) -> list[dict[str, Any]]:
    """batching_headroom findings of one run; the services' figures go into ``summary["inference"]`` (the
    one computation every surface shows) and the tokens per allocation into ``summary["inference_tokens"]``."""
    from auditor.audit.evidence import _finding

    rows = pods(conn, rows_of, since, horizon)
    out = []
    for p in rows:
        p["headroom"] = sentence = headroom(p, th)
        if not sentence:
            continue
        ev = {"rule": sentence, "engine": p["engine"], "model": p["model"], "service": p["service"],
              "mean_concurrency": p["concurrency"], "mean_waiting": p["waiting"], "mean_batch": p["batch"],
              "generated_tokens": p["tokens"], "tokens_per_gpu_hour": p["tokens_per_gpu_hour"],
              "cost_per_million_tokens": p["cost_per_million"], "chip": chip_state(p, th)}
        out.append(_finding(run_id, "batching_headroom", p["_r"], ev, 0.0, since, horizon))
    for p in rows:
        del p["_r"]
    if summary is not None and rows:
        summary["inference"] = services(rows)
        summary["inference_tokens"] = tokens_by_allocation(rows)
    return out

