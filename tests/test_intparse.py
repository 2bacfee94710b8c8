"""The one strict integer reader (auditor.intparse) and where outside text is read as a number: Slurm job
ids before they reach squeue/scancel argv, the scrape reader's gpu label (one bad line quarantined, the good
ones kept), the web UI's page parameter."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from auditor.config import EnforceConfig, Policy
from auditor.intparse import INT64_MAX, parse_uint, uint_or_none
from connectors import build
from connectors.base import Context, Problems, Window

EVER = Window(datetime(2000, 1, 1, tzinfo=UTC), datetime(2100, 1, 1, tzinfo=UTC))
T0 = 1_795_705_200  # a whole hour (2026-11-26T15:00Z)
# each of these passes str.isdigit(), int() or re.match(r"^\d+$") and is still no ASCII integer
HOSTILE = ["104\n", "\uff11\uff10\uff14", "\u00b2", " 7", "7 ", "1_000", "+5", "-1", "", "\u0661", "9" * 20]


@pytest.mark.parametrize("text", HOSTILE)
def test_only_ascii_digits_are_a_number(text: str) -> None:
    with pytest.raises(ValueError, match="not a whole number"):
        parse_uint(text, what="page")
    assert uint_or_none(text) is None


def test_bounds_and_plain_numbers() -> None:
    assert [parse_uint(t) for t in ("0", "007", "104", str(INT64_MAX))] == [0, 7, 104, INT64_MAX]
    with pytest.raises(ValueError, match="out of range"):
        parse_uint("10001", hi=10_000)
    with pytest.raises(ValueError, match="out of range"):
        parse_uint(str(INT64_MAX + 1))


@pytest.mark.parametrize("job", ["104\n", "\uff11\uff10\uff14", "12_\u00b3", "5+\u0661"])
def test_slurm_job_id_with_odd_digits_never_reaches_a_command(job: str) -> None:
    from connectors.actions.slurm import SlurmActions
    from connectors.slurm import SlurmOptions

    acts = SlurmActions("hpc", SlurmOptions(), EnforceConfig())
    live = acts.inspect({"external_id": job, "cluster": "hpc"}, Policy(name="p"))  # blocked before any command
    assert not live.running and live.blocked.startswith("not a Slurm job id")


def test_scrape_gpu_label_not_a_number_costs_only_its_line(tmp_path: Path) -> None:
    good = 'gpu="0",UUID="GPU-3",Hostname="n3"'
    (tmp_path / "odd.prom").write_text(
        f"DCGM_FI_PROF_SM_ACTIVE{{{good}}} 0.5 {T0 * 1000}\n"
        f'DCGM_FI_PROF_SM_ACTIVE{{gpu="\u00b2",UUID="GPU-4",Hostname="n3"}} 0.5 {T0 * 1000}\n'
        f'DCGM_FI_PROF_SM_ACTIVE{{gpu="\uff11",UUID="GPU-5",Hostname="n3"}} 0.5 {T0 * 1000}\n'
        f'DCGM_FI_DEV_GPU_UTIL{{gpu="1",UUID="GPU-6",Hostname="n3"}} 40 {T0 * 1000}\n')
    src = build("scrape", "telemetry", {"paths": ["odd.prom"]}, Context("c1", tmp_path))
    problems = Problems()
    buckets = list(src.collect(EVER, problems))
    assert sorted((b.host, b.gpu) for b in buckets) == [("n3", 0), ("n3", 1)]  # the good lines are kept
    assert [(Path(s).name, where) for s, where, _, _ in problems.items] == [("odd.prom", "line 2"),
                                                                            ("odd.prom", "line 3")]
    assert all("gpu label" in why and "not a whole number" in why for _, _, why, _ in problems.items)


@pytest.mark.parametrize("text", ["\uff11", "\u0662", "1\u0663"])
def test_kubernetes_gpu_quantity_is_ascii(text: str) -> None:
    from connectors.k8s_resources import BadObject, gpu_units

    with pytest.raises(BadObject, match="odd quantity"):  # before: full-width and Arabic-Indic digits read as GPUs
        gpu_units(text, "nvidia.com/gpu")
    assert gpu_units("2", "nvidia.com/gpu") == 2


def test_jobstats_gpu_index_that_is_no_number_is_a_js1_error() -> None:
    from connectors.slurm.jobstats import Js1Error, per_gpu

    with pytest.raises(Js1Error, match="is not an index"):  # before: int('²') ValueError, no node named
        list(per_gpu({"nodes": {"n1": {"gpu_utilization": {"\u00b2": 50}, "gpu_used_memory": {}}}}))
