"""Benchmark: a generated week of saved ``sacct -P`` output whose jobs carry jobstats summaries (``JS1:``
in AdminComment, the public format of PrincetonUniversity/jobstats), read and audited end to end:
allocations through the file connector (format sacct), telemetry through the ``jobstats`` connector, both
into a fresh SQLite store by ``collect``, then ``run_audit`` over the week.

Each size runs in its own process so its peak RSS (``ru_maxrss``) is its own. Targets (issue 14):
10,000 jobs <= 5 s and 100,000 jobs <= 60 s with peak RSS <= 1 GiB, on 2 cores. Generation is not timed.

Jobs: 1, 2, 4 or 8 GPUs on one 8-GPU node, 10 min to 3 h, back to back per node, 90 % with a summary
(a third of their GPUs idle at 0-3 %, the rest 40-99 %), 5 % ``JS1:Short``, 5 % with only Slurm's
``gres/gpuutil`` on a batch step.

Run: python -m bench.bench_jobstats [--jobs 10000,100000] [--bucket 3600]
"""

from __future__ import annotations

import argparse
import heapq
import json
import random
import resource
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from connectors.slurm.jobstats import encode_js1

WEEK0 = datetime(2026, 11, 16, tzinfo=UTC)
HEADER = ("JobID|JobIDRaw|User|Account|Partition|QOS|State|Submit|Start|End|ElapsedRaw|TimelimitRaw|NodeList|"
          "AllocTRES|ReservationId|Reservation|TRESUsageInAve|AdminComment|JobName")
USERS = [("alice", "team-a"), ("bob", "team-b"), ("carol", "team-a"), ("dave", "team-c")]


def generate(n: int, path: Path, seed: int = 1) -> dict[str, int]:
    """Write ``n`` jobs (plus step lines) as one saved sacct file; returns counts by kind."""
    rng = random.Random(seed)
    nodes = max(1, n // 100)
    free = [(WEEK0.timestamp(), i) for i in range(nodes)]
    heapq.heapify(free)
    kinds = {"summary": 0, "short": 0, "tres": 0}
    fmt = "%Y-%m-%dT%H:%M:%S"
    with path.open("w", encoding="ascii") as fh:
        fh.write(HEADER + "\n")
        for j in range(1, n + 1):
            t, node_i = heapq.heappop(free)
            start = int(t) + rng.randint(0, 120)
            dur = rng.randint(600, 3 * 3600)
            end = start + dur
            heapq.heappush(free, (end, node_i))
            k = rng.choice((1, 1, 1, 2, 4, 8))
            node = f"g{node_i:04d}"
            user, acct = rng.choice(USERS)
            s, e = datetime.fromtimestamp(start, UTC).strftime(fmt), datetime.fromtimestamp(end, UTC).strftime(fmt)
            r = rng.random()
            step = ""
            if r < 0.90:
                util = {str(g): (round(rng.uniform(0, 3), 1) if rng.random() < 1 / 3 else round(rng.uniform(40, 99), 1))
                        for g in range(k)}
                mem = {str(g): rng.randint(1, 80) * 2**30 for g in range(k)}
                comment = encode_js1({"nodes": {node: {"gpu_utilization": util, "gpu_used_memory": mem,
                                                       "gpu_total_memory": {g: 85899345920 for g in util},
                                                       "cpus": 8, "total_time": dur}},
                                      "total_time": dur, "gpus": k})
                kinds["summary"] += 1
            elif r < 0.95:
                comment = "JS1:Short"
                kinds["short"] += 1
            else:
                comment = ""
                step = (f"{j}.batch|{j}.batch||||||{s}|{s}|{e}|{dur}||{node}|cpu=8,gres/gpu={k}|||"
                        f"cpu=00:10:00,gres/gpumem={rng.randint(1, 40)}G,gres/gpuutil={rng.randint(0, 99)}||batch\n")
                kinds["tres"] += 1
            fh.write(f"{j}|{j}|{user}|{acct}|gpu|normal|COMPLETED|{s}|{s}|{e}|{dur}|240|{node}|"
                     f"billing={k},cpu={k},gres/gpu={k},node=1||||{comment}|job{j}\n")
            fh.write(step)
    return kinds


def child(path: str, db: str, bucket: int) -> None:
    """One end-to-end run (in its own process): collect both sources, audit the week; print JSON."""
    from auditor.audit.run import run_audit
    from auditor.collect import collect
    from auditor.config import Config
    from auditor.store.engine import Store

    cfg = Config.model_validate({"clusters": [{
        "name": "hpc",
        "allocations": [{"kind": "file", "paths": [path], "format": "sacct"}],
        "telemetry": [{"kind": "jobstats", "paths": [path], "bucket_seconds": bucket}]}]})
    t0 = time.perf_counter()
    store = Store.open(f"sqlite:///{db}")
    store.upgrade()
    until = WEEK0 + timedelta(days=8)
    summary = collect(store, cfg, base_dir=Path(path).parent, since=WEEK0, until=until, now=until)
    t1 = time.perf_counter()
    run_audit(store, cfg, WEEK0, until)
    t2 = time.perf_counter()
    stats = {r.source: r.stats for r in summary.results}
    print(json.dumps({"collect_s": t1 - t0, "audit_s": t2 - t1, "total_s": t2 - t0, "ok": all(
        r.ok for r in summary.results), "stats": stats,
        "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


def run(sizes: list[int], bucket: int) -> list[dict]:
    out = []
    with tempfile.TemporaryDirectory(prefix="bench-jobstats-") as tmp:
        for n in sizes:
            path = Path(tmp) / f"sacct-{n}.txt"
            t = time.perf_counter()
            kinds = generate(n, path)
            gen_s = time.perf_counter() - t
            proc = subprocess.run([sys.executable, "-m", "bench.bench_jobstats", "--child", str(path),  # noqa: S603
                                   str(Path(tmp) / f"store-{n}.db"), str(bucket)],
                                  capture_output=True, text=True, check=False)
            if proc.returncode != 0:
                raise SystemExit(proc.stderr[-3000:])
            res = json.loads(proc.stdout.strip().splitlines()[-1])
            res.update(jobs=n, bucket_s=bucket, generate_s=gen_s, kinds=kinds,
                       file_mib=path.stat().st_size / 2**20)
            out.append(res)
            limit = 5.0 if n <= 10_000 else 60.0
            print(f"{n:>7,} jobs ({path.stat().st_size / 2**20:.0f} MiB sacct, bucket {bucket} s): "
                  f"collect {res['collect_s']:.1f} s + audit {res['audit_s']:.1f} s = {res['total_s']:.1f} s "
                  f"[target <= {limit:g} s: {'met' if res['total_s'] <= limit else 'MISSED'}], "
                  f"peak RSS {res['rss_mib']:.0f} MiB [<= 1024: {'met' if res['rss_mib'] <= 1024 else 'MISSED'}]",
                  flush=True)
    return out


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--child":
        child(argv[1], argv[2], int(argv[3]))
        return
    ap = argparse.ArgumentParser(prog="python -m bench.bench_jobstats", description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", default="10000,100000", help="Comma-separated job counts.")
    ap.add_argument("--bucket", type=int, default=3600, help="jobstats.bucket_seconds (300 = 5-min rows).")
    ap.add_argument("--json", dest="json_out", default=None, help="Also write the figures to this file.")
    a = ap.parse_args(argv)
    res = run([int(x) for x in a.jobs.split(",") if x], a.bucket)
    if a.json_out:
        Path(a.json_out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
