"""Crash-safe ingest: a collector killed with SIGKILL at random points leaves no partial batch, watermarks
never ahead of committed data, and after a resume the store equals one uninterrupted run.

Each engine: one uninterrupted reference run, then >= 20 kills of a collector on a second store (each
resumed run starts again from that store's watermarks), then one run to completion. 50,000 telemetry
samples (10,016 buckets) and 300 allocations, batch_rows = 100, so a kill lands inside one of ~100
transactions. Run with ``-s`` to see the counts.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from pathlib import Path

import pytest
from helpers_crash import DATA_TABLES, REPO, Collectors, driver_cmd, generate, natural_rows, pg_schema, write_config
from storecheck import checksum

from auditor.store.engine import Store

KILLS = 20
BATCH = 100
ALLOC_SOURCE, TEL_SOURCE = "allocations[0]:file", "telemetry[0]:file"
ALLOC_TABLES, TEL_TABLES = ("allocations", "allocated_gpus"), ("telemetry_gpus", "gpu_buckets")


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}


def _run_to_end(config: Path) -> float:
    res = subprocess.run(driver_cmd(config), capture_output=True, text=True, timeout=120, env=_env(), cwd=REPO)
    assert res.returncode == 0, res.stderr[-2000:]
    return float(res.stdout.split()[-1])


def _check_after_kill(cur: dict, ref: dict) -> str:
    """No row that the uninterrupted run would not have; whole batches only; watermark => complete."""
    for table in cur:
        if table == "watermarks":
            continue
        for key, row in cur[table].items():
            assert ref[table].get(key) == row, f"{table} {key}: {row} is not the uninterrupted run's row"
    n = len(cur["gpu_buckets"])
    full = len(ref["gpu_buckets"])
    assert n % BATCH == 0 or n == full, f"{n} buckets visible: a partial batch of {BATCH} was committed"
    for (_cluster, source), wm in cur["watermarks"].items():
        assert ref["watermarks"][(_cluster, source)] == wm
        tables = ALLOC_TABLES if source == ALLOC_SOURCE else TEL_TABLES
        for table in tables:
            assert cur[table] == ref[table], f"watermark of {source} moved before all of {table} was committed"
    if 0 < n < full:
        return "mid-telemetry"
    if 0 < len(cur["allocations"]) < len(ref["allocations"]):
        return "mid-allocations"
    if ("c", TEL_SOURCE) not in cur["watermarks"]:
        return "before-telemetry-commit"
    return "after-commit"


def _empty(store: Store) -> None:
    """Start a new crash cycle on an empty store (same schema)."""
    from sqlalchemy import text

    with store.engine.begin() as conn:
        for table in ("gpu_buckets", "telemetry_gpus", "allocated_gpus", "allocations", "clusters", "watermarks"):
            conn.execute(text(f"DELETE FROM {table}"))


def _crash_cycle(tmp_path: Path, ref_url: str, crash_url: str, engine: str) -> None:
    generate(tmp_path)
    ref_cfg = write_config(tmp_path, ref_url, BATCH, "ref.toml")
    crash_cfg = write_config(tmp_path, crash_url, BATCH, "crash.toml")
    ref_store, crash_store = Store.open(ref_url), Store.open(crash_url)
    ref_store.upgrade()
    crash_store.upgrade()
    seconds = _run_to_end(ref_cfg)
    ref = natural_rows(ref_store)
    assert len(ref["gpu_buckets"]) > 50 * BATCH and len(ref["allocations"]) > 200

    rnd = random.Random(f"crash-{engine}")
    kinds: dict[str, int] = {}
    kills = completions = 0
    collectors = Collectors(crash_cfg, _env())
    try:
        while kills < KILLS:
            collectors.start()
            time.sleep(rnd.uniform(0.2 * seconds, seconds))
            alive = collectors.finish(kill=True) == -signal.SIGKILL  # killed, not finished before it came
            cur = natural_rows(crash_store)
            state = _check_after_kill(cur, ref)
            if alive:
                kills += 1
                kinds[state] = kinds.get(state, 0) + 1
            if ("c", TEL_SOURCE) in cur["watermarks"]:  # this cycle's resumes completed: equal, then start over
                assert cur == ref
                completions += 1
                _empty(crash_store)
    finally:
        collectors.close()
    _run_to_end(crash_cfg)
    final = natural_rows(crash_store)
    for table in ref:
        assert final[table] == ref[table], f"{table} differs from the uninterrupted run after resume"
    if engine == "sqlite":  # ids are deterministic here: the store's own checksum must match too
        a, b = checksum(ref_store), checksum(crash_store)
        assert {t: a[t] for t in DATA_TABLES} == {t: b[t] for t in DATA_TABLES}
    assert kinds.get("mid-telemetry", 0) >= KILLS // 4, f"too few kills landed inside ingest: {kinds}"
    print(f"\ncrash-safety {engine}: {kills} SIGKILLs survived {dict(sorted(kinds.items()))}; "
          f"{completions} cycles resumed to completion by themselves; {len(ref['gpu_buckets'])} buckets, "
          f"{len(ref['allocations'])} allocations equal after resume")
    ref_store.engine.dispose()
    crash_store.engine.dispose()


@pytest.mark.slow
def test_sigkill_during_ingest_sqlite(tmp_path: Path) -> None:
    _crash_cycle(tmp_path, f"sqlite:///{tmp_path / 'ref.db'}", f"sqlite:///{tmp_path / 'crash.db'}", "sqlite")


@pytest.mark.slow
@pytest.mark.service
def test_sigkill_during_ingest_postgresql(tmp_path: Path, pg_schema_url: str, pg_url: str) -> None:
    with pg_schema(pg_url) as ref_url:
        _crash_cycle(tmp_path, ref_url, pg_schema_url, "postgresql")


# -- idempotent and order-independent, through `gpu-audit collect --since/--until` -------------------------

def _content(rows: dict[str, dict[tuple, tuple]]) -> dict[str, set[tuple]]:
    """Data without collection history (first/last_seen_ts record *when* a window was read, by design)."""
    drop = {"allocations": 2, "clusters": 2}
    return {t: {r[:-drop[t]] if t in drop else r for r in v.values()} for t, v in rows.items()}


def _collect_windows(tmp_path: Path, url: str, name: str, windows: list[tuple[int, int]]) -> dict:
    from click.testing import CliRunner
    from helpers_crash import T0

    from auditor.cli import main

    cfg = write_config(tmp_path, url, BATCH, f"{name}.toml")
    store = Store.open(url)
    store.upgrade()
    for a, b in windows:
        since, until = (T0.timestamp() + a * 3600, T0.timestamp() + b * 3600)
        res = CliRunner().invoke(main, ["-q", "-c", str(cfg), "collect", "--since", str(int(since)),
                                        "--until", str(int(until))])
        assert res.exit_code == 0, res.output
    rows = _content(natural_rows(store))
    store.engine.dispose()
    return rows


@pytest.mark.service
def test_windows_twice_overlapping_and_out_of_order_give_one_store(tmp_path: Path, store_url: str) -> None:
    generate(tmp_path, rows=6000, allocations=60)
    base = store_url if store_url.startswith("postgresql") else None
    rnd = random.Random(7)
    tiles, t = [], 0
    while t < 48:
        step = rnd.randint(1, 9)
        tiles.append((max(0, t - rnd.randint(0, 3)), min(48, t + step)))
        t += step
    rnd.shuffle(tiles)
    plans = {"once": [(0, 48)], "twice": [(0, 48), (0, 48)], "overlapping": [(0, 12), (6, 30), (24, 48)],
             "reversed": [(24, 48), (6, 30), (0, 12)], "random_tiles": tiles}
    results = {}
    for name, windows in plans.items():
        if base:
            with pg_schema(base.split("?")[0]) as url:
                results[name] = _collect_windows(tmp_path, url, name, windows)
        else:
            results[name] = _collect_windows(tmp_path, f"sqlite:///{tmp_path / (name + '.db')}", name, windows)
    assert len(results["once"]["gpu_buckets"]) > 100 and len(results["once"]["allocations"]) == 60
    for name, rows in results.items():
        assert rows == results["once"], f"{name} windows {plans[name]} differ from one window"
    print(f"\nidempotency: {len(plans)} window plans ({sum(len(w) for w in plans.values())} collects) identical")
