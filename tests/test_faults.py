"""Fault isolation, part 2 (issue 15): a record the store refuses costs that record only, on both engines; a
quarantine that cannot be written never sticks the watermark; a reader bug fails its source only and `run`
still audits and reports (exit 3); one retry policy (Retry-After, a time budget, no retry inside a retry);
the scrape and file readers never hang on a FIFO or /dev/zero; CLI times out of range are one line."""

from __future__ import annotations

import http.server
import logging
import os
import subprocess
import sys
import threading
import time
import types
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from conftest import run_cli
from helpers import add_connector
from helpers_crash import REPO, T0, generate
from sqlalchemy import select

from auditor import collect as collect_mod
from auditor import config as config_mod
from auditor.errors import SourceError
from auditor.records import AllocatedGpu, Allocation, GpuBucket
from auditor.store import schema
from auditor.store.engine import Store
from connectors import retry as retry_mod
from connectors.base import Context, Options, Problems, Window

WINDOW = Window(T0, T0 + timedelta(days=2), 300)


def _alloc(i: int, name: str | None = "job") -> Allocation:
    return Allocation("c", "file", f"a{i}", name=name, start=T0, end=T0 + timedelta(hours=1),  # type: ignore[arg-type]
                      gpus=[AllocatedGpu("n0", i)])


def _bucket(host: str, minute: int, samples: int | None = 1) -> GpuBucket:
    return GpuBucket("c", host, 0, T0 + timedelta(minutes=5 * minute), 300, samples, sm_active=0.5)  # type: ignore[arg-type]


def test_a_refused_batch_is_stored_row_by_row(store: Store) -> None:
    """Both engines refuse NULL in NOT NULL columns. The batch fails, is retried record by record in
    savepoints: the 5 good allocations and 10 good buckets are committed, the 2 bad records are handed to
    ``on_bad`` with a one-line reason, and the bad bucket's new GPU row (host nX) is rolled back with it."""
    good_allocs = [_alloc(i) for i in range(5)]
    good_buckets = [_bucket("n0", m) for m in range(10)]
    records = [*good_allocs[:2], _alloc(99, name=None), *good_allocs[2:], *good_buckets[:4],
               _bucket("nX", 0, samples=None), *good_buckets[4:]]
    refused: list[tuple[str, str]] = []
    stats = store.ingest(records, seen_at_ts=int(T0.timestamp()),
                         on_bad=lambda rec, reason: refused.append((type(rec).__name__, reason)))
    assert (stats.allocations, stats.allocated_gpus, stats.buckets) == (5, 5, 10)
    assert [kind for kind, _ in refused] == ["Allocation", "GpuBucket"]
    assert all(r.startswith("the store refused it: ") and "\n" not in r for _, r in refused)
    with store.engine.connect() as c:
        ids = sorted(c.execute(select(schema.allocations.c.external_id)).scalars())
        hosts = sorted(c.execute(select(schema.telemetry_gpus.c.host)).scalars())
    assert ids == [f"a{i}" for i in range(5)] and hosts == ["n0"]
    assert store.count("gpu_buckets") == 10


def test_without_on_bad_a_refused_batch_still_fails_whole(store: Store) -> None:
    """The library call without a quarantine keeps all-or-nothing: nothing of the batch is committed."""
    with pytest.raises(Exception):  # noqa: B017 - the driver's own IntegrityError class differs per engine
        store.ingest([_alloc(1), _alloc(2, name=None)], seen_at_ts=int(T0.timestamp()))
    assert store.count("allocations") == 0


def _file_cfg(tmp_path: Path, url: str) -> config_mod.Config:
    (tmp_path / "a.csv").write_text("id,start,gpus\n1,2026-11-20,n0:0\n2,not-a-time,n0:1\n3,2026-11-20,n0:2\n")
    return config_mod.parse({"store": {"url": url}, "clusters": [
        {"name": "c", "allocations": [{"kind": "file", "paths": ["a.csv"]}]}]})


def test_quarantine_that_cannot_be_written_does_not_stick_the_watermark(
        tmp_path: Path, store_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    from sqlalchemy.exc import DataError

    def refuse(*_a: object) -> None:
        raise DataError("INSERT INTO quarantined_records", {}, Exception("value too long"))

    monkeypatch.setattr(collect_mod, "_quarantine", refuse)
    monkeypatch.setattr(logging.getLogger("gpu_audit"), "propagate", True)
    cfg = _file_cfg(tmp_path, store_url)
    store = Store.open(store_url)
    store.upgrade()
    c = cfg.clusters[0]
    res = collect_mod.collect_source(store, cfg, c, "allocations", 0, c.allocations[0], WINDOW, tmp_path)
    assert res.ok and res.skipped == 1 and res.stats["allocations"] == 2
    assert store.watermark("c", "allocations[0]:file") == int(WINDOW.until.timestamp())
    assert any("1 quarantined records could not be stored" in r.getMessage() for r in caplog.records)
    store.engine.dispose()


def _module(name: str, collect: object, role: str = "TELEMETRY") -> types.ModuleType:
    class Source:
        class Options(Options):
            pass

        def __init__(self, context: Context, options: Options) -> None:
            self.ctx = context

    Source.collect = collect  # type: ignore[attr-defined]
    mod = types.ModuleType(f"connectors.{name}")
    setattr(mod, role, Source)
    return mod


def test_reader_bug_fails_its_source_only_and_run_reports_exit_3(
        tmp_path: Path, store_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A reader raising OverflowError (not one of ours) after yielding a bucket: that source fails on one
    line, nothing of it is stored, its watermark stays; the other cluster is collected; audit and report run;
    the exit code is 3."""
    from auditor.daemon.pipeline import run_steps
    from auditor.errors import EXIT_PARTIAL

    def broken(self: object, window: Window, problems: Problems) -> Iterator[GpuBucket]:
        yield GpuBucket(self.ctx.cluster, "n0", 0, window.since, 300, 10, sm_active=0.9)  # type: ignore[attr-defined]
        raise OverflowError("date value out of range")

    add_connector(monkeypatch, "brokenreader", _module("brokenreader", broken))
    generate(tmp_path, rows=200, allocations=5)
    cfg = config_mod.parse({"store": {"url": store_url}, "report": {"out_dir": str(tmp_path / "out")}, "clusters": [
        {"name": "good", "initial_days": 30, "allocations": [{"kind": "file", "paths": ["alloc.csv"]}],
         "telemetry": [{"kind": "file", "paths": ["tel.csv"]}]},
        {"name": "bad", "initial_days": 30, "telemetry": [{"kind": "brokenreader"}]}]})
    store = Store.open(store_url)
    store.upgrade()
    summary = run_steps(store, cfg, ["collect", "audit", "report"], base_dir=tmp_path, since=T0,
                        until=T0 + timedelta(days=2), formats=["text"])
    assert summary.exit_code == EXIT_PARTIAL
    steps = {s.name: s for s in summary.steps}
    assert steps["audit"].ok and steps["report"].ok and steps["audit"].detail["reserved_gpu_hours"] == 10
    bad = [r for r in steps["collect"].detail["sources"] if r["cluster"] == "bad"][0]
    assert not bad["ok"] and "OverflowError" in bad["error"] and "\n" not in bad["error"]
    with store.engine.connect() as c:
        assert c.execute(select(schema.telemetry_gpus.c.id).where(schema.telemetry_gpus.c.cluster == "bad")).all() == []
    assert store.watermark("bad", "telemetry[0]:brokenreader") is None
    store.engine.dispose()


def _flaky(fail: int, calls: list[float], retry_after: float | None = None, takes_s: float = 0.0):
    def collect(self: object, window: Window, problems: Problems) -> Iterator[GpuBucket]:
        calls.append(time.monotonic())
        time.sleep(takes_s)
        if len(calls) <= fail:
            raise SourceError("http://exporter", "503 busy", transient=True, retry_after=retry_after)
        yield GpuBucket(self.ctx.cluster, "n0", 0, window.since, 300, 10, sm_active=0.9)  # type: ignore[attr-defined]

    return collect


def _flaky_cfg(tmp_path: Path, kind: str) -> config_mod.Config:
    return config_mod.parse({"store": {"url": f"sqlite:///{tmp_path / 's.db'}"},
                             "clusters": [{"name": "c", "telemetry": [{"kind": kind}]}]})


@pytest.mark.parametrize("retry_after,sleeps", [(None, [1.0, 2.0]), (5.0, [5.0, 5.0]), (1.5, [1.5, 2.0])])
def test_retry_after_is_honoured(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, retry_after: float | None,
                                 sleeps: list[float]) -> None:
    """Waits are max(backoff 1 s, 2 s, ..., Retry-After): hand-computed for each hint."""
    calls: list[float] = []
    add_connector(monkeypatch, "flaky2", _module("flaky2", _flaky(2, calls, retry_after)))
    cfg = _flaky_cfg(tmp_path, "flaky2")
    store = Store.open(cfg.store.url)
    store.upgrade()
    slept: list[float] = []
    c = cfg.clusters[0]
    res = collect_mod.collect_source(store, cfg, c, "telemetry", 0, c.telemetry[0], WINDOW, tmp_path,
                                     sleep=slept.append)
    assert res.ok and res.attempts == 3 and slept == sleeps and store.count("gpu_buckets") == 1


def test_a_dead_source_costs_at_most_its_time_budget(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each attempt takes 1 s and fails; with a 1.5 s budget the second attempt is the last (attempt 1 ends at
    1.0 s, + 0.1 s wait < 1.5: retry; attempt 2 ends at 2.1 s: no time for a third)."""
    calls: list[float] = []
    add_connector(monkeypatch, "slow", _module("slow", _flaky(99, calls, takes_s=1.0)))
    monkeypatch.setattr(retry_mod, "SOURCE_BUDGET_S", 1.5)
    monkeypatch.setattr(retry_mod, "BACKOFF_S", 0.1)
    cfg = _flaky_cfg(tmp_path, "slow")
    store = Store.open(cfg.store.url)
    store.upgrade()
    c = cfg.clusters[0]
    t0 = time.monotonic()
    res = collect_mod.collect_source(store, cfg, c, "telemetry", 0, c.telemetry[0], WINDOW, tmp_path)
    assert not res.ok and res.attempts == 2 and len(calls) == 2 and time.monotonic() - t0 < 3.0


class _Busy(http.server.BaseHTTPRequestHandler):
    hits: list[float] = []

    def do_GET(self) -> None:  # noqa: N802 - http.server API
        _Busy.hits.append(time.monotonic())
        self.send_response(503)
        self.send_header("Retry-After", "1")
        self.send_header("Content-Length", "4")
        self.end_headers()
        self.wfile.write(b"busy")

    do_POST = do_GET  # noqa: N815

    def log_message(self, *_a: object) -> None:
        pass


def test_prometheus_is_retried_once_per_request_never_again_by_the_collector(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A Prometheus answering 503 + Retry-After: 1 to everything, with retries = 2: exactly 3 requests (not
    3 x 3 from a collector retry around a request retry), about 1 s apart as the server asked."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Busy)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _Busy.hits = []
    from connectors import retry

    monkeypatch.setattr(retry, "BACKOFF_S", 0.0)  # the server's Retry-After alone sets the waits
    try:
        cfg = config_mod.parse({"store": {"url": f"sqlite:///{tmp_path / 's.db'}"}, "clusters": [
            {"name": "c", "telemetry": [{"kind": "prometheus", "url": f"http://127.0.0.1:{server.server_port}",
                                         "retries": 2, "timeout_s": 5}]}]})
        store = Store.open(cfg.store.url)
        store.upgrade()
        c = cfg.clusters[0]
        res = collect_mod.collect_source(store, cfg, c, "telemetry", 0, c.telemetry[0], WINDOW, tmp_path)
    finally:
        server.shutdown()
    assert not res.ok and res.attempts == 1 and "HTTP 503" in res.error
    assert len(_Busy.hits) == 3
    gaps = [b - a for a, b in zip(_Busy.hits, _Busy.hits[1:], strict=False)]
    assert all(0.9 <= g < 3 for g in gaps), gaps


@pytest.mark.timeout(30)
@pytest.mark.parametrize("kind", ["fifo", "dev-zero-link", "directory"])
@pytest.mark.parametrize("connector", ["scrape", "file"])
def test_fifo_or_dev_zero_is_an_error_not_a_hang(tmp_path: Path, kind: str, connector: str) -> None:
    name = "x.prom" if connector == "scrape" else "x.csv"
    target = tmp_path / name
    if kind == "fifo":
        os.mkfifo(target)
    elif kind == "dev-zero-link":
        target.symlink_to("/dev/zero")
    else:
        target.mkdir()
    role = "telemetry"
    cfg = config_mod.parse({"store": {"url": f"sqlite:///{tmp_path / 's.db'}"}, "clusters": [
        {"name": "c", role: [{"kind": connector, "paths": [name]}]}]})
    store = Store.open(cfg.store.url)
    store.upgrade()
    c = cfg.clusters[0]
    t0 = time.monotonic()
    res = collect_mod.collect_source(store, cfg, c, role, 0, c.telemetry[0], WINDOW, tmp_path)
    want = {"fifo": "a FIFO", "dev-zero-link": "a device, through a link", "directory": "a directory"}[kind]
    assert not res.ok and f"not a regular file ({want})" in res.error and "\n" not in res.error
    assert time.monotonic() - t0 < 5 and res.attempts == 1


def test_scrape_size_cap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from connectors import scrape
    from connectors.scrape import ScrapeFiles

    monkeypatch.setattr(scrape, "MAX_BYTES", 4096)
    (tmp_path / "big.prom").write_text("# " + "x" * 5000 + "\n")
    src = ScrapeFiles(Context("c", tmp_path), ScrapeFiles.Options(paths=["big.prom"]))
    with pytest.raises(SourceError, match="larger than 4,096 bytes"):
        src.collect(WINDOW, Problems())


@pytest.mark.parametrize("args", [["audit", "--since", "0001-01-01T00:00:00+01:00"],
                                  ["audit", "--until", "now-99999999999999999999days"],
                                  ["collect", "--since", "9999-12-31T23:00:00-05:00"],
                                  ["run", "--since", "2026-11-20", "--until", "99999999999"],
                                  ["collect", "--until", "1800-01-01"],
                                  ["db", "prune", "--keep-weeks", "1e300", "--dry-run"],
                                  ["db", "prune", "--keep-runs-days", "nan", "--dry-run"]])
def test_cli_times_out_of_range_are_one_line(tmp_path: Path, args: list[str]) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[store]\nurl = "sqlite:///{tmp_path / "s.db"}"\n')
    assert run_cli("-c", str(cfg), "db", "upgrade", cwd=REPO).returncode == 0
    res = run_cli("-c", str(cfg), *args, cwd=REPO)
    lines = res.stderr.strip().splitlines()
    assert "unexpected" not in res.stderr and "Traceback" not in res.stderr
    if args[0] == "db":  # click's usage error, one line like the others: exit 2, naming the option
        assert res.returncode == 2 and len(lines) == 1, res.stderr
        assert lines[0].startswith("gpu-audit: error: Invalid value for '--keep"), res.stderr
        return
    assert res.returncode == 1 and len(lines) == 1 and lines[0].startswith("gpu-audit: error: "), res.stderr
    assert "out of range" in lines[0]


def test_log_lines_escape_unicode_separators_and_bidi() -> None:
    from auditor.logs import _SafeFormatter, log_safe

    evil = "job\u2028INFO forged\u2029x\x85y\u202egnp.exe\u2066z\u200f"
    assert log_safe(evil) == "job\\u2028INFO forged\\u2029x\\x85y\\u202egnp.exe\\u2066z\\u200f"
    rec = logging.LogRecord("gpu_audit.t", logging.WARNING, __file__, 1, "name %s", (evil,), None)
    line = _SafeFormatter("%(message)s").format(rec)
    assert line.splitlines() == [line] and len(str.splitlines(line)) == 1
    assert not any(c in line for c in "\u2028\u2029\x85\u202e\u2066\u200f")


def test_retry_after_header_forms() -> None:
    now = datetime(2026, 11, 30, 8, 0, 0, tzinfo=UTC)
    assert retry_mod.retry_after("7") == 7.0
    assert retry_mod.retry_after("Mon, 30 Nov 2026 08:00:30 GMT", now) == 30.0
    assert retry_mod.retry_after("99999") == retry_mod.MAX_RETRY_AFTER_S
    assert retry_mod.retry_after("soon") is None and retry_mod.retry_after(None) is None


def _decoded(p: Path) -> str:
    """A report's text, or an email's text and HTML parts decoded (their bodies are base64/QP on the wire)."""
    if p.suffix != ".eml":
        return p.read_text(encoding="utf-8")
    import email
    from email import policy

    msg = email.message_from_bytes(p.read_bytes(), policy=policy.default)
    return "\n".join(part.get_content() for part in msg.walk() if part.get_content_maintype() == "text")


def test_a_10_mb_job_name_makes_small_reports_and_emails(tmp_path: Path, store: Store) -> None:
    """One idle allocation named with 10 MB (and a 300 kB user and account): every report format but JSON
    and every email (admin report, team and user nudges, written as .eml) stays under 1 MB and shows the name
    shortened; the store and the JSON report keep it whole."""
    from auditor.audit.run import run_audit
    from auditor.report.notify import notify
    from auditor.report.render import write_reports

    big = "J" * 10_000_000
    user = "u" * 300_000
    a = Allocation("c", "file", "big", name=big, user=user, account="acct", start=T0, end=T0 + timedelta(hours=6),
                   gpus=[AllocatedGpu("n0", 0, model="h100")])
    buckets = [GpuBucket("c", "n0", 0, T0 + timedelta(minutes=5 * m), 300, 5, sm_active=0.0, gpu_util=0.0)
               for m in range(72)]
    store.ingest([a, *buckets], seen_at_ts=int(T0.timestamp()))
    cfg = config_mod.parse({"store": {"url": "sqlite://"}, "report": {"out_dir": str(tmp_path / "out")},
                            "teams": [{"name": "t", "accounts": ["acct"], "emails": ["t@example.org"]}],
                            "email": {"admin_to": ["ops@example.org"], "user_domain": "example.org"}})
    run = run_audit(store, cfg, T0, T0 + timedelta(days=1))
    assert run.summary["findings"], "the idle allocation must be a finding, or the test proves nothing"
    paths = write_reports(store, cfg, run.run_id, tmp_path / "out")
    result = notify(store, cfg, run.run_id, dry_run=True, out_dir=tmp_path / "outbox")
    emails = [Path(e["file"]) for e in result["sent"]]
    assert {e["kind"] for e in result["sent"]} >= {"admin_report", "team_nudge"}
    for p in [*paths, *emails]:
        size = p.stat().st_size
        if p.suffix == ".json":
            assert size > 10_000_000 and big in p.read_text()  # the JSON keeps the full name
        elif p.suffix != ".csv":
            assert size < 1_000_000, (p.name, size)
            text = _decoded(p)
            assert "J" * 20 in text and "J" * 1000 not in text  # shown, shortened
            # cut where shown: display names end in an ellipsis (render.shorten), other long values say
            # their full length (render.cap_shown)
            assert "10,000,000 characters" in text or "J\u2026J" in text
    with store.engine.connect() as c:
        assert len(c.execute(select(schema.allocations.c.name)).scalar()) == 10_000_000


@pytest.mark.service
def test_config_check_probe_says_which_answer(tmp_path: Path, pg_schema_url: str) -> None:
    """The real Prometheus testbed (scripts/testbed-prometheus.sh, port 19090) answers, a closed port does not,
    the PostgreSQL store answers (not migrated yet); `config check` alone would say "config ok"."""
    import json

    from conftest import TSDB_TESTBED_ROOT, need_tsdb

    need_tsdb("http://127.0.0.1:19090", TSDB_TESTBED_ROOT / "test")
    (tmp_path / "a.csv").write_text("id,start,gpus\n")
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[store]\nurl = "{pg_schema_url}"\n[[clusters]]\nname = "c"\n'
                   '[[clusters.allocations]]\nkind = "file"\npaths = ["a.csv", "missing.csv"]\n'
                   '[[clusters.telemetry]]\nkind = "prometheus"\nurl = "http://127.0.0.1:19090"\n'
                   '[[clusters.telemetry]]\nkind = "prometheus"\nurl = "http://127.0.0.1:9"\ntimeout_s = 2\n')

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "auditor", "-c", str(cfg), *args], capture_output=True,
                              text=True, cwd=REPO, timeout=120)

    plain = cli("config", "check")  # a file that is not there: the source would collect nothing (issue 44)
    assert plain.returncode == 1 and plain.stderr.strip().endswith("missing.csv: no such file"), plain.stderr
    t0 = time.monotonic()
    res = cli("--json", "config", "check", "--probe")
    assert res.returncode == 1 and time.monotonic() - t0 < 30
    probes = {p["what"]: p for p in json.loads(res.stdout)["probes"]}
    assert probes["store"]["ok"] and "revision none" in probes["store"]["detail"]
    assert probes["c telemetry[0]:prometheus"]["ok"] and "Prometheus API answers" in \
        probes["c telemetry[0]:prometheus"]["detail"]
    assert not probes["c telemetry[1]:prometheus"]["ok"] and "cannot connect" in \
        probes["c telemetry[1]:prometheus"]["detail"]
    assert not probes["c allocations[0]:file"]["ok"] and "missing.csv: no such file" in \
        probes["c allocations[0]:file"]["detail"]
    text = cli("config", "check", "--probe")
    assert text.returncode == 1 and "2 of 4 do not answer" in text.stdout and "FAIL c telemetry[1]" in text.stdout


def test_run_logs_one_line_per_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                    caplog: pytest.LogCaptureFixture) -> None:
    """A cron log alone says what happened: records and quarantined per source, findings, mails sent."""
    from auditor.daemon.pipeline import run_steps

    monkeypatch.setattr(logging.getLogger("gpu_audit"), "propagate", True)
    caplog.set_level(logging.INFO, "gpu_audit")
    (tmp_path / "a.csv").write_text("id,user,start,end,gpus\n1,ann,2026-11-20T00:00:00Z,2026-11-20T06:00:00Z,n0:0\n"
                                    "2,bob,never,,n0:1\n")
    (tmp_path / "t.csv").write_text("timestamp,host,gpu,uuid,metric,value\n" + "".join(
        f"{1795132800 + 300 * i},n0,0,GPU-0,sm_active,0\n" for i in range(72)))
    cfg = config_mod.parse({"store": {"url": f"sqlite:///{tmp_path / 's.db'}"},
                            "report": {"out_dir": str(tmp_path / "out")},
                            "email": {"admin_to": ["ops@example.org"]},
                            "clusters": [{"name": "c", "initial_days": 30,
                                          "allocations": [{"kind": "file", "paths": ["a.csv"]}],
                                          "telemetry": [{"kind": "file", "paths": ["t.csv"]}]}]})
    store = Store.open(cfg.store.url)
    store.upgrade()
    run_steps(store, cfg, ["collect", "audit", "report", "notify"], base_dir=tmp_path, since=T0,
              until=T0 + timedelta(days=1), dry_run=True, formats=["text"])
    lines = [r.getMessage() for r in caplog.records if r.name == "gpu_audit.run"]
    # hand count: 1 allocation + 1 GPU row stored, 1 line quarantined; 72 samples at 5-min spacing = 72 buckets
    assert any(ln.startswith("step collect ok") and "c allocations[0]:file: 2 records, 1 quarantined" in ln
               and "c telemetry[0]:file: 72 records, 0 quarantined" in ln for ln in lines), lines
    assert any(ln.startswith("step audit ok") and "findings (idle_allocation 1" in ln for ln in lines), lines
    # the admin report goes out; user nudges are skipped (email.user_domain is not set): one skip entry
    assert any(ln.startswith("step notify ok") and ln.endswith(": 1 mails sent, 1 skipped") for ln in lines), lines
    assert any(ln.startswith("step report ok") and ln.endswith("2 files written") for ln in lines), lines


@pytest.mark.parametrize("connector", ["scrape", "file"])
def test_a_glob_never_follows_a_link_out_of_its_directory(tmp_path: Path, connector: str) -> None:
    """``dir/*.prom`` finds ``dir/evil.prom -> /outside/secret.prom``: refused by name; a link inside the
    directory is read as usual."""
    ext = "prom" if connector == "scrape" else "csv"
    (tmp_path / "outside").mkdir()
    (tmp_path / "d").mkdir()
    (tmp_path / "outside" / f"secret.{ext}").write_text("timestamp,host,gpu,uuid,metric,value\n")
    (tmp_path / "d" / f"real.{ext}").write_text("timestamp,host,gpu,uuid,metric,value\n")
    (tmp_path / "d" / f"alias.{ext}").symlink_to(tmp_path / "d" / f"real.{ext}")
    cfg = config_mod.parse({"store": {"url": f"sqlite:///{tmp_path / 's.db'}"}, "clusters": [
        {"name": "c", "telemetry": [{"kind": connector, "paths": [f"d/*.{ext}"]}]}]})
    store = Store.open(cfg.store.url)
    store.upgrade()
    c = cfg.clusters[0]
    ok = collect_mod.collect_source(store, cfg, c, "telemetry", 0, c.telemetry[0], WINDOW, tmp_path)
    assert ok.ok, ok.error
    (tmp_path / "d" / f"evil.{ext}").symlink_to(tmp_path / "outside" / f"secret.{ext}")
    res = collect_mod.collect_source(store, cfg, c, "telemetry", 0, c.telemetry[0], WINDOW, tmp_path)
    assert not res.ok and f"evil.{ext}" in res.error and "a link leading outside" in res.error
