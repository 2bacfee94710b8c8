"""Channels through apprise over real HTTP to a loopback sink: generic JSON webhook, Mattermost and Microsoft
Teams (Power Automate workflow) payloads as they arrive, routing per team / user / kind, throttling in the
notifications table (SQLite and PostgreSQL), failures, dry-run, and webhook secrets never printed."""

from __future__ import annotations

import io
import logging
import re
import shutil
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from conftest import need  # noqa: E402
from http_sink import Sink  # noqa: E402

from auditor.config import Channel, Config, Policy, SecretRef  # noqa: E402
from auditor.report.channels import Message, Notifier  # noqa: E402
from auditor.report.notify import sent_count  # noqa: E402

SECRETS = {"GPU_AUDIT_TEST_HOOK_JSON": "jsonSECRET7f3a", "GPU_AUDIT_TEST_HOOK_MM": "mmSECRET91b2",
           "GPU_AUDIT_TEST_HOOK_WF": "wfSECRET55c0"}


@pytest.fixture
def sink(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Sink]:
    """Plain HTTP for the JSON and Mattermost hooks, HTTPS (self-signed, verify=no) for Teams workflows; both
    sinks write into one request list."""
    need(shutil.which("openssl") is not None, "openssl is needed for the HTTPS sink")
    with Sink() as s, Sink(tls_dir=tmp_path) as tls:
        tls.requests = s.requests
        tls.fail_paths = s.fail_paths
        j, m, w = SECRETS.values()
        monkeypatch.setenv("GPU_AUDIT_TEST_HOOK_JSON", f"json://127.0.0.1:{s.port}/hooks/{j}")
        monkeypatch.setenv("GPU_AUDIT_TEST_HOOK_MM", f"mmost://127.0.0.1:{s.port}/{m}")
        monkeypatch.setenv("GPU_AUDIT_TEST_HOOK_WF", f"workflow://127.0.0.1:{tls.port}/wf1/{w}?verify=no")
        yield s


def make_cfg(tmp_path: Path) -> Config:
    secret_file = tmp_path / "mm.url"
    return Config(channels=[
        Channel(name="ops", url=SecretRef(env="GPU_AUDIT_TEST_HOOK_JSON")),  # no teams/users: every message
        Channel(name="ml-mattermost", url=SecretRef(env="GPU_AUDIT_TEST_HOOK_MM"), teams=["ml"]),
        Channel(name="dave-teams", url=SecretRef(env="GPU_AUDIT_TEST_HOOK_WF"), users=["dave"], kinds=["warn"]),
        Channel(name="broken", url=SecretRef(file=secret_file), teams=["nobody"]),
    ])


def msg(kind: str = "warn", **kw: Any) -> Message:
    return Message(kind=kind, subject="[gpu-audit] slurm job 201 is idle", body="slurm job 201 (user dave) is idle",
                   team="ml", user="dave", allocation_id=7, **kw)


def test_payloads_routing_and_throttling(store: Any, sink: Sink, tmp_path: Path) -> None:
    cfg = make_cfg(tmp_path)
    res = Notifier(store, cfg, dry_run=False).send(msg())
    assert res == [{"to": "channel:ops", "status": "sent"}, {"to": "channel:ml-mattermost", "status": "sent"},
                   {"to": "channel:dave-teams", "status": "sent"}]
    by_path = {r["path"].split("?")[0]: r for r in sink.requests}
    assert set(by_path) == {"/hooks/jsonSECRET7f3a", "/hooks/mmSECRET91b2",
                            "/workflows/wf1/triggers/manual/paths/invoke"}
    gen = by_path["/hooks/jsonSECRET7f3a"]["body"]
    assert (gen["title"], gen["message"], gen["type"]) == ("[gpu-audit] slurm job 201 is idle",
                                                           "slurm job 201 (user dave) is idle", "info")
    mm = by_path["/hooks/mmSECRET91b2"]["body"]
    assert "slurm job 201 (user dave) is idle" in mm["text"]
    card = by_path["/workflows/wf1/triggers/manual/paths/invoke"]
    assert card["content_type"].startswith("application/json")
    # a Teams message with an adaptive card: title and body as TextBlocks (apprise escapes Markdown in them)
    content = card["body"]["attachments"][0]["content"]
    assert (card["body"]["type"], card["body"]["attachments"][0]["contentType"], content["type"]) == \
        ("message", "application/vnd.microsoft.card.adaptive", "AdaptiveCard")
    blocks = {b.get("id"): b["text"].replace("\\", "") for b in content["body"] if b["type"] == "TextBlock"}
    assert blocks == {"title": "[gpu-audit] slurm job 201 is idle", "body": "slurm job 201 (user dave) is idle"}
    assert sent_count(store, kind="enforce_warn") == 3

    # the same notice again: throttled for everyone (nothing posted); another kind goes where it is routed
    again = Notifier(store, cfg, dry_run=False).send(msg())
    assert [r["status"] for r in again] == ["throttled"] * 3 and len(sink.requests) == 3
    esc = Notifier(store, cfg, dry_run=False).send(msg("escalate"))
    assert [r["to"] for r in esc] == ["channel:ops", "channel:ml-mattermost"]  # dave-teams takes only warn
    assert len(sink.requests) == 5
    # another team, another user: only the catch-all channel
    other = Notifier(store, cfg, dry_run=False).send(Message(kind="warn", subject="s", body="b", team="vision",
                                                             user="erin", allocation_id=8))
    assert [r["to"] for r in other] == ["channel:ops"]


@pytest.fixture
def gpu_audit_log() -> Iterator[io.StringIO]:
    """What gpu-audit's own log handler (auditor.logs.setup_logging, as the CLI installs it) writes, at DEBUG.
    Only this is gpu-audit's output: a third party's loggers (apprise's DEBUG lines quote the URLs it posts
    to) are not ours to read, and pytest's capture handlers sit on them differently from version to version."""
    from auditor.logs import setup_logging

    root = logging.getLogger("gpu_audit")
    saved = (root.handlers[:], root.level, root.propagate)
    setup_logging(logging.DEBUG)
    stream = io.StringIO()
    root.handlers[0].setStream(stream)  # type: ignore[attr-defined]
    try:
        yield stream
    finally:
        root.handlers[:], root.level, root.propagate = saved[0], saved[1], saved[2]


def test_dry_run_failure_and_secrets(store: Any, sink: Sink, tmp_path: Path, gpu_audit_log: io.StringIO,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    cfg = make_cfg(tmp_path)
    dry = Notifier(store, cfg, dry_run=True).send(msg())
    assert [r["status"] for r in dry] == ["dry_run"] * 3 and sink.requests == []
    sink.fail_paths.add("/hooks/mmSECRET91b2")
    res = Notifier(store, cfg, dry_run=False).send(msg())
    assert [(r["to"], r["status"]) for r in res] == [("channel:ops", "sent"), ("channel:ml-mattermost", "failed"),
                                                      ("channel:dave-teams", "sent")]
    assert res[1]["error"] == "channel ml-mattermost: delivery failed"
    # a failed delivery is not recorded: the next run retries it (and only it)
    sink.fail_paths.clear()
    retry = Notifier(store, cfg, dry_run=False).send(msg())
    assert [r["status"] for r in retry] == ["throttled", "sent", "throttled"]
    # a secret file that is missing: one line naming the file, not a value
    bad = Notifier(store, cfg, dry_run=False).send(Message(kind="warn", subject="s", body="b", team="nobody",
                                                           allocation_id=9))
    assert bad[1]["status"] == "failed" and "cannot read secret file" in bad[1]["error"]
    out, log = capsys.readouterr(), gpu_audit_log.getvalue()
    assert "cannot read secret file" in log and "ml-mattermost" in log  # the log was read: it has our lines
    text = " ".join([out.out, out.err, log, repr(res), repr(retry), repr(bad)])
    for secret in SECRETS.values():
        assert secret not in text, "a webhook secret leaked into output"


def test_weekly_nudges_to_channels(store: Any, sink: Sink, tmp_path: Path) -> None:
    """The week of tests/test_report.py: 101 idle and 102 mirage (team ml), 104 half idle on 2 GPUs
    (vision), 103 working, 105 without telemetry: the nudge-worthy allocations are 101, 102 and 104."""
    from test_report import T0, WEEK, week_records
    from test_report import make_cfg as report_cfg

    from auditor.audit.run import run_audit
    from auditor.report.channels import send_nudges
    from auditor.report.notify import notify

    store.ingest(week_records(T0 + timedelta(hours=1)))
    run_id = run_audit(store, report_cfg(), T0, T0 + WEEK).run_id
    cfg = report_cfg().model_copy(update={"channels": [
        Channel(name="ops", url=SecretRef(env="GPU_AUDIT_TEST_HOOK_JSON"), kinds=["nudge"]),
        Channel(name="ml-mattermost", url=SecretRef(env="GPU_AUDIT_TEST_HOOK_MM"), teams=["ml"])]})
    dry = notify(store, cfg, run_id, dry_run=True, out_dir=tmp_path / "outbox", admin=False)
    assert dry["channels"] == [{"to": "channel:ops", "status": "dry_run", "allocations": 3},
                               {"to": "channel:ml-mattermost", "status": "dry_run", "allocations": 2}]
    assert sink.requests == []
    res = send_nudges(store, cfg, run_id, dry_run=False)
    assert [(r["to"], r["status"], r["allocations"]) for r in res] == [("channel:ops", "sent", 3),
                                                                      ("channel:ml-mattermost", "sent", 2)]
    ops = next(r["body"] for r in sink.requests if "jsonSECRET" in r["path"])
    # 101: 8 h idle + 102: 6 h mirage + 104: its idle GPU's 5 h = 19.0 idle GPU-hours
    assert ops["title"] == "[gpu-audit] 3 allocations held GPUs idle, 19.0 GPU-hours"
    # one line per allocation even with a CR/LF in a user name (user-controlled text)
    assert sorted(line.split()[3] for line in ops["message"].splitlines()) == ["101", "102", "104"]
    # and where to look further, as the email nudges say it
    assert sorted(re.findall(r"gpu-audit job (\S+)", ops["message"])) == ["c1:101", "c1:102", "c1:104"]
    mm = next(r["body"] for r in sink.requests if "mmSECRET" in r["path"])
    assert "101" in mm["text"] and "102" in mm["text"] and "104" not in mm["text"]
    # never twice about one allocation: a second run sends nothing
    assert send_nudges(store, cfg, run_id, dry_run=False) == [] and len(sink.requests) == 2


def test_idle_reservation_owners_are_told_once(store: Any, sink: Sink, tmp_path: Path) -> None:
    """A 2-GPU reservation for alice, 3 h old, no job in it: the audit finds it idle; enforcement tells its
    user (routed channel) once per policy window, logs it, and never changes the reservation."""
    from auditor.audit.run import run_audit
    from auditor.enforce.policy import enforce, log_rows
    from auditor.records import Reservation
    from auditor.timeutil import floor_to, utcnow

    now = floor_to(utcnow(), 300)
    store.ingest([Reservation("hpc", "resv-a", now - timedelta(hours=3), now + timedelta(hours=5), nodes=["n5"],
                              gpu_count=2, users=["alice"]),
                  # idle too, but over: nobody is told about a reservation that no longer holds GPUs
                  Reservation("hpc", "resv-old", now - timedelta(hours=10), now - timedelta(hours=1), nodes=["n6"],
                              gpu_count=4, users=["alice"])])
    cfg = Config(policies=[Policy(name="p")],
                 channels=[Channel(name="alice-dm", url=SecretRef(env="GPU_AUDIT_TEST_HOOK_JSON"), users=["alice"])])
    run_audit(store, cfg, now - timedelta(days=1), now)
    res = enforce(store, cfg, apply=True, backends=lambda c, s: None, now=now)
    assert [(d["target"], d["stage"], d["action"], d["decision"], d["result"]) for d in res["decisions"]] == [
        ("reservation resv-a", "notify", "notify_owners", "done", "channel:alice-dm: sent")]
    (body,) = [r["body"] for r in sink.requests]
    # 2 GPUs x the policy's 1 h window (warn_after_hours), nothing ran: 2.0 of 2.0 GPU-hours idle (issue 44)
    assert body["message"] == ("reservation resv-a on hpc: 2.0 of 2.0 reserved GPU-hours idle in the last 1 h. "
                               "Release it if it is not needed.")
    again = enforce(store, cfg, apply=True, backends=lambda c, s: None, now=now)
    assert again["decisions"] == [] and len(sink.requests) == 1
    assert [r["stage"] for r in log_rows(store)] == ["notify"]
