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
(owner_workload, else the pod's name) in one namespace (a Slurm job's: its account) of one cluster: the
identity (cluster, namespace, workload), so a Deployment of the same name in two namespaces is two services,
never one row adding two tenants' money. Its figures are the sums (and the seconds-weighted mean
concurrency) of its pods'.

batching_headroom: a pod with mean concurrency < ``batching_concurrency`` over >= ``batching_min_gpu_hours``
reserved GPU-hours with inference metrics, on a chip that is memory-bound (mean DRAM activity >=
``hint_dram_high``) or low (mean SM activity < ``low_efficiency_sm``): decode at batch ~1 reads all the weights
per token, so the chip reads busy while its math waits; more requests per batch raise tokens per GPU-hour.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any

from sqlalchemy import Connection, text

from auditor.audit.efficiency import HINT_DRAM_HIGH
from auditor.audit.money import costs
from auditor.config import Thresholds

# batching_headroom's constants (docs/definitions.md; `[thresholds]` settings until issue 45).
#: a pod whose mean requests running is below this (2: decode at batch ~1) on a memory-bound or low chip...
BATCHING_CONCURRENCY = 2.0
#: ...over at least this many reserved GPU-hours with inference metrics (less is no pattern)
BATCHING_MIN_GPU_HOURS = 1.0

H = 3600.0
#: a service whose prompt cache is on (it looked tokens up, or reports a hit rate) and finds fewer than this
#: share of them is flagged: each miss prefills the prompt again (docs/definitions.md "Prompt-cache hit rate")
LOW_CACHE_HIT_RATE = 0.2
#: the batching knee (docs/definitions.md "The batching knee"): past the knee one more request running adds
#: less than this share of the tokens/s one request alone gets (adding requests no longer comes almost free)
KNEE_GAIN = 0.5
#: concurrency bins of the curve a knee is looked for on (fewer: "not enough spread", no knee)
KNEE_MIN_POINTS = 3

BUCKETS = """SELECT a.id AS allocation_id, a.owner_workload, a.start_ts AS a_start, a.end_ts AS a_end, ib.cluster,
 ib.job, ib.engine,
 ib.model, ib.start_ts, ib.seconds, ib.observed_s, ib.span_start, ib.span_end, ib.generated_tokens, ib.running_mean,
 ib.waiting_mean, ib.batch_mean, ib.cache_queries, ib.cache_hits, ib.cache_hit_rate
FROM inference_buckets ib JOIN allocations a ON a.cluster = ib.cluster
 AND ib.job = (CASE WHEN a.source = 'kubernetes' THEN a.account || '/' || a.name ELSE a.external_id END)
WHERE ib.start_ts >= :since_hour AND ib.start_ts < :horizon AND ib.start_ts + ib.seconds > a.start_ts
 AND (a.end_ts IS NULL OR ib.start_ts < a.end_ts)"""


def _mean(num: float, den: float) -> float | None:
    return num / den if den > 0 else None


def service_of(owner_workload: str | None, name: str) -> str:
    """The service a pod belongs to: its Kubernetes workload (``Deployment/chat``), else its own name."""
    return owner_workload or name


def service_key(cluster: str, namespace: str | None, service: str) -> tuple[str, str, str]:
    """A service's identity: (cluster, namespace, workload). A Kubernetes pod's namespace is its allocation's
    ``account``; a Slurm job's account stands in the same place. Every grouping, lookup and scope of services
    uses this key (:func:`services`, the web page's scoping)."""
    return (cluster or "", namespace or "", service)


def held(b: Any, horizon: int) -> float:
    """Seconds of bucket row ``b`` (as collected) inside its allocation's [start, end or horizon)."""
    end = b.a_end if b.a_end is not None else max(horizon, b.start_ts + b.seconds)
    return max(0.0, min(b.start_ts + b.seconds, end) - max(b.start_ts, b.a_start))


def share(b: Any, since: int, horizon: int, held_by_all: float | None = None) -> float:
    """The part of bucket row ``b`` that belongs to its allocation and the audit window [since, horizon): a
    bucket as collected counts when it starts in the window (0 otherwise): whole, or, when pods of one
    name held it in turn (a StatefulSet's pod replaced inside the bucket: ``held_by_all``, the seconds all
    allocations of its job key held of it), by the share of those seconds this allocation held, so the
    bucket's tokens are split by time, never counted for both; a rolled-up hour, by the share of its span
    that both the allocation's [start, end or horizon) and the window overlap."""
    if b.span_start is None or b.span_end is None or b.span_end <= b.span_start:
        if b.start_ts < since:
            return 0.0
        mine = held(b, horizon)
        return mine / held_by_all if held_by_all and held_by_all > mine else 1.0
    lo = max(b.span_start, since, b.a_start if b.a_start is not None else b.span_start)
    hi = min(b.span_end, horizon, b.a_end if b.a_end is not None else horizon)
    return max(0.0, min(1.0, (hi - lo) / (b.span_end - b.span_start)))


def pods(conn: Connection, rows_of: Callable[[Iterable[int]], dict[int, dict[str, Any]]], since: int,
         horizon: int) -> list[dict[str, Any]]:
    """Per allocation of the run with inference buckets: its inference figures (one row each). ``rows_of``:
    the run's per-allocation rows of some ids (:meth:`auditor.audit.totals.AllocationRows.get`)."""
    acc: dict[int, dict[str, Any]] = {}
    # an hour rolled up from before ``since`` may reach into the window: read from the hour before
    got = conn.execute(text(BUCKETS), {"since_hour": since - 3600, "horizon": horizon}).all()
    by_all: dict[tuple[Any, ...], float] = defaultdict(float)  # (cluster, engine, job, start) -> seconds held
    for b in got:
        if b.span_start is None:
            by_all[(b.cluster, b.engine, b.job, b.start_ts)] += held(b, horizon)
    for b in got:
        w = share(b, since, horizon, by_all.get((b.cluster, b.engine, b.job, b.start_ts)))
        if w <= 0:
            continue
        seconds = w * (b.observed_s if b.observed_s is not None else b.seconds)
        a = acc.setdefault(b.allocation_id, {"workload": b.owner_workload or "", "engines": set(),
                                             "models": set(), "tokens": 0.0, "run_s": 0.0, "run": 0.0,
                                             "wait_s": 0.0, "wait": 0.0, "batch_s": 0.0, "batch": 0.0,
                                             "seconds": 0.0, "cq": 0.0, "ch": 0.0, "cq_n": 0,
                                             "rate": 0.0, "rate_s": 0.0, "points": []})
        a["engines"].add(b.engine)
        if b.model:
            a["models"].add(b.model)
        a["seconds"] += seconds
        a["tokens"] += w * (b.generated_tokens or 0.0)
        if b.running_mean is not None and b.generated_tokens is not None and seconds > 0:
            # one point of the batching curve: requests running and tokens/s over the bucket, weighted by seconds
            a["points"].append((seconds, b.running_mean, b.generated_tokens / (b.observed_s or b.seconds)))
        if b.cache_queries is not None:
            a["cq"] += w * b.cache_queries
            a["ch"] += w * (b.cache_hits or 0.0)
            a["cq_n"] += 1
        for key, v in (("run", b.running_mean), ("wait", b.waiting_mean), ("batch", b.batch_mean),
                       ("rate", b.cache_hit_rate)):
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
            "user_name": r["user_name"], "pod": r["name"], "namespace": r["account"] or "",
            "service": service_of(a["workload"], r["name"]), "engine": ",".join(sorted(a["engines"])),
            "model": ",".join(sorted(a["models"])), "tokens": a["tokens"], "gpu_hours": gpu_h, "cost": cost,
            "metric_hours": min(gpu_h, a["seconds"] / H * (r["gpus"] or 1)), "_r": r,
            "run_s": a["run_s"], "run": a["run"],
            "concurrency": _mean(a["run"], a["run_s"]), "waiting": _mean(a["wait"], a["wait_s"]),
            "batch": _mean(a["batch"], a["batch_s"]),
            "cost_per_million": cost / a["tokens"] * 1e6 if a["tokens"] > 0 else None,
            "tokens_per_gpu_hour": a["tokens"] / gpu_h if gpu_h > 0 else None,
            "sm": _mean(r["sm_s"], sm_obs), "dram": _mean(r["dram_s"], sm_obs),
            "cache_queries": a["cq"] if a["cq_n"] else None, "cache_hits": a["ch"] if a["cq_n"] else None,
            "rate": a["rate"], "rate_s": a["rate_s"], "points": a["points"],
        })
    return out


def chip_state(p: dict[str, Any], th: Thresholds) -> str:
    """memory-bound, low (SM activity) or "" (neither, or no profiling fields)."""
    if p["dram"] is not None and p["dram"] >= HINT_DRAM_HIGH - 1e-9:
        return "memory-bound"
    if p["sm"] is not None and p["sm"] < th.low_efficiency_sm - 1e-9:
        return "low"
    return ""


def headroom(p: dict[str, Any], th: Thresholds) -> str:
    """The batching_headroom rule's sentence for one pod, "" when it does not hold."""
    state = chip_state(p, th)
    conc = p["concurrency"]
    if not state or conc is None or conc >= BATCHING_CONCURRENCY - 1e-9 or \
            p["metric_hours"] < BATCHING_MIN_GPU_HOURS - 1e-9:
        return ""
    chip = "a memory-bound chip" if state == "memory-bound" else "a chip with low SM activity"
    return f"mean concurrency {conc:.1f} on {chip}: batching would raise tokens per GPU-hour"


def cache_hit_rate(ps: list[dict[str, Any]]) -> tuple[float | None, str]:
    """The prompt-cache hit rate of some pods and how it was measured: found / looked-up tokens where an engine
    counts them (vLLM; 0 looked up: caching off, no rate), else the seconds-weighted mean of a hit-rate gauge
    (SGLang); (None, "") when neither."""
    queries = sum(p["cache_queries"] or 0.0 for p in ps)
    if queries > 0:
        return sum(p["cache_hits"] or 0.0 for p in ps) / queries, "tokens"
    rate_s = sum(p["rate_s"] for p in ps)
    if rate_s > 0:
        return sum(p["rate"] for p in ps) / rate_s, "gauge"
    return None, ""


def curve(points: list[tuple[float, float, float]]) -> list[dict[str, float]]:
    """The batching curve of (seconds, requests running, tokens/s) points: per half-octave bin of requests
    running (bin k = round(2 log2(running)): 1, 1.4, 2, 2.8, 4, ...; below 0.5 running: no point, the server
    was about idle), the seconds-weighted mean requests running and tokens/s, by requests running."""
    acc: dict[int, list[float]] = {}
    for s, c, t in points:
        if c < 0.5:
            continue
        k = round(2 * math.log2(c))
        x = acc.setdefault(k, [0.0, 0.0, 0.0])
        x[0] += s
        x[1] += s * c
        x[2] += s * t
    return [{"running": x[1] / x[0], "tokens_per_s": x[2] / x[0], "hours": x[0] / H}
            for _k, x in sorted(acc.items())]


def at(pts: list[dict[str, float]], c: float) -> float:
    """Tokens/s of the curve at ``c`` requests running (linear between its points, flat beyond them)."""
    if c <= pts[0]["running"]:
        return pts[0]["tokens_per_s"]
    for p, q in zip(pts, pts[1:], strict=False):
        if c <= q["running"]:
            return p["tokens_per_s"] + (q["tokens_per_s"] - p["tokens_per_s"]) * (c - p["running"]) / (
                q["running"] - p["running"])
    return pts[-1]["tokens_per_s"]


def knee(points: list[tuple[float, float, float]], concurrency: float | None) -> dict[str, Any] | None:
    """The batching knee of a service's curve (:func:`curve`): per request, the first bin gives e0 = tokens/s
    / requests running; walking up the bins, the knee is the last point before the first step whose gain
    (added tokens/s per added request) is below :data:`KNEE_GAIN` x e0 (no such step: the highest point, the
    curve still rising where it was seen). A service whose mean concurrency is left of the knee leaves
    (the curve at the knee - the curve at its concurrency) tokens/s per pod on the chip. None without
    points; ``knee`` None with fewer than :data:`KNEE_MIN_POINTS` bins."""
    pts = curve(points)
    if not pts:
        return None
    out: dict[str, Any] = {"points": pts, "knee": None, "left_of_knee": False, "leaves_tokens_per_s": None,
                           "leaves_share": None, "rising": False}
    if len(pts) < KNEE_MIN_POINTS:
        return out
    e0 = pts[0]["tokens_per_s"] / pts[0]["running"]
    k = len(pts) - 1
    for i in range(1, len(pts)):
        dx = pts[i]["running"] - pts[i - 1]["running"]
        if dx > 0 and (pts[i]["tokens_per_s"] - pts[i - 1]["tokens_per_s"]) / dx < KNEE_GAIN * e0 - 1e-9:
            k = i - 1
            break
    else:
        out["rising"] = True
    out["knee"] = {"running": pts[k]["running"], "tokens_per_s": pts[k]["tokens_per_s"]}
    if concurrency is not None and concurrency < pts[k]["running"] - 1e-9:
        now = at(pts, concurrency)
        out.update(left_of_knee=True, at_tokens_per_s=now,
                   leaves_tokens_per_s=max(0.0, pts[k]["tokens_per_s"] - now),
                   leaves_share=max(0.0, pts[k]["tokens_per_s"] - now) / pts[k]["tokens_per_s"]
                   if pts[k]["tokens_per_s"] > 0 else None)
    return out


def low_cache(rate: float | None) -> bool:
    """A service with caching on (a hit rate measured) below :data:`LOW_CACHE_HIT_RATE`."""
    return rate is not None and rate < LOW_CACHE_HIT_RATE - 1e-9


def services(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per service (:func:`service_key`: cluster, namespace, workload): the sums of its pods, cost per million
    tokens, tokens per GPU-hour and the seconds-weighted mean concurrency; most expensive per token first."""
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = defaultdict(list)
    for p in rows:
        groups[service_key(p["cluster"], p["namespace"], p["service"])].append(p)
    out = []
    for (cluster, namespace, service), ps in groups.items():
        tokens = sum(p["tokens"] for p in ps)
        gpu_h = sum(p["gpu_hours"] for p in ps)
        cost = sum(p["cost"] for p in ps)
        run_s = sum(p["run_s"] for p in ps)
        hit, how = cache_hit_rate(ps)
        queries = sum(p["cache_queries"] or 0.0 for p in ps)
        out.append({"cache_hit_rate": hit, "cache_measured": how,
                    "cache_queries": queries if how == "tokens" else None,
                    "cache_hits": sum(p["cache_hits"] or 0.0 for p in ps) if how == "tokens" else None,
                    "low_cache_hit_rate": low_cache(hit), "cluster": cluster, "namespace": namespace,
                    "service": service, "team": ps[0]["team"],
                    "engine": ",".join(sorted({p["engine"] for p in ps})),
                    "model": ",".join(sorted({p["model"] for p in ps if p["model"]})), "pods": len(ps),
                    "tokens": tokens, "gpu_hours": gpu_h, "cost": cost,
                    "cost_per_million": cost / tokens * 1e6 if tokens > 0 else None,
                    "tokens_per_gpu_hour": tokens / gpu_h if gpu_h > 0 else None,
                    "concurrency": sum(p["run"] for p in ps) / run_s if run_s > 0 else None,
                    "batching_headroom": any(p.get("headroom") for p in ps),
                    "knee": knee([x for p in ps for x in p["points"]],
                                 sum(p["run"] for p in ps) / run_s if run_s > 0 else None)})
    out.sort(key=order)
    return out


def order(s: dict[str, Any]) -> tuple[Any, ...]:
    """Services' order: dearest per million tokens first, then by name, namespace and cluster."""
    return (s["cost_per_million"] is None, -(s["cost_per_million"] or 0.0), s["service"], s.get("namespace") or "",
            s["cluster"])


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

