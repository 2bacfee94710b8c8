"""Issue 19: ghost_busy on GPUs nobody held, right-sizing per team to a smaller model of the site's inventory,
and Slurm request hygiene, on both engines. Every expected number is worked out by hand in the comments
(buckets of 300 s: 12 to the hour)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import text

from auditor.audit import rightsize
from auditor.audit.hygiene import p90
from auditor.audit.run import run_audit
from auditor.config import Config, parse
from auditor.records import AllocatedGpu, Allocation, GpuBucket
from auditor.store.engine import Store

T0 = datetime(2026, 11, 20, tzinfo=UTC)
W0, W1 = T0 - timedelta(days=1), T0 + timedelta(days=1)


def series(host: str, gpu: int, n: int, first: int = 0, cluster: str = "c", samples: int = 10,
           **metrics) -> list[GpuBucket]:
    return [GpuBucket(cluster, host, gpu, T0 + timedelta(minutes=5 * (first + i)), 300, samples, **metrics)
            for i in range(n)]


def ev(e) -> dict:
    return json.loads(e) if isinstance(e, str) else e


def rows(store: Store, run_id: int, kind: str) -> list:
    with store.engine.connect() as conn:
        return list(conn.execute(text("SELECT * FROM findings WHERE run_id = :r AND kind = :k"),
                                 {"r": run_id, "k": kind}))


# -- ghost_busy on GPUs nobody held -------------------------------------------------------------------------

GHOST = {"gpu_util": 1.0, "sm_active": 0.0, "fb_used_mib": 0.0, "power_w": 60.0}


def ghost_fleet() -> list:
    held = Allocation("c", "slurm", "held", user="u", account="acct", start=T0, end=T0 + timedelta(hours=2),
                      gpus=[AllocatedGpu("n1", 3)])
    # count-only, 1 GPU on a node with 2 telemetry GPUs, no labels: unattributed, it may have been either
    blind = Allocation("c", "slurm", "blind", user="u", account="acct", start=T0, end=T0 + timedelta(hours=2),
                       gpus=[AllocatedGpu("n2", None)])
    return [
        held, blind,
        *series("n1", 0, 12, **GHOST),                  # nobody held it: 12 x 300 s = 1.0 h -> ghost
        *series("n1", 1, 6, **GHOST),                   # 6 x 300 = 30 min = the minimum -> ghost, 0.5 h
        *series("n1", 1, 6, first=6, samples=0, **GHOST),  # then values without samples: not observed
        *series("n1", 2, 5, **GHOST),                   # 25 min < 30 -> nothing
        *series("n1", 3, 30, **GHOST),                  # 24 buckets inside "held" (its own ghost_busy), 6 after
        *series("n2", 1, 24, **GHOST),                  # during "blind": maybe its GPU -> nothing
        *series("n3", 0, 24, samples=0),                # no samples: unknown, never a ghost
        *series("n3", 2, 24, samples=0, **GHOST),       # values but no samples: not observed, never a ghost
        *series("n3", 1, 24, gpu_util=0.89, sm_active=0.0, fb_used_mib=0.0),  # 0.89 < 0.9 -> nothing
        *series("n4", 0, 24, hpc_job="999", **GHOST),   # a job label says someone ran there -> nothing
    ]


def test_ghost_busy_on_unallocated_gpus(store: Store) -> None:
    store.ingest(ghost_fleet())
    run = run_audit(store, Config(), W0, W1)
    got = {(r.cluster, ev(r.evidence)["node"], ev(r.evidence)["gpu_index"]): r
           for r in rows(store, run.run_id, "ghost_busy") if r.allocation_id is None}
    assert {k: round(r.gpu_hours, 6) for k, r in got.items()} == {
        ("c", "n1", 0): 1.0, ("c", "n1", 1): 0.5,
        ("c", "n1", 3): 0.5}  # the 6 buckets after "held" ended: T0+2h .. T0+2.5h
    n13 = got[("c", "n1", 3)]
    assert (n13.start_ts, n13.end_ts) == (int((T0 + timedelta(hours=2)).timestamp()),
                                          int((T0 + timedelta(hours=2.5)).timestamp()))
    # n1 GPU 1: its 6 sampled buckets only (T0 .. T0 + 30 min), not the 6 unsampled ones after them
    n11 = got[("c", "n1", 1)]
    assert (n11.end_ts - n11.start_ts, ev(n11.evidence)["buckets"]) == (1800, 6)
    e = ev(got[("c", "n1", 0)].evidence)
    assert e["recipient"] == "operations" and e["unallocated"] is True and e["mean_gpu_util"] == pytest.approx(1.0)
    assert e["peak_fb_mib"] == 0.0 and "no process" in e["rule"] and "n1 GPU 0" in e["rule"]
    # unallocated time is not reserved: no idle hours, no cost on the finding ...
    assert all(r.idle_gpu_hours == 0 and r.cost == 0 for r in got.values())
    # ... and the run's totals are the two allocations alone: 2 x 2 h reserved; "held" 2 h idle (mirage),
    # "blind" 2 h unknown (unattributed)
    s = run.summary
    assert (s["reserved_gpu_hours"], s["idle_gpu_hours"], s["unknown_gpu_hours"]) == (
        pytest.approx(4.0), pytest.approx(2.0), pytest.approx(2.0))
    # chargeback: one owner (user u), the same 4 reserved GPU-hours, 2 of them idle as mirage ("held"), 2 unknown:
    # 4 x 2.0 = 8.00, idle 2 x 2.0 = 4.00
    from decimal import Decimal as D

    from auditor.report import chargeback

    cb = chargeback.chargeback(store, Config(), W0, W1, "user", run_id=run.run_id)
    assert [(r["owner"], r["reserved_gpu_hours"], r["idle_gpu_hours"], r["mirage_gpu_hours"], r["unknown_gpu_hours"],
             r["reserved_cost"], r["idle_cost"]) for r in cb] == [("u", D("4"), D("0"), D("2"), D("2"), D("8"), D("4"))]
    held = [r for r in rows(store, run.run_id, "ghost_busy") if r.allocation_id is not None]
    assert len(held) == 1 and ev(held[0].evidence)["job"]["id"] == "held"
    assert s["findings"]["ghost_busy"] == 4


def test_ghost_minimum_decides(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """GHOST_UNALLOCATED_MIN_MINUTES (auditor.audit.ghosts; a setting until issue 45) decides."""
    from auditor.audit import ghosts

    store.ingest(ghost_fleet())
    # 20 min: n1 GPU 2's 25 minutes now count (0.4167 h); 61 min: only n1 GPU 0's 60 min... which is below 61
    monkeypatch.setattr(ghosts, "GHOST_UNALLOCATED_MIN_MINUTES", 20)
    run = run_audit(store, Config(), W0, W1)
    got = sorted((ev(r.evidence)["node"], ev(r.evidence)["gpu_index"], round(r.gpu_hours, 4))
                 for r in rows(store, run.run_id, "ghost_busy") if r.allocation_id is None)
    assert got == [("n1", 0, 1.0), ("n1", 1, 0.5), ("n1", 2, 0.4167), ("n1", 3, 0.5)]
    monkeypatch.setattr(ghosts, "GHOST_UNALLOCATED_MIN_MINUTES", 61)
    run = run_audit(store, Config(), W0, W1)
    assert [r for r in rows(store, run.run_id, "ghost_busy") if r.allocation_id is None] == []


# -- right-sizing per team ------------------------------------------------------------------------------------

H100 = "NVIDIA H100 80GB HBM3"


def sized(cluster: str, ext: str, account: str, node: str, n: int, model: str, sm: float, fb: float,
          util: float = 0.9) -> list:
    a = Allocation(cluster, "slurm", ext, user="u", account=account, start=T0, end=T0 + timedelta(hours=5),
                   gpus=[AllocatedGpu(node, i, model=model) for i in range(n)])
    return [a, *(b for g in range(n) for b in series(node, g, 60, cluster=cluster, model=model, sm_active=sm,
                                                       gpu_util=util, fb_used_mib=fb))]


def rightsize_fleet() -> list:
    return [
        *sized("c", "a1", "acct-a", "n1", 1, H100, 0.3, 20000.0),
        *sized("c", "a2", "acct-a", "n2", 1, H100, 0.3, 30000.0),
        *sized("c", "b1", "acct-b", "n3", 2, H100, 0.6, 60000.0),
        *sized("c", "b2", "acct-b", "n4", 4, H100, 0.2, 60000.0),
        *sized("c", "b3", "acct-b", "n5", 1, H100, 0.0, 1000.0, util=0.0),
        *sized("c", "a3", "acct-a", "n6", 1, "NVIDIA L4", 0.1, 5000.0),
        *series("n7", 0, 1, model="NVIDIA L40S", gpu_util=0.0, sm_active=0.0),  # present, never allocated
        *sized("d", "d1", "acct-a", "m1", 1, H100, 0.3, 20000.0),  # cluster d has H100 only
        *sized("d", "d2", "acct-b", "m2", 1, H100, 0.0, 1000.0, util=0.0),  # idle, like b3, in cluster d
    ]


def test_model_memory_table() -> None:
    # the name's size first, else the table (NVIDIA data sheets); sold in two sizes without a size: unknown
    assert rightsize.model_mib("NVIDIA-A100-SXM4-40GB") == 40 * 1024
    assert rightsize.model_mib("NVIDIA L4") == 24 * 1024 and rightsize.model_mib("NVIDIA L40S") == 48 * 1024
    assert rightsize.model_mib("Tesla T4") == 16 * 1024 and rightsize.model_mib("NVIDIA H200") == 141 * 1024
    assert rightsize.model_mib("NVIDIA A100-PCIE") is None  # not "a10" (24 GB)
    assert rightsize.model_mib("NVIDIA RTX A4000") is None  # not "a40"
    assert rightsize.has_mig(H100) and not rightsize.has_mig("NVIDIA L40S")


def test_right_sizing_by_team(store: Store) -> None:
    store.ingest(rightsize_fleet())
    cfg = parse({"prices": {"default": 2.0, "models": {"h100": 4.0, "l40s": 1.5, "l4": 0.8}},
                 "teams": [{"name": "A", "accounts": ["acct-a"]}, {"name": "B", "accounts": ["acct-b"]}]})
    run = run_audit(store, cfg, W0, W1)
    got = [{k: (round(v, 6) if isinstance(v, float) else v) for k, v in r.items()}
           for r in run.summary["right_sizing"]]
    assert got == [
        # b2: 4 H100 at SM 0.2: 0.8 GPUs of work at 50 % fill = ceil(1.6) = 2 GPUs; 60000 MiB fits no MIG
        # profile (40960) nor L40S (49152); 20 GPU-h x 4.0 = 80, half of it saved = 40, 10 GPU-h freed
        {"team": "B", "option": "fewer_gpus", "recommended": "2 of 4 GPUs", "allocations": 1, "gpu_hours": 20.0,
         "freed_gpu_hours": 10.0, "saving": 40.0},
        # a1: 20000 MiB <= L4's 24 GiB (24576), SM 0.3 <= 0.5: 5 h x (4.0 - 0.8) = 16.0, more than MIG 3g.40gb
        # (5 x 4.0 x 3/7 = 8.571 -> saves 11.43)
        {"team": "A", "option": "model", "recommended": "NVIDIA L4", "allocations": 1, "gpu_hours": 5.0,
         "freed_gpu_hours": 5.0, "saving": 16.0},
        # a2: 30000 > 24576 (L4), <= 49152 (L40S): 5 x (4.0 - 1.5) = 12.5 (> MIG 11.43)
        {"team": "A", "option": "model", "recommended": "NVIDIA L40S", "allocations": 1, "gpu_hours": 5.0,
         "freed_gpu_hours": 5.0, "saving": 12.5},
        # d1 = a1 in cluster d, where only H100s exist: MIG (2g's 20480 MiB hold 20000, but SM 0.3 > 2/7), 3g.40gb:
        # 20 - 5 x 4 x 3/7 = 11.428571 saved, 5 x 4/7 = 2.857143 GPU-h freed
        {"team": "A", "option": "mig", "recommended": "3g.40gb", "allocations": 1, "gpu_hours": 5.0,
         "freed_gpu_hours": 2.857143, "saving": 11.428571},
        # b1 (SM 0.6: too busy for every option), b3 (idle: reported as such), a3 (already the cheapest,
        # an L4 has no MIG): no row
    ]
    # the per-finding hint names the model too: b3 is an idle allocation on an H100 whose 1000 MiB fit an L4
    with store.engine.connect() as conn:
        hints = {r.external_id: ev(r.evidence)["right_size"] for r in conn.execute(text(
            "SELECT a.external_id, f.evidence FROM findings f JOIN allocations a ON a.id = f.allocation_id "
            "WHERE f.run_id = :r AND f.kind = 'idle_allocation'"), {"r": run.run_id})}
    assert hints["b3"]["model"] == "NVIDIA L4" and hints["b3"]["model_saving"] == pytest.approx(5 * 3.2)
    # d2, the same in cluster d: no L4 there, only the MIG hint (1g.10gb: 1000 MiB, SM 0)
    assert "model" not in hints["d2"] and hints["d2"]["mig_profile"] == "1g.10gb"


# -- request hygiene ----------------------------------------------------------------------------------------

WORK = {"sm_active": 0.8, "gpu_util": 1.0}
IDLE = {"sm_active": 0.0, "gpu_util": 0.0}


def jobs(user: str, node: str, limits_h: list[float], *, gpus: int = 1, second: dict | None = None,
         source: str = "slurm") -> list:
    """One 1-hour job per limit, back to back from T0 on ``node``; GPU 0 works, GPU 1 (if any) does
    ``second`` (None: no telemetry)."""
    out: list = []
    for k, lim in enumerate(limits_h):
        start = T0 + timedelta(hours=k)
        out.append(Allocation("c", source, f"{user}-{k}", user=user, account="acct", start=start,
                              end=start + timedelta(hours=1), time_limit_s=int(lim * 3600),
                              gpus=[AllocatedGpu(node, i) for i in range(gpus)]))
        out += series(node, 0, 12, first=12 * k, **WORK)
        if gpus > 1 and second is not None:
            out += series(node, 1, 12, first=12 * k, **second)
    return out


def hygiene_fleet() -> list:
    return [
        # ratios 0.1, 0.1, 0.5, 0.25, 1.0 -> median 0.25, not below 0.25: fine
        *jobs("u1", "n1", [10, 10, 2, 4, 1]),
        # ratios 0.1, 0.1, 0.1, 0.25, 1.0 -> median 0.1 < 0.25: flagged; p90 = 5th of 5 (ceil 4.5) = 1.0
        *jobs("u2", "n2", [10, 10, 10, 4, 1]),
        # 2 GPUs per job, the second observed and idle: 5 of 10 unused (50 % >= 25 %): flagged; ratios 1.0
        *jobs("u3", "n3", [1, 1, 1, 1, 1], gpus=2, second=IDLE),
        # 4 jobs only (< 5), every ratio 0.1: not judged
        *jobs("u4", "n4", [10, 10, 10, 10]),
        # the second GPU has no telemetry: unknown, never "unused": 0 of 5 seen unused; ratios 1.0
        *jobs("u5", "n5", [1, 1, 1, 1, 1], gpus=2),
        # Kubernetes pods have no Slurm time limit to judge
        *jobs("u6", "n6", [10, 10, 10, 10, 10], source="kubernetes"),
    ]


def test_p90_nearest_rank() -> None:
    # 10 values: the 9th (ceil 9.0); 11 values: the 10th (ceil 9.9); 1 value: itself
    assert p90([float(x) for x in range(1, 11)]) == 9.0
    assert p90([float(x) for x in range(1, 12)]) == 10.0 and p90([0.3]) == 0.3


def test_request_hygiene(store: Store) -> None:
    store.ingest(hygiene_fleet())
    run = run_audit(store, Config(), W0, W1)
    got = {r.user_name: r for r in rows(store, run.run_id, "request_hygiene")}
    assert sorted(got) == ["u2", "u3"]
    u2, u3 = ev(got["u2"].evidence), ev(got["u3"].evidence)
    assert u2["flags"] == ["time_limit"] and u2["recipient"] == "user"
    assert (u2["jobs"], u2["jobs_with_limit"]) == (5, 5)
    assert u2["median_runtime_ratio"] == pytest.approx(0.1) and u2["p90_runtime_ratio"] == pytest.approx(1.0)
    assert (u2["gpus_requested"], u2["gpus_seen"], u2["gpus_unused"]) == (5, 5, 0)
    assert got["u2"].idle_gpu_hours == 0 and got["u2"].gpu_hours == pytest.approx(5.0)
    assert u3["flags"] == ["unused_gpus"] and u3["median_runtime_ratio"] == pytest.approx(1.0)
    assert (u3["gpus_requested"], u3["gpus_seen"], u3["gpus_unused"]) == (10, 10, 5)
    assert u3["unused_share"] == pytest.approx(0.5)
    # 5 unused GPUs x 1 h = 5 GPU-h at the default 2.0 = 10.0; reserved 10 GPU-h
    assert (got["u3"].idle_gpu_hours, got["u3"].cost, got["u3"].gpu_hours) == (
        pytest.approx(5.0), pytest.approx(10.0), pytest.approx(10.0))
    assert run.summary["findings"]["request_hygiene"] == 2


def test_request_hygiene_per_team(store: Store) -> None:
    store.ingest(hygiene_fleet())
    run = run_audit(store, parse({"teams": [{"name": "T2", "users": ["u2", "u3"]}]}), W0, W1)
    got = [{k: (round(v, 6) if isinstance(v, float) else v) for k, v in r.items()}
           for r in run.summary["request_hygiene_by_team"]]
    assert got == [
        # u2 (.1 .1 .1 .25 1) + u3 (1 x 5): 10 ratios, the 5th and 6th are 1.0 -> median 1.0; p90 = 9th = 1.0;
        # GPUs: u2 5 seen, u3 10 seen, 5 unused -> 1/3; 5 GPU-h x 2.0 = 10.0
        {"team": "T2", "users": 2, "flagged_users": 2, "jobs": 10, "jobs_with_limit": 10,
         "median_runtime_ratio": 1.0, "p90_runtime_ratio": 1.0, "gpus_requested": 15, "gpus_seen": 15,
         "gpus_unused": 5, "unused_share": round(1 / 3, 6), "unused_gpu_hours": 5.0, "unused_cost": 10.0},
        # u1 (.1 .1 .5 .25 1), u4 (.1 x 4), u5 (1 x 5); not u6 (Kubernetes): 14 ratios, sorted .1 x 6, .25, .5,
        # 1 x 6 -> median (.25 + .5) / 2 = .375, p90 = the 13th (ceil 12.6) = 1.0; u5's second GPUs unseen
        {"team": "(unmapped)", "users": 3, "flagged_users": 0, "jobs": 14, "jobs_with_limit": 14,
         "median_runtime_ratio": 0.375, "p90_runtime_ratio": 1.0, "gpus_requested": 19, "gpus_seen": 14,
         "gpus_unused": 0, "unused_share": 0.0, "unused_gpu_hours": 0.0, "unused_cost": 0.0},
    ]


def test_request_hygiene_constants_decide(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """The rule's constants (auditor.audit.hygiene; settings until issue 45) decide."""
    from auditor.audit import hygiene

    store.ingest(hygiene_fleet())
    # runtime ratio 0.3: u1's median 0.25 is now below; unused share 0.6: u3's 50 % no longer; min jobs 4: u4
    # (median 0.1) joins
    monkeypatch.setattr(hygiene, "HYGIENE_RUNTIME_RATIO", 0.3)
    monkeypatch.setattr(hygiene, "HYGIENE_UNUSED_GPUS", 0.6)
    monkeypatch.setattr(hygiene, "HYGIENE_MIN_JOBS", 4)
    run = run_audit(store, Config(), W0, W1)
    assert sorted(r.user_name for r in rows(store, run.run_id, "request_hygiene")) == ["u1", "u2", "u4"]


# -- the report ---------------------------------------------------------------------------------------------


def test_report_sections_escape_and_cut(store: Store) -> None:
    from auditor.report import context as report
    from auditor.report import render

    evil = "<b>x|y</b>"
    recs = [*ghost_fleet()] + [r for r in jobs(evil, "n9", [10, 10, 10, 4, 1])]
    store.ingest(recs)
    cfg = parse({"report": {"top_n": 2}})
    run = run_audit(store, cfg, W0, W1)
    ctx = report.build_context(store, cfg, run.run_id)
    # 3 GPUs nobody held, cut at 2 with the total kept; the allocation's own ghost stays in top idle
    assert (ctx["ghosts"]["total"], ctx["ghosts"]["shown"], ctx["ghosts"]["cut"]) == (3, 2, True)
    assert [r["job_id"] for r in ctx["top_idle"]["rows"]] == ["held"]
    h = ctx["request_hygiene"]
    assert h["total"] == 1 and h["rows"][0]["user"] == evil and h["rows"][0]["jobs"] == 5
    assert h["rows"][0]["median_runtime_ratio"] == pytest.approx(0.1)
    txt, (html, _images), md = render.render_text(ctx), render.render_html(ctx), render.render_md(ctx)
    assert "n1 GPU 0 read GPU-Util 100% for 1.0 h with no allocation" in txt
    assert f"c {evil} ((unmapped)): 5 jobs, runtime median 10%, p90 100% of the time limit" in txt
    # the per-team rollup counts every judged job of the team; here the unflagged "held" and "blind" have no
    # time limit and are the same team: 7 jobs, 5 with a limit (median 0.1 of those)
    assert "team (unmapped): 1 of 2 users flagged, 7 jobs, runtime median 10%" in txt
    assert evil not in html and "&lt;b&gt;x|y&lt;/b&gt;" in html
    assert evil not in md and "x\\|y" in md
