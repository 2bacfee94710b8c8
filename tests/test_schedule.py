"""The daemon: fast schedules, no overlap (max_instances and the store lease), crash safety of collection,
clean SIGTERM shutdown, one weekly email from two daemons on one PostgreSQL store, /healthz and /metrics."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from apscheduler.triggers.interval import IntervalTrigger
from conftest import port_open
from helpers import free_port
from sqlalchemy import text

from auditor import config as config_mod
from auditor.collect import collect
from auditor.daemon.health import HealthServer, health
from auditor.daemon.pipeline import RunSummary, StepResult
from auditor.daemon.schedule import MARKER_KIND, Daemon, cron_triggers, period_done, period_key, previous_fire
from auditor.report.notify import period_key as notify_period_key
from auditor.store import locks
from auditor.store.engine import Store
from auditor.timeutil import floor_to, utcnow

ROOT = Path(__file__).resolve().parent.parent


def fast(seconds: float = 0.2) -> dict[str, IntervalTrigger]:
    return {"collect": IntervalTrigger(seconds=seconds), "audit": IntervalTrigger(seconds=seconds)}


class Recorder:
    """A stand-in for run_steps that records each call (to memory and optionally a file)."""

    def __init__(self, sleep: float = 0.0, path: Path | None = None, fail: set[str] | None = None) -> None:
        self.calls: list[tuple[list[str], list[str] | None]] = []
        self.sleep, self.path, self.fail = sleep, path, fail or set()
        self.lock = threading.Lock()
        self.active = self.max_active = 0
        self.started = threading.Event()

    def __call__(self, store: Store, cfg: Any, steps: list[str], **kw: Any) -> RunSummary:
        with self.lock:
            self.active += 1
            self.max_active = max(self.max_active, self.active)
            self.calls.append((list(steps), kw.get("clusters")))
            if self.path:
                with self.path.open("a") as f:
                    f.write(",".join(steps) + "\n")
        self.started.set()
        time.sleep(self.sleep)
        with self.lock:
            self.active -= 1
        return RunSummary([StepResult(s, s not in self.fail) for s in steps])

    def count(self, step: str) -> int:
        with self.lock:
            return sum(step in steps for steps, _ in self.calls)


def make_cfg(tmp: Path, url: str, clusters: list[dict] | None = None, **schedule: Any) -> config_mod.Config:
    return config_mod.parse({"store": {"url": url, "batch_rows": 100}, "clusters": clusters or [],
                             "schedule": schedule, "report": {"out_dir": str(tmp / "reports")}})


@pytest.fixture
def sqlite_store(tmp_path: Path) -> Store:
    store = Store.open(f"sqlite:///{tmp_path / 'store.db'}")
    store.upgrade()
    return store


def wait_for(cond: Any, timeout: float, step: float = 0.05) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(step)
    return bool(cond())


# -- schedule mechanics ----------------------------------------------------------------------------------
def test_jobs_fire_on_a_fast_schedule(tmp_path: Path, sqlite_store: Store) -> None:
    cfg = make_cfg(tmp_path, "sqlite://", [{"name": "a"}, {"name": "b"}])
    rec = Recorder()
    d = Daemon(sqlite_store, cfg, base_dir=tmp_path, runner=rec, triggers=fast(0.2))
    d.start()
    try:
        assert wait_for(lambda: rec.count("collect") >= 6 and rec.count("audit") >= 3, 10)
    finally:
        d.shutdown()
    assert {tuple(c or []) for steps, c in rec.calls if steps == ["collect"]} == {("a",), ("b",)}
    assert d.metrics.registry.get_sample_value("gpu_audit_job_runs_total", {"job": "audit"}) >= 3
    assert not d.scheduler.running


def test_per_cluster_collect_jobs_have_their_own_lease(tmp_path: Path, sqlite_store: Store) -> None:
    cfg = make_cfg(tmp_path, "sqlite://", [{"name": "a"}, {"name": "b"}])
    rec = Recorder(sleep=1.0)
    d = Daemon(sqlite_store, cfg, base_dir=tmp_path, runner=rec, per_cluster=True)
    assert {j.id for j in d.build().get_jobs()} >= {"collect:a", "collect:b", "audit", "report", "chargeback"}
    t = threading.Thread(target=d.collect_job, args=["a"])
    t.start()
    assert rec.started.wait(5)
    other = Daemon(sqlite_store, cfg, base_dir=tmp_path, runner=Recorder(), per_cluster=True)
    assert other.collect_job("a") == []  # a is being collected elsewhere
    assert len(other.collect_job("b")) == 1  # b is not
    t.join()


def test_max_instances_prevents_overlap(tmp_path: Path, sqlite_store: Store) -> None:
    cfg = make_cfg(tmp_path, "sqlite://", [{"name": "a"}])
    rec = Recorder(sleep=0.5)
    d = Daemon(sqlite_store, cfg, base_dir=tmp_path, runner=rec, triggers=fast(0.1), workers=4)
    d.start()
    time.sleep(1.6)
    d.shutdown()
    assert rec.count("collect") >= 2
    assert rec.max_active == 2  # collect and audit overlap each other (4 workers), never themselves
    per_job = {}
    for steps, _ in rec.calls:
        per_job[steps[0]] = per_job.get(steps[0], 0) + 1
    assert per_job["collect"] <= 1.6 / 0.5 + 1


def test_lease_keeps_a_second_daemon_out(tmp_path: Path, sqlite_store: Store) -> None:
    cfg = make_cfg(tmp_path, "sqlite://", [{"name": "a"}])
    rec_a, rec_b = Recorder(sleep=1.0), Recorder()
    a = Daemon(sqlite_store, cfg, base_dir=tmp_path, runner=rec_a, lease_ttl_s=30)
    b = Daemon(sqlite_store, cfg, base_dir=tmp_path, runner=rec_b, lease_ttl_s=30)
    t = threading.Thread(target=a.collect_job)
    t.start()
    assert rec_a.started.wait(5)
    assert b.collect_job() == []
    t.join()
    assert rec_b.calls == [] and len(rec_a.calls) == 1
    assert b.metrics.registry.get_sample_value("gpu_audit_job_skips_total",
                                             {"job": "collect", "reason": "lease_held"}) == 1
    assert len(b.collect_job()) == 1  # released after a's run


def test_lease_expiry_renew_release(sqlite_store: Store) -> None:
    t0 = datetime(2026, 11, 30, 8, tzinfo=UTC)
    clock = {"now": t0}

    def now() -> datetime:
        return clock["now"]

    assert locks.acquire(sqlite_store, "x", "A", 60, now)
    assert not locks.acquire(sqlite_store, "x", "B", 60, now)
    assert locks.acquire(sqlite_store, "x", "A", 60, now)  # re-entrant for its holder
    clock["now"] = t0 + timedelta(seconds=59)
    assert locks.renew(sqlite_store, "x", "A", 60, now)
    clock["now"] = t0 + timedelta(seconds=100)
    assert not locks.acquire(sqlite_store, "x", "B", 60, now)  # renewed until 119
    clock["now"] = t0 + timedelta(seconds=120)
    assert locks.acquire(sqlite_store, "x", "B", 60, now)  # lapsed: B takes over
    assert not locks.renew(sqlite_store, "x", "A", 60, now)
    locks.release(sqlite_store, "x", "A")  # not A's any more: no effect
    assert locks.renew(sqlite_store, "x", "B", 60, now)  # still B's: only the holder can renew
    locks.release(sqlite_store, "x", "B")
    assert locks.acquire(sqlite_store, "x", "C", 60, now)  # released: free for anyone


# -- periods: once per week / month, across restarts -----------------------------------------------------
def test_period_keys_follow_the_cron_in_its_timezone() -> None:
    cfg = config_mod.parse({"schedule": {"timezone": "Europe/Berlin"}})
    trig = cron_triggers(cfg)["report"]
    tz = ZoneInfo("Europe/Berlin")
    now = datetime(2026, 12, 2, 12, tzinfo=tz)  # a Wednesday
    fire = previous_fire(trig, now)
    assert fire is not None and fire.weekday() == 0 and (fire.hour, fire.minute) == (8, 0)
    assert fire <= now < fire + timedelta(days=7)
    # the same key notify stamps on the admin email of an audit window ending at the firing
    assert period_key("report", fire) == notify_period_key(int(fire.timestamp()))
    assert period_key("report", fire) != period_key("report", fire + timedelta(days=7))
    monthly = previous_fire(cron_triggers(cfg)["chargeback"], now)
    assert monthly is not None and monthly.day == 1
    prev_month = monthly - timedelta(days=1)
    assert period_key("chargeback", monthly) == f"{prev_month.year}-{prev_month.month:02d}"


def test_bad_schedule_names_the_key() -> None:
    with pytest.raises(Exception, match="schedule.audit"):
        cron_triggers(config_mod.parse({"schedule": {"audit": "61 * * * *"}}))
    with pytest.raises(Exception, match="schedule.timezone"):
        cron_triggers(config_mod.parse({"schedule": {"timezone": "Mars/Olympus"}}))


def test_weekly_report_once_per_period_and_caught_up_after_restart(tmp_path: Path, sqlite_store: Store) -> None:
    cfg = make_cfg(tmp_path, "sqlite://")
    tz = ZoneInfo(cfg.schedule.timezone)
    monday = previous_fire(cron_triggers(cfg)["report"], datetime(2026, 11, 25, tzinfo=tz))
    assert monday is not None
    clock = {"now": monday + timedelta(seconds=5)}
    rec = Recorder()

    def daemon() -> Daemon:
        return Daemon(sqlite_store, cfg, base_dir=tmp_path, runner=rec, clock=lambda: clock["now"])

    assert daemon().missed() == []  # first install: nothing to catch up
    d = daemon()
    assert d.report_job() is not None and rec.count("notify") == 1
    assert d.report_job() is None and rec.count("notify") == 1  # same period: skipped
    assert period_done(sqlite_store, "report", period_key("report", monday), False)

    # down over the next Monday's firing; restarted at 10:00
    clock["now"] = monday + timedelta(days=7, hours=2)
    d2 = daemon()
    assert [job for job, _fire in d2.missed()] == ["report"]
    d2.start()
    try:
        assert wait_for(lambda: rec.count("notify") == 2, 10)
    finally:
        d2.shutdown()
    assert daemon().missed() == []  # and a further restart does not repeat it
    with sqlite_store.engine.connect() as c:
        keys = [r[0] for r in c.execute(text("SELECT period_key FROM notifications WHERE kind = :k ORDER BY id"),
                                        {"k": MARKER_KIND["report"]})]
    assert keys == [period_key("report", monday), period_key("report", monday + timedelta(days=7))]


def test_failed_notify_leaves_the_period_open(tmp_path: Path, sqlite_store: Store) -> None:
    cfg = make_cfg(tmp_path, "sqlite://")
    fire = datetime(2026, 11, 30, 8, tzinfo=UTC)
    rec = Recorder(fail={"notify"})
    d = Daemon(sqlite_store, cfg, base_dir=tmp_path, runner=rec, clock=lambda: fire)
    d.report_job(fire)
    assert not period_done(sqlite_store, "report", period_key("report", fire), False)
    d.runner = Recorder()
    d.report_job(fire)
    assert period_done(sqlite_store, "report", period_key("report", fire), False)


# -- crash safety: SIGKILL mid-collect -------------------------------------------------------------------
def write_long_csv(path: Path, start: datetime, hours: float, gpus: int) -> None:
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["timestamp", "host", "gpu", "uuid", "metric", "value"])
        for i in range(int(hours * 60)):
            ts = (start + timedelta(minutes=i)).isoformat()
            for g in range(gpus):
                w.writerow([ts, "node-1", g, f"GPU-{g:04d}", "DCGM_FI_PROF_SM_ACTIVE", (g * 7 + i) % 100 / 100])
                w.writerow([ts, "node-1", g, f"GPU-{g:04d}", "DCGM_FI_DEV_GPU_UTIL", (g * 13 + i) % 100])


CHILD = r"""
import json, os, signal, sys
from pathlib import Path
import auditor.store.ingest as ingest
from auditor import config
from auditor.collect import collect
from auditor.store.engine import Store
calls, real = [], ingest.ingest_buckets
def killing(conn, buckets, cache, *rest):
    calls.append([[b.gpu, int(b.start.timestamp())] for b in buckets])
    n = real(conn, buckets, cache, *rest)
    if len(calls) == 3:  # the third batch is written inside its transaction, not committed
        Path(sys.argv[2]).write_text(json.dumps(calls))
        os.kill(os.getpid(), signal.SIGKILL)
    return n
ingest.ingest_buckets = killing
cfg = config.load(sys.argv[1])
collect(Store.open(cfg.store.url, cfg.store.batch_rows), cfg, base_dir=Path(sys.argv[1]).parent)
"""


def bucket_rows(store: Store) -> set[tuple]:
    with store.engine.connect() as c:
        return set(c.execute(text("SELECT tg.host, tg.gpu_index, b.bucket_ts, b.samples, b.sm_active, b.gpu_util "
                                  "FROM gpu_buckets b JOIN telemetry_gpus tg ON tg.id = b.gpu_id")).all())


def test_sigkill_mid_collect_leaves_no_partial_batch_and_next_run_catches_up(tmp_path: Path) -> None:
    now = utcnow()
    start = floor_to(now, 3600) - timedelta(hours=6)
    write_long_csv(tmp_path / "telemetry.csv", start, 5.5, 8)
    cluster = {"name": "c", "initial_days": 1, "telemetry": [{"kind": "file", "paths": ["telemetry.csv"]}]}
    cfg = make_cfg(tmp_path, f"sqlite:///{tmp_path / 'crash.db'}", [cluster])
    (tmp_path / "cfg.toml").write_text(
        f'[store]\nurl = "{cfg.store.url}"\nbatch_rows = 100\n[[clusters]]\nname = "c"\ninitial_days = 1\n'
        '[[clusters.telemetry]]\nkind = "file"\npaths = ["telemetry.csv"]\n')
    store = Store.open(cfg.store.url, 100)
    store.upgrade()
    # run 1: everything up to start + 2h
    first = collect(store, cfg, base_dir=tmp_path, until=start + timedelta(hours=2))
    assert first.ok
    wm1 = store.watermark("c", "telemetry[0]:file")
    before = bucket_rows(store)
    # run 2: killed while its third batch is inside an open transaction
    dump = tmp_path / "batches.json"
    proc = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path / "cfg.toml"), str(dump)],  # noqa: S603
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    batches = json.loads(dump.read_text())
    after = bucket_rows(store)
    keys_after = {(g, ts) for _h, g, ts, *_ in after}
    assert store.watermark("c", "telemetry[0]:file") == wm1  # the watermark did not move
    assert all((g, ts) in keys_after for b in batches[:2] for g, ts in b)  # committed batches are whole
    keys_before = {(g, ts) for _h, g, ts, *_ in before}
    assert not [k for k in map(tuple, batches[2]) if k not in keys_before and k in keys_after]  # batch 3: none
    # run 3: the daemon's collect job catches up from the watermark
    d = Daemon(store, cfg, base_dir=tmp_path)
    summaries = d.collect_job()
    assert summaries and summaries[0].exit_code == 0
    assert store.watermark("c", "telemetry[0]:file") > wm1
    # same as one uninterrupted collection into a fresh store
    ref = Store.open(f"sqlite:///{tmp_path / 'ref.db'}", 100)
    ref.upgrade()
    assert collect(ref, cfg, base_dir=tmp_path).ok
    assert bucket_rows(store) == bucket_rows(ref)
    assert len(bucket_rows(ref)) > len(before)


# -- two daemons, one PostgreSQL store -------------------------------------------------------------------
@pytest.mark.service
def test_two_daemons_on_postgresql_send_one_weekly_email(tmp_path: Path, pg_schema_url: str) -> None:
    store = Store.open(pg_schema_url)
    store.upgrade()
    with store.engine.connect() as c:
        assert c.execute(text("SELECT current_schema()")).scalar().startswith("t_")
    cfg = make_cfg(tmp_path, pg_schema_url)
    sent = tmp_path / "sent.txt"
    fire = datetime(2026, 11, 30, 8, tzinfo=UTC)
    daemons = [Daemon(Store.open(pg_schema_url), cfg, base_dir=tmp_path, runner=Recorder(0.3, sent),
                      clock=lambda: fire, triggers={"report": IntervalTrigger(seconds=0.2)}) for _ in range(2)]
    # both fire at the same moment
    threads = [threading.Thread(target=d.report_job) for d in daemons]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sent.read_text().splitlines() == ["audit,report,notify"]
    # and both keep firing on a fast schedule: the period is done, nothing more is sent
    for d in daemons:
        d.start()
    time.sleep(1.5)
    for d in daemons:
        d.shutdown()
    assert sum(d.metrics.registry.get_sample_value("gpu_audit_job_runs_total", {"job": "report"}) or 0
               for d in daemons) >= 6
    assert sent.read_text().splitlines() == ["audit,report,notify"]
    with store.engine.connect() as c:
        assert c.execute(text("SELECT count(*) FROM notifications WHERE kind = 'weekly_report_run'")).scalar() == 1


@pytest.mark.service
def test_lease_race_on_postgresql(pg_schema_url: str) -> None:
    store = Store.open(pg_schema_url)
    store.upgrade()
    barrier, won = threading.Barrier(8), []

    def grab(i: int) -> None:
        s = Store.open(pg_schema_url)
        barrier.wait()
        if locks.acquire(s, "weekly-report", f"h{i}", 60):
            won.append(i)
        s.engine.dispose()

    threads = [threading.Thread(target=grab, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1
    assert [i for i in range(8) if locks.renew(store, "weekly-report", f"h{i}", 60)] == won  # the winner holds it


# -- /healthz and /metrics on the demo fleet -------------------------------------------------------------
def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def demo_store(tmp_path: Path) -> tuple[Path, config_mod.Config, Store]:
    from auditor.demo import generate

    cfg_path, _start, _end = generate(tmp_path / "demo")
    cfg = config_mod.load(cfg_path)
    store = Store.open(cfg.store.url)
    store.upgrade()
    return cfg_path, cfg, store


def test_metrics_health_and_weekly_report_on_the_demo_fleet(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.chdir(tmp_path)
    cfg_path, cfg, store = demo_store(tmp_path)
    d = Daemon(store, cfg, base_dir=cfg_path.parent)
    assert all(s.exit_code == 0 for s in d.collect_job())
    assert d.audit_job().exit_code == 0
    server = HealthServer("127.0.0.1", 0, d.metrics, lambda: health(store, cfg, 900)).start()
    try:
        code, body = get(f"http://127.0.0.1:{server.port}/metrics")
        assert code == 200
        for c in cfg.clusters:
            for role in ("allocations", "telemetry"):
                label = f'cluster="{c.name}",source="{role}[0]:{getattr(c, role)[0].kind}"'
                assert f"gpu_audit_last_collect_success_timestamp_seconds{{{label}}}" in body
                assert f"gpu_audit_collect_lag_seconds{{{label}}}" in body
        assert 'gpu_audit_step_duration_seconds_count{step="collect"}' in body
        assert 'gpu_audit_step_runs_total{step="audit"} 1.0' in body
        with store.engine.connect() as c:
            rows = c.execute(text("SELECT team, SUM(idle_s + mirage_s), SUM(idle_cost) FROM usage_allocation "
                                  "WHERE run_id = (SELECT MAX(id) FROM audit_runs WHERE status = 'ok') "
                                  "GROUP BY team")).all()
        assert rows
        series = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in body.splitlines()
                  if line.startswith("gpu_audit_team_idle")}
        for team, seconds, cost in rows:
            assert series[f'gpu_audit_team_idle_gpu_seconds{{team="{team}"}}'] == pytest.approx(seconds)
            assert series[f'gpu_audit_team_idle_cost{{currency="USD",team="{team}"}}'] == pytest.approx(cost)
        code, body = get(f"http://127.0.0.1:{server.port}/healthz")
        assert code == 200 and json.loads(body)["status"] == "ok"
    finally:
        server.stop()
    ok, detail = health(store, cfg, 900, now=utcnow() + timedelta(hours=1))
    # every source of the demo is stale an hour later: each cluster's allocations, telemetry and node telemetry
    # files, the k8s cluster's inference metrics, and the 2026 site's pods and saved /federate answer
    # (auditor/demo.py writes nine sources)
    assert not ok and sorted(detail["stale"]) == ["hpc allocations[0]:file", "hpc telemetry[0]:file",
                                                  "hpc telemetry[1]:node_exporter", "k8s allocations[0]:file",
                                                  "k8s telemetry[0]:file", "k8s telemetry[1]:inference",
                                                  "k8s telemetry[2]:node_exporter", "k8s-2026 allocations[0]:file",
                                                  "k8s-2026 telemetry[0]:scrape"], detail["stale"]
    # the weekly job through the real steps (audit, report, notify in dry-run: .eml files)
    weekly = Daemon(store, cfg, base_dir=cfg_path.parent, dry_run=True)
    summary = weekly.report_job()
    assert summary is not None and summary.exit_code == 0, summary.as_dict()
    outbox = cfg.report.out_dir / "outbox"  # report.out_dir is relative to the config file
    assert outbox == tmp_path / "demo" / "reports" / "outbox"
    emails = list(outbox.glob("*.eml"))
    assert emails
    assert weekly.report_job() is None  # same period: not again
    assert sorted(outbox.glob("*.eml")) == sorted(emails)


@pytest.mark.slow
def test_serve_runs_demo_and_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    cfg_path, cfg, _store = demo_store(tmp_path)
    port = free_port()
    launcher = ("import sys; from auditor.cli import main; from auditor.cli import serve as cli_serve\n"
                "'serve' in main.commands or cli_serve.register(main)\nmain()")
    proc = subprocess.Popen([sys.executable, "-c", launcher, "-c", str(cfg_path), "serve", "--listen",  # noqa: S603
                             f"127.0.0.1:{port}", "--once-now", "--every", "3", "--health-max-age", "600"],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert wait_for(lambda: port_open("127.0.0.1", port), 30, 0.2), proc.stderr
        assert wait_for(lambda: get(f"http://127.0.0.1:{port}/healthz")[0] == 200
                        and "gpu_audit_latest_audit_run_id" in get(f"http://127.0.0.1:{port}/metrics")[1]
                        and "gpu_audit_team_idle_gpu_seconds" in get(f"http://127.0.0.1:{port}/metrics")[1], 90, 0.5)
        body = get(f"http://127.0.0.1:{port}/metrics")[1]
        assert 'gpu_audit_job_runs_total{job="collect"}' in body
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert "Traceback" not in err + out
    assert "shutting down" in err


def test_example_config_is_valid() -> None:
    cfg = config_mod.load(ROOT / "deploy" / "example-config.toml")
    assert set(cron_triggers(cfg)) == {"collect", "audit", "report", "chargeback"}
    assert cfg.clusters and all(c.allocations and c.telemetry for c in cfg.clusters)


def test_deploy_files_agree() -> None:
    yaml = pytest.importorskip("yaml")
    kube = ROOT / "deploy" / "kubernetes"
    dep = [d for d in yaml.safe_load_all((kube / "daemon" / "deployment.yaml").read_text()) if d]
    cron = [d for d in yaml.safe_load_all((kube / "cronjob" / "cronjob.yaml").read_text()) if d]
    pod = next(d for d in dep if d["kind"] == "Deployment")["spec"]["template"]["spec"]
    job = next(d for d in cron if d["kind"] == "CronJob")["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == job["serviceAccountName"] == "gpu-audit"
    assert "serve" in pod["containers"][0]["args"]
    args = job["containers"][0]["args"]
    assert args[args.index("--steps") + 1] == "collect,audit,report,notify"
    systemd = ROOT / "deploy" / "systemd"
    assert "gpu-audit" in (systemd / "gpu-audit.service").read_text()
    assert "OnCalendar=" in (systemd / "gpu-audit-run.timer").read_text()
    assert os.path.exists(systemd / "gpu-audit-run.service")


def test_collect_then_audit_then_enforce_when_both_fire_in_one_tick(tmp_path: Path, sqlite_store: Store) -> None:
    """Issue 31 item 14: collect every 15 minutes and audit hourly both fire at 10:00. APScheduler runs the
    two jobs in its thread pool in either order; before the fix the audit job (audit, enforce) could run
    first on the store as it was, the collect after it. Now the audit job collects first and the collect
    firing of that tick stands aside; at 10:15 the collect runs alone."""
    from apscheduler.triggers.cron import CronTrigger

    rec = Recorder()
    clock = [datetime(2026, 12, 1, 10, 0, 3, tzinfo=UTC)]
    cfg = make_cfg(tmp_path, f"sqlite:///{tmp_path / 'store.db'}", [{"name": "a"}, {"name": "b"}],
                   collect="*/15 * * * *", audit="0 * * * *")
    d = Daemon(sqlite_store, cfg, base_dir=tmp_path, runner=rec, clock=lambda: clock[0])
    assert all(isinstance(d.triggers[j], CronTrigger) for j in ("collect", "audit"))
    sched = d.build()
    audit_fn, collect_fn = sched.get_job("audit").func, sched.get_job("collect").func
    audit_fn()  # the worst order: the audit firing is picked first
    collect_fn()
    assert rec.calls == [(["collect"], ["a"]), (["collect"], ["b"]), (["audit", "enforce"], None)]
    clock[0] = datetime(2026, 12, 1, 10, 15, 2, tzinfo=UTC)
    collect_fn()
    assert rec.calls[3:] == [(["collect"], ["a"]), (["collect"], ["b"])]
