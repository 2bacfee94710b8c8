"""Issue 44, site trial: a GPU starved by its own job's input is not idle (auditor/audit/starved.py,
docs/definitions.md "A starved GPU is not idle"), on both engines.

The site trial: a job read its data with real disk I/O (``dd`` with O_DIRECT) and kept its GPU at SM ~0; it was
billed as idle, nudged as idle and, every GPU at 0, cancelled like an idle job. Here the same shape by hand
(1 h of 5-minute buckets, SM 0.0, DRAM 0.0: the verdict "idle"), each job on its own node:

- "own": holds the node's only GPU, its node's busiest disk busy 0.9 (>= host_disk_busy 0.8) all hour:
  1.0 GPU-h input/storage wait, 0 idle, no idle finding, priced 1.0 h x USD 2 = USD 2 apart from idle cost;
- "half": the same, disk busy only the second half hour: 0.5 input wait, 0.5 idle;
- "shared": GPU 0 of a 2-GPU node whose GPU 1 "other" (another user's job, working) holds; iowait 4 of 8
  cores (>= host_iowait_share 0.05): the I/O could be the other job's, so 1.0 idle (still idle) of which
  1.0 host-busy, and no action;
- "cores": holds the node's only GPU but 8 of its 64 cores, iowait busy: a CPU job could share the node:
  idle, host-busy 1.0;
- "quiet": the node's host reads nothing busy: 1.0 idle;
- "ep": 5 h alone on its node: 1 h working (SM 0.9), 1 h SM 0, 1.5 h SM 0 with its disk busy, 1 h SM 0,
  0.5 h working: 2 h idle in two spells of 1 h, no idle episode (>= episode_hours 2 h) although 3.5 h in a
  row read SM 0; "ep2": 2 h working, 2.5 h SM 0 (disk quiet), 0.5 h working: one episode.
"""

from __future__ import annotations

import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

sys.path.insert(0, str(Path(__file__).parent))
from test_enforce_property import Fleet, HonestBackend, Unit, build  # noqa: E402

from auditor.audit.run import run_audit  # noqa: E402
from auditor.config import Config, Policy, PriceCard  # noqa: E402
from auditor.enforce.policy import enforce, evaluate  # noqa: E402
from auditor.records import AllocatedGpu, Allocation, GpuBucket, NodeBucket  # noqa: E402
from auditor.store import schema  # noqa: E402
from auditor.timeutil import floor_to, utcnow  # noqa: E402

H = 3600.0
T0 = datetime(2026, 11, 20, tzinfo=UTC)
B = 300


def _gpu(node: str, g: int, sm: float = 0.0) -> list[GpuBucket]:
    return [GpuBucket("c", node, g, T0 + timedelta(minutes=5 * i), B, 10, sm_active=sm, dram_active=0.0)
            for i in range(12)]


def _host(node: str, n: int = 12, first: int = 0, **fields: float) -> list[NodeBucket]:
    return [NodeBucket("c", node, T0 + timedelta(minutes=5 * (first + i)), B, 10, 300.0, **fields)
            for i in range(n)]


def _job(ext: str, node: str, gpus: tuple[int, ...] = (0,), cpus: int | None = None) -> Allocation:
    return Allocation("c", "slurm", ext, user=f"u-{ext}", account="a", start=T0, end=T0 + timedelta(hours=1),
                      gpus=[AllocatedGpu(node, g) for g in gpus], cpus=cpus)


def _phased(node: str, busy: bool) -> list[Any]:
    """5 h alone on ``node``: ``busy``: 1 h working, 1 h SM 0, 1.5 h SM 0 with the disk busy, 1 h SM 0, 0.5 h
    working; else 2 h working, 2.5 h SM 0, 0.5 h working."""
    sm = ([0.9] * 12 + [0.0] * 42 + [0.9] * 6) if busy else ([0.9] * 24 + [0.0] * 30 + [0.9] * 6)
    disk = [0.9 if busy and 24 <= i < 42 else 0.0 for i in range(60)]
    return [Allocation("c", "slurm", node, user="u", account="a", start=T0, end=T0 + timedelta(hours=5),
                       gpus=[AllocatedGpu(node, 0)]),
            *[GpuBucket("c", node, 0, T0 + timedelta(minutes=5 * i), B, 10, sm_active=x, dram_active=0.0)
              for i, x in enumerate(sm)],
            *[NodeBucket("c", node, T0 + timedelta(minutes=5 * i), B, 10, 300.0, disk_busy=d)
              for i, d in enumerate(disk)]]


def _fleet() -> list[Any]:
    return [*_phased("ep", True), *_phased("ep2", False),
            _job("own", "n1"), *_gpu("n1", 0), *_host("n1", disk_busy=0.9),
            _job("half", "n5"), *_gpu("n5", 0), *_host("n5", n=6, first=6, disk_busy=0.9),
            _job("shared", "n2"), _job("other", "n2", (1,)), *_gpu("n2", 0), *_gpu("n2", 1, sm=0.9),
            *_host("n2", cpus=8.0, cpu_iowait=4.0),
            _job("cores", "n3", cpus=8), *_gpu("n3", 0), *_host("n3", cpus=64.0, cpu_iowait=20.0),
            _job("quiet", "n4"), *_gpu("n4", 0), *_host("n4", cpus=8.0, cpu_iowait=0.0, disk_busy=0.0)]


def _usage(store: Any, run_id: int) -> dict[str, dict[str, float]]:
    ua, a = schema.usage_allocation, schema.allocations
    with store.engine.connect() as conn:
        return {r.external_id: {k: getattr(r, k) / H for k in ("idle_s", "input_wait_s", "host_busy_idle_s",
                                                                  "reserved_s", "idle_cost")} | {
                    "idle_cost": r.idle_cost}
                for r in conn.execute(select(a.c.external_id, ua.c.idle_s, ua.c.input_wait_s, ua.c.host_busy_idle_s,
                                             ua.c.reserved_s, ua.c.idle_cost)
                                      .join(a, a.c.id == ua.c.allocation_id).where(ua.c.run_id == run_id))}


def _kinds(store: Any, run_id: int) -> dict[str, set[str]]:
    f, a = schema.findings, schema.allocations
    out: dict[str, set[str]] = {}
    with store.engine.connect() as conn:
        for ext, kind in conn.execute(select(a.c.external_id, f.c.kind).join(a, a.c.id == f.c.allocation_id)
                                      .where(f.c.run_id == run_id)):
            out.setdefault(ext, set()).add(kind)
    return out


def test_starved_gpu_is_input_wait_not_idle(store: Any) -> None:
    store.ingest(_fleet())
    cfg = Config(prices=PriceCard(default=2.0))
    res = run_audit(store, cfg, T0 - timedelta(hours=1), T0 + timedelta(hours=6))
    u = _usage(store, res.run_id)
    want = {"own": (0.0, 1.0, 0.0), "half": (0.5, 0.5, 0.0), "shared": (1.0, 0.0, 1.0), "cores": (1.0, 0.0, 1.0),
            "quiet": (1.0, 0.0, 0.0)}
    for ext, (idle, wait, busy) in want.items():
        assert (u[ext]["idle_s"], u[ext]["input_wait_s"], u[ext]["host_busy_idle_s"]) == pytest.approx(
            (idle, wait, busy), abs=1e-9), ext
    assert u["own"]["idle_cost"] == 0.0 and u["half"]["idle_cost"] == pytest.approx(1.0)  # 0.5 h x USD 2
    kinds = _kinds(store, res.run_id)
    assert "idle_allocation" not in kinds.get("own", set())  # before the fix: idle 100 %, an idle finding
    assert "idle_allocation" in kinds["shared"] and "idle_allocation" in kinds["quiet"]
    assert "idle_episode" not in kinds.get("ep", set()) and "idle_episode" in kinds["ep2"]
    assert u["ep"]["input_wait_s"] == pytest.approx(1.5) and u["ep"]["idle_s"] == pytest.approx(2.0)
    s = res.summary
    assert s["input_wait_gpu_hours"] == pytest.approx(3.0) and s["input_wait_cost"] == pytest.approx(6.0)
    assert s["host_busy_idle_gpu_hours"] == pytest.approx(2.0)
    assert s["idle_gpu_hours"] == pytest.approx(0.5 + 1.0 + 1.0 + 1.0 + 2.0 + 2.5)  # never the starved hours
    waits = {a["job_id"]: a["gpu_hours"] for a in s["waiting"]["allocations"]}
    assert waits["own"]["storage"] == pytest.approx(1.0) and waits["own"]["idle"] == pytest.approx(0.0)
    assert waits["half"]["storage"] == pytest.approx(0.5) and waits["half"]["idle"] == pytest.approx(0.5)
    # the one decision function: a starved GPU is refused with the reason, whatever the stage; an idle one
    # on a shared node whose host read busy too (the activity could be another job's)
    pol = Policy(name="p", warn_after_hours=1, act_after_hours=1, idle_fraction=0.5)
    now = int((T0 + timedelta(hours=1)).timestamp())
    for ext, why in (("own", "input/storage wait, GPU starved"), ("shared", "could be this job's input or "
                                                                             "another job's")):
        row = {k: v * H for k, v in u[ext].items()} | {"observed_s": u[ext]["reserved_s"] * H}
        for stage in ("warn", "act"):
            status, reason, _ev = evaluate(row, {"start_ts": int(T0.timestamp())}, pol, stage, 1.0, now)
            assert status == "blocked" and why in reason, (ext, stage, reason)


def test_enforcement_never_cancels_a_job_its_input_starves(store: Any) -> None:
    """The site trial's cancel: two idle jobs (SM 0 for 1.5 h, alone on their nodes, the policy acts after
    1 h); the first one's node reads its disk busy all the while. Only the second is cancelled; the first's
    log row says why not."""
    now = floor_to(utcnow(), 300)
    world, _truth, cfg = build(store, Fleet(jobs=[Unit("idle"), Unit("idle")], groups=[]), now)
    t0 = now - timedelta(hours=1.5)
    store.ingest([NodeBucket("hpc", "n1", t0 + timedelta(minutes=5 * i), B, 10, 300.0, disk_busy=0.95)
                  for i in range(18)])
    backends = {"slurm": HonestBackend(world, "hpc")}
    enforce(store, cfg, backends=lambda cluster, source: backends.get(source), now=now)
    assert [c[:2] for c in world.calls] == [("cancel", "slurm job 1001")]  # before the fix: 1000 too
    t = schema.enforcement_log
    with store.engine.connect() as conn:
        rows = [dict(r) for r in conn.execute(select(t).where(t.c.target == "slurm job 1000")).mappings()]
    assert rows and all(r["decision"] == "skipped" for r in rows)
    assert "input/storage wait, GPU starved" in rows[0]["reason"]


def test_oracle_agrees_by_hand(store: Any) -> None:
    """The independent oracle (tests/oracle.py, plain Python from the definitions) on the same fleet: equal
    idle, input-wait and host-busy GPU-hours per allocation, and the same idle findings."""
    from oracle import Oracle

    o = Oracle()
    o.ingest(_fleet())
    prices = PriceCard(default=2.0)
    since, until = T0 - timedelta(hours=1), T0 + timedelta(hours=6)
    want = {k[2]: r for k, r in o.audit(Config().thresholds, prices, since.timestamp(), until.timestamp(),
                                        until.timestamp() + 86400).items()}
    store.ingest(_fleet())
    res = run_audit(store, Config(prices=prices), since, until)
    got = _usage(store, res.run_id)
    kinds = _kinds(store, res.run_id)
    assert set(got) == set(want)
    for ext, r in want.items():
        t = r.totals
        assert (got[ext]["idle_s"], got[ext]["input_wait_s"], got[ext]["host_busy_idle_s"]) == pytest.approx(
            (t["idle"] / H, t["input_wait"] / H, t["host_busy_idle"] / H), abs=1e-9), ext
        assert got[ext]["idle_cost"] == pytest.approx(r.idle_cost, abs=1e-9), ext
        assert ("idle_allocation" in kinds.get(ext, set())) == ("idle_allocation" in r.findings), ext
