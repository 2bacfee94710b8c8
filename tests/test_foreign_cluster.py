"""Beside a live Slurm cluster that is not the testbed (tests/foreign_cluster.py: stand-in commands that answer
as a healthy cluster "prod", obey, and record each call), the Slurm test modules run no command that changes
it, with and without `-m "not service"`, and write no SQLite file outside the temp dirs."""

from __future__ import annotations

import subprocess
from pathlib import Path

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


def test_only_what_the_suite_could_write_is_watched(tmp_path, monkeypatch) -> None:  # noqa: ANN001 - fixtures
    """A .db the suite writes under its home is found; one another program writes under the real home while
    the suite runs is not the suite's. Before: every .db written under the home directory failed the run."""
    import threading
    import time

    real_home = tmp_path / "real-home"
    real_home.mkdir()
    monkeypatch.setenv("HOME", str(real_home))
    inner = tmp_path / "inner"
    inner.mkdir()
    (inner / "test_inner.py").write_text("import time\nfrom pathlib import Path\n\n\ndef test_writes_home():\n"
                                         "    (Path.home() / 'suite.db').write_bytes(b'x')\n    time.sleep(2)\n")

    def other_program() -> None:
        time.sleep(0.5)
        (real_home / "other.db").write_bytes(b"y")

    t = threading.Thread(target=other_program)
    t.start()
    res = run(["-q", str(inner / "test_inner.py")], pg=False)
    t.join()
    assert (real_home / "other.db").exists() and res["pytest_rc"] == 0, res
    assert [Path(p).name for p in res["sqlite_outside_tmp"]] == ["suite.db"], res
    assert Path(res["sqlite_outside_tmp"][0]).parent != real_home


@pytest.mark.slow
def test_the_skip_reason_beside_a_foreign_slurm_says_no_testbed(tmp_path) -> None:  # noqa: ANN001 - fixture
    """Before: "no running Slurm" although a Slurm (not the testbed) answered."""
    out = tmp_path / "out.txt"
    res = run(["-q", "-rs", "tests/test_jobstats_live.py", "tests/test_queue_live.py"], pg=False,
              out=out)
    text = out.read_text()
    assert "no running Slurm" not in text, text[-2000:]
    assert "no Slurm testbed: the Slurm that answers is cluster 'prod'" in text, text[-2000:]
    assert res["mutating_calls"] == [], res
