"""Fault isolation: a store that is down is one line and exit 1; a broken source fails alone (other clusters
complete, exit 3, the summary names it); transient failures are retried a bounded number of times with
exponential backoff; time a failed source did not observe is unknown, never idle.

Faults of the Slurm, Kubernetes, Prometheus and SMTP sources are tested by their owners' test files (see
docs/reliability.md)."""

from __future__ import annotations

import json
import subprocess
import types
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from conftest import run_cli
from helpers import add_connector
from helpers_crash import REPO, T0, generate

from auditor import collect as collect_mod
from auditor import config as config_mod
from auditor.errors import SourceError
from auditor.records import GpuBucket
from auditor.store.engine import Store
from connectors import retry as retry_mod
from connectors.base import Context, Options, Problems, Window


def cli(*args: str) -> subprocess.CompletedProcess:
    return run_cli(*args, cwd=REPO)  # in this process: the CLI's answer is the point, not its process


@pytest.mark.parametrize("url", ["postgresql+psycopg://gpu_audit:pw@127.0.0.1:9/x",
                                 "sqlite:///{tmp}/a-file/store.db", "sqlite:///{tmp}"])
@pytest.mark.parametrize("command", [["collect"], ["audit"], ["run", "--steps", "collect,audit"], ["db", "upgrade"]])
def test_store_down_is_one_line_and_exit_1(tmp_path: Path, url: str, command: list[str]) -> None:
    (tmp_path / "a-file").write_text("not a directory")
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[store]\nurl = "{url.format(tmp=tmp_path)}"\n')
    res = cli("-c", str(cfg), *command)
    assert res.returncode == 1, res.stdout + res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpu-audit: "), res.stderr
    assert "Traceback" not in res.stderr


def test_unwritable_sqlite_path_is_a_store_error(tmp_path: Path) -> None:
    from auditor.errors import StoreError

    (tmp_path / "a-file").write_text("x")
    with pytest.raises(StoreError):
        Store.open(f"sqlite:///{tmp_path / 'a-file' / 'store.db'}")


def _two_clusters(tmp_path: Path, bad: str) -> Path:
    """Cluster "good" reads generated files; cluster "bad" has one broken source (``bad`` is its TOML)."""
    generate(tmp_path, rows=3000, allocations=20)
    (tmp_path / "garbage.json").write_text('[{"id": "1", "gpus": "n0:0", "start": "2026-11-20"},\n{"id": ')
    (tmp_path / "binary.csv").write_bytes(b"\xff\xfe\x00garbage\x00\x81\n" * 20)
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[store]\nurl = "sqlite:///{tmp_path / "s.db"}"\n'
                   '[[clusters]]\nname = "good"\ninitial_days = 30\n'
                   '[[clusters.allocations]]\nkind = "file"\npaths = ["alloc.csv"]\n'
                   '[[clusters.telemetry]]\nkind = "file"\npaths = ["tel.csv"]\n'
                   f'[[clusters]]\nname = "bad"\ninitial_days = 30\n{bad}\n')
    assert cli("-c", str(cfg), "db", "upgrade").returncode == 0
    return cfg


@pytest.mark.parametrize("bad,what", [
    ('[[clusters.telemetry]]\nkind = "file"\npaths = ["missing.csv"]', "no such file"),
    ('[[clusters.telemetry]]\nkind = "file"\npaths = ["missing-*.csv"]', "matches no file"),  # issue 44
    ('[[clusters.allocations]]\nkind = "file"\npaths = ["garbage.json"]', "invalid JSON"),
    ('[[clusters.allocations]]\nkind = "file"\npaths = ["binary.csv"]', None),
    ('[[clusters.allocations]]\nkind = "file"\npaths = ["/proc/self/nonexistent.csv"]', "no such file"),
])
def test_broken_file_source_fails_alone_exit_3(tmp_path: Path, bad: str, what: str | None) -> None:
    cfg = _two_clusters(tmp_path, bad)
    res = cli("-c", str(cfg), "--json", "run", "--steps", "collect,audit", "--since", "2026-11-20",
              "--until", "2026-11-22")
    data = json.loads(res.stdout)
    collect_step = next(s for s in data["steps"] if s["name"] == "collect")
    by_cluster = {(r["cluster"], r["source"]): r for r in collect_step["detail"]["sources"]}
    assert all(r["ok"] for (c, _), r in by_cluster.items() if c == "good")
    bad_results = [r for (c, _), r in by_cluster.items() if c == "bad"]
    if what is None:  # an undecodable CSV: not an error, but nothing read and every line counted
        assert res.returncode == 0 and all(r["ok"] for r in bad_results)
        assert sum(r["skipped"] for r in bad_results) == (0 if "missing" in bad else 1)
        assert all(r["stats"]["allocations"] == r["stats"]["buckets"] == 0 for r in bad_results)
        return
    assert res.returncode == 3, res.stdout + res.stderr
    assert not bad_results[0]["ok"] and what in bad_results[0]["error"]
    assert "bad " in collect_step["error"] and what in collect_step["error"]
    audit_step = next(s for s in data["steps"] if s["name"] == "audit")
    assert audit_step["ok"] and audit_step["detail"]["reserved_gpu_hours"] > 0
    store = Store.open(f"sqlite:///{tmp_path / 's.db'}")
    assert store.count("allocations") == 20 and store.count("gpu_buckets") > 0
    assert store.watermark("bad", bad_results[0]["source"]) is None


def _flaky_module(fail_times: int, calls: list[int], transient: bool = True) -> types.ModuleType:
    """A telemetry source that fails ``fail_times`` times (a down exporter), then answers."""

    class Flaky:
        class Options(Options):
            pass

        name = "flaky"

        def __init__(self, context: Context, options: Options) -> None:
            self.ctx = context

        def collect(self, window: Window, problems: Problems) -> Iterator[GpuBucket]:
            calls.append(1)
            if len(calls) <= fail_times:
                raise SourceError("http://exporter:9400", "connection refused", transient=transient)
            yield GpuBucket(self.ctx.cluster, "n0", 0, window.since, 300, 10, sm_active=0.9)

    mod = types.ModuleType("connectors.flaky")
    mod.TELEMETRY = Flaky  # type: ignore[attr-defined]
    return mod


def _flaky_config(tmp_path: Path) -> config_mod.Config:
    generate(tmp_path, rows=100, allocations=5)
    return config_mod.parse({"store": {"url": f"sqlite:///{tmp_path / 's.db'}"}, "clusters": [
        {"name": "c", "initial_days": 30, "allocations": [{"kind": "file", "paths": ["alloc.csv"]}],
         "telemetry": [{"kind": "flaky"}]}]})


@pytest.mark.parametrize("fail_times,transient,ok,attempts,sleeps", [
    (0, True, True, 1, []),
    (2, True, True, 3, [1.0, 2.0]),
    (99, True, False, 3, [1.0, 2.0]),
    (99, False, False, 1, []),
])
def test_transient_errors_retried_bounded_with_backoff(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       fail_times: int, transient: bool, ok: bool, attempts: int,
                                                       sleeps: list[float]) -> None:
    calls: list[int] = []
    add_connector(monkeypatch, "flaky", _flaky_module(fail_times, calls, transient))
    cfg = _flaky_config(tmp_path)
    store = Store.open(cfg.store.url)
    store.upgrade()
    slept: list[float] = []
    cluster = cfg.clusters[0]
    window = Window(T0, T0 + timedelta(days=2), 300)
    res = collect_mod.collect_source(store, cfg, cluster, "telemetry", 0, cluster.telemetry[0], window, tmp_path,
                                     sleep=slept.append)
    assert (res.ok, res.attempts, slept, len(calls)) == (ok, attempts, sleeps, attempts)
    assert store.count("gpu_buckets") == (1 if ok else 0)
    assert (store.watermark("c", "telemetry[0]:flaky") is not None) == ok
    if not ok:
        assert "connection refused" in res.error and "\n" not in res.error


def test_failed_telemetry_is_unknown_never_idle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Allocations collected, telemetry down for the whole window: every reserved hour is unknown."""
    from auditor.audit.run import run_audit
    from auditor.daemon.pipeline import run_steps
    from auditor.errors import EXIT_PARTIAL

    calls: list[int] = []
    add_connector(monkeypatch, "flaky", _flaky_module(99, calls))
    monkeypatch.setattr(retry_mod, "BACKOFF_S", 0.0)
    cfg = _flaky_config(tmp_path)
    store = Store.open(cfg.store.url)
    store.upgrade()
    until = T0 + timedelta(days=2)
    summary = run_steps(store, cfg, ["collect"], base_dir=tmp_path, since=T0, until=until)
    assert summary.exit_code == EXIT_PARTIAL and len(calls) == collect_mod.RETRIES
    result = run_audit(store, cfg, T0, until)
    s = result.summary
    assert s["reserved_gpu_hours"] > 0
    assert s["idle_gpu_hours"] == 0 and s["mirage_gpu_hours"] == 0
    assert s["unknown_gpu_hours"] == pytest.approx(s["reserved_gpu_hours"])

