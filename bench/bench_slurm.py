"""Benchmark: parse 10,000 jobs of sacct history into Allocations, from ``sacct -P`` text and from
``sacct --json``, the two history formats the cli backend reads.

The jobs are generated from REAL rows: the text lines reuse the value shapes of the captured 22.05 sacct
output (tests/fixtures/slurm/22.05/2node/running/sacct-X.txt) in the connector's own column layout
(connectors.slurm.jobs.SACCT_FIELDS); the JSON jobs are copies of the captured 24.11 sacct --json objects
(steps included; ``json.loads`` is timed too). Ids, users, accounts, node lists (1-4 nodes of 128), GPU
counts and arrays vary.

Run: python -m bench.bench_slurm [--jobs 10000]
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

from connectors import build
from connectors.base import Context, Problems
from connectors.slurm import jobs

FX = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "slurm"
USERS = [("alice", "team-a"), ("bob", "team-b"), ("carol", "team-a"), ("dave", "team-c")]
STATES = ["COMPLETED", "COMPLETED", "COMPLETED", "FAILED", "CANCELLED by 1003", "TIMEOUT", "RUNNING"]


def _hostlist(first: int, n: int) -> str:
    return f"gpu-node-{first:03d}" if n == 1 else f"gpu-node-[{first:03d}-{first + n - 1:03d}]"


def synth_text(n: int, rng: random.Random) -> str:
    """n sacct -P lines (no header, like ``-n``) in SACCT_FIELDS order."""
    real = [ln.split("|") for ln in (FX / "22.05/2node/running/sacct-X.txt").read_text().splitlines()[2:-1]]
    head = (FX / "22.05/2node/running/sacct-X.txt").read_text().splitlines()[1].split("|")
    times = [(r[head.index("Submit")], r[head.index("Start")], r[head.index("End")]) for r in real
             if r[head.index("End")] not in ("Unknown",) and r[head.index("Start")] not in ("Unknown", "None")]
    lines = []
    for i in range(n):
        user, acct = rng.choice(USERS)
        nodes = rng.choice([1, 1, 1, 2, 4])
        per = rng.choice([1, 2, 4, 8])
        gpus = per * nodes
        submit, start, end = rng.choice(times)
        state = rng.choice(STATES)
        job = 100000 + i
        array = i % 10 == 0
        jid = f"{job - 1}_{i % 7}" if array else str(job)
        tres = f"billing={nodes},cpu={nodes},gres/gpu:h100={gpus},gres/gpu={gpus},node={nodes}"
        row = {"JobID": jid, "JobIDRaw": str(job), "User": user, "Account": acct, "Partition": "gpu",
               "QOS": "normal", "State": state, "Submit": submit, "Start": start,
               "End": "Unknown" if state == "RUNNING" else end, "ElapsedRaw": str(rng.randint(1, 86400)),
               "TimelimitRaw": str(rng.choice([60, 240, 1440])),
               "NodeList": _hostlist(rng.randint(1, 120), nodes), "AllocTRES": tres,
               "ReservationId": "", "Reservation": "", "JobName": f"train-{i % 97}"}
        lines.append("|".join(row[f] for f in jobs.SACCT_FIELDS))
    return "\n".join(lines) + "\n"


def synth_json(n: int, rng: random.Random) -> str:
    """n sacct --json job objects cloned from the real 24.11 capture."""
    real = json.loads((FX / "24.11/running/sacct.json").read_text())
    templates = [j for j in real["jobs"] if any(t["type"] == "gres" for t in j["tres"]["allocated"])]
    out = []
    for i in range(n):
        j = copy.deepcopy(rng.choice(templates))
        user, acct = rng.choice(USERS)
        nodes = rng.choice([1, 1, 1, 2, 4])
        j.update(job_id=100000 + i, user=user, account=acct, nodes=_hostlist(rng.randint(1, 120), nodes))
        for t in j["tres"]["allocated"]:
            if t["type"] == "gres":
                t["count"] = rng.choice([1, 2, 4, 8]) * nodes
        out.append(j)
    return json.dumps({"meta": real["meta"], "jobs": out})


def measure(fn: Callable[[], list]) -> tuple[float, float, int]:
    """(best seconds of 3 untraced calls, peak MiB of one call traced by tracemalloc, allocations);
    tracing slows Python several-fold, so time and memory come from separate calls."""
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - t0)
    del result
    tracemalloc.start()
    count = len(fn())
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return best, peak / 2**20, count


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=10_000)
    n = ap.parse_args().jobs
    rng = random.Random(7)
    text, js = synth_text(n, rng), synth_json(n, rng)
    cli = build("slurm", "allocations", {}, Context("bench")).backend
    runs = {
        "sacct -P text": lambda: list(cli.history_text(text, Problems(), {}, jobs.SACCT_FIELDS)),
        "sacct --json": lambda: cli._history_json(json.loads(js), Problems(), {}),
    }
    print(f"parsing {n:,} jobs of sacct history into Allocations "
          f"(input: text {len(text) / 2**20:.1f} MiB, JSON {len(js) / 2**20:.1f} MiB)")
    print(f"{'format':<16}{'seconds':>9}{'jobs/s':>10}{'peak MiB':>10}{'GPUs':>9}")
    base = None
    for name, fn in runs.items():
        dt, peak, count = measure(fn)
        gpus = sum(len(a.gpus) for a in fn())
        assert count == n, (name, count)
        base = base or dt
        print(f"{name:<16}{dt:>9.3f}{n / dt:>10,.0f}{peak:>10.1f}{gpus:>9,}  ({dt / base:.2f}x text time)")


if __name__ == "__main__":
    main()
