"""Driver and helpers for the crash, idempotency and concurrency tests.

Run as a script it is a collector process: ``python tests/helpers_crash.py CONFIG UNTIL`` loads the config,
opens the store, prints ``ready`` (so the parent times its SIGKILL from the start of the real work, not from
interpreter start-up) and then runs :func:`auditor.collect.collect` -- the function ``gpu-audit collect``
calls -- and prints the seconds the collection took.
"""

from __future__ import annotations

import csv
import os
import random
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
T0 = datetime(2026, 11, 20, tzinfo=UTC)
UNTIL = "2026-11-22T00:00:00Z"
DATA_TABLES = ("clusters", "allocations", "allocated_gpus", "reservations", "gpu_inventory", "telemetry_gpus",
               "gpu_buckets")


def generate(directory: Path, rows: int = 50_000, hosts: int = 4, gpus: int = 8, allocations: int = 300,
             seed: int = 1) -> None:
    """An allocations CSV and a long-CSV telemetry file of ``rows`` samples (one per GPU per minute)."""
    rnd = random.Random(seed)
    with (directory / "alloc.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["id", "name", "user", "account", "start", "end", "gpus", "model"])
        for i in range(allocations):
            s = T0 + timedelta(minutes=7 * i)
            w.writerow([str(i), f"job{i}", f"user{i % 7}", f"acct{i % 3}", s.isoformat(),
                        (s + timedelta(hours=2)).isoformat(), f"n{i % hosts}:{i % gpus}", "h100"])
    base = int(T0.timestamp())
    with (directory / "tel.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["timestamp", "host", "gpu", "uuid", "metric", "value"])
        n, t = 0, 0
        while n < rows:
            for h in range(hosts):
                for g in range(gpus):
                    metric = "sm_active" if n % 3 else "DCGM_FI_DEV_GPU_UTIL"
                    value = round(rnd.random(), 3) if metric == "sm_active" else rnd.randint(0, 100)
                    w.writerow([base + t, f"n{h}", g, f"GPU-{h}-{g}", metric, value])
                    n += 1
            t += 60


def write_config(directory: Path, url: str, batch_rows: int = 100, name: str = "c.toml",
                 alloc: str = "alloc.csv", tel: str = "tel.csv") -> Path:
    path = directory / name
    path.write_text(f'[store]\nurl = "{url}"\nbatch_rows = {batch_rows}\n\n'
                    '[[clusters]]\nname = "c"\ninitial_days = 30\n'
                    f'[[clusters.allocations]]\nkind = "file"\npaths = ["{alloc}"]\n'
                    f'[[clusters.telemetry]]\nkind = "file"\npaths = ["{tel}"]\n')
    return path


def natural_rows(store: Any) -> dict[str, dict[tuple, tuple]]:
    """Every data table keyed by its natural key, surrogate ids replaced by what they point at.

    ``Store.checksum`` includes surrogate ids; PostgreSQL sequences are not transactional, so a rolled-back
    insert leaves a gap and a resumed run gets other ids for the same rows. Contents are what must match."""
    from sqlalchemy import text

    q = {
        "clusters": ("SELECT name, first_seen_ts, last_seen_ts FROM clusters", 1),
        "allocations": ("SELECT cluster, source, external_id, name, user_name, account, partition, qos, "
                        "state, submit_ts, start_ts, end_ts, reservation, owner_workload, time_limit_s, "
                        "gpu_count, first_seen_ts, last_seen_ts FROM allocations", 3),
        "allocated_gpus": ("SELECT a.cluster, a.source, a.external_id, g.node, g.slot, g.gpu_index, g.uuid, "
                           "g.model, g.share, g.mig_profile FROM allocated_gpus g "
                           "JOIN allocations a ON a.id = g.allocation_id", 5),
        "reservations": ("SELECT cluster, name, start_ts, end_ts, gpu_count, last_seen_ts FROM reservations", 3),
        "gpu_inventory": ("SELECT cluster, host, gpu_index, model, uuid, first_seen_ts, last_seen_ts "
                          "FROM gpu_inventory", 3),
        "telemetry_gpus": ("SELECT cluster, host, gpu_index, gpu_instance, uuid, model FROM telemetry_gpus", 4),
        "gpu_buckets": ("SELECT t.cluster, t.host, t.gpu_index, t.gpu_instance, b.bucket_ts, b.bucket_s, "
                        "b.samples, b.gpu_util, b.sm_active, b.fb_used_mib, b.hpc_job FROM gpu_buckets b "
                        "JOIN telemetry_gpus t ON t.id = b.gpu_id", 5),
        "watermarks": ("SELECT cluster, source, watermark_ts FROM watermarks", 2),
    }
    out: dict[str, dict[tuple, tuple]] = {}
    with store.engine.connect() as conn:
        for table, (sql, nkey) in q.items():
            rows = {}
            for r in conn.execute(text(sql)):
                vals = tuple(round(v, 9) if isinstance(v, float) else v for v in r)
                rows[vals[:nkey]] = vals
            out[table] = rows
    return out


from conftest import pg_schema  # noqa: E402,F401  (re-exported for the crash and concurrency tests)


def driver_cmd(config: Path, until: str = UNTIL) -> list[str]:
    return [sys.executable, str(Path(__file__).resolve()), str(config), until]


def _collect_once(config: str, until_text: str) -> int:
    """One collector run (in this process): ``ready``, then the collection, then its seconds."""
    from auditor import config as config_mod
    from auditor.collect import collect
    from auditor.store.engine import Store
    from auditor.timeutil import parse_time

    cfg = config_mod.load(config)
    store = Store.open(cfg.store.resolved_url(), cfg.store.batch_rows)
    store.require_current()
    until = parse_time(until_text)
    print("ready", flush=True)
    t0 = time.monotonic()
    summary = collect(store, cfg, base_dir=Path(config).resolve().parent, until=until, now=until)
    print(f"{time.monotonic() - t0:.3f}", flush=True)
    return 0 if summary.ok else 3


def _zygote(config: str, until_text: str) -> int:
    """Import once, then fork one collector per ``go`` line on stdin: each is a separate process, killed with
    SIGKILL like any collector, without paying the interpreter start-up and imports (about a second) again.
    No store is opened here, so a child shares no connection or file lock with the zygote or its siblings.
    Prints ``pid N`` and the child's ``ready`` (and seconds) lines; the next line on stdin, ``kill`` or
    ``wait``, says whether to SIGKILL it (the zygote reaps its children, so a pid is never stale); then
    prints ``exit CODE`` (negative: the signal)."""
    import auditor.collect  # noqa: F401  (the imports the children inherit)
    import auditor.store.engine  # noqa: F401

    print("zygote", flush=True)
    for line in sys.stdin:
        if line.strip() != "go":
            break
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                code = _collect_once(config, until_text)
            finally:
                sys.stdout.flush()
                os._exit(code)
        print(f"pid {pid}", flush=True)
        if sys.stdin.readline().strip() == "kill":  # the child is not reaped yet: its pid is still its own
            os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        print(f"exit {os.waitstatus_to_exitcode(status)}", flush=True)
    return 0


class Collectors:
    """Collector processes forked from one zygote (see :func:`_zygote`), for tests that kill many of them."""

    def __init__(self, config: Path, env: dict[str, str], until: str = UNTIL) -> None:
        self.proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--zygote", str(config),
                                      until], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True, env=env, cwd=REPO)
        assert self._line() == "zygote"

    def _line(self) -> str:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line, "the collector zygote died"
        return line.strip()

    def start(self) -> int:
        """Fork a collector; return its pid once it is ready (its store open, the collection about to begin)."""
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        pid = int(self._line().removeprefix("pid "))
        assert self._line() == "ready"
        return pid

    def finish(self, kill: bool) -> int:
        """SIGKILL the collector (or let it run to its end); its exit code once reaped (negative: the
        signal that ended it; 0 when it had finished before the kill came)."""
        assert self.proc.stdin is not None
        self.proc.stdin.write("kill\n" if kill else "wait\n")
        self.proc.stdin.flush()
        while not (line := self._line()).startswith("exit "):
            pass
        return int(line.removeprefix("exit "))

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
            if self.proc.stdout is not None:
                self.proc.stdout.close()


def main(argv: list[str]) -> int:
    sys.path.insert(0, str(REPO))
    if argv[0] == "--zygote":
        return _zygote(argv[1], argv[2])
    return _collect_once(argv[0], argv[1])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
