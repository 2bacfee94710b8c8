"""Slurm request hygiene (issue 19 §5): time limit versus runtime, GPUs requested versus GPUs used, across a
user's GPU jobs.

Jobs: Slurm allocations of the audit run that ended inside the window (runtime = end - start, the whole
job). Per job the store gives the time limit (``allocations.time_limit_s``) and, from the run's
``usage_gpu`` rows (one per requested GPU, summed set-based in SQL), which GPUs were *seen* (observed at
least ``unmonitored_coverage`` of their reserved time: missing data is never "unused") and which of those
were *unused* (not one low, working or busy-unverified second in the window). Per cluster and user, over
the grouped rows streamed in user order (one user's ratios in memory at a time): the median and p90
(nearest rank) of runtime / time limit, and the share of seen GPUs that were unused. A user with at least
``hygiene_min_jobs`` jobs is flagged (``request_hygiene``, to the user) when the median is below
``hygiene_runtime_ratio`` or the unused share is at least ``hygiene_unused_gpus``. The finding's idle
GPU-hours and cost are those of the unused GPUs (already idle in every total: not added again).
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Iterator
from itertools import groupby
from typing import Any

from sqlalchemy import Connection, text

from auditor.audit.verdict import EPS
from auditor.config import Thresholds
from auditor.timeutil import H

# request_hygiene's constants (docs/definitions.md; `[thresholds]` settings until issue 45).
#: a user is judged on at least this many ended Slurm GPU jobs in the window, per cluster (fewer: no pattern)
HYGIENE_MIN_JOBS = 5
#: flagged when the median of runtime / time limit over the user's jobs is below this (a quarter: limits 4x
#: too long keep the backfill scheduler from placing other jobs)...
HYGIENE_RUNTIME_RATIO = 0.25
#: ...or when at least this share of the GPUs the user's jobs requested (and telemetry saw) never worked
HYGIENE_UNUSED_GPUS = 0.25

JOBS = """SELECT a.cluster, a.user_name, a.account, ua.team, a.id, a.start_ts, a.end_ts, a.time_limit_s,
 COUNT(*) AS gpus, SUM(CASE WHEN {seen} THEN 1 ELSE 0 END) AS seen,
 SUM(CASE WHEN {unused} THEN 1 ELSE 0 END) AS unused,
 SUM(CASE WHEN {unused} THEN u.reserved_s ELSE 0 END) AS unused_s,
 SUM(CASE WHEN {unused} THEN u.reserved_s * ua.price_per_gpu_hour ELSE 0 END) AS unused_cost_s,
 SUM(u.reserved_s) AS reserved_s
FROM usage_gpu u JOIN allocations a ON a.id = u.allocation_id
JOIN usage_allocation ua ON ua.run_id = u.run_id AND ua.allocation_id = u.allocation_id
WHERE u.run_id = :run AND a.source = 'slurm' AND a.start_ts IS NOT NULL AND a.end_ts IS NOT NULL
 AND a.end_ts > :since AND a.end_ts <= :horizon
GROUP BY a.cluster, a.user_name, a.account, ua.team, a.id, a.start_ts, a.end_ts, a.time_limit_s
ORDER BY a.cluster, a.user_name, a.id"""


def jobs_sql(th: Thresholds) -> str:
    seen = f"u.reserved_s > 0 AND u.observed_s >= {th.unmonitored_coverage!r} * u.reserved_s - {EPS!r}"
    unused = f"{seen} AND u.low_s + u.working_s + u.busy_unverified_s + u.input_wait_s <= 0"
    return JOBS.format(seen=seen, unused=unused)


def p90(xs: list[float]) -> float:
    """Nearest-rank 90th percentile: the smallest value with at least 90 % of the values at or below it."""
    s = sorted(xs)
    return s[max(0, math.ceil(0.9 * len(s)) - 1)]


def user_stats(jobs: list[dict[str, Any]]) -> dict[str, Any]:
    """The request-hygiene numbers of one user's jobs (rows of :data:`JOBS`)."""
    ratios = [(j["end_ts"] - j["start_ts"]) / j["time_limit_s"] for j in jobs if (j["time_limit_s"] or 0) > 0]
    seen = sum(int(j["seen"] or 0) for j in jobs)
    unused = sum(int(j["unused"] or 0) for j in jobs)
    teams = Counter(j["team"] or "" for j in jobs)
    return {"jobs": len(jobs), "jobs_with_limit": len(ratios),
            "median_runtime_ratio": statistics.median(ratios) if ratios else None,
            "p90_runtime_ratio": p90(ratios) if ratios else None,
            "gpus_requested": sum(int(j["gpus"] or 0) for j in jobs), "gpus_seen": seen, "gpus_unused": unused,
            "unused_share": unused / seen if seen else None,
            "unused_gpu_hours": sum(float(j["unused_s"] or 0.0) for j in jobs) / H,
            "unused_cost": sum(float(j["unused_cost_s"] or 0.0) for j in jobs) / H,
            "reserved_gpu_hours": sum(float(j["reserved_s"] or 0.0) for j in jobs) / H,
            "team": min(teams, key=lambda t: (-teams[t], t)),
            "accounts": sorted({j["account"] or "" for j in jobs}),
            "first_ts": min(j["start_ts"] for j in jobs), "last_ts": max(j["end_ts"] for j in jobs)}


def verdicts(st: dict[str, Any], th: Thresholds) -> list[str]:
    """Why a user is flagged: "time_limit", "unused_gpus", both or none."""
    out = []
    if st["jobs"] < HYGIENE_MIN_JOBS:
        return out
    if (st["jobs_with_limit"] >= HYGIENE_MIN_JOBS and st["median_runtime_ratio"] is not None
            and st["median_runtime_ratio"] < HYGIENE_RUNTIME_RATIO - EPS):
        out.append("time_limit")
    if st["unused_share"] is not None and st["unused_share"] >= HYGIENE_UNUSED_GPUS - EPS:
        out.append("unused_gpus")
    return out


def _users(conn: Connection, run_id: int, th: Thresholds, p: dict[str, Any]
           ) -> Iterator[tuple[tuple[str, str], list[dict[str, Any]]]]:
    res = conn.execute(text(jobs_sql(th)), {"run": run_id, "since": p["since"], "horizon": p["horizon"]})
    keys = tuple(res.keys())
    rows = (dict(zip(keys, r, strict=True)) for r in res)  # plain rows: a RowMapping per job cost 3x as much
    for key, group in groupby(rows, key=lambda r: (r["cluster"], r["user_name"])):
        yield key, list(group)


class TeamTally:
    """One team's request-hygiene numbers, summed job by job (only the runtime ratios are kept, for the
    median and p90: holding every job row of a 16,384-GPU week cost ~160 MiB)."""

    __slots__ = ("ratios", "jobs", "gpus", "seen", "unused", "unused_s", "unused_cost_s", "users")

    def __init__(self) -> None:
        self.ratios: list[float] = []
        self.jobs = self.gpus = self.seen = self.unused = 0
        self.unused_s = self.unused_cost_s = 0.0
        self.users: set[tuple[str, str]] = set()

    def add(self, j: dict[str, Any]) -> None:
        self.jobs += 1
        if (j["time_limit_s"] or 0) > 0:
            self.ratios.append((j["end_ts"] - j["start_ts"]) / j["time_limit_s"])
        self.gpus += int(j["gpus"] or 0)
        self.seen += int(j["seen"] or 0)
        self.unused += int(j["unused"] or 0)
        self.unused_s += float(j["unused_s"] or 0.0)
        self.unused_cost_s += float(j["unused_cost_s"] or 0.0)
        self.users.add((j["cluster"], j["user_name"]))

    def merge(self, o: TeamTally) -> None:
        """Add the tally of the same team's jobs in other clusters (per-cluster audit processes)."""
        self.ratios += o.ratios
        self.jobs += o.jobs
        self.gpus += o.gpus
        self.seen += o.seen
        self.unused += o.unused
        self.unused_s += o.unused_s
        self.unused_cost_s += o.unused_cost_s
        self.users |= o.users

    def __getstate__(self) -> dict[str, Any]:  # __slots__: pickled for a per-cluster audit process
        return {k: getattr(self, k) for k in self.__slots__}

    def __setstate__(self, state: dict[str, Any]) -> None:
        for k, v in state.items():
            setattr(self, k, v)

    def row(self, team: str, flagged: int) -> dict[str, Any]:
        r = self.ratios
        return {"team": team, "users": len(self.users), "flagged_users": flagged, "jobs": self.jobs,
                "jobs_with_limit": len(r), "median_runtime_ratio": statistics.median(r) if r else None,
                "p90_runtime_ratio": p90(r) if r else None, "gpus_requested": self.gpus, "gpus_seen": self.seen,
                "gpus_unused": self.unused, "unused_share": self.unused / self.seen if self.seen else None,
                "unused_gpu_hours": self.unused_s / H, "unused_cost": self.unused_cost_s / H}


def team_rows(teams: dict[str, TeamTally], flagged: Counter) -> list[dict[str, Any]]:
    """Per team (of each job): the same numbers over all its users' jobs, and how many users were flagged."""
    out = [t.row(team, flagged[team]) for team, t in teams.items()]
    return sorted(out, key=lambda r: (-r["unused_cost"], r["team"]))


def request_hygiene(conn: Connection, run_id: int, th: Thresholds, p: dict[str, Any]
                    ) -> tuple[list[dict[str, Any]], dict[str, TeamTally], Counter]:
    """request_hygiene findings (finding-table rows, one per flagged cluster and user), the per-team tally
    of every judged job (tallied as the jobs stream by) and the flagged users per team: :func:`team_rows`
    makes the rollup of them (after the tallies of per-cluster audit processes are merged)."""
    out = []
    teams: dict[str, TeamTally] = {}
    flagged: Counter = Counter()
    for (cluster, user), jobs in _users(conn, run_id, th, p):
        for j in jobs:
            teams.setdefault(j["team"] or "", TeamTally()).add(j)
        st = user_stats(jobs)
        why = verdicts(st, th)
        if not why:
            continue
        flagged[st["team"]] += 1
        parts = []
        if "time_limit" in why:
            parts.append(f"median runtime {st['median_runtime_ratio']:.0%} of the time limit over "
                         f"{st['jobs_with_limit']} jobs (< {HYGIENE_RUNTIME_RATIO:.0%}): ask for shorter limits, "
                         "they start sooner (backfill)")
        if "unused_gpus" in why:
            parts.append(f"{st['gpus_unused']} of {st['gpus_seen']} requested GPUs never worked "
                         f"(>= {HYGIENE_UNUSED_GPUS:.0%}): request fewer GPUs")
        ev = {"rule": "; ".join(parts), "recipient": "user", "flags": why,
              **{k: v for k, v in st.items() if k not in ("first_ts", "last_ts")}}
        out.append({"run_id": run_id, "kind": "request_hygiene", "cluster": cluster, "allocation_id": None,
                    "reservation_id": None, "account": ",".join(st["accounts"])[:255], "user_name": user,
                    "team": st["team"], "start_ts": max(int(st["first_ts"]), int(p["since"])),
                    "end_ts": int(st["last_ts"]), "gpu_hours": st["reserved_gpu_hours"],
                    "idle_gpu_hours": st["unused_gpu_hours"], "cost": st["unused_cost"], "evidence": ev})
    return out, teams, flagged
