"""Driver and helpers for the crash, idempotency and concurrency tests.

Run as a script it is a collector process: ``python tests/helpers_crash.py CONFIG UNTIL`` loads the config,
opens the store, prints ``ready`` (so the parent times its SIGKILL from the start of the real work, not from
interpreter start-up) and then runs :func:`auditor.collect.collect` -- the function ``gpu-audit collect``
calls -- and prints the seconds the collection took.
"""

from __future__ import annotations

import csv
import random
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


def main(argv: list[str]) -> int:
    sys.path.insert(0, str(REPO))
    from auditor import config as config_mod
    from auditor.collect import collect
    from auditor.store.engine import Store
    from auditor.timeutil import parse_time

    cfg = config_mod.load(argv[0])
    store = Store.open(cfg.store.resolved_url(), cfg.store.batch_rows)
    store.require_current()
    until = parse_time(argv[1])
    print("ready", flush=True)
    t0 = time.monotonic()
    summary = collect(store, cfg, base_dir=Path(argv[0]).resolve().parent, until=until, now=until)
    print(f"{time.monotonic() - t0:.3f}", flush=True)
    return 0 if summary.ok else 3


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
