"""Beside a live Slurm cluster that is not the testbed (tests/foreign_cluster.py: stand-in commands that answer
as a healthy cluster "prod", obey, and record each call), the Slurm test modules run no command that changes
it, with and without `-m "not service"`, and write no SQLite file outside the temp dirs."""

from __future__ import annotations

import subprocess

import pytest
from foreign_cluster import make_cluster, mutating, run

SLURM_MODULES = ["tests/test_slurm_live.py", "tests/test_infra_slurm.py", "tests/test_queue_live.py",
                 "tests/test_jobstats_live.py", "tests/test_slurm_variants_live.py",
                 "tests/test_enforce_slurm_live.py"]


def test_stand_ins_answer_as_a_live_cluster_and_record(tmp_path) -> None:  # noqa: ANN001 - fixture
    """The stand-in is a cluster a careless test would take for live: ping says UP, sbatch gives a job id."""
    bin_dir, _, log = make_cluster(tmp_path)
    ping = subprocess.run([str(bin_dir / "scontrol"), "ping"], capture_output=True, text=True, check=True)
    job = subprocess.run([str(bin_dir / "sbatch"), "--parsable", "--wrap", "sleep 1"], capture_output=True,
                         text=True, check=True)
    subprocess.run([str(bin_dir / "scontrol"), "update", "nodename=n1", "state=drain"], check=True)
    assert "is UP" in ping.stdout and job.stdout.strip() == "4242"
    calls = log.read_text().splitlines()
    assert calls == ["scontrol ping", "sbatch --parsable --wrap sleep 1", "scontrol update nodename=n1 state=drain"]
    assert [mutating(c) for c in calls] == [False, True, True]
    assert not mutating("sacctmgr -n -P show event") and mutating("sacctmgr -i add qos q1")


@pytest.mark.slow
@pytest.mark.parametrize("select", [[], ["-m", "not service"]], ids=["all", "not-service"])
def test_slurm_tests_leave_a_foreign_cluster_alone(select: list[str]) -> None:
    res = run(["-q", *select, *SLURM_MODULES], pg=False)
    assert res["mutating_calls"] == [] and res["sqlite_outside_tmp"] == [], res
    assert res["pytest_rc"] == 0, res["summary"]  # service tests skip (not the testbed), the others pass
