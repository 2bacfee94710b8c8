"""The Slurm connector against a REAL Slurm (scripts/testbed-slurm.sh up: slurmctld, 2 x slurmd with 8 fake
h100 each, slurmdbd on MariaDB, slurmrestd). The test submits real jobs with sbatch and checks what the
connector reads against what was submitted, and against what the jobs themselves saw
(CUDA_VISIBLE_DEVICES per node). The fault tests at the end need no Slurm."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from auditor.errors import SourceError
from auditor.records import Allocation, GpuInventory, Reservation
from connectors import build
from connectors.base import Context, Problems, RunningSnapshot, Window
from tests.conftest import need, need_slurm, port_open, slurm_testbed

CLUSTER = "auditlab"


def sh(*args: str, timeout: float = 30) -> str:
    proc = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout, check=True)  # noqa: S603
    return proc.stdout


def slurm_ready() -> bool:
    """The Slurm that answers is the project's testbed (its marker's cluster name and state directory), not
    merely a cluster: only then may a test submit, cancel or drain (tests/conftest.py slurm_testbed)."""
    return slurm_testbed() is None


def sbatch(*args: str) -> str:
    """Submit a testbed job. Its working directory is /tmp, never this process's: a test before it may have left
    the process in a temporary directory since removed, and a step started there ran without its GPUs."""
    return sh("sbatch", "--parsable", "-p", "gpu", "--chdir=/tmp", *args).strip().split(";")[0]


def job_state(job: str) -> str:
    out = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"],  # noqa: S603
                         capture_output=True, text=True, timeout=10)
    return out.stdout.strip().splitlines()[0] if out.stdout.strip() else ""


def wait(what: str, cond, timeout: float = 60) -> None:  # type: ignore[no-untyped-def]
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.5)


def in_sacct(job: str, states: tuple[str, ...]) -> bool:
    out = sh("sacct", "-n", "-X", "-P", "-j", job, "-o", "State")
    return bool(out.strip()) and all(s.split()[0] in states for s in out.strip().splitlines())


@dataclass
class Workload:
    out_dir: Path
    running: str = ""
    finished: str = ""
    cancelled: str = ""
    array: str = ""
    in_resv: str = ""
    reservation: str = ""
    jobs: list[str] = field(default_factory=list)


@pytest.fixture(scope="module")
def workload() -> Iterator[Workload]:
    need_slurm()  # its reason names why (a foreign Slurm: "no Slurm testbed: ...")
    # job output must be writable by alice/bob/carol: pytest's tmp dirs are 0700, so use /tmp directly
    out = Path(tempfile.mkdtemp(prefix="gpu-audit-slurm-", dir="/tmp"))
    out.chmod(0o1777)
    w = Workload(out_dir=out)
    o = ["-o", f"{out}/%j.out"]
    try:
        w.running = sbatch(*o, "--uid=alice", "-A", "team-a", "-N", "2", "--gres=gpu:3", "-t", "10",
                           "--wrap", "srun -l bash -c 'echo $SLURMD_NODENAME=$CUDA_VISIBLE_DEVICES'; sleep 600")
        w.cancelled = sbatch(*o, "--uid=carol", "-A", "team-b", "--gres=gpu:2", "-t", "10", "--wrap", "sleep 600")
        w.finished = sbatch(*o, "--uid=bob", "-A", "team-b", "--gres=gpu:1", "-t", "5", "--wrap", "sleep 1")
        w.array = sbatch(*o, "--uid=alice", "-A", "team-a", "--array=0-2", "--gres=gpu:1", "-t", "5",
                         "--wrap", "sleep 2")
        w.jobs += [w.running, w.cancelled, w.finished, w.array]
        wait("running + cancel-me jobs", lambda: job_state(w.running) == "RUNNING"
             and job_state(w.cancelled) == "RUNNING")
        sh("scancel", w.cancelled)
        wait("sacct to record them", lambda: in_sacct(w.finished, ("COMPLETED",))
             and in_sacct(w.cancelled, ("CANCELLED",)) and in_sacct(w.array, ("COMPLETED",)), timeout=90)
        # an advance reservation (created here as root; the connector itself never changes Slurm)
        w.reservation = f"gpuaudit-{uuid.uuid4().hex[:8]}"
        sh("scontrol", "create", "reservation", f"ReservationName={w.reservation}", "StartTime=now",
           "Duration=15", "Users=alice", "Nodes=gpu-node-02", "Flags=IGNORE_JOBS")
        w.in_resv = sbatch(*o, "--uid=alice", "-A", "team-a", f"--reservation={w.reservation}",
                           "--gres=gpu:1", "-t", "10", "--wrap", "echo $CUDA_VISIBLE_DEVICES; sleep 600")
        w.jobs.append(w.in_resv)
        wait("job in reservation", lambda: job_state(w.in_resv) == "RUNNING")
        wait("job output", lambda: len((out / f"{w.running}.out").read_text().splitlines()) >= 2
             if (out / f"{w.running}.out").exists() else False)
        yield w
    finally:
        for j in w.jobs:
            subprocess.run(["scancel", j], capture_output=True, timeout=10)  # noqa: S603
        if w.reservation:
            wait("jobs to leave the reservation", lambda: not any(job_state(j) in ("RUNNING", "COMPLETING")
                                                                   for j in w.jobs), timeout=30)
            subprocess.run(["scontrol", "delete", f"ReservationName={w.reservation}"],  # noqa: S603
                           capture_output=True, timeout=10)
        shutil.rmtree(out, ignore_errors=True)


def collect(opts: dict | None = None, expect: tuple[str, ...] = ()) -> tuple[list, Problems]:
    """One collection; with ``expect``, collect again (up to ~20 s) until those job ids are all there.
    slurmdbd takes finished jobs in asynchronously, so under load a windowed sacct can lag `sacct -j` by a
    moment; the connector's overlapping re-reads pick such jobs up on the next collection, as here."""
    deadline = time.monotonic() + 20
    while True:
        conn = build("slurm", "allocations", opts or {}, Context(CLUSTER))
        now = datetime.now(UTC)
        problems = Problems()
        records = list(conn.collect(Window(now - timedelta(hours=1), now + timedelta(minutes=1)), problems))
        got = {r.external_id for r in records if isinstance(r, Allocation)}
        if all(e in got for e in expect) or time.monotonic() > deadline:
            return records, problems
        time.sleep(1)


def history_ids(w: Workload) -> tuple[str, ...]:
    return (w.running, w.finished, w.cancelled, w.in_resv, *(f"{w.array}_{i}" for i in range(3)))


def allocs(records: list) -> dict[str, Allocation]:
    return {r.external_id: r for r in records if isinstance(r, Allocation)}


def per_node(a: Allocation) -> dict[str, list[int | None]]:
    out: dict[str, list[int | None]] = {}
    for g in a.gpus:
        out.setdefault(g.node, []).append(g.index)
    return {k: sorted(v, key=lambda x: -1 if x is None else x) for k, v in out.items()}


@pytest.mark.service
@pytest.mark.serial
def test_cli_reads_what_was_submitted(workload: Workload) -> None:
    records, problems = collect(expect=history_ids(workload))
    assert problems.total == 0, problems.items
    got = allocs(records)
    run = got[workload.running]
    # what the job itself saw: "0: gpu-node-01=0,1,2" per task/node
    seen = {}
    for line in (workload.out_dir / f"{workload.running}.out").read_text().splitlines():
        node, _, devs = line.split(":", 1)[1].strip().partition("=")
        seen[node] = sorted(int(d) for d in devs.split(","))
    assert per_node(run) == seen and len(seen) == 2 and all(len(v) == 3 for v in seen.values())
    assert (run.user, run.account, run.state, run.end, run.time_limit_s) == ("alice", "team-a", "RUNNING",
                                                                             None, 600)
    fin = got[workload.finished]
    assert (fin.user, fin.account, fin.state, len(fin.gpus)) == ("bob", "team-b", "COMPLETED", 1)
    assert fin.end is not None and fin.gpus[0].index is None and fin.gpus[0].model == "h100"
    can = got[workload.cancelled]
    assert (can.user, can.state, len(can.gpus)) == ("carol", "CANCELLED", 2) and can.end is not None
    tasks = {k: v for k, v in got.items() if k.startswith(f"{workload.array}_")}
    assert sorted(tasks) == [f"{workload.array}_{i}" for i in range(3)]
    assert all(len(t.gpus) == 1 and t.state == "COMPLETED" for t in tasks.values())
    rj = got[workload.in_resv]
    assert rj.reservation == workload.reservation and list(per_node(rj)) == ["gpu-node-02"]
    own = (workload.out_dir / f"{workload.in_resv}.out").read_text().split()
    assert [g.index for g in rj.gpus] == [int(own[0])]
    (resv,) = [r for r in records if isinstance(r, Reservation) and r.name == workload.reservation]
    assert (resv.nodes, resv.gpu_count, resv.users) == (["gpu-node-02"], 8, ["alice"])
    inventory = [r for r in records if isinstance(r, GpuInventory)]
    assert len(inventory) == 16 and {g.model for g in inventory} == {"h100"}
    assert isinstance(records[-1], RunningSnapshot)


@pytest.mark.service
@pytest.mark.serial
def test_json_and_text_history_agree_and_rereading_changes_nothing(workload: Workload) -> None:
    js, _ = collect({"history_format": "json"}, expect=history_ids(workload))
    txt, _ = collect({"history_format": "text"}, expect=history_ids(workload))

    def shape(records: list) -> dict:
        return {k: (a.user, a.account, a.state, a.start, a.reservation, per_node(a))
                for k, a in allocs(records).items() if k in workload.jobs or k.startswith(f"{workload.array}_")}

    assert shape(js) == shape(txt) and len(shape(js)) == 7
    again, _ = collect({"history_format": "json"}, expect=history_ids(workload))
    assert shape(again) == shape(js)
    squeue, problems = collect({"running_from": "squeue"}, expect=history_ids(workload))
    assert problems.total == 0 and shape(squeue) == shape(js)


@pytest.mark.service
@pytest.mark.serial
def test_rest_backend_matches_cli(workload: Workload) -> None:
    need(port_open("127.0.0.1", 6820), "slurmrestd not listening on 127.0.0.1:6820")
    token = sh("scontrol", "token", "username=root", "lifespan=600").strip().split("=", 1)[1]
    os.environ["GPU_AUDIT_TEST_SLURM_JWT"] = token
    try:
        rest, problems = collect({"backend": "rest", "rest_url": "http://127.0.0.1:6820",
                                  "rest_token": {"env": "GPU_AUDIT_TEST_SLURM_JWT"}}, expect=history_ids(workload))
    finally:
        del os.environ["GPU_AUDIT_TEST_SLURM_JWT"]
    cli, _ = collect(expect=history_ids(workload))
    assert problems.total == 0
    mine = [workload.running, workload.finished, workload.cancelled, workload.in_resv]
    assert {k: per_node(allocs(rest)[k]) for k in mine} == {k: per_node(allocs(cli)[k]) for k in mine}
    assert any(isinstance(r, Reservation) and r.name == workload.reservation for r in rest)
    assert isinstance(rest[-1], RunningSnapshot)
    with pytest.raises(SourceError) as exc:
        collect({"backend": "rest", "rest_url": "http://127.0.0.1:6820", "rest_version": "v0.0.38",
                 "rest_token": {"file": str(_secret(workload.out_dir / "bad.jwt", "not-a-token"))}})
    # 22.05 answers a forged token with HTTP 500 "Unspecified error" (no token at all: 401)
    assert "GET /slurm/v0.0.38/" in str(exc.value) and "not-a-token" not in str(exc.value)
    assert "\n" not in str(exc.value)


def _secret(path: Path, value: str) -> Path:
    path.write_text(value)
    path.chmod(0o600)
    return path


# --- faults (no Slurm needed) ------------------------------------------------------------------------------

def _script(tmp_path: Path, name: str, body: str) -> str:
    p = tmp_path / name
    p.write_text("#!/bin/sh\n" + body + "\n")
    p.chmod(p.stat().st_mode | stat.S_IXUSR)
    return str(p)


def test_missing_binary_is_one_line_source_error(tmp_path: Path) -> None:
    with pytest.raises(SourceError) as exc:
        collect({"scontrol": str(tmp_path / "no-such-scontrol")})
    assert "command not found" in str(exc.value) and "\n" not in str(exc.value)
    assert exc.value.transient is False


def test_hanging_command_times_out(tmp_path: Path) -> None:
    hang = _script(tmp_path, "scontrol", "sleep 30")
    t0 = time.monotonic()
    with pytest.raises(SourceError) as exc:
        collect({"scontrol": hang, "timeout_s": 1})
    assert time.monotonic() - t0 < 10
    assert "timed out after 1s" in str(exc.value) and exc.value.transient and "\n" not in str(exc.value)


def test_failing_and_garbage_commands(tmp_path: Path) -> None:
    garbage = _script(tmp_path, "scontrol", 'echo "JobId=notanumber JobState=RUNNING"; echo "NodeName="')
    ok = _script(tmp_path, "empty", "exit 0")
    fail = _script(tmp_path, "sacct", 'echo "sacct: error: slurmdbd: unreachable" >&2; exit 1')
    with pytest.raises(SourceError) as exc:
        collect({"scontrol": ok, "sacctmgr": ok, "sacct": fail})
    assert "exited 1: sacct: error: slurmdbd: unreachable" in str(exc.value) and exc.value.transient
    records, problems = collect({"scontrol": garbage, "sacctmgr": ok, "sacct": ok, "history_format": "text"})
    assert problems.total >= 1 and not any(isinstance(r, RunningSnapshot) for r in records)
