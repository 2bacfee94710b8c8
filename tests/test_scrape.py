"""Scrape-file connector: every real scrape in tests/fixtures/dcgm parses with the right labels and units,
plus the bucket rules (timestamps, copies not summed, NaN/negative quarantined, clamping, window)."""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from conftest import FIXTURES

from auditor.errors import SourceError
from connectors import build
from connectors.aliases import pick_label
from connectors.base import Context, Problems, Window
from connectors.scrape import ScrapeFiles, parse_line, parse_text

DCGM = FIXTURES / "dcgm"
EVER = Window(datetime(2000, 1, 1, tzinfo=UTC), datetime(2100, 1, 1, tzinfo=UTC))
T0 = 1_795_705_200  # a whole hour (2026-11-26T15:00Z)


def collect(tmp_or_paths: list[str] | list[Path], window: Window = EVER, base: Path = DCGM,
            **opts: object) -> tuple[list, Problems]:
    src = build("scrape", "telemetry", {"paths": [str(p) for p in tmp_or_paths], **opts},
                Context("c1", base))
    problems = Problems()
    return list(src.collect(window, problems)), problems


def one(buckets: list, **match: object):
    found = [b for b in buckets if all(getattr(b, k) == v for k, v in match.items())]
    assert len(found) == 1, found
    return found[0]


def test_a100_and_mig_instance_from_nvidia_docs() -> None:
    buckets, problems = collect(["a100-mig-nvidia-docs.txt"])
    assert problems.total == 0
    whole = one(buckets, gpu_instance="")
    assert (whole.host, whole.gpu) == ("ub20-a100-k8s", 0)
    assert whole.uuid == "GPU-34319582-d595-d1c7-d1d2-179bcfa61660"
    assert whole.dram_active == pytest.approx(0.690789)
    assert whole.tensor_active == pytest.approx(0.929260)
    assert whole.gr_engine == pytest.approx(0.995630)
    assert whole.fb_used_mib == 4845 and whole.power_w == pytest.approx(409.692)
    assert whole.pcie_tx_bps == 33011804 and whole.pcie_rx_bps == 97863601
    assert whole.samples == 1 and whole.gpu_util is None and whole.sm_active is None
    mig = one(buckets, gpu_instance="13")
    assert mig.model is not None and "1g.5gb" in mig.model
    assert mig.dram_active == pytest.approx(0.800339) and mig.tensor_active == pytest.approx(0.930433)


def test_t4_gke_pod_labels() -> None:
    buckets, problems = collect(["t4-gke-k8s-prof.prom"])
    assert problems.total == 0 and len(buckets) == 2
    g0, g1 = one(buckets, gpu=0), one(buckets, gpu=1)
    assert g0.host == g1.host == "gke-test-dcgm-default-pool-fed1e979-tt7p"
    assert (g0.pod, g0.namespace, g0.container) == ("triton-84d57987c9-kks4k", "default", "triton-server")
    assert (g1.pod, g1.namespace, g1.container) == (None, None, None)  # empty labels mean "not set"
    assert g0.model == "Tesla T4" and g0.uuid == "GPU-84412445-5790-0b3f-f714-da8aa3b2c0b0"
    assert (g0.sm_active, g0.sm_occupancy, g0.tensor_active) == (0.0, 0.0, 0.0)


def test_old_1x_names_and_host_override() -> None:
    buckets, problems = collect(["old-1x-names-partial.prom"])
    assert problems.total == 0
    b = one(buckets, gpu=0)
    assert b.host == "dcgm-exporter-6ldbb"  # Hostname is the exporter pod here...
    assert b.gpu_util == 0.0 and b.power_w == pytest.approx(30.982)
    override, _ = collect(["old-1x-names-partial.prom"], host="gpu-node-7")
    assert one(override, gpu=0).host == "gpu-node-7"  # ...so sites set the node name


@pytest.mark.parametrize(("name", "util", "fb_bytes", "power"), [
    ("nvidia_gpu_exporter-h100-load.metrics", 1.0, 2.0780679168e10, 631.95),
    ("nvidia_gpu_exporter-h100-idle.metrics", 0.0, 0.0, 69.85),
])
def test_nvidia_gpu_exporter(name: str, util: float, fb_bytes: float, power: float) -> None:
    buckets, problems = collect([name], host="h100-1")
    assert problems.total == 0
    b = one(buckets, gpu=0)  # index from nvidia_smi_index, keyed by uuid
    assert b.host == "h100-1" and b.model == "NVIDIA H100 80GB HBM3"
    assert b.uuid == "00000000-0000-0000-0000-000000000000"
    assert b.gpu_util == util and b.power_w == pytest.approx(power)
    assert b.fb_used_mib == pytest.approx(fb_bytes / 1024 / 1024)
    assert b.sm_active is None  # no profiling: the audit falls back to idle-by-util


def test_nvidia_gpu_exporter_without_host_is_quarantined() -> None:
    buckets, problems = collect(["nvidia_gpu_exporter-h100-load.metrics"])
    assert buckets == [] and problems.total == 3  # util, memory, power
    assert all("set scrape.host" in reason for _, _, reason, _ in problems.items)


@pytest.mark.parametrize(("name", "host_label"), [
    ("label-order-release-4.5.3.txt", "Hostname"), ("label-order-head-hostname-renamed.txt", "hostname")])
def test_label_order_before_and_after_hostname_rename(name: str, host_label: str) -> None:
    problems = Problems()
    samples = list(parse_text((DCGM / name).read_text(), name, problems))
    assert [s.name for s in samples] == ["TEST_METRIC"]
    labels = samples[0].labels
    assert host_label in labels and pick_label(labels, "host") == "testhost"
    assert pick_label(labels, "uuid") == "GPU-00000000-0000-0000-0000-000000000000"
    assert pick_label(labels, "model") == "NVIDIA T400 4GB" and labels["pci_bus_id"] == ""
    assert samples[0].value == 42
    assert problems.total == 2  # the Go string literal around the text, quarantined by line
    assert {loc for _, loc, _, _ in problems.items} == {"line 1", "line 4"}


def test_every_fixture_file_parses(tmp_path: Path) -> None:
    for path in sorted(DCGM.iterdir()):
        if path.suffix in (".md", ".csv") or path.name.startswith("LICENSE"):
            continue
        buckets, problems = collect([path], host="h" if "nvidia_gpu_exporter" in path.name else None)
        assert buckets or path.name.startswith("label-order"), path.name
        assert all(b.samples >= 1 and b.start.tzinfo is not None for b in buckets)


def test_timestamps_prometheus_ms_and_openmetrics_seconds(tmp_path: Path) -> None:
    lab = 'gpu="0",UUID="GPU-1",Hostname="n1"'
    (tmp_path / "a.prom").write_text(
        f"DCGM_FI_PROF_SM_ACTIVE{{{lab}}} 0.2 {T0 * 1000}\n"
        f"DCGM_FI_PROF_SM_ACTIVE{{{lab}}} 0.4 {(T0 + 30) * 1000}\n"
        f"DCGM_FI_PROF_SM_ACTIVE{{{lab}}} 0.9 {(T0 + 300) * 1000}\n")
    (tmp_path / "b.om").write_text(
        "# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n"
        f"DCGM_FI_DEV_GPU_UTIL{{{lab}}} 100 {T0 + 60}.5\n# EOF\n")
    buckets, problems = collect(["*.prom", "b.om"], base=tmp_path)
    assert problems.total == 0
    first = one(buckets, start=datetime.fromtimestamp(T0, UTC))
    assert first.sm_active == pytest.approx(0.3) and first.gpu_util == 1.0
    assert first.samples == 3  # three instants: T0, T0+30, T0+60.5
    second = one(buckets, start=datetime.fromtimestamp(T0 + 300, UTC))
    assert second.sm_active == pytest.approx(0.9) and second.samples == 1


def test_copies_per_hpc_job_are_not_summed_and_stay_separate_rows(tmp_path: Path) -> None:
    base = 'gpu="1",UUID="GPU-2",hostname="n2",instance="10.0.0.2:9400"'
    lines = []
    for job in ("7", "8"):
        lines += [f'DCGM_FI_DEV_FB_USED{{{base},hpc_job="{job}"}} 1000 {T0 * 1000}',
                  f'DCGM_FI_DEV_FB_USED{{{base},hpc_job="{job}"}} 3000 {(T0 + 30) * 1000}',
                  f'DCGM_FI_DEV_POWER_USAGE{{{base},hpc_job="{job}"}} 100 {T0 * 1000}']
    (tmp_path / "jobs.prom").write_text("\n".join(lines) + "\n")
    buckets, _ = collect(["jobs.prom"], base=tmp_path)
    # one sub-row per job label (definitions.md: never merged); each: 2 instants 30 s apart -> interval
    # 30 s, observed 2 x 30 = 60 s, span [T0, T0 + 60)
    for job in ("7", "8"):
        b = one(buckets, gpu=1, job=job)
        assert b.host == "n2" and b.hpc_job == job
        assert b.fb_used_mib == 3000  # max over the bucket, not 1000+3000 nor the copies summed
        assert b.power_w == 100 and b.samples == 2
        assert b.observed_s == 60.0
        assert (int(b.span_start.timestamp()), int(b.span_end.timestamp())) == (T0, T0 + 60)


def test_bad_values_quarantined_with_file_and_line_and_mig_clamped(tmp_path: Path) -> None:
    lab = 'gpu="0",UUID="GPU-3",Hostname="n3",GPU_I_ID="2",GPU_I_PROFILE="3g.40gb"'
    (tmp_path / "bad.prom").write_text(
        f"DCGM_FI_PROF_SM_ACTIVE{{{lab}}} NaN {T0 * 1000}\n"
        f"DCGM_FI_PROF_DRAM_ACTIVE{{{lab}}} -0.5 {T0 * 1000}\n"
        f"DCGM_FI_PROF_SM_ACTIVE{{{lab}}} 1.04 {(T0 + 30) * 1000}\n"
        "DCGM_FI_PROF_SM_ACTIVE{gpu=\"0\" 1\n")
    buckets, problems = collect(["bad.prom"], base=tmp_path)
    b = one(buckets, gpu=0)
    assert b.gpu_instance == "2" and "3g.40gb" in (b.model or "")
    assert b.sm_active == 1.0 and b.dram_active is None
    assert sum(problems.clamped.values()) == 1
    where = {(Path(src).name, loc) for src, loc, _, _ in problems.items}
    assert where == {("bad.prom", "line 1"), ("bad.prom", "line 2"), ("bad.prom", "line 4")}


def test_untimestamped_samples_take_at_or_mtime_and_window_filters(tmp_path: Path) -> None:
    f = tmp_path / "now.prom"
    f.write_text('DCGM_FI_DEV_GPU_UTIL{gpu="0",instance="node9:9400"} 50\n')
    os.utime(f, (T0 + 310, T0 + 310))
    by_mtime, _ = collect(["now.prom"], base=tmp_path)
    assert one(by_mtime, gpu=0).start == datetime.fromtimestamp(T0 + 300, UTC)
    assert one(by_mtime, gpu=0).host == "node9"  # instance host:port -> host
    at = datetime.fromtimestamp(T0 + 1000, UTC)
    by_at, _ = collect(["now.prom"], base=tmp_path, at=at.isoformat())
    assert one(by_at, gpu=0).start == datetime.fromtimestamp(T0 + 900, UTC)
    outside = Window(at + timedelta(seconds=1), at + timedelta(hours=1))
    assert collect(["now.prom"], outside, base=tmp_path, at=at.isoformat())[0] == []


def test_missing_file_is_a_source_error(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="no file matches"):
        collect(["nothing-*.prom"], base=tmp_path)
    src = ScrapeFiles(Context("c"), ScrapeFiles.Options(paths=[str(tmp_path / "gone.prom")]))
    with pytest.raises(SourceError, match="cannot read"):
        list(src.collect(EVER, Problems()))


def test_parse_line_escapes_and_exemplars() -> None:
    name, labels, value, ts = parse_line(r'm{a="x\"y",b="c\\d",e="f\ng"} 1.5e3 1700000000000', False) or ()
    assert (name, labels, value, ts) == ("m", {"a": 'x"y', "b": "c\\d", "e": "f\ng"}, 1500.0, 1.7e9)
    om = parse_line('m_total{a="b"} 3 1700000000.250 # {trace_id="x"} 1 1700000000', True)
    assert om == ("m_total", {"a": "b"}, 3.0, 1700000000.25)
    assert parse_line("# HELP m help", False) is None and parse_line("   ", False) is None
    with pytest.raises(ValueError):
        parse_line('m{a="b"', False)


def test_every_option_is_documented() -> None:
    doc = (Path(__file__).resolve().parent.parent / "docs" / "telemetry.md").read_text()
    for field in ScrapeFiles.Options.model_fields:
        assert f"| `scrape.{field}` |" in doc, field


JOBSTATS = Path(__file__).parent / "fixtures" / "jobstats"


def test_jobstats_exporter_names_units_and_job_id_metric() -> None:
    """jobstats' exporter (fixture built from its documented exposition, see fixtures/jobstats/PROVENANCE.md):
    duty cycle 0-100, memory in bytes, power in milliwatts, GPU index from ``minor_number``, node from
    ``instance``, and the Slurm job as the *value* of ``nvidia_gpu_jobId`` (0 = none)."""
    problems = Problems()
    src = build("scrape", "telemetry", {"paths": ["federate-jobstats-exporter.prom"]}, Context("della", JOBSTATS))
    t0 = datetime(2025, 11, 29, 8, 0, tzinfo=UTC)
    buckets = list(src.collect(Window(t0, t0 + timedelta(hours=1), 300), problems))
    assert problems.total == 0
    by_gpu = {b.gpu: b for b in buckets}
    assert sorted(by_gpu) == [0, 1] and all(b.host == "della-l01g1" and b.start == t0 for b in buckets)
    g0, g1 = by_gpu[0], by_gpu[1]
    # hand: (97 + 99 + 98) / 3 / 100 = 0.98; power (251 + 255 + 253) / 3 W = 253 W; memory max 4.3e10 B
    assert g0.gpu_util == pytest.approx(0.98) and g0.power_w == pytest.approx(253.0)
    assert g0.fb_used_mib == pytest.approx(4.3e10 / 1048576) and g0.samples == 3
    assert g0.hpc_job == "51234567" and g0.model == "NVIDIA A100 80GB PCIe" and g0.sm_active is None
    # GPU 1: idle (0 %), 61 W on average, 44,040,192,000 B = 42,000 MiB held; no job at the first sample
    assert g1.gpu_util == 0.0 and g1.power_w == pytest.approx(61.0) and g1.fb_used_mib == pytest.approx(42000.0)
    assert g1.hpc_job == "51234568" and g1.uuid == "GPU-0a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9"


#: metrics of the real A100 scrape that gpu-audit does not store (written out by hand, not from the alias table)
A100_UNSTORED = ("DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_MEMORY_TEMP", "DCGM_FI_DEV_MEM_CLOCK",
                 "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "DCGM_FI_DEV_SM_CLOCK",
                 "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "DCGM_FI_DEV_VGPU_LICENSE_STATUS")


def test_gpu_with_only_unstored_metrics_is_warned_about(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A node whose exporter sends temperatures and clocks but no utilization (the real A100 scrape's lines of
    those metrics) beside the real T4 scrape: the T4 GPUs give buckets, the A100 gives a warning naming host,
    index, UUID and the names seen (before: nothing at all; the warning existed only for a whole scrape)."""
    lines = (DCGM / "a100-mig-nvidia-docs.txt").read_text().splitlines()
    (tmp_path / "a100.prom").write_text("\n".join(ln for ln in lines if ln.strip().split("{")[0] in A100_UNSTORED))
    (tmp_path / "t4.prom").write_bytes((DCGM / "t4-gke-k8s-prof.prom").read_bytes())
    src = build("scrape", "telemetry", {"paths": ["a100.prom", "t4.prom"]}, Context("c1", tmp_path))
    with caplog.at_level("WARNING", "gpu_audit"):
        buckets = list(src.collect(EVER, Problems()))
    assert sorted({(b.host, b.gpu) for b in buckets}) == [("gke-test-dcgm-default-pool-fed1e979-tt7p", 0),
                                                         ("gke-test-dcgm-default-pool-fed1e979-tt7p", 1)]
    want = ("GPU ub20-a100-k8s/0 (UUID GPU-34319582-d595-d1c7-d1d2-179bcfa61660) has only metrics gpu-audit does "
            f"not store: {', '.join(sorted(A100_UNSTORED)[:8])} and 1 more; no bucket for it")
    assert src.notes == [want]
    assert [r.getMessage() for r in caplog.records] == [f"scrape a100.prom: {want}"]
    assert not getattr(src, "empty_reason", "")  # the source as a whole had usable GPUs


def test_collect_output_lists_the_unstored_gpu(tmp_path: Path) -> None:
    """``gpu-audit collect`` shows the warning under the source's line (and in --json, under notes)."""
    import json

    from click.testing import CliRunner

    from auditor.cli import main

    lines = (DCGM / "a100-mig-nvidia-docs.txt").read_text().splitlines()
    (tmp_path / "a100.prom").write_text("\n".join(ln for ln in lines if ln.strip().split("{")[0] in A100_UNSTORED))
    (tmp_path / "t4.prom").write_bytes((DCGM / "t4-gke-k8s-prof.prom").read_bytes())
    cfg = tmp_path / "gpu-audit.toml"
    cfg.write_text(f'[store]\nurl = "sqlite:///{tmp_path / "a.db"}"\n[[clusters]]\nname = "c1"\n'
                   '[[clusters.telemetry]]\nkind = "scrape"\npaths = ["a100.prom", "t4.prom"]\n'
                   'at = "2026-11-26T15:00:00Z"\n')
    assert CliRunner().invoke(main, ["-c", str(cfg), "db", "upgrade"]).exit_code == 0
    args = ["-c", str(cfg), "collect", "--since", "2026-11-26T14:00:00Z", "--until", "2026-11-26T16:00:00Z"]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    out = res.output.strip().splitlines()
    assert out[-2].startswith("c1 telemetry[0]:scrape: ok (0 allocations, 2 buckets")
    assert out[-1] == ("  note: GPU ub20-a100-k8s/0 (UUID GPU-34319582-d595-d1c7-d1d2-179bcfa61660) has only metrics "
                       f"gpu-audit does not store: {', '.join(sorted(A100_UNSTORED)[:8])} and 1 more; no bucket for it")
    doc = json.loads(CliRunner().invoke(main, ["--json", *args]).stdout)
    assert doc["sources"][0]["notes"] == [out[-1][len("  note: "):]]
