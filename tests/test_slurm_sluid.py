"""Slurm 25.11's SLUID (issue 43 section 2): read in every backend where Slurm gives it, stored with the
allocation on both engines, and kept apart from older Slurm, which prints none.

Sources (SchedMD/slurm @ 284c3b95f0): the job's SLUID is ``step_id.sluid`` of a slurmctld job object from
OpenAPI v0.0.44 (src/plugins/data_parser/v0.0.44/parsers.c ``PARSER_ARRAY(JOB_INFO)`` -> ``SLURM_STEP_ID``),
``SLUID=`` in ``scontrol -d show job`` (src/scontrol/info_job.c, 41163083af, 25.11) and ``%s`` of squeue
(doc/man/man1/squeue.1 of slurm-25-11-0-1); accounting prints the record's ``SLUID`` (sacct, 24.11+) and,
from 26.05, ``OriginalSLUID`` / ``original_sluid`` (the job's: doc/man/man1/sacct.1, data_parser v0.0.45
``PARSER_ARRAY(JOB)``). The 25.11 job objects below are real recordings (tests/fixtures/slurm/
slurmrestd-25.11, PROVENANCE.md)."""

from __future__ import annotations

import json
import stat
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from auditor.records import AllocatedGpu, Allocation
from auditor.store import schema
from connectors.base import Context, Problems, Window
from connectors.slurm import SlurmAllocations, SlurmOptions, jobs
from connectors.slurm.cli import parse_version
from connectors.slurm.parse import scontrol_records, sluid

FX = Path(__file__).parent / "fixtures" / "slurm"
R2511 = FX / "slurmrestd-25.11"
C = "auditlab"


def _script(tmp: Path, name: str, body: str) -> str:
    p = tmp / name
    p.write_text("#!/bin/sh\n" + body + "\n")
    p.chmod(p.stat().st_mode | stat.S_IXUSR)
    return str(p)


def test_sluid_text_is_checked_and_normalised() -> None:
    assert sluid("sDXHK9VRZTBX00") == "sDXHK9VRZTBX00"
    assert sluid("SdxhK9vrztbx00") == "sDXHK9VRZTBX00"  # str2sluid accepts either case
    for bad in (None, "", "0", "N/A", "(null)", "sDXHK9VRZTBX0", "sDXHK9VRZTBX000", "xDXHK9VRZTBX00",
                "sDXHK9VRZTBXU0", 5749, {"sluid": "sDXHK9VRZTBX00"}):  # U is not in Crockford's base 32
        assert sluid(bad) is None, bad


def test_2511_slurmctld_job_objects_carry_the_jobs_sluid() -> None:
    """Every recorded v0.0.44 job object: the allocation's SLUID is its step_id.sluid as recorded."""
    seen = set()
    for path in sorted(R2511.glob("slurm-job*.json")):
        for j in json.loads(path.read_text())["jobs"]:
            a = jobs.from_json_job(j, C)
            assert a.sluid == j["step_id"]["sluid"] and a.sluid.startswith("s") and len(a.sluid) == 14, path
            seen.add(a.sluid)
    assert len(seen) >= 8  # one per recorded job: no two runs share one
    # 25.11's accounting (/slurmdb/v0.0.44) gives no SLUID: that came with v0.0.45 (CHANGELOG/slurm-26.05.md)
    for path in sorted(R2511.glob("slurmdb-job*.json")):
        for j in json.loads(path.read_text())["jobs"]:
            assert jobs.from_json_db_job(j, C).sluid is None


def test_older_json_has_no_sluid() -> None:
    for rel in ("24.11/rest/slurm_v0.0.42_jobs.json", "24.11/rest/slurmdb_v0.0.42_jobs.json",
                "22.05/2node/rest/slurm_v0.0.38_jobs.json"):
        data = json.loads((FX / rel).read_text())
        conv = jobs.from_json_db_job if "slurmdb" in rel else jobs.from_json_job
        assert data["jobs"] and all(conv(j, C).sluid is None for j in data["jobs"]), rel


# ``scontrol -d -o show job`` of 25.11: SLUID= after JobName (src/scontrol/info_job.c: printed with -d when
# set); the other keys as the recorded 24.11 one-liner prints them
SCONTROL_2511 = ("JobId=5749 JobName=gpus UserId=alice(1001) GroupId=alice(1001) MCS_label=N/A Priority=1 "
                 "Nice=0 Account=team-a QOS=normal SLUID=sDXHK9VRZTBX00 JobState=RUNNING Reason=None "
                 "Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0 "
                 "SubmitTime=2026-11-29T14:20:00 EligibleTime=2026-11-29T14:20:00 StartTime=2026-11-29T14:20:01 "
                 "EndTime=2026-11-29T15:20:01 Partition=gpu NodeList=gpu-node-01 "
                 "TRES=cpu=1,mem=1G,node=1,billing=1,gres/gpu=2 Nodes=gpu-node-01 CPU_IDs=0 Mem=1024 "
                 "GRES=gpu:h100:2(IDX:0-1) TimeLimit=01:00:00")


def test_scontrol_show_job_sluid() -> None:
    (rec,) = scontrol_records(SCONTROL_2511)
    a = jobs.from_scontrol_job(rec, C)
    assert (a.external_id, a.sluid, [g.index for g in a.gpus]) == ("5749", "sDXHK9VRZTBX00", [0, 1])
    old = (FX / "24.11/running/scontrol-show-job-oneliner.txt").read_text()
    got = [jobs.from_scontrol_job(r, C) for r in scontrol_records(old) if r.startswith("JobId=")]
    assert got and all(x.sluid is None for x in got)


def test_sacct_columns_follow_the_version() -> None:
    assert parse_version("slurm 25.11.2\n") == (25, 11) and parse_version("slurm-wlm 22.05.8") == (22, 5)
    assert parse_version("JobID|...") is None
    assert "SLUID" not in jobs.sacct_fields((22, 5)) and "SLUID" not in jobs.sacct_fields(None)
    f2511, f2605 = jobs.sacct_fields((25, 11)), jobs.sacct_fields((26, 5))
    assert "SLUID" in f2511 and "OriginalSLUID" not in f2511 and f2511[-1] == "JobName"
    assert {"SLUID", "OriginalSLUID"} <= set(f2605) and f2605[-1] == "JobName"


def test_sacct_prefers_the_jobs_original_sluid() -> None:
    """26.05 prints the record's SLUID (new on a resize) and the job's OriginalSLUID (what squeue shows):
    the run is the latter; 25.11 prints only SLUID."""
    hdr = "|".join(jobs.sacct_fields((26, 5)))
    row = ("100|100|alice|team-a|gpu|normal|COMPLETED|2026-11-29T15:00:00|2026-11-29T15:00:00|"
           "2026-11-29T15:38:00|2280|60|gpu-node-01|billing=1,cpu=1,gres/gpu=1,node=1|0||"
           "2026-11-29T15:00:00|billing=1,cpu=1,gres/gpu=1,node=1|0:0|00:01.500|sDXHM0000000AB|sDXHK9VRZTBX00|ft")
    ((_, r),) = list(jobs.sacct_rows(hdr + "\n" + row))
    assert jobs.from_sacct_row(r, C).sluid == "sDXHK9VRZTBX00"
    assert jobs.from_sacct_row({**r, "OriginalSLUID": ""}, C).sluid == "sDXHM0000000AB"


def test_cli_backend_asks_sacct_for_sluid_only_where_it_prints_one(tmp_path: Path) -> None:
    """A 25.11 sacct (by ``--version``) is asked for SLUID and the row's SLUID is kept; 22.05's is not asked
    (it refuses unknown columns)."""
    for version, want in (("slurm 25.11.2", "sDXHK9VRZTBX00"), ("slurm-wlm 22.05.8", None)):
        d = tmp_path / version.replace(" ", "_")
        d.mkdir()
        row = ("100|100|alice|team-a|gpu|normal|COMPLETED|2026-11-29T15:00:00|2026-11-29T15:00:00|"
               "2026-11-29T15:38:00|2280|60|"
               "gpu-node-01|billing=1,cpu=1,gres/gpu=1,node=1|0||2026-11-29T15:00:00|gres/gpu=1|0:0|00:00:00|"
               + ("sDXHK9VRZTBX00|" if want else "") + "ft")
        sacct = _script(d, "sacct", f'case "$1" in --version) echo "{version}";; *) echo "$*" > {d}/args; '
                                    f'echo "{row}";; esac')
        scontrol = _script(d, "scontrol", 'case "$*" in *"show job"*) echo "No jobs in the system";; '
                                          '*"show node"*) echo "NodeName=gpu-node-01 Gres=gpu:h100:8 State=MIXED";; '
                                          '*"show reservation"*) echo "No reservations in the system";; esac')
        opts = SlurmOptions.model_validate({"backend": "cli", "sacct": sacct, "scontrol": scontrol,
                                            "sacctmgr": _script(d, "sacctmgr", "exit 0")})
        from datetime import UTC, datetime

        w = Window(datetime(2026, 11, 29, 14, tzinfo=UTC), datetime(2026, 11, 29, 16, tzinfo=UTC))
        got = [r for r in SlurmAllocations(Context(C), opts).collect(w, Problems()) if isinstance(r, Allocation)]
        asked = (d / "args").read_text()
        assert ("SLUID" in asked) == bool(want), asked
        assert [a.sluid for a in got] == [want]


def test_running_view_sluid_wins_over_the_accounting_records() -> None:
    """A resized 25.11 job: accounting's record SLUID is new, the job's (slurmctld) is not: the run keeps it."""
    h = Allocation(C, "slurm", "7", sluid="sDXHM0000000AB")
    r = Allocation(C, "slurm", "7", sluid="sDXHK9VRZTBX00")
    assert jobs.merge(h, r).sluid == "sDXHK9VRZTBX00"
    assert jobs.merge(Allocation(C, "slurm", "7", sluid="sDXHM0000000AB"), Allocation(C, "slurm", "7")).sluid == \
        "sDXHM0000000AB"


def _sluids(store: Any) -> dict[str, Any]:
    t = schema.allocations
    with store.engine.connect() as conn:
        return {r.external_id: r.sluid for r in conn.execute(select(t.c.external_id, t.c.sluid))}


def test_store_keeps_the_sluid(store: Any) -> None:
    """Both engines: stored, kept by a later sighting that does not say (sacct of 25.11 -X, older backends)."""
    from datetime import UTC, datetime

    t0 = datetime(2026, 11, 29, 14, tzinfo=UTC)
    store.ingest([Allocation(C, "slurm", "5749", start=t0, submit=t0, sluid="sDXHK9VRZTBX00",
                             gpus=[AllocatedGpu("gpu-node-01", 0)]),
                  Allocation(C, "slurm", "5750", start=t0, submit=t0, gpus=[AllocatedGpu("gpu-node-01", 1)])])
    assert _sluids(store) == {"5749": "sDXHK9VRZTBX00", "5750": None}
    store.ingest([Allocation(C, "slurm", "5749", start=t0, submit=t0, gpus=[AllocatedGpu("gpu-node-01", 0)])])
    assert _sluids(store)["5749"] == "sDXHK9VRZTBX00"


@pytest.mark.parametrize("tail", ["", "|(null)"])
def test_live_identity_sluid_only_from_a_slurm_that_shows_one(tmp_path: Path, tail: str) -> None:
    """squeue 25.11 is asked for ``%s`` and its SLUID joins the identity; an older squeue is not asked
    (22.05 prints other data there, 23.02-25.05 refuse it) and the identity has no SLUID key."""
    from auditor.config import EnforceConfig, Policy
    from connectors.actions.slurm import SlurmActions

    scontrol = _script(tmp_path, "scontrol", 'echo "NodeName=$4 State=MIXED"')
    for version, shown in (("slurm 25.11.2", "sDXHK9VRZTBX00"), ("slurm 24.11.5", None)):
        line = "RUNNING|gpu-node-01|2026-12-01T20:13:27|alice" + ("|sDXHK9VRZTBX00" if shown else tail)
        squeue = _script(tmp_path, "squeue", f'case "$1" in --version) echo "{version}";; *) echo "$*" > '
                                             f'{tmp_path}/args; echo "{line}";; esac')
        act = SlurmActions("hpc", SlurmOptions.model_validate({"backend": "cli", "squeue": squeue,
                                                               "scontrol": scontrol}), EnforceConfig())
        live = act.inspect({"external_id": "4242"}, Policy(name="p"))
        assert (tmp_path / "args").read_text().strip().endswith("%T|%N|%S|%u" + ("|%s" if shown else ""))
        assert ("sluid" in live.identity, live.identity.get("sluid")) == (bool(shown), shown)
