"""The daemon under faults (issue 15): exact cron arithmetic for any schedule, and a job whose lease is
taken over stops, so the weekly email goes out once (real SMTP on loopback, aiosmtpd)."""

from __future__ import annotations

import email
import socket
import threading
import time
from datetime import UTC, datetime, timedelta
from email import policy
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from apscheduler.triggers.cron import CronTrigger
from conftest import need
from sqlalchemy import text

from auditor import config as config_mod
from auditor.daemon.pipeline import run_steps
from auditor.daemon.schedule import Daemon, period_done, period_key, previous_fire
from auditor.store.engine import Store

try:
    from aiosmtpd.controller import Controller
except ImportError:  # pragma: no cover - a test dependency
    Controller = None


@pytest.mark.parametrize("cron,tz,now,want", [
    # every 2 minutes, Monday 30 Nov 2026 10:01:30 UTC: the previous firing is 10:00:00 that Monday
    ("*/2 * * * *", "UTC", datetime(2026, 11, 30, 10, 1, 30, tzinfo=UTC), datetime(2026, 11, 30, 10, 0, tzinfo=UTC)),
    # exactly on a firing: that firing
    ("*/2 * * * *", "UTC", datetime(2026, 11, 30, 10, 2, tzinfo=UTC), datetime(2026, 11, 30, 10, 2, tzinfo=UTC)),
    # every minute, a second after one
    ("* * * * *", "UTC", datetime(2026, 11, 30, 0, 0, 1, tzinfo=UTC), datetime(2026, 11, 30, 0, 0, tzinfo=UTC)),
    # 29 February only: from 1 March 2027 the previous one is 29 Feb 2024, three years back
    ("0 0 29 2 *", "UTC", datetime(2027, 3, 1, tzinfo=UTC), datetime(2024, 2, 29, tzinfo=UTC)),
    # weekly, Monday 08:00 Berlin (07:00 UTC in winter), asked on Sunday 6 Dec 2026
    ("0 8 * * mon", "Europe/Berlin", datetime(2026, 12, 6, 12, tzinfo=UTC), datetime(2026, 11, 30, 7, tzinfo=UTC)),
])
def test_previous_fire_is_exact(cron: str, tz: str, now: datetime, want: datetime) -> None:
    zone = ZoneInfo(tz)
    got = previous_fire(CronTrigger.from_crontab(cron, timezone=zone), now.astimezone(zone))
    assert got == want


def lease_holder(store: Store, name: str) -> str:
    """Who holds the lease now, read from the store's locks table (what another daemon would see)."""
    with store.engine.connect() as conn:
        return conn.execute(text("SELECT holder FROM locks WHERE name = :n"), {"n": name}).scalar() or ""


def test_previous_fire_of_a_cron_that_never_fired() -> None:
    trig = CronTrigger.from_crontab("0 0 1 1 *", timezone=UTC)  # 1 January: none between 2 Jan and now
    assert previous_fire(trig, datetime(2026, 6, 1, tzinfo=UTC), horizon=timedelta(days=100)) is None


def test_report_every_two_minutes_on_a_monday_marks_this_week(tmp_path: Path) -> None:
    """The old search from 35 days back stopped after 20,000 firings (27.8 days of a 2-minute cron) and
    stamped the report of Monday 30 Nov 2026 (ISO week 49) as last week's, 2026-W48."""
    store = Store.open(f"sqlite:///{tmp_path / 's.db'}")
    store.upgrade()
    cfg = config_mod.parse({"store": {"url": "sqlite://"}, "schedule": {"report": "*/2 * * * *"}})
    now = datetime(2026, 11, 30, 10, 1, 30, tzinfo=UTC)
    calls: list[list[str]] = []

    def runner(_store: Store, _cfg: Any, steps: list[str], **_kw: Any) -> Any:
        from auditor.daemon.pipeline import RunSummary, StepResult

        calls.append(steps)
        return RunSummary([StepResult(s, True) for s in steps])

    d = Daemon(store, cfg, base_dir=tmp_path, runner=runner, clock=lambda: now)
    d.report_job()
    assert calls == [["audit", "report", "notify"]]
    assert period_done(store, "report", "2026-W49", False) and not period_done(store, "report", "2026-W48", False)


class _Inbox:
    def __init__(self) -> None:
        self.messages: list[Any] = []

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:  # noqa: N802 - aiosmtpd API
        self.messages.append(email.message_from_bytes(envelope.content, policy=policy.default))
        return "250 OK"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_lease_taken_over_mid_job_sends_one_weekly_email(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Daemon A runs the weekly job: audit, report... then stalls past its lease (a GC pause, a suspended VM).
    Daemon B finds the lease lapsed, takes it and runs the whole job. A wakes up: its lease is gone, so it must
    not notify. Both notifies are held at a barrier after building their messages (so neither sees the
    other's), which is exactly when two emails would go out; with the lease check only B gets there."""
    need(Controller is not None, "aiosmtpd is not installed")
    import auditor.report.notify as notify_mod

    inbox, port = _Inbox(), _free_port()
    smtp = Controller(inbox, hostname="127.0.0.1", port=port)
    smtp.start()
    try:
        store = Store.open(f"sqlite:///{tmp_path / 's.db'}")
        store.upgrade()
        cfg = config_mod.parse({"store": {"url": "sqlite://"}, "report": {"out_dir": str(tmp_path / "out")},
                                "email": {"smtp_host": "127.0.0.1", "smtp_port": port, "security": "none",
                                          "admin_to": ["ops@example.org"]}})
        fire = datetime(2026, 11, 30, 8, tzinfo=UTC)
        clock_a = {"now": fire}
        clock_b = {"now": fire + timedelta(hours=1)}  # B looks after A's 300 s lease lapsed
        barrier = threading.Barrier(2, timeout=3)
        real_build = notify_mod.build_messages

        def build_then_meet(*a: Any, **kw: Any) -> Any:
            out = real_build(*a, **kw)
            try:
                barrier.wait()
            except threading.BrokenBarrierError:
                pass
            return out

        monkeypatch.setattr(notify_mod, "build_messages", build_then_meet)
        b = Daemon(store, cfg, base_dir=tmp_path, clock=lambda: clock_b["now"], holder="B", lease_ttl_s=300)
        b_thread = threading.Thread(target=b.report_job, args=(fire,))

        def runner_a(*args: Any, keep_going: Any = None, **kw: Any) -> Any:
            def stalls_before_notify() -> bool:
                if len(calls) == 2:  # audit and report done: A stalls, B takes over
                    b_thread.start()
                    deadline = time.monotonic() + 10
                    while lease_holder(store, "weekly-report") != "B":
                        assert time.monotonic() < deadline, "B never took the lease"
                        time.sleep(0.02)
                calls.append(1)
                return keep_going() if keep_going else True

            calls: list[int] = []
            return run_steps(*args, keep_going=stalls_before_notify, **kw)

        a = Daemon(store, cfg, base_dir=tmp_path, runner=runner_a, clock=lambda: clock_a["now"], holder="A",
                   lease_ttl_s=300)
        summary_a = a.report_job(fire)
        b_thread.join(timeout=30)
        assert wait_until(lambda: len(inbox.messages) >= 1)
        time.sleep(0.5)
        assert len(inbox.messages) == 1, [m["Subject"] for m in inbox.messages]
        assert summary_a is not None
        assert [s.name for s in summary_a.steps if not s.ok] == ["notify"]
        assert "lease was lost" in summary_a.steps[-1].error
        with store.engine.connect() as c:
            markers = c.execute(text("SELECT message_id FROM notifications WHERE kind = 'weekly_report_run'")).all()
        assert [m[0] for m in markers] == ["B"]
        assert period_done(store, "report", period_key("report", fire), False)
    finally:
        smtp.stop()


def wait_until(cond: Any, timeout: float = 10) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.05)
    return bool(cond())
