"""Findings: judged seconds per allocation (from :mod:`auditor.audit.run`) -> flagged problems with evidence.

Each rule reads the per-allocation totals the SQL produced; only the sparkline and per-GPU checks go back
to the store, in set-based queries over the flagged allocations.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from sqlalchemy import Connection, insert, text

from auditor import energy, jsonsafe
from auditor.audit import goodput, infra, kinds, parallel, rightsize, stragglers, waiting
from auditor.audit.efficiency import low_efficiency
from auditor.audit.episodes import idle_episodes
from auditor.audit.evidence import (
    _finding,
    _ratio,
    accountable,
    judged,
    util_only,
    verified,
    whole_allocation_finding,
    whole_idle,
)
from auditor.audit.ghosts import unallocated_ghosts
from auditor.audit.hygiene import request_hygiene
from auditor.audit.money import Pricing
from auditor.audit.reservations import idle_reservations
from auditor.audit.sparklines import sparkline_texts
from auditor.audit.timing import step
from auditor.audit.verdict import EPS
from auditor.config import Config, Thresholds
from auditor.store import schema
from auditor.store.ingest_pg import copy_dicts
from auditor.timeutil import H


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
    if util >= th.ghost_gpu_util - eps and fb is not None and fb <= th.ghost_max_fb_mib + eps:
        return "ghost_busy", f"GPU-Util {util:.0%} with {fb:.0f} MiB used: no process holds the GPU"
    power = _ratio(r.get("mirage_power_s") or 0.0, r.get("mirage_power_observed_s") or 0.0)
    if (r["gpus"] >= 2 and util >= th.hung_gpu_util - eps and power is not None
            and power <= th.hung_max_power_w + eps and fb is not None and fb >= th.hung_held_mib - eps):
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
            elif (g["low_s"] + g["working_s"] + g["busy_unverified_s"]) / gj >= th.idle_gpus_worked_fraction:
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


def per_gpu_rows(conn: Connection, run_id: int) -> dict[int, list[dict[str, Any]]]:
    """Per-GPU seconds of the multi-GPU allocations of a run (only the columns the idle_gpus rule reads:
    a fleet has hundreds of thousands of these rows)."""
    cols = ("gpu_index", "reserved_s", "observed_s", "idle_s", "mirage_s", "low_s", "working_s",
            "busy_unverified_s", "infra_s", "idle_peak_fb_mib", "node")
    sql = (f"SELECT u.allocation_id, {', '.join('u.' + c for c in cols[:-1])}, ag.node FROM usage_gpu u JOIN "
           "(SELECT allocation_id FROM usage_gpu WHERE run_id = :run GROUP BY allocation_id HAVING COUNT(*) >= 2) m "
           "ON m.allocation_id = u.allocation_id JOIN allocated_gpus ag ON ag.id = u.allocated_gpu_id "
           "WHERE u.run_id = :run ORDER BY u.allocation_id, ag.node, u.allocated_gpu_id")
    # ordered: the idle_gpus evidence lists GPUs in this order (without it, the order rows happened to be
    # stored in, which differs when several connections judged the run)
    out: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for r in conn.execute(text(sql), {"run": run_id}):
        out[r[0]].append(dict(zip(cols, r[1:], strict=True)))
    return out


def find_all(conn: Connection, run_id: int, per_alloc: list[dict[str, Any]], th: Thresholds, cfg: Config,
             *, since: int, until: int, horizon: int, clusters: list[str] | None = None) -> dict[str, Any]:
    """Store the findings of one run; return the run's headline summary."""
    from auditor.audit.capacity import capacity

    p = {"since": since, "until": until, "horizon": horizon, "run": run_id}
    # reads of committed rows only, begun now on a helper connection where the run has them (else run where
    # they are used): they overlap the Python of the rules below
    ghosts = parallel.later(conn, unallocated_ghosts, run_id, th, p, clusters)
    checked = parallel.later(conn, verification, run_id)
    room = parallel.later(conn, lambda c: capacity(c, since, until, horizon=horizon))
    with step("core rules"):
        gpus = per_gpu_rows(conn, run_id)
        rows: list[dict[str, Any]] = []
        for r in per_alloc:
            for kind, ev in classify(r, th, gpus.get(r["allocation_id"], [])):
                idle_h = (ev.pop("partial_idle_gpu_hours", None) if kind == "idle_gpus"
                          else (r["idle_s"] + r["mirage_s"]) / H)
                if kind == "unmonitored":
                    idle_h = 0.0  # never counted or billed as idle
                rows.append(_finding(run_id, kind, r, ev, idle_h, since, horizon))
        del gpus  # the per-GPU rows (hundreds of thousands at fleet scale) are done with
        # the allocations not reported as a whole, judged once for the episode, efficiency and right-sizing rules
        working = [r for r in per_alloc if not whole_idle(r, th)]
    flagged = frozenset(f["allocation_id"] for f in rows)
    extra: dict[str, Any] = {}
    with step("opportunity (queue, quota)"):
        opp = opportunity(conn, run_id, per_alloc, th, cfg, {"since": since, "until": until, "horizon": horizon,
                                                             "run": run_id}, clusters)
    rows += opp.pop("findings")
    rows += extra_findings(conn, run_id, per_alloc, th, cfg, since=since, until=until, horizon=horizon,
                           flagged=flagged, clusters=clusters, summary=extra, ghosts=ghosts, working=working)
    rows = [f for f in rows if f["gpu_hours"] >= th.min_finding_gpu_hours]  # 9-second array tasks: noise
    with step("nodes that cost us"):
        nodes = infra.nodes_that_cost(conn, run_id, th, since, horizon, clusters)
    rows += infra.lemon_findings(run_id, nodes, th)  # repeated faults matter even on a node nobody held
    with step("goodput (failed restarts)"):
        rows += goodput.restart_findings(conn, run_id, th)
    # the thresholds are the run's (audit_runs.thresholds), stored once, not in every finding's evidence: the
    # same 1.2 kB of JSON encoded 60,000 times at 16,384 GPUs, and stripped again by every export
    resv = reservation_unused(rows)  # read before the evidence is written away
    by_id = {r["allocation_id"]: r for r in per_alloc}
    models = rightsize.cluster_models(conn, Pricing(cfg))
    rows.sort(key=lambda f: (f["allocation_id"] is None, f["allocation_id"] or 0))
    chunks = [rows[i:i + 5000] for i in range(0, len(rows), 5000)]  # never every sparkline in memory at once

    def spark_ahead(chunk: list[dict[str, Any]]) -> Callable[[], dict[int, dict]]:
        """The chunk's sparklines, read on helper connections while the chunk before is written, where the
        run has helpers (at most two chunks' sparklines in memory)."""
        ids = sorted({f["allocation_id"] for f in chunk if f["allocation_id"] is not None})
        return parallel.ahead(conn, lambda: sparkline_texts(conn, run_id, ids, since, horizon,
                                                            helpers_only=parallel.readers(conn) > 1))

    pending = spark_ahead(chunks[0]) if chunks else None
    for k, chunk in enumerate(chunks):
        with step("sparklines"):
            spark = pending()  # type: ignore[misc]
        if k + 1 < len(chunks):
            pending = spark_ahead(chunks[k + 1])
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
    with step("summary"):
        summary = summarise(per_alloc, rows, cfg)
        summary.update(resv)
        summary["verification_by_node_group"] = checked()
        summary["capacity"] = room()
        summary["infra_nodes"] = nodes
        summary["energy"] = energy.summary(per_alloc, cfg.energy)
        summary["right_sizing"] = rightsize.by_team(working, th, cfg.prices, models, working=True)
    summary.update(extra)
    summary["opportunity"] = opp
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


def opportunity(conn: Connection, run_id: int, per_alloc: list[dict[str, Any]], th: Thresholds, cfg: Config,
                p: dict[str, Any], clusters: list[str] | None = None) -> dict[str, Any]:
    """idle_while_queued and idle_quota findings, and the run summary's "opportunity" section (of
    ``clusters`` only, when the audit is limited to some)."""
    from auditor.audit.money import Pricing
    from auditor.audit.queue import idle_quota, idle_while_queued

    queued, waiting = idle_while_queued(conn, run_id, per_alloc, th, p, clusters)
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
    """Per cluster and node group: reserved GPU-hours verified by SM activity, judged by GPU-Util only, and
    unknown; advice where GPU-Util-only time shows the profiling fields are missing."""
    sql = ("SELECT a.cluster, ag.node, SUM(u.reserved_s) AS reserved_s, SUM(u.sm_observed_s) AS verified_s, "
           "SUM(u.idle_by_util_s + u.busy_unverified_s) AS util_only_s, SUM(u.unknown_s) AS unknown_s "
           "FROM usage_gpu u JOIN allocated_gpus ag ON ag.id = u.allocated_gpu_id "
           "JOIN allocations a ON a.id = u.allocation_id WHERE u.run_id = :run GROUP BY a.cluster, ag.node")
    groups: dict[tuple[str, str], dict[str, Any]] = {}
    for r in conn.execute(text(sql), {"run": run_id}):
        g = groups.setdefault((r.cluster, node_group(r.node)), {"nodes": 0, "reserved_s": 0.0, "verified_s": 0.0,
                                                                 "util_only_s": 0.0, "unknown_s": 0.0})
        g["nodes"] += 1
        for k in ("reserved_s", "verified_s", "util_only_s", "unknown_s"):
            g[k] += float(getattr(r, k) or 0.0)
    out = []
    for (cluster, group), g in sorted(groups.items()):
        out.append({"cluster": cluster, "node_group": group, "nodes": g["nodes"],
                    "reserved_gpu_hours": g["reserved_s"] / H, "verified_gpu_hours": g["verified_s"] / H,
                    "util_only_gpu_hours": g["util_only_s"] / H, "unknown_gpu_hours": g["unknown_s"] / H,
                    "advice": COUNTERS_ADVICE if g["util_only_s"] > 0 else None})
    return out


def summarise(per_alloc: list[dict[str, Any]], findings: list[dict[str, Any]], cfg: Config) -> dict[str, Any]:
    """Headline numbers of a run; observed = verified by SM activity + GPU-Util only."""
    tot: dict[str, float] = defaultdict(float)
    clusters: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for r in per_alloc:
        for c in ("reserved_s", "observed_s", "idle_s", "idle_by_util_s", "mirage_s", "low_s", "working_s",
                  "busy_unverified_s", "unknown_s", "infra_s", "gpu_util_s", "util_observed_s",
                  "sm_s", "sm_observed_s"):
            tot[c] += r[c]
        k = clusters[r["cluster"]]
        k["reserved_s"] += r["reserved_s"]
        k["verified_s"] += verified(r)
        k["util_only_s"] += util_only(r)
        k["unknown_s"] += r["unknown_s"]
        tot["reserved_cost"] += r["reserved_s"] / H * r["price"]
        tot["idle_cost"] += (r["idle_s"] + r["mirage_s"]) / H * r["price"]
        tot["infra_cost"] += r["infra_s"] / H * r["price"]
    kinds: dict[str, int] = defaultdict(int)
    for f in findings:
        kinds[f["kind"]] += 1
    eff_h = tot["sm_s"] / H  # effective seconds are the SM sum (evidence.effective)
    util_only_h = (tot["idle_by_util_s"] + tot["busy_unverified_s"]) / H
    return {"allocations": len(per_alloc), "currency": cfg.prices.currency,
            "reserved_gpu_hours": tot["reserved_s"] / H, "observed_gpu_hours": tot["observed_s"] / H,
            "coverage": _ratio(tot["observed_s"], tot["reserved_s"] - tot["infra_s"]),
            "verified_gpu_hours": tot["sm_observed_s"] / H, "util_only_gpu_hours": util_only_h,
            "effective_gpu_hours": eff_h, "idle_gpu_hours": (tot["idle_s"] + tot["mirage_s"]) / H,
            "idle_only_gpu_hours": tot["idle_s"] / H, "idle_by_util_gpu_hours": tot["idle_by_util_s"] / H,
            "mirage_gpu_hours": tot["mirage_s"] / H, "low_gpu_hours": tot["low_s"] / H,
            "working_gpu_hours": tot["working_s"] / H, "busy_unverified_gpu_hours": tot["busy_unverified_s"] / H,
            "unknown_gpu_hours": tot["unknown_s"] / H, "infra_gpu_hours": tot["infra_s"] / H,
            "infra_cost": tot["infra_cost"],
            "mean_gpu_util": _ratio(tot["gpu_util_s"], tot["util_observed_s"]),
            "mean_sm_active": _ratio(tot["sm_s"], tot["sm_observed_s"]),
            "reserved_cost": tot["reserved_cost"], "idle_cost": tot["idle_cost"],
            "cost_per_effective_gpu_hour": tot["reserved_cost"] / eff_h if eff_h > 0 else None,
            "verification_by_cluster": [
                {"cluster": c, "reserved_gpu_hours": k["reserved_s"] / H, "verified_gpu_hours": k["verified_s"] / H,
                 "util_only_gpu_hours": k["util_only_s"] / H, "unknown_gpu_hours": k["unknown_s"] / H,
                 "advice": COUNTERS_ADVICE if k["util_only_s"] > 0 else None} for c, k in sorted(clusters.items())],
            "advice": COUNTERS_ADVICE if util_only_h > 0 else None,
            "findings": dict(sorted(kinds.items()))}


def extra_findings(conn: Connection, run_id: int, per_alloc: list[dict[str, Any]], th: Thresholds, cfg: Config, *,
                   since: int, until: int, horizon: int, flagged: frozenset[int] = frozenset(),
                   clusters: list[str] | None = None, summary: dict[str, Any] | None = None,
                   ghosts: Callable[[], list[dict[str, Any]]] | None = None,
                   working: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """idle_episode, low_efficiency, idle_reservation, ghost_busy on GPUs nobody held and request_hygiene
    findings of one run (finding-table rows).
    ``flagged``: allocations a core rule already reported (idle GPUs explain a low mean: no low_efficiency).
    ``summary``: receives the per-team request-hygiene rollup (``request_hygiene_by_team``).
    ``ghosts``: the ghost findings begun earlier (:func:`auditor.audit.parallel.later`), else read here.
    ``working``: the rows of ``per_alloc`` not reported as a whole (:func:`whole_idle`), where already known."""
    p = {"since": since, "until": until, "horizon": horizon, "run": run_id}
    if working is None:
        working = [r for r in per_alloc if not whole_idle(r, th)]
    with step("idle episodes"):
        out = idle_episodes(conn, run_id, working, th, p)
    with step("low efficiency"):
        out += low_efficiency(run_id, [r for r in working if r["allocation_id"] not in flagged], th, since, horizon)
    with step("idle reservations"):
        out += idle_reservations(conn, run_id, cfg, p, clusters, th)
    with step("ghosts on unallocated GPUs"):
        out += ghosts() if ghosts is not None else unallocated_ghosts(conn, run_id, th, p, clusters)
    with step("inference services"):
        from auditor.audit import inference

        out += inference.findings(conn, run_id, per_alloc, th, since, horizon, summary)
    with step("request hygiene"):
        hygiene, teams = request_hygiene(conn, run_id, th, p)
    if summary is not None:
        summary["request_hygiene_by_team"] = teams
    with step("where the waiting goes, stragglers"):
        waits = waiting.breakdown(per_alloc, waiting.class_seconds(conn, run_id))
        strag = stragglers.stragglers(conn, run_id, per_alloc, th, p)
    if summary is not None:
        summary["waiting"] = waits
    return out + hygiene + strag
