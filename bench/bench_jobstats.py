"""Benchmark: gpu-audit and Job Defense Shield (JDS, PrincetonUniversity/job_defense_shield, the ``bench``
extra) side by side on the same generated ``sacct`` rows whose jobs carry jobstats summaries (``JS1:`` in
AdminComment, the public format of PrincetonUniversity/jobstats): CPU seconds, peak RSS, and each tool's idle
GPU-hours checked against the generator's truth.

- gpu-audit reads the saved ``sacct -P`` file end to end: allocations through the file connector (format
  sacct), telemetry through the ``jobstats`` connector, both into a fresh SQLite store by ``collect``, then
  ``run_audit`` over the window; its idle GPU-hours are the run's ``idle_gpu_hours``.
- JDS runs as its command ``job_defense_shield --zero-util-gpu-hours -S .. -E .. -M hpc``, unmodified, with
  a config naming one ``zero-util-gpu-hours`` alert (every user, no thresholds). It reads its jobs by running
  ``sacct`` (``-a -X -P -n -o <its fields>``, ``SLURM_TIME_FORMAT=%s``): a stand-in ``sacct`` first on its
  PATH answers from the same saved file (:mod:`bench.sacct_replay`). Its idle GPU-hours are its per-user
  "GPU-Hours-At-0%", read off the alert before its report rounds them (a wrapper around
  ``generate_report_for_admins`` that only reads); the stand-in's CPU is reported apart (it is sacct's).

Each tool runs in its own process (peak RSS: its own ``VmHWM``; CPU: its own user + system seconds); JDS gets
an address-space limit (``--jds-limit-gib``, default 8) so a run out of memory fails alone. Targets (issue 34):
gpu-audit CPU <= 0.5x JDS's at 1,000 and 10,000 jobs; 100,000 jobs <= 60 s of CPU and <= 1 GiB. Generation is
not timed.

Jobs: 1, 2, 4 or 8 GPUs on one 8-GPU node, 10 min to 3 h, back to back per node, 90 % with a summary (a
third of their GPUs at 0 % utilisation: the truth both tools must find, GPUs x elapsed hours; the rest
40-99 %), 5 % ``JS1:Short``, 5 % with only Slurm's ``gres/gpuutil`` (40-99 %) on a batch step.

Run: python -m bench.bench_jobstats [--jobs 1000,10000,100000] [--bucket 3600] [--no-jds]
"""

from __future__ import annotations

import argparse
import heapq
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from connectors.slurm.jobstats import encode_js1

WEEK0 = datetime(2026, 11, 16, tzinfo=UTC)
#: the audit window: every job of the largest size has ended by then (100 jobs of <= 3 h per node)
DAYS = 14
HEADER = ("JobID|JobIDRaw|User|Cluster|Account|Partition|CPUTimeRaw|ElapsedRaw|TimelimitRaw|NNodes|NCPUS|AllocTRES|"
          "Submit|Eligible|Start|End|QOS|State|NodeList|ReservationId|Reservation|TRESUsageInAve|AdminComment|JobName")
USERS = [("alice", "team-a"), ("bob", "team-b"), ("carol", "team-a"), ("dave", "team-c")]


def generate(n: int, path: Path, seed: int = 1) -> dict[str, Any]:
    """Write ``n`` jobs (plus step lines) as one saved ``sacct -a -P`` file; returns counts by kind and the
    truth: GPU-hours of GPUs at 0 % utilisation in jobs with a summary."""
    rng = random.Random(seed)
    nodes = max(1, n // 100)
    free = [(WEEK0.timestamp(), i) for i in range(nodes)]
    heapq.heapify(free)
    kinds: dict[str, Any] = {"summary": 0, "short": 0, "tres": 0}
    zero_s = 0
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
                util = {str(g): (0.0 if rng.random() < 1 / 3 else round(rng.uniform(40, 99), 1)) for g in range(k)}
                zero_s += sum(1 for v in util.values() if v == 0.0) * dur
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
                step = (f"{j}.batch|{j}.batch||hpc|||{dur * 8}|{dur}||1|8||{s}|{s}|{s}|{e}|||{node}||||"
                        f"cpu=00:10:00,gres/gpumem={rng.randint(1, 40)}G,gres/gpuutil={rng.randint(40, 99)}||batch\n")
                kinds["tres"] += 1
            fh.write(f"{j}|{j}|{user}|hpc|{acct}|gpu|{dur * 8}|{dur}|240|1|8|billing={k},cpu=8,gres/gpu={k},node=1|"
                     f"{s}|{s}|{s}|{e}|normal|COMPLETED|{node}||||{comment}|job{j}\n")
            fh.write(step)
    kinds["truth_zero_gpu_hours"] = zero_s / 3600
    return kinds


def _peak_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return float(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _cpu(who: int = resource.RUSAGE_SELF) -> float:
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime


def child(path: str, db: str, bucket: int) -> None:
    """gpu-audit, end to end (in its own process): collect both sources, audit the window; print JSON."""
    from auditor.audit.run import run_audit
    from auditor.collect import collect
    from auditor.config import Config
    from auditor.store.engine import Store

    cfg = Config.model_validate({"clusters": [{
        "name": "hpc",
        "allocations": [{"kind": "file", "paths": [path], "format": "sacct"}],
        "telemetry": [{"kind": "jobstats", "paths": [path], "bucket_seconds": bucket}]}]})
    c0, t0 = _cpu(), time.perf_counter()
    store = Store.open(f"sqlite:///{db}")
    store.upgrade()
    until = WEEK0 + timedelta(days=DAYS)
    c1, t1 = _cpu(), time.perf_counter()
    summary = collect(store, cfg, base_dir=Path(path).parent, since=WEEK0, until=until, now=until)
    c2, t2 = _cpu(), time.perf_counter()
    run = run_audit(store, cfg, WEEK0, until)
    c3, t3 = _cpu(), time.perf_counter()
    stats = {r.source: r.stats for r in summary.results}
    print(json.dumps({"upgrade_s": t1 - t0, "collect_s": t2 - t1, "audit_s": t3 - t2, "total_s": t3 - t0,
                      "cpu_s": c3, "cpu": {"start and imports": c0, "store created": c1 - c0, "collect": c2 - c1,
                                           "audit": c3 - c2},
                      "ok": all(r.ok for r in summary.results), "stats": stats,
                      "idle_gpu_hours": run.summary["idle_gpu_hours"], "rss_mib": _peak_mib()}))


JDS_CONFIG = """violation-logs-path: {tmp}/violations
email-files-path: {tmp}
sender: bench@localhost
reply-to: bench@localhost
workday-method: always
email-domain-name: "@localhost"
greeting-method: basic
zero-util-gpu-hours-1:
  cluster: hpc
  partitions:
    - gpu
  min_run_time: 0
  gpu_hours_threshold_user: 0
  gpu_hours_threshold_admin: 0
  email_file: zero_util_gpu_hours.txt
  admin_emails: []
"""


def jds_child(path: str, tmp: str, limit_gib: float) -> None:
    """Job Defense Shield's command in this process, its jobs from the stand-in ``sacct``; print JSON."""
    if limit_gib > 0:
        lim = int(limit_gib * 2**30)
        resource.setrlimit(resource.RLIMIT_AS, (lim, lim))
    import contextlib
    import io

    from job_defense_shield import job_defense_shield as jds
    from job_defense_shield.alert.zero_util_gpu_hours import ZeroUtilGPUHours

    seen: list[float] = []
    report = ZeroUtilGPUHours.generate_report_for_admins

    def read_then_report(self: Any, *args: Any, **kw: Any) -> str:
        seen.append(float(self.admin["GPU-Hours-At-0%"].sum()) if not self.admin.empty else 0.0)
        return report(self, *args, **kw)

    ZeroUtilGPUHours.generate_report_for_admins = read_then_report  # type: ignore[method-assign]
    cfg = Path(tmp) / "jds.yaml"
    cfg.write_text(JDS_CONFIG.format(tmp=tmp))
    (Path(tmp) / "zero_util_gpu_hours.txt").write_text("<GREETING>\n<TABLE>\n")
    until = WEEK0 + timedelta(days=DAYS)
    sys.argv = ["job_defense_shield", "--zero-util-gpu-hours", "-M", "hpc", "--config-file", str(cfg),
                "-S", WEEK0.strftime("%Y-%m-%dT%H:%M:%S"), "-E", until.strftime("%Y-%m-%dT%H:%M:%S")]
    out = io.StringIO()
    t = time.perf_counter()
    try:
        with contextlib.redirect_stdout(out):
            jds.main()
    except SystemExit:  # JDS exits on what it cannot use (no job data, a config error): say what it said
        raise SystemExit("JDS exited: " + " ".join(out.getvalue().split())[-300:]) from None
    wall = time.perf_counter() - t
    print(json.dumps({"wall_s": wall, "cpu_s": _cpu(), "sacct_cpu_s": _cpu(resource.RUSAGE_CHILDREN),
                      "idle_gpu_hours": seen[0] if seen else None, "rss_mib": _peak_mib(),
                      "report_tail": out.getvalue()[-300:]}))


def _run(cmd: list[str], env: dict[str, str] | None = None) -> dict[str, Any]:
    t = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)  # noqa: S603
    wall = time.perf_counter() - t
    if proc.returncode != 0:
        return {"error": (proc.stderr or proc.stdout).strip().splitlines()[-1:] or [f"rc {proc.returncode}"],
                "rc": proc.returncode, "wall_s": wall}
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    res["process_wall_s"] = wall
    return res


def _exact(got: float | None, truth: float) -> bool:
    return got is not None and abs(got - truth) <= 1e-6 * max(1.0, truth)


def run(sizes: list[int], bucket: int, jds: bool = True, limit_gib: float = 8.0,
        jds_max: int | None = None) -> list[dict[str, Any]]:
    """Each size generated, then gpu-audit and (``jds``, up to ``jds_max`` jobs) JDS on it."""
    out = []
    with tempfile.TemporaryDirectory(prefix="bench-jobstats-") as tmp:
        shim = Path(tmp) / "bin"
        shim.mkdir()
        (shim / "sacct").write_text(f"#!/bin/sh\nexec {sys.executable} -m bench.sacct_replay \"$@\"\n")
        (shim / "sacct").chmod(0o755)
        here = str(Path(__file__).resolve().parent.parent)
        for n in sizes:
            path = Path(tmp) / f"sacct-{n}.txt"
            t = time.perf_counter()
            kinds = generate(n, path)
            gen_s = time.perf_counter() - t
            truth = kinds["truth_zero_gpu_hours"]
            ga = _run([sys.executable, "-m", "bench.bench_jobstats", "--child", str(path),
                       str(Path(tmp) / f"store-{n}.db"), str(bucket)])
            row: dict[str, Any] = {"jobs": n, "bucket_s": bucket, "generate_s": gen_s, "kinds": kinds,
                                   "file_mib": path.stat().st_size / 2**20, "gpu_audit": ga}
            if jds and (jds_max is None or n <= jds_max):
                env = {**os.environ, "PATH": f"{shim}:{os.environ.get('PATH', '')}",
                       "GPU_AUDIT_SACCT_REPLAY": str(path),
                       "PYTHONPATH": here + os.pathsep + os.environ.get("PYTHONPATH", "")}
                row["jds"] = _run([sys.executable, "-m", "bench.bench_jobstats", "--jds-child", str(path), tmp,
                                   str(limit_gib)], env)
            out.append(row)
            print(line(row, truth), flush=True)
    return out


def line(row: dict[str, Any], truth: float) -> str:
    n, ga, jd = row["jobs"], row["gpu_audit"], row.get("jds")

    def tool(name: str, r: dict[str, Any] | None) -> str:
        if r is None:
            return f"{name}: not run"
        if "error" in r:
            return f"{name}: FAILED ({r['error'][-1][:100]}, after {r['wall_s']:.0f} s)"
        ok = "exact" if _exact(r.get("idle_gpu_hours"), truth) else f"NOT EXACT ({r.get('idle_gpu_hours')})"
        extra = f" + sacct stand-in {r['sacct_cpu_s']:.1f} s" if "sacct_cpu_s" in r else ""
        parts = (" (" + ", ".join(f"{k} {v:.2f}" for k, v in r["cpu"].items()) + ")") if "cpu" in r else ""
        return (f"{name}: CPU {r['cpu_s']:.2f} s{parts}{extra}, wall {r['process_wall_s']:.1f} s, "
                f"peak RSS {r['rss_mib']:.0f} MiB, {ok}")

    out = f"{n:>7,} jobs, truth {truth:,.2f} idle GPU-h | {tool('gpu-audit', ga)} | {tool('JDS', jd)}"
    if "error" not in ga:
        if jd and "error" not in jd and n <= 10_000:
            ratio = ga["cpu_s"] / jd["cpu_s"]
            out += f" | CPU gpu-audit/JDS {ratio:.2f} [<= 0.5: {'met' if ratio <= 0.5 else 'MISSED'}]"
        if n >= 100_000:
            ok = ga["cpu_s"] <= 60 and ga["rss_mib"] <= 1024
            out += f" | [<= 60 s CPU, <= 1 GiB: {'met' if ok else 'MISSED'}]"
    return out


#: issue 46's targets: gpu-audit CPU / JDS CPU at 1,000 and 10,000 jobs (goal 0.5x); 100,000 jobs CPU and RSS
RATIO_TARGET, RATIO_GOAL, CPU_100K_S, RSS_100K_MIB = 0.8, 0.5, 30.0, 512.0


def jds_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("job_defense_shield") is not None


def table_rows(res: list[dict[str, Any]]) -> list[Any]:
    """The rows of ``python -m bench``'s closing table: CPU ratio per size JDS ran at, the largest size's CPU and
    peak RSS, each tool's idle GPU-hours exact or not (in the note)."""
    from bench.table import Row

    rows = []
    for r in res:
        ga, jd, n = r["gpu_audit"], r.get("jds"), r["jobs"]
        truth = r["kinds"]["truth_zero_gpu_hours"]
        if "error" in ga:
            rows.append(Row(f"jobstats {n:,} jobs: gpu-audit", None, "s", note="FAILED: " + ga["error"][-1][:80]))
            continue
        exact = "exact" if _exact(ga.get("idle_gpu_hours"), truth) else "NOT EXACT"
        rows.append(Row(f"jobstats {n:,} jobs: gpu-audit CPU (wall {ga['process_wall_s']:.1f} s)", ga["cpu_s"], "s",
                        CPU_100K_S if n >= 100_000 else None, note=f"idle GPU-h {exact}"))
        if n >= 100_000:
            rows.append(Row(f"jobstats {n:,} jobs: gpu-audit peak RSS", ga["rss_mib"], "MiB", RSS_100K_MIB))
        if jd and "error" not in jd:
            jexact = "exact" if _exact(jd.get("idle_gpu_hours"), truth) else "NOT EXACT"
            rows += [Row(f"jobstats {n:,} jobs: JDS CPU (wall {jd['process_wall_s']:.1f} s)", jd["cpu_s"], "s",
                         note=f"idle GPU-h {jexact}; sacct stand-in {jd['sacct_cpu_s']:.1f} s apart"),
                     Row(f"gpu-audit CPU / JDS CPU, {n:,} jobs", ga["cpu_s"] / jd["cpu_s"], "x", RATIO_TARGET,
                         note=f"goal {RATIO_GOAL:g}x")]
        elif jd:
            rows.append(Row(f"jobstats {n:,} jobs: JDS", None, "s", note="FAILED: " + str(jd["error"][-1])[:80]))
    return rows


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--child":
        child(argv[1], argv[2], int(argv[3]))
        return
    if argv and argv[0] == "--jds-child":
        jds_child(argv[1], argv[2], float(argv[3]))
        return
    ap = argparse.ArgumentParser(prog="python -m bench.bench_jobstats", description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", default="1000,10000,100000", help="Comma-separated job counts.")
    ap.add_argument("--bucket", type=int, default=3600, help="jobstats.bucket_seconds (300 = 5-min rows).")
    ap.add_argument("--no-jds", action="store_true", help="gpu-audit only (JDS not installed: the bench extra).")
    ap.add_argument("--jds-limit-gib", type=float, default=8.0, help="JDS's address-space limit (0: none).")
    ap.add_argument("--json", dest="json_out", default=None, help="Also write the figures to this file.")
    a = ap.parse_args(argv)
    from bench.__main__ import machine

    m = machine()
    print(f"machine: {m['cpu']}, {m['cores']} cores; a 10-million-step Python loop takes "
          f"{m['python_loop_10m_s']:.2f} s; load {m['load_avg']}", flush=True)
    res = run([int(x) for x in a.jobs.split(",") if x], a.bucket, not a.no_jds, a.jds_limit_gib)
    if a.json_out:
        Path(a.json_out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
