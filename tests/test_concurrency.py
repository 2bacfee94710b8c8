"""Concurrency: collectors and audits running at once on one store (SQLite in WAL with a busy timeout, and
PostgreSQL) finish without errors, and no row is lost: the store equals a run made alone."""

from __future__ import annotations

import os
import subprocess
import time
from datetime import timedelta
from pathlib import Path

import pytest
from helpers_crash import REPO, T0, driver_cmd, generate, natural_rows, pg_schema, write_config

from auditor import config as config_mod
from auditor.audit.run import run_audit
from auditor.store.engine import Store


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}


def _concurrent(tmp_path: Path, ref_url: str, url: str, engine: str) -> None:
    generate(tmp_path, rows=30_000)
    ref_cfg = write_config(tmp_path, ref_url, 200, "ref.toml")
    cfg_path = write_config(tmp_path, url, 200, "busy.toml")
    ref_store, store = Store.open(ref_url), Store.open(url)
    ref_store.upgrade()
    store.upgrade()
    alone = subprocess.run(driver_cmd(ref_cfg), capture_output=True, text=True, timeout=120, env=_env(), cwd=REPO)
    assert alone.returncode == 0, alone.stderr[-2000:]
    ref = natural_rows(ref_store)

    cfg = config_mod.load(cfg_path)
    collectors = [subprocess.Popen(driver_cmd(cfg_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                   env=_env(), cwd=REPO) for _ in range(2)]
    audits = 0
    deadline = time.monotonic() + 120
    while any(p.poll() is None for p in collectors) and time.monotonic() < deadline:
        run_audit(store, cfg, T0, T0 + timedelta(days=2))  # raises on any store error (locked, deadlock...)
        audits += 1
        time.sleep(0.05)
    outs = [p.communicate(timeout=120) for p in collectors]
    for p, (_out, err) in zip(collectors, outs, strict=True):
        assert p.returncode == 0, f"collector failed beside an audit: {err[-2000:]}"
        assert "Traceback" not in err and "locked" not in err
    assert audits >= 1
    final = run_audit(store, cfg, T0, T0 + timedelta(days=2))
    got = natural_rows(store)
    for table in ref:
        assert got[table] == ref[table], f"{table}: rows lost or changed by concurrent runs"
    alone_audit = run_audit(ref_store, cfg, T0, T0 + timedelta(days=2))
    assert final.summary["reserved_gpu_hours"] == pytest.approx(alone_audit.summary["reserved_gpu_hours"])
    assert final.summary["effective_gpu_hours"] == pytest.approx(alone_audit.summary["effective_gpu_hours"])
    print(f"\nconcurrency {engine}: 2 collectors + {audits} audits at once, {len(got['gpu_buckets'])} buckets, "
          "no errors, no lost rows")
    store.engine.dispose()
    ref_store.engine.dispose()


def test_sqlite_read_then_write_transaction_waits_for_a_concurrent_writer(tmp_path: Path) -> None:
    """Deterministic form of the race the audit runs into: A reads main inside its write transaction, B
    commits a write, A writes. With a deferred transaction A fails at once with "database is locked"; a write
    transaction must hold the write lock from its start (BEGIN IMMEDIATE), so B waits instead."""
    import threading

    from sqlalchemy import text

    url = f"sqlite:///{tmp_path / 's.db'}"
    a, b = Store.open(url), Store.open(url)
    a.upgrade()
    errors: list[BaseException] = []

    def writer() -> None:
        try:
            with b.begin() as conn:
                b.set_watermark(conn, "c", "x", 1)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    with a.begin() as conn:
        conn.execute(text("CREATE TEMPORARY TABLE _t (n INTEGER)"))
        conn.execute(text("INSERT INTO _t SELECT count(*) FROM gpu_buckets"))  # like run_audit's _attr
        t = threading.Thread(target=writer)
        t.start()
        t.join(0.5)
        a.set_watermark(conn, "c", "y", 2)
    t.join(30)
    assert not errors, errors
    assert a.watermark("c", "x") == 1 and a.watermark("c", "y") == 2


@pytest.mark.slow
def test_collectors_and_audit_at_once_sqlite(tmp_path: Path) -> None:
    _concurrent(tmp_path, f"sqlite:///{tmp_path / 'ref.db'}", f"sqlite:///{tmp_path / 'busy.db'}", "sqlite")


@pytest.mark.slow
@pytest.mark.service
def test_collectors_and_audit_at_once_postgresql(tmp_path: Path, pg_schema_url: str, pg_url: str) -> None:
    with pg_schema(pg_url) as ref_url:
        _concurrent(tmp_path, ref_url, pg_schema_url, "postgresql")
