"""GPU faults from telemetry (README "Infrastructure-affected time"): XID errors, fault clock-throttle
reasons, ECC double-bit errors and row remapping, read by the scrape-file connector with dcgm-exporter's
field names and label sets (tests/fixtures/dcgm, its default counters CSV) and nvidia_gpu_exporter's."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from conftest import FIXTURES

from auditor.records import GpuBucket, NodeEvent
from connectors import build
from connectors._faults import bits_named
from connectors.aliases import FAULT_ALIASES
from connectors.base import Context, Problems, Window

T0 = 1_795_705_200  # 2026-11-26T15:00Z, a whole hour
LABELS = 'gpu="{g}",UUID="GPU-34319582-d595-d1c7-d1d2-179bcfa61660",device="nvidia{g}",Hostname="ub20-a100-k8s"'
WINDOW = Window(datetime.fromtimestamp(T0, UTC), datetime.fromtimestamp(T0 + 3600, UTC), 300)


def scrapes(tmp: Path, series: dict[tuple[str, int], list[float]], step: int = 60) -> list[Path]:
    """One scrape file per instant (T0, T0 + step, ...), like ``curl :9400/metrics`` every minute, each line
    with its millisecond timestamp; every GPU also reports GPU-Util."""
    n = max(len(v) for v in series.values())
    out = []
    for i in range(n):
        ms = (T0 + i * step) * 1000
        lines = [f"{name}{{{LABELS.format(g=g)}}} {vals[i]:g} {ms}" for (name, g), vals in series.items()
                 if i < len(vals)]
        lines += [f"DCGM_FI_DEV_GPU_UTIL{{{LABELS.format(g=g)}}} 0 {ms}" for g in {g for _n, g in series}]
        p = tmp / f"scrape-{i:03d}.prom"
        p.write_text("\n".join(lines) + "\n")
        out.append(p)
    return out


def collect(paths: list[Path]) -> tuple[list[NodeEvent], list[GpuBucket], Problems]:
    src = build("scrape", "telemetry", {"paths": [str(p) for p in paths]}, Context("c1", Path("/")))
    p = Problems()
    recs = list(src.collect(WINDOW, p))
    return ([r for r in recs if isinstance(r, NodeEvent)], [r for r in recs if isinstance(r, GpuBucket)], p)


def ev(minute_from: int, minute_to: int) -> tuple[datetime, datetime]:
    base = datetime.fromtimestamp(T0, UTC)
    return base + timedelta(minutes=minute_from), base + timedelta(minutes=minute_to)


def test_field_names_are_dcgm_exporters() -> None:
    """Every DCGM fault field we read is one the dcgm-exporter counters CSV names (enabled or commented), or
    the DCGM 4.x name of one (checked against DCGM's header in tests/test_dcgm_names.py)."""
    csv = (FIXTURES / "dcgm" / "dcgm-exporter-default-counters.csv").read_text()
    renamed = {line.split()[1] for line in (FIXTURES / "dcgm_names" / "dcgm_fields-72fa3fe-aliases.txt")
               .read_text().splitlines() if line and not line.startswith("#")}
    dcgm = [n for n in FAULT_ALIASES if n.startswith("DCGM_") and n not in renamed]
    assert dcgm and all(n in csv for n in dcgm if n != "DCGM_FI_DEV_CLOCKS_EVENT_REASONS"
                        and n != "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"), [n for n in dcgm if n not in csv]
    # NVML clocks event reasons (nvml.h): 0x8 HW slowdown, 0x20 SW thermal, 0x40 HW thermal, 0x80 power brake;
    # GPU idle 0x1, application clocks 0x2, SW power cap 0x4, sync boost 0x10 are not faults
    assert bits_named(0x1 | 0x2 | 0x4 | 0x10 | 0x100) == []
    assert bits_named(0x8 | 0x40) == ["HW slowdown", "HW thermal slowdown"]
    assert bits_named(0xFF) == ["HW slowdown", "SW thermal slowdown", "HW thermal slowdown", "HW power brake slowdown"]


def test_shipped_counters_enable_the_fault_fields() -> None:
    from test_aliases import ROOT, counters

    ours = counters(ROOT / "deploy" / "dcgm-counters.csv")
    faults = {n for n in ours if n in FAULT_ALIASES}
    assert faults == {"DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
                      "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_ROW_REMAP_FAILURE"}


def test_real_scrape_with_xid_zero_has_no_fault() -> None:
    src = build("scrape", "telemetry", {"paths": ["a100-mig-nvidia-docs.txt"]}, Context("c1", FIXTURES / "dcgm"))
    p = Problems()
    recs = list(src.collect(Window(datetime(2000, 1, 1, tzinfo=UTC), datetime(2100, 1, 1, tzinfo=UTC)), p))
    assert p.total == 0 and not [r for r in recs if isinstance(r, NodeEvent)]


def test_faults_become_events_per_gpu(tmp_path: Path) -> None:
    """One sample a minute for 20 minutes (buckets of 5 min: 0-5, 5-10, 10-15, 15-20)."""
    xid = [0, 0, 0, 0, 0, 0, 0, 79, 79, 79, 79, 79, 79, 79, 79, 79, 79, 48, 48, 48]  # 79 at 7 min, 48 at 17
    throttle = [1, 1, 4, 4, 4, 4, 4, 4, 4, 4, 0x48, 0x48, 0x48, 1, 1, 1, 1, 1, 1, 1]  # fault 10-12 min
    dbe = [0] * 12 + [2] * 8  # +2 at 12 min
    remap = [0] * 16 + [1] * 4  # failure 16-19 min
    paths = scrapes(tmp_path, {("DCGM_FI_DEV_XID_ERRORS", 0): xid, ("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", 0): throttle,
                               ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", 1): dbe, ("DCGM_FI_DEV_ROW_REMAP_FAILURE", 1): remap})
    events, buckets, p = collect(paths)
    assert p.total == 0 and len(buckets) == 8  # 2 GPUs x 4 buckets: faults do not hide the telemetry
    got = sorted(((e.gpu, e.kind, e.start, e.end, e.reason) for e in events), key=lambda x: (x[0], x[1], x[2]))
    assert got == [
        (0, "throttle", *ev(10, 15), "throttle: HW slowdown, HW thermal slowdown"),
        (0, "xid", *ev(5, 10), "XID 79"), (0, "xid", *ev(15, 20), "XID 48"),
        (1, "ecc_dbe", *ev(10, 15), "ECC double-bit errors +2"),
        (1, "row_remap", *ev(15, 20), "row remap failure")]
    assert all(e.node == "ub20-a100-k8s" and e.cluster == "c1" and e.source == "scrape" for e in events)


def test_consecutive_faulty_buckets_are_one_event_and_resets_are_not_faults(tmp_path: Path) -> None:
    brake = [0x80] * 12 + [0] * 3  # power brake 0-12 min: buckets 0-5, 5-10, 10-15 -> one event
    dbe = [5, 5, 0, 0, 0]  # a counter reset (driver reload) is not an error
    paths = scrapes(tmp_path, {("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", 0): brake,
                               ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", 0): dbe})
    events, _b, p = collect(paths)
    assert p.total == 0
    assert [(e.kind, e.start, e.end, e.reason) for e in events] == [
        ("throttle", *ev(0, 15), "throttle: HW power brake slowdown")]


def test_nvidia_gpu_exporter_clock_event_flags(tmp_path: Path) -> None:
    """nvidia_gpu_exporter labels series with uuid only (the index from nvidia_smi_index): the same names as
    its real scrape (tests/fixtures/dcgm/nvidia_gpu_exporter-h100-idle.metrics)."""
    uuid = 'uuid="00000000-0000-0000-0000-000000000000"'
    real = (FIXTURES / "dcgm" / "nvidia_gpu_exporter-h100-idle.metrics").read_text()
    assert "nvidia_smi_clocks_event_reasons_hw_thermal_slowdown{" in real
    lines = []
    for i, v in enumerate([0, 0, 1, 1, 0, 0]):
        ms = (T0 + 60 * i) * 1000
        lines += [f"nvidia_smi_index{{{uuid}}} 3 {ms}", f"nvidia_smi_utilization_gpu_ratio{{{uuid}}} 0 {ms}",
                  f"nvidia_smi_clocks_event_reasons_hw_thermal_slowdown{{{uuid}}} {v} {ms}",
                  f"nvidia_smi_clocks_event_reasons_active{{{uuid}}} {1 if v == 0 else 0x41} {ms}"]
    (tmp_path / "n.prom").write_text("\n".join(lines) + "\n")
    src = build("scrape", "telemetry", {"paths": [str(tmp_path / "n.prom")], "host": "h100-a"},
                Context("c1", Path("/")))
    p = Problems()
    events = [r for r in src.collect(WINDOW, p) if isinstance(r, NodeEvent)]
    assert p.total == 0
    assert [(e.node, e.gpu, e.kind, e.start, e.end, e.reason) for e in events] == [
        ("h100-a", 3, "throttle", *ev(0, 5), "HW thermal slowdown; throttle: HW thermal slowdown")]
