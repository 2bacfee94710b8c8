"""Findings: judged seconds per allocation (from :mod:`auditor.audit.run`) -> flagged problems with evidence.

Each rule reads the per-allocation totals the SQL produced; only the sparkline and per-GPU checks go back
to the store, in set-based queries over the flagged allocations.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, insert, text

from auditor import energy, jsonsafe
from auditor.audit import goodput, hostwait, infra, kinds, rightsize, stragglers, waiting
from auditor.audit.efficiency import low_efficiency
from auditor.audit.episodes import idle_episodes
from auditor.audit.evidence import (
    _finding,
    _ratio,
    accountable,
    counters,
    judged,
    util_only,
    verified,
    whole_allocation_finding,
    whole_idle,
)
from auditor.audit.ghosts import GHOST_GPU_UTIL, GHOST_MAX_FB_MIB, unallocated_ghosts
from auditor.audit.hygiene import request_hygiene, team_rows
from auditor.audit.judging import DEFAULT, Judging
from auditor.audit.money import Pricing
from auditor.audit.reservations import idle_reservations
from auditor.audit.sparklines import sparkline_texts
from auditor.audit.timing import step
from auditor.audit.totals import AllocationRows
from auditor.audit.verdict import EPS
from auditor.config import Config, Thresholds
from auditor.store import schema
from auditor.store.ingest_pg import copy_dicts
from auditor.timeutil import H

# hung_collective's rule constants (docs/definitions.md): what a stuck NCCL collective looks like on any GPU, not
# a site's policy (they were `[thresholds]` settings until issue 45).
#: mean GPU-Util (0-1) over the mirage time at least this (a collective spins the launch queue)...
HUNG_GPU_UTIL = 0.9
#: ...mean power over the mirage time at most this (W: near idle, the SMs do nothing; no power reading: not hung)...
HUNG_MAX_POWER_W = 150.0
#: ...memory held while idle or mirage at least this (MiB: a process with a model loaded), on 2 or more GPUs
HUNG_HELD_MIB = 1024.0


def _held(r: dict[str, Any]) -> str:
    """", held 41 GiB while idle" when memory was held (>= 1 GiB) in idle buckets: a live process."""
    mib = r.get("idle_peak_fb_mib") or 0.0
    return f", held {mib / 1024:.0f} GiB while idle" if mib >= 1024 else ""


def mirage_kind(r: dict[str, Any], th: Thresholds) -> tuple[str, str]:
    """Which mirage this is (docs/definitions.md): ghost_busy (GPU-Util high, no memory used: no process,
    a driver or hardware state), hung_collective (GPU-Util high, power near idle, memory held, 2+ GPUs: a
    stuck NCCL collective), else util_mirage (a process spinning or waiting). Missing power or memory
    readings are no evidence: such a mirage stays util_mirage."""
    eps = EPS
    util = (r.get("mirage_util_s") or 0.0) / r["mirage_s"] if r["mirage_s"] > 0 else 0.0
    fb = r.get("idle_peak_fb_mib")
    if util >= GHOST_GPU_UTIL - eps and fb is not None and fb <= GHOST_MAX_FB_MIB + eps:
        return "ghost_busy", f"GPU-Util {util:.0%} with {fb:.0f} MiB used: no process holds the GPU"
    power = _ratio(r.get("mirage_power_s") or 0.0, r.get("mirage_power_observed_s") or 0.0)
    if (r["gpus"] >= 2 and util >= HUNG_GPU_UTIL - eps and power is not None
            and power <= HUNG_MAX_POWER_W + eps and fb is not None and fb >= HUNG_HELD_MIB - eps):
        return "hung_collective", (f"GPU-Util {util:.0%} at {power:.0f} W holding {fb / 1024:.1f} GiB on "
                                   f"{r['gpus']} GPUs: stuck, not slow")
    return "util_mirage", ""


def _gpu_name(g: dict[str, Any]) -> str:
    idx = g.get("gpu_index")
    node = g.get("node")
    where = f"{node} " if node else ""
    return f"{where}GPU {idx if idx is not None else '?'}"


def classify(r: dict[str, Any], th: Thresholds, per_gpu: list[dict[str, Any]]) -> list[tuple[str, dict]]:
    """The allocation-level findings of one allocation, most specific first. Shares are over all observed
    time (GPU-Util-only time included)."""
    out: list[tuple[str, dict]] = []
    if accountable(r) <= 0:  # nothing but infrastructure-affected time: not the user's
        return out
    whole = whole_allocation_finding(r, th)
    if whole is not None and whole[0] == "unmonitored":
        return [("unmonitored", {"rule": whole[1]})]
    mirage_long = r["max_gpu_mirage_s_max"] >= th.mirage_min_minutes * 60
    if whole is not None:
        idle_frac = whole[1]
        if mirage_long and r["mirage_s"] > r["idle_s"]:
            kind, why = mirage_kind(r, th)
            out.append((kind, {"rule": f"idle by SM activity {idle_frac} of observed time, "
                               "mostly while GPU-Util read busy" + (f"; {why}" if why else "")}))
        else:
            out.append(("idle_allocation", {"rule": f"idle {idle_frac} of observed time >= "
                                            f"{th.idle_allocation_fraction:.0%}{_held(r)}"}))
        return out
    if mirage_long:
        kind, why = mirage_kind(r, th)
        out.append((kind, {"rule": f"a GPU read busy while idle for {r['max_gpu_mirage_s_max'] / 60:.0f} min"
                           + (f"; {why}" if why else "")}))
    if len(per_gpu) >= 2:
        idle, busy = [], []
        for g in per_gpu:
            gj = judged(g)
            if gj <= 0 or (_ratio(g["observed_s"], accountable(g)) or 0) < th.unmonitored_coverage:
                continue
            if (g["idle_s"] + g["mirage_s"]) / gj >= th.idle_gpus_fraction:
                idle.append(g)
            elif (g["low_s"] + g["working_s"] + g["busy_unverified_s"] + g["input_wait_s"] + g["busy_by_counters_s"]
                  + g["engine_spin_s"]) / gj >= th.idle_gpus_worked_fraction:
                busy.append(g)
        if idle and busy:
            named = [f"{_gpu_name(g)} idle {(g['idle_s'] + g['mirage_s']) / judged(g):.0%}{_held(g)}" for g in idle]
            out.append(("idle_gpus", {
                "rule": f"{len(idle)} of {len(per_gpu)} GPUs idle >= {th.idle_gpus_fraction:.0%} while "
                        f"{len(busy)} worked: " + ", ".join(named),
                "idle_gpus": len(idle), "total_gpus": len(per_gpu),
                "idle_gpu_indices": [g["gpu_index"] for g in idle],
                "idle_gpu_names": named,
                "idle_gpu_list": [{"node": g.get("node"), "gpu_index": g["gpu_index"],
                                   "idle_share": (g["idle_s"] + g["mirage_s"]) / judged(g),
                                   "held_while_idle_mib": g.get("idle_peak_fb_mib")} for g in idle],
                "partial_idle_gpu_hours": sum(g["idle_s"] + g["mirage_s"] for g in idle) / H}))
    return out


def per_gpu_rows(conn: Connection, run_id: int, lo: int, hi: int) -> dict[int, list[dict[str, Any]]]:
    """Per-GPU seconds of the multi-GPU allocations of a run with ids in [lo, hi] (only the columns the
    idle_gpus rule reads, one batch of allocations at a time: a fleet has hundreds of thousands of these rows)."""
    cols = ("gpu_index", "reserved_s", "observed_s", "idle_s", "mirage_s", "low_s", "working_s",
            "busy_unverified_s", "idle_by_counters_s", "busy_by_counters_s", "engine_spin_s", "infra_s",
            "input_wait_s", "idle_peak_fb_mib", "node")
    sql = (f"SELECT u.allocation_id, {', '.join('u.' + c for c in cols[:-1])}, ag.node FROM usage_gpu u JOIN "
           "(SELECT allocation_id FROM usage_gpu WHERE run_id = :run AND allocation_id BETWEEN :lo AND :hi "
           "GROUP BY allocation_id HAVING COUNT(*) >= 2) m "
           "ON m.allocation_id = u.allocation_id JOIN allocated_gpus ag ON ag.id = u.allocated_gpu_id "
           "WHERE u.run_id = :run AND u.allocation_id BETWEEN :lo AND :hi "
           "ORDER BY u.allocation_id, ag.node, u.allocated_gpu_id")
    # ordered: the idle_gpus evidence lists GPUs in this order (without it, the order rows happened to be
    # stored in)
    out: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for r in conn.execute(text(sql), {"run": run_id, "lo": lo, "hi": hi}):
        out[r[0]].append(dict(zip(cols, r[1:], strict=True)))
    return out


@dataclass
class Part:
    """What the rules of some clusters found, apart from the findings they wrote: the run summary's parts,
    each still open to :func:`merge` with those of other clusters (per-cluster audit processes,
    :mod:`auditor.audit.processes`)."""

    summary: dict[str, Any]
    headline: Headline
    energy: energy.Tally
    sizing: rightsize.TeamSizing
    hygiene: dict[str, Any]
    kinds: dict[str, int]


def find_clusters(conn: Connection, rows: AllocationRows, th: Thresholds, cfg: Config, *, since: int, until: int,
                  horizon: int, clusters: list[str] | None = None, judging: Judging = DEFAULT) -> Part:
    """Store the findings of the run's allocations in ``rows`` (those of ``clusters``, or all) and return
    their part of the summary. The per-allocation rows stream by once in batches (:class:`AllocationRows`):
    every rule that needs one allocation's totals runs as its row passes and keeps only what it flags;
    rules reading the store (episodes, queues, inference, stragglers) get the rows of the allocations they
    name (``rows.get``). So memory follows the findings, not the fleet. ``judging``: what the sparklines'
    judging reads (:class:`auditor.audit.judging.Judging`)."""
    run_id = rows.run_id
    p = {"since": since, "until": until, "horizon": horizon, "run": run_id}
    pricing = Pricing(cfg)
    models = rightsize.cluster_models(conn, pricing)
    head, tally, sizing = Headline(), energy.Tally(cfg.energy), rightsize.TeamSizing(th, cfg.prices, models)
    core: list[dict[str, Any]] = []
    low: list[dict[str, Any]] = []
    cands: list[int] = []  # the idle episodes' candidates: worked, and were idle some of the time
    with step("core rules"):
        for batch in rows.batches():
            gpus = per_gpu_rows(conn, run_id, batch[0]["allocation_id"], batch[-1]["allocation_id"])
            for r in batch:
                head.add(r)
                tally.add(r)
                mine = classify(r, th, gpus.get(r["allocation_id"], []))
                for kind, ev in mine:
                    idle_h = (ev.pop("partial_idle_gpu_hours", None) if kind == "idle_gpus"
                              else (r["idle_s"] + r["mirage_s"]) / H)
                    if kind == "unmonitored":
                        idle_h = 0.0  # never counted or billed as idle
                    core.append(_finding(run_id, kind, r, ev, idle_h, since, horizon))
                if whole_idle(r, th):  # reported as a whole: no episode, no low efficiency, no right-sizing
                    continue
                sizing.add(r)
                if (r["low_s"] + r["working_s"] + r["busy_unverified_s"] + r["busy_by_counters_s"]
                        + r["engine_spin_s"] > 0 and r["idle_s"] + r["mirage_s"] > 0):
                    cands.append(r["allocation_id"])
                if not mine:  # idle GPUs explain a low mean: no low_efficiency
                    low += low_efficiency(run_id, [r], th, since, horizon)
            del gpus
    found = core
    extra: dict[str, Any] = {}
    with step("opportunity (queue, quota)"):
        opp = opportunity(conn, run_id, rows, th, cfg, p, clusters)
    found += opp.pop("findings")
    with step("idle episodes"):
        found += idle_episodes(conn, run_id, cands, rows.get, th, p)
    del cands
    found += low
    del low
    found += extra_findings(conn, rows, th, cfg, since=since, until=until, horizon=horizon, clusters=clusters,
                            summary=extra)
    found = [f for f in found if f["gpu_hours"] >= th.min_finding_gpu_hours]  # 9-second array tasks: noise
    with step("nodes that cost us"):
        nodes = infra.nodes_that_cost(conn, run_id, th, since, horizon, clusters)
    found += infra.lemon_findings(run_id, nodes, th)  # repeated faults matter even on a node nobody held
    with step("goodput (failed restarts)"):
        found += goodput.restart_findings(conn, run_id, th)
    summary: dict[str, Any] = {**reservation_unused(found), "infra_nodes": nodes,
                               "verification_by_node_group": verification(conn, run_id), **extra,
                               "opportunity": opp}
    kinds_found: dict[str, int] = defaultdict(int)
    for f in found:
        kinds_found[f["kind"]] += 1
    write_findings(conn, rows, found, th, cfg, models, since=since, horizon=horizon, judging=judging)
    return Part(summary, head, tally, sizing, summary.pop("request_hygiene_tally"), dict(kinds_found))


def write_findings(conn: Connection, rows: AllocationRows, found: list[dict[str, Any]], th: Thresholds, cfg: Config,
                   models: dict[str, list[rightsize.Option]], *, since: int, horizon: int,
                   judging: Judging = DEFAULT) -> None:
    """Write findings in allocation order, 5,000 at a time, each with its allocation's right-sizing hint and
    sparkline (read per chunk: never every sparkline in memory at once). The thresholds are the run's
    (audit_runs.thresholds), stored once, not in every finding's evidence."""
    run_id = rows.run_id
    found.sort(key=lambda f: (f["allocation_id"] is None, f["allocation_id"] or 0))
    for i in range(0, len(found), 5000):
        chunk = found[i:i + 5000]
        ids = sorted({f["allocation_id"] for f in chunk if f["allocation_id"] is not None})
        with step("sparklines"):
            spark = sparkline_texts(conn, run_id, ids, since, horizon, judging)
        by_id = rows.get(ids)
        with step("write findings"):
            for f in chunk:
                aid = f["allocation_id"]
                if aid in by_id:
                    r = by_id[aid]
                    f["evidence"]["right_size"] = rightsize.hint(r, th, cfg.prices, models.get(r["cluster"]))
                if aid in spark:  # the sparkline's JSON text goes in as read (jsonsafe.Encoded)
                    f["evidence"] = jsonsafe.with_member(jsonsafe.dumps(f["evidence"]), "sparkline", spark[aid])
            if conn.dialect.name == "postgresql":  # COPY: binding 40 parameters per row cost seconds
                copy_dicts(conn, schema.findings, chunk)
            else:
                conn.execute(insert(schema.findings), chunk)
            for f in chunk:
                f["evidence"] = None  # stored; only the kind is still needed (summary)


def finish(conn: Connection, parts: list[Part], cfg: Config, *, since: int, until: int, horizon: int
           ) -> dict[str, Any]:
    """The run summary from the parts of its clusters (one part: the whole run as one process judged it;
    several: per-cluster processes, merged in the order given) and the fleet's capacity."""
    from auditor.audit.capacity import capacity

    with step("summary"):
        one = merge(parts)
        x = one.summary
        summary = one.headline.result(one.kinds, cfg)
        summary.update(idle_reservation_gpu_hours=x["idle_reservation_gpu_hours"],
                       idle_reservation_cost=x["idle_reservation_cost"])
        summary["verification_by_node_group"] = x["verification_by_node_group"]
        summary["capacity"] = capacity(conn, since, until, horizon=horizon)
        summary["infra_nodes"] = x["infra_nodes"]
        summary["energy"] = one.energy.result()
        summary["right_sizing"] = one.sizing.result()
        for k in ("inference", "inference_tokens"):  # the order the rules wrote them in
            if k in x:
                summary[k] = x[k]
        summary["request_hygiene_by_team"] = hygiene_teams(one.hygiene)
        summary["waiting"] = x["waiting"]
        summary["opportunity"] = x["opportunity"]
    return summary


def reservation_unused(rows: list[dict[str, Any]]) -> dict[str, float]:
    """The headline's idle reservation figures: reserved GPU-hours of idle reservations that no job used,
    and their cost. Not in ``idle_gpu_hours`` (that counts allocations); the idle hours of jobs inside a
    reservation are (they are the jobs')."""
    h = c = 0.0
    for f in rows:
        if kinds.BY_NAME[f["kind"]].family == "reservation":
            ev = f["evidence"]
            h += float(ev.get("unused_gpu_hours") or 0.0)
            c += float(ev.get("unused_gpu_hours") or 0.0) * float(ev.get("price_per_gpu_hour") or 0.0)
    return {"idle_reservation_gpu_hours": h, "idle_reservation_cost": c}


def opportunity(conn: Connection, run_id: int, rows: AllocationRows, th: Thresholds, cfg: Config,
                p: dict[str, Any], clusters: list[str] | None = None) -> dict[str, Any]:
    """idle_while_queued and idle_quota findings, and the run summary's "opportunity" section (of
    ``clusters`` only, when the audit is limited to some)."""
    from auditor.audit.queue import idle_quota, idle_while_queued

    queued, waiting = idle_while_queued(conn, run_id, rows.get, th, p, clusters)
    quota_findings, quotas = idle_quota(conn, run_id, th, cfg, p, Pricing(cfg).team_of, clusters)
    return {"findings": queued + quota_findings, "idle_while_queued": waiting, "quotas": quotas}


COUNTERS_ADVICE = ("enable the DCGM profiling fields (DCGM_FI_PROF_SM_ACTIVE, ..._DRAM_ACTIVE, "
                   "..._PIPE_TENSOR_ACTIVE) in dcgm-exporter with deploy/dcgm-counters.csv (`gpu-audit deploy "
                   "dcgm-counters > dcgm-counters.csv` writes it), so busy time can be verified")
_GROUP = re.compile(r"[-_.]?\d+$")


def node_group(node: str) -> str:
    """Nodes named alike (gpu-a001, gpu-a002) form a group: the name without its trailing number."""
    return _GROUP.sub("", node) or node


def verification(conn: Connection, run_id: int) -> list[dict[str, Any]]:
    """Per cluster and node group: reserved GPU-hours verified by SM activity, judged on the stock counters,
    by GPU-Util only, and unknown; advice where counters or GPU-Util-only time show SM activity is missing."""
    sql = ("SELECT a.cluster, ag.node, SUM(u.reserved_s) AS reserved_s, SUM(u.sm_observed_s) AS verified_s, "
           "SUM(u.idle_by_counters_s + u.busy_by_counters_s + u.engine_spin_s) AS counters_s, "
           "SUM(u.idle_by_util_s + u.busy_unverified_s) AS util_only_s, SUM(u.unknown_s) AS unknown_s "
           "FROM usage_gpu u JOIN allocated_gpus ag ON ag.id = u.allocated_gpu_id "
           "JOIN allocations a ON a.id = u.allocation_id WHERE u.run_id = :run GROUP BY a.cluster, ag.node")
    groups: dict[tuple[str, str], dict[str, Any]] = {}
    for r in conn.execute(text(sql), {"run": run_id}):
        g = groups.setdefault((r.cluster, node_group(r.node)), {"nodes": 0, "reserved_s": 0.0, "verified_s": 0.0,
                                                                 "counters_s": 0.0, "util_only_s": 0.0,
                                                                 "unknown_s": 0.0})
        g["nodes"] += 1
        for k in ("reserved_s", "verified_s", "counters_s", "util_only_s", "unknown_s"):
            g[k] += float(getattr(r, k) or 0.0)
    out = []
    for (cluster, group), g in sorted(groups.items()):
        out.append({"cluster": cluster, "node_group": group, "nodes": g["nodes"],
                    "reserved_gpu_hours": g["reserved_s"] / H, "verified_gpu_hours": g["verified_s"] / H,
                    "counters_gpu_hours": g["counters_s"] / H,
                    "util_only_gpu_hours": g["util_only_s"] / H, "unknown_gpu_hours": g["unknown_s"] / H,
                    "advice": COUNTERS_ADVICE if g["util_only_s"] + g["counters_s"] > 0 else None})
    return out


_TOTALS = ("reserved_s", "observed_s", "idle_s", "idle_by_util_s", "mirage_s", "low_s", "working_s",
           "busy_unverified_s", "idle_by_counters_s", "busy_by_counters_s", "engine_spin_s", "unknown_s", "infra_s",
           "gpu_util_s", "util_observed_s", "sm_s", "sm_observed_s", "input_wait_s", "host_busy_idle_s")


class Headline:
    """Headline numbers of a run, summed as its per-allocation rows stream by (:meth:`add`) and merged over
    the parts of disjoint clusters (:meth:`merge`); observed = verified by SM activity + GPU-Util only."""

    def __init__(self) -> None:
        self.n = 0
        self.tot: dict[str, float] = defaultdict(float)
        self.clusters: dict[str, dict[str, float]] = {}

    def add(self, r: dict[str, Any]) -> None:
        tot = self.tot
        self.n += 1
        for c in _TOTALS:
            tot[c] += r[c]
        k = self.clusters.get(r["cluster"])
        if k is None:
            k = self.clusters[r["cluster"]] = defaultdict(float)
        k["reserved_s"] += r["reserved_s"]
        k["verified_s"] += verified(r)
        k["counters_s"] += counters(r)
        k["util_only_s"] += util_only(r)
        k["unknown_s"] += r["unknown_s"]
        tot["reserved_cost"] += r["reserved_s"] / H * r["price"]
        tot["idle_cost"] += (r["idle_s"] + r["mirage_s"]) / H * r["price"]
        tot["infra_cost"] += r["infra_s"] / H * r["price"]
        tot["input_wait_cost"] += r["input_wait_s"] / H * r["price"]  # reserved time that did no math, not idle

    def merge(self, other: Headline) -> None:
        self.n += other.n
        for k, v in other.tot.items():
            self.tot[k] += v
        for c, v in other.clusters.items():
            mine = self.clusters.setdefault(c, defaultdict(float))
            for k, x in v.items():
                mine[k] += x

    def __getstate__(self) -> dict[str, Any]:  # picklable (a per-cluster audit process hands it back)
        return {"n": self.n, "tot": dict(self.tot), "clusters": {c: dict(v) for c, v in self.clusters.items()}}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.n = state["n"]
        self.tot = defaultdict(float, state["tot"])
        self.clusters = {c: defaultdict(float, v) for c, v in state["clusters"].items()}

    def result(self, kinds_found: dict[str, int], cfg: Config) -> dict[str, Any]:
        tot, clusters = self.tot, self.clusters
        eff_h = tot["sm_s"] / H  # effective seconds are the SM sum (evidence.effective)
        util_only_h = (tot["idle_by_util_s"] + tot["busy_unverified_s"]) / H
        counters_h = counters(tot) / H
        return {"allocations": self.n, "currency": cfg.prices.currency,
                "reserved_gpu_hours": tot["reserved_s"] / H, "observed_gpu_hours": tot["observed_s"] / H,
                "coverage": _ratio(tot["observed_s"], tot["reserved_s"] - tot["infra_s"]),
                "verified_gpu_hours": tot["sm_observed_s"] / H, "util_only_gpu_hours": util_only_h,
                "counters_gpu_hours": counters_h,
                "tier_gpu_hours": {"sm_active": tot["sm_observed_s"] / H, "counters": counters_h,
                                   "gpu_util": util_only_h},
                "idle_by_counters_gpu_hours": tot["idle_by_counters_s"] / H,
                "busy_by_counters_gpu_hours": tot["busy_by_counters_s"] / H,
                "engine_spin_gpu_hours": tot["engine_spin_s"] / H,
                "effective_gpu_hours": eff_h, "idle_gpu_hours": (tot["idle_s"] + tot["mirage_s"]) / H,
                "idle_only_gpu_hours": tot["idle_s"] / H, "idle_by_util_gpu_hours": tot["idle_by_util_s"] / H,
                "mirage_gpu_hours": tot["mirage_s"] / H, "low_gpu_hours": tot["low_s"] / H,
                "working_gpu_hours": tot["working_s"] / H,
                "busy_unverified_gpu_hours": tot["busy_unverified_s"] / H,
                "unknown_gpu_hours": tot["unknown_s"] / H, "infra_gpu_hours": tot["infra_s"] / H,
                "infra_cost": tot["infra_cost"],
                # a GPU starved by its own job's input (auditor.audit.starved): not idle, priced apart
                "input_wait_gpu_hours": tot["input_wait_s"] / H, "input_wait_cost": tot["input_wait_cost"],
                "host_busy_idle_gpu_hours": tot["host_busy_idle_s"] / H,
                "mean_gpu_util": _ratio(tot["gpu_util_s"], tot["util_observed_s"]),
                "mean_sm_active": _ratio(tot["sm_s"], tot["sm_observed_s"]),
                "reserved_cost": tot["reserved_cost"], "idle_cost": tot["idle_cost"],
                "cost_per_effective_gpu_hour": tot["reserved_cost"] / eff_h if eff_h > 0 else None,
                "verification_by_cluster": [
                    {"cluster": c, "reserved_gpu_hours": k["reserved_s"] / H,
                     "verified_gpu_hours": k["verified_s"] / H, "counters_gpu_hours": k["counters_s"] / H,
                     "util_only_gpu_hours": k["util_only_s"] / H, "unknown_gpu_hours": k["unknown_s"] / H,
                     "advice": COUNTERS_ADVICE if k["util_only_s"] + k["counters_s"] > 0 else None}
                    for c, k in sorted(clusters.items())],
                "advice": COUNTERS_ADVICE if util_only_h + counters_h > 0 else None,
                "findings": dict(sorted(kinds_found.items()))}


def extra_findings(conn: Connection, rows: AllocationRows, th: Thresholds, cfg: Config, *,
                   since: int, until: int, horizon: int, clusters: list[str] | None = None,
                   summary: dict[str, Any]) -> list[dict[str, Any]]:
    """idle_reservation, ghost_busy on GPUs nobody held, batching_headroom, request_hygiene and straggler
    findings of one run (finding-table rows). ``summary`` receives the inference services, the per-team
    request-hygiene tally (``request_hygiene_tally``, :func:`hygiene_teams`) and where the waiting goes."""
    run_id = rows.run_id
    p = {"since": since, "until": until, "horizon": horizon, "run": run_id}
    with step("idle reservations"):
        out = idle_reservations(conn, run_id, cfg, p, clusters, th)
    with step("ghosts on unallocated GPUs"):
        out += unallocated_ghosts(conn, run_id, th, p, clusters)
    with step("inference services"):
        from auditor.audit import inference

        out += inference.findings(conn, run_id, rows.get, th, since, horizon, summary)
    with step("request hygiene"):
        hygiene, teams, flagged = request_hygiene(conn, run_id, th, p)
    summary["request_hygiene_tally"] = {"teams": teams, "flagged": flagged}
    with step("where the waiting goes, stragglers"):
        seconds = waiting.class_seconds(conn, run_id)
        hostwait.refine(conn, run_id, th, p, seconds)
        waits = waiting.breakdown(rows, seconds)
        strag = stragglers.stragglers(conn, run_id, rows.get, th, p)
    summary["waiting"] = waits
    return out + hygiene + strag


def hygiene_teams(tally: dict[str, Any]) -> list[dict[str, Any]]:
    """The run summary's ``request_hygiene_by_team`` from the (merged) tallies of :func:`request_hygiene`."""
    return team_rows(tally["teams"], tally["flagged"])


def merge(parts: list[Part]) -> Part:
    """One part of the summary from those of disjoint clusters, in the order given (one part: itself). Sums
    add up, per-cluster lists are joined and sorted as each rule sorts them, the allocations with the most
    waiting are taken again from every part's (each part keeps its first ones)."""
    if len(parts) == 1:
        return parts[0]
    first, rest = parts[0], parts[1:]
    s = {k: v for k, v in first.summary.items()}
    for o in rest:
        first.headline.merge(o.headline)
        first.energy.merge(o.energy)
        first.sizing.merge(o.sizing)
        for team, t in o.hygiene["teams"].items():
            first.hygiene["teams"].setdefault(team, type(t)()).merge(t)
        first.hygiene["flagged"].update(o.hygiene["flagged"])
        for k, n in o.kinds.items():
            first.kinds[k] = first.kinds.get(k, 0) + n
        x = o.summary
        for k in ("idle_reservation_gpu_hours", "idle_reservation_cost"):
            s[k] += x[k]
        s["verification_by_node_group"] = sorted(s["verification_by_node_group"] + x["verification_by_node_group"],
                                                 key=lambda g: (g["cluster"], g["node_group"]))
        s["infra_nodes"] = infra.sort_nodes(s["infra_nodes"] + x["infra_nodes"])
        if "inference" in x:
            s["inference"] = inference_services_merge(s.get("inference", []), x["inference"])
            s["inference_tokens"] = {**s.get("inference_tokens", {}), **x["inference_tokens"]}
        s["waiting"] = waiting.merge(s["waiting"], x["waiting"])
        s["opportunity"] = queue_merge(s["opportunity"], x["opportunity"])
    first.summary = s
    return first


def inference_services_merge(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Services of disjoint clusters (a service is per cluster), in :func:`auditor.audit.inference.services`'
    order."""
    from auditor.audit.inference import order

    out = a + b
    out.sort(key=order)
    return out


def queue_merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """The "opportunity" sections of disjoint clusters (:func:`auditor.audit.queue.idle_while_queued`)."""
    qa, qb = a["idle_while_queued"], b["idle_while_queued"]
    q = {"by_cluster": sorted(qa["by_cluster"] + qb["by_cluster"], key=lambda r: r["cluster"]),
         "by_team": sorted(qa["by_team"] + qb["by_team"], key=lambda r: (r["cluster"], r["team"])),
         "waiting_jobs": qa["waiting_jobs"] + qb["waiting_jobs"],
         "waiting_gpu_hours": qa["waiting_gpu_hours"] + qb["waiting_gpu_hours"]}
    return {"idle_while_queued": q, "quotas": sorted(a["quotas"] + b["quotas"],
                                                    key=lambda r: (r["cluster"], r["kind"], r["name"]))}
