"""Kubernetes pod times as a real API server gives them (issue 14 §3b), on the replay server
(tests/k8s_server.py) with recorded objects changed the way a real cluster changes them: graceful deletes
(deletionTimestamp = delete time + grace), pods bound through pods/binding without startTime, Failed pods
without termination times, pods that vanish, and TLS certificate failures."""

from __future__ import annotations

import logging
import shutil
import ssl
import subprocess
import time
import warnings
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from conftest import need
from k8s_server import TOKEN, TOKEN_ENV, K8sServer, allocations, collect
from sqlalchemy import text

from auditor.collect import collect as collect_all
from auditor.config import Config
from auditor.errors import SourceError
from auditor.records import Allocation
from auditor.store.engine import Store


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[K8sServer]:
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    with K8sServer() as srv:
        yield srv


def read(srv: K8sServer, **options: Any) -> dict[str, Allocation]:
    return allocations(collect(srv, **options))


def pod(srv: K8sServer, name: str) -> dict[str, Any]:
    return next(p for p in srv.replay.data["pods"] if p["metadata"]["name"] == name)


def iso(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def test_graceful_delete_is_never_charged_into_the_future(server: K8sServer) -> None:
    now = datetime.now(UTC).replace(microsecond=0)
    llama = pod(server, "llama-ft-x7k2p")
    llama["metadata"]["deletionTimestamp"] = iso(now + timedelta(seconds=30))  # delete now, grace 30 s
    a = read(server)["llama-ft-x7k2p"]
    assert a.state == "Terminating" and a.end is None  # still held; closed at its last sighting if it vanishes
    # its container has stopped: it ends then, although the grace period runs on
    stopped = now - timedelta(seconds=5)
    llama["status"]["containerStatuses"][0]["state"] = {"terminated": {
        "exitCode": 143, "reason": "Error", "startedAt": "2026-11-29T11:31:58Z", "finishedAt": iso(stopped)}}
    assert read(server)["llama-ft-x7k2p"].end == stopped
    # a Succeeded pod without container times, deleted with a deletionTimestamp far ahead: the deletion is no
    # sign of life; it ends at the phase change as the API server recorded it (its last status write in
    # managedFields, 14:31:58 in the recording), never later than now
    sweep = pod(server, "resnet-sweep-7-q9d4m")
    for cs in sweep["status"]["containerStatuses"]:
        cs["state"] = {"terminated": {"exitCode": 0, "reason": "Completed"}}
    sweep["status"]["conditions"] = [c for c in sweep["status"]["conditions"] if c["type"] == "PodScheduled"]
    sweep["metadata"]["deletionTimestamp"] = iso(now + timedelta(days=2))
    written = max(f["time"] for f in sweep["metadata"]["managedFields"] if "f:status" in f["fieldsV1"])
    assert written == "2026-11-29T14:31:58Z"
    end = read(server)["resnet-sweep-7-q9d4m"].end
    assert end == datetime(2026, 11, 29, 14, 31, 58, tzinfo=UTC) <= datetime.now(UTC)


def test_bound_without_start_time_starts_at_its_first_container(server: K8sServer) -> None:
    nb = pod(server, "notebook-alice-6d5f8b7c9-tx2lq")
    del nb["status"]["startTime"]  # pods/binding: PodScheduled set, kubelet has not written startTime
    nb["status"]["conditions"][0]["lastTransitionTime"] = "2026-11-28T07:00:00Z"  # bind time
    nb["status"]["containerStatuses"][0]["state"] = {"running": {"startedAt": "2026-11-28T08:31:58Z"}}
    assert read(server)["notebook-alice-6d5f8b7c9-tx2lq"].start == datetime(2026, 11, 28, 8, 31, 58, tzinfo=UTC)
    nb["status"].pop("containerStatuses")  # bound, nothing started yet: Pending, not charged
    nb["status"]["phase"] = "Pending"
    assert "notebook-alice-6d5f8b7c9-tx2lq" not in read(server)


def test_failed_pod_without_termination_times(server: K8sServer) -> None:
    crashed = pod(server, "crashed-eval")  # Failed; recorded: OOMKilled finishedAt 11:01:58
    crashed["status"]["containerStatuses"][0]["state"] = {"waiting": {"reason": "ContainerStatusUnknown"}}
    a = read(server)["crashed-eval"]
    # no finishedAt: the last sign of life after its 10:31:58 start, the Ready=False change at 11:01:58
    assert (a.start, a.end) == (datetime(2026, 11, 29, 10, 31, 58, tzinfo=UTC),
                                datetime(2026, 11, 29, 11, 1, 58, tzinfo=UTC))
    # deleted 16 minutes after its failure: the deletion is no sign of life (before: it ended at 11:17:58)
    crashed["metadata"]["deletionTimestamp"] = "2026-11-29T11:17:58Z"
    assert read(server)["crashed-eval"].end == datetime(2026, 11, 29, 11, 1, 58, tzinfo=UTC)
    del crashed["metadata"]["deletionTimestamp"]
    # nothing but PodScheduled: it ran (a container id), so it ends at the phase change as the API server
    # last recorded it, its latest status write in managedFields (14:31:59 in the recording); before: open
    # until deleted, charged as running ("STILL RUNNING")
    crashed["status"]["conditions"] = [c for c in crashed["status"]["conditions"] if c["type"] == "PodScheduled"]
    written = max(f["time"] for f in crashed["metadata"]["managedFields"] if "f:status" in f["fieldsV1"])
    b = read(server)["crashed-eval"]
    assert b.state == "Failed" and b.end == datetime.fromisoformat(written.replace("Z", "+00:00"))


def rejected_at_admission(srv: K8sServer, after_s: int = 969) -> dict[str, Any]:
    """The recorded crashed-eval pod as the kubelet leaves a pod it rejects at admission: phase Failed,
    reason UnexpectedAdmissionError, startTime set by the status manager, no container ever created, its
    status written ``after_s`` seconds later (the lab's records carry the recorder's managedFields times)."""
    p = pod(srv, "crashed-eval")
    start = datetime(2026, 11, 29, 10, 31, 58, tzinfo=UTC)
    p["status"] = {"phase": "Failed", "reason": "UnexpectedAdmissionError",
                   "message": "Pod Allocate failed due to requested number of devices unavailable for "
                              "nvidia.com/gpu. Requested: 2, Available: 0, which is unexpected",
                   "startTime": iso(start),
                   "conditions": [c for c in p["status"]["conditions"] if c["type"] == "PodScheduled"]}
    for f in p["metadata"]["managedFields"]:
        if "f:status" in f["fieldsV1"]:
            f["time"] = iso(start + timedelta(seconds=after_s))
    return p


def test_pod_rejected_at_admission_is_charged_nothing(server: K8sServer) -> None:
    rejected_at_admission(server)
    a = read(server)["crashed-eval"]
    assert a.state == "Failed" and a.start == a.end == datetime(2026, 11, 29, 10, 31, 58, tzinfo=UTC)


def test_failed_pods_end_in_the_store(store: Store, store_url: str, server: K8sServer, tmp_path: Path) -> None:
    """Both engines: the admission-rejected pod holds 0 s, the crashed one ends at Ready=False, and neither is
    left open (an open allocation is what `gpu-audit job` calls STILL RUNNING)."""
    rejected_at_admission(server)
    cfg = Config.model_validate({"store": {"url": store_url}, "clusters": [{"name": "k8s-test", "allocations": [
        {"kind": "kubernetes", "host": server.url, "token": {"env": TOKEN_ENV}}]}]})
    assert all(r.ok for r in collect_all(store, cfg, base_dir=tmp_path, now=datetime.now(UTC)).results)
    with store.engine.connect() as conn:
        rows = {r.name: r for r in conn.execute(text(
            "SELECT name, state, start_ts, end_ts FROM allocations WHERE name IN ('crashed-eval', "
            "'resnet-sweep-7-q9d4m')"))}
    assert rows["crashed-eval"].end_ts == rows["crashed-eval"].start_ts  # before: end_ts NULL (open)
    sweep = rows["resnet-sweep-7-q9d4m"]  # Succeeded, recorded: 04:31:58 to its container's finish 08:31:58
    assert sweep.end_ts - sweep.start_ts == 4 * 3600


def test_start_after_the_sighting_is_clamped_and_said(store: Store, store_url: str, server: K8sServer,
                                                       tmp_path: Path) -> None:
    """A node clock 1 h ahead: llama-ft's startTime lies after the listing. Before: stored starting in the
    future and, once it vanished, ending at its last sighting before its start (negative GPU-hours)."""
    llama = pod(server, "llama-ft-x7k2p")
    ahead = datetime.now(UTC).replace(microsecond=0) + timedelta(hours=1)
    llama["status"]["startTime"] = iso(ahead)
    llama["status"]["containerStatuses"][0]["state"] = {"running": {"startedAt": iso(ahead)}}
    cfg = Config.model_validate({"store": {"url": store_url}, "clusters": [{"name": "k8s-test", "allocations": [
        {"kind": "kubernetes", "host": server.url, "token": {"env": TOKEN_ENV}}]}]})
    first = collect_all(store, cfg, base_dir=tmp_path, now=datetime.now(UTC)).results
    assert all(r.ok for r in first)
    (res,) = [r for r in first if r.source.startswith("allocations")]
    assert res.clamped == 1
    assert res.notes == ["1 pods had a startTime after the listing that saw them (node clock ahead of the API "
                         "server?): start clamped to the sighting (ml-train/llama-ft-x7k2p); labels "
                         "start_clamped_from keep the original"]
    server.replay.data["pods"] = [p for p in server.replay.data["pods"] if p is not llama]
    time.sleep(1.1)
    assert all(r.ok for r in collect_all(store, cfg, base_dir=tmp_path, now=datetime.now(UTC)).results)
    with store.engine.connect() as conn:
        row = conn.execute(text("SELECT state, start_ts, end_ts, labels FROM allocations "
                                "WHERE name = 'llama-ft-x7k2p'")).one()
    assert row.state == "GONE" and row.start_ts <= row.end_ts < ahead.timestamp()
    assert iso(ahead) in str(row.labels)


def test_vanished_pod_is_closed_at_its_last_sighting(server: K8sServer, tmp_path: Path) -> None:
    cfg = Config.model_validate({"clusters": [{"name": "k8s-test", "allocations": [
        {"kind": "kubernetes", "host": server.url, "token": {"env": TOKEN_ENV}}]}]})
    store = Store.open(f"sqlite:///{tmp_path / 's.db'}")
    store.upgrade()
    first = datetime.now(UTC)
    assert all(r.ok for r in collect_all(store, cfg, base_dir=tmp_path, now=first).results)
    server.replay.data["pods"] = [p for p in server.replay.data["pods"]
                                  if p["metadata"]["name"] != "llama-ft-x7k2p"]
    time.sleep(1.1)  # the second collect comes a second later, inside the same 5-minute bucket
    assert all(r.ok for r in collect_all(store, cfg, base_dir=tmp_path, now=datetime.now(UTC)).results)
    with store.engine.connect() as conn:
        row = conn.execute(text("SELECT state, start_ts, end_ts, last_seen_ts FROM allocations "
                                "WHERE name = 'llama-ft-x7k2p'")).one()
    assert row.state == "GONE" and row.end_ts == row.last_seen_ts
    assert abs(row.end_ts - first.timestamp()) < 5  # the sighting itself, not the boundary before it
    assert row.end_ts >= row.start_ts


@pytest.fixture
def tls(tmp_path: Path) -> ssl.SSLContext:
    need(shutil.which("openssl") is not None, "openssl is not installed")
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key),  # noqa: S607
                    "-out", str(cert), "-days", "1", "-subj", "/CN=127.0.0.1"], check=True, capture_output=True)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert, key)
    return ctx


def test_certificate_failure_is_one_line_and_not_retried(tls: ssl.SSLContext, monkeypatch: pytest.MonkeyPatch,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    with K8sServer(ssl_context=tls) as srv:
        with pytest.raises(SourceError) as err:
            read(srv)
        assert not err.value.transient and "TLS certificate" in str(err.value)
        assert "\n" not in str(err.value) and TOKEN not in str(err.value)
        with warnings.catch_warnings(record=True) as seen, caplog.at_level(logging.WARNING):
            warnings.simplefilter("always")
            allocs = read(srv, verify_tls=False)
        assert len(allocs) == 7
        assert [r.message for r in caplog.records if "TLS verification" in r.message] and \
            len([r for r in caplog.records if "TLS" in r.getMessage()]) == 1
        assert not [w for w in seen if "Unverified HTTPS" in str(w.message)]
