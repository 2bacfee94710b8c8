"""Telemetry pre-aggregated by the TSDB: deploy/prometheus-recording-rules.yml against REAL servers.

The `rules` testbeds (scripts/testbed-prometheus.sh up rules: 127.0.0.1:19094; scripts/testbed-victoriametrics.sh
up rules: 127.0.0.1:19095) hold the test profile's generated samples plus the rules' recorded series, computed
by promtool's rule backfill and by vmalert's replay from hour 1 on (so the first buckets have no recorded
series, as when the rules are installed on a running server) and evaluated off the 5-minute grid. The
connector reading the recorded series must give the buckets it gives from the raw series (and those worked
out from the generator's samples), while reading about a tenth of the samples."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import need, need_tsdb
from test_prometheus import PROM_DIR, PROM_URL, compare, expected_buckets

from auditor.errors import SourceError
from connectors import build, recording
from connectors.aliases import JOB_ID_METRICS, METRIC_ALIASES
from connectors.base import Context, Problems, Window

ROOT = Path(__file__).resolve().parent.parent
RULES_FILE = ROOT / "deploy" / "prometheus-recording-rules.yml"
RULES_PROM_URL = os.environ.get("GPU_AUDIT_TEST_RULES_PROM_URL", "http://127.0.0.1:19094")
RULES_PROM_DIR = Path(os.environ.get("GPU_AUDIT_TEST_RULES_PROM_DIR", "/var/lib/gpu-audit-testbed/rules"))
RULES_VM_URL = os.environ.get("GPU_AUDIT_TEST_RULES_VM_URL", "http://127.0.0.1:19095")
RULES_VM_DIR = Path(os.environ.get("GPU_AUDIT_TEST_RULES_VM_DIR",
                                   "/var/lib/gpu-audit-testbed/victoriametrics-rules"))
#: Buckets with recorded series: the backfill evaluates from start + 3600 + 137 s on; an evaluation at T
#: records the bucket that ended at floor((T - 60) / 300) * 300, so the first one recorded is the bucket
#: ending at start + 3600 (the 12th of 72), and every later one is: 72 - 11 = 61.
RECORDED_BUCKETS = 61


def _state(url: str, directory: Path) -> dict:
    need_tsdb(url, directory)  # the rules testbed itself (marker and reported storage path)
    return json.loads((directory / "state.json").read_text())


def _window(state: dict, bucket_s: int = 300, from_hour: float = 0) -> Window:
    start = datetime.fromtimestamp(state["start"], UTC)
    return Window(start + timedelta(hours=from_hour), start + timedelta(hours=state["hours"]), bucket_s)


def _pull(url: str, state: dict, mode: str, bucket_s: int = 300, from_hour: float = 0,
          **opts: Any) -> tuple[list, Problems, Any]:
    src = build("prometheus", "telemetry", {"url": url, "recording_rules": mode, **opts}, Context("test"))
    problems = Problems()
    return list(src.collect(_window(state, bucket_s, from_hour), problems)), problems, src


def _rows(buckets: list) -> dict[tuple, dict[str, Any]]:
    """Every field of every bucket, keyed by GPU, bucket and job (dataclass fields: none left out)."""
    out = {(b.host, b.gpu, b.gpu_instance, b.start, b.job): dataclasses.asdict(b) for b in buckets}
    assert len(out) == len(buckets), "duplicate buckets"
    return out


# -- the shipped file ---------------------------------------------------------------------------------------

def test_shipped_rules_file_is_the_generated_one() -> None:
    assert RULES_FILE.read_text() == recording.rules_yaml(), \
        "deploy/prometheus-recording-rules.yml is stale: python -m connectors.recording > it"


def test_rules_cover_every_alias_with_the_raw_bucket_expression() -> None:
    doc = yaml.safe_load(RULES_FILE.read_text())
    (group,) = doc["groups"]
    assert group["interval"] == "5m"
    rules = {r["record"]: r["expr"] for r in group["rules"]}
    # written out by hand: the raw connector's bucket query, picked at the bucket end 60 s before evaluation
    assert rules["gpu_audit:DCGM_FI_PROF_SM_ACTIVE:avg5m"] == (
        "last_over_time((avg_over_time(DCGM_FI_PROF_SM_ACTIVE[300s] offset 1ms))[299999ms:300s] offset 60s)")
    assert rules["gpu_audit:DCGM_FI_DEV_FB_USED:max5m"] == (
        "last_over_time((max_over_time(DCGM_FI_DEV_FB_USED[300s] offset 1ms))[299999ms:300s] offset 60s)")
    assert rules["gpu_audit:DCGM_FI_DEV_GPU_UTIL:count5m"] == (
        "last_over_time((count_over_time(DCGM_FI_DEV_GPU_UTIL[300s] offset 1ms))[299999ms:300s] offset 60s)")
    assert rules["gpu_audit:recording_rules:version"] == "vector(1)"
    sources = {r.split(":")[1] for r in rules if r != "gpu_audit:recording_rules:version"}
    assert sources == set(METRIC_ALIASES) | JOB_ID_METRICS
    counted = {r.split(":")[1] for r in rules if r.endswith(":count5m")}
    assert "DCGM_FI_PROF_SM_ACTIVE" in counted and "nvidia_gpu_duty_cycle" in counted
    assert {"DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "DCGM_FI_PROF_DRAM_ACTIVE"} <= counted
    assert "DCGM_FI_DEV_POWER_USAGE" not in counted  # samples come from the activity fields only


@pytest.mark.service
def test_promtool_and_vmalert_accept_the_rules() -> None:
    need(bool(shutil.which("promtool")), "promtool not installed (Debian package prometheus)")
    out = subprocess.run(["promtool", "check", "rules", str(RULES_FILE)], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0 and "SUCCESS" in out.stdout, out.stdout + out.stderr
    need(bool(shutil.which("vmalert")), "vmalert not installed (Debian package victoria-metrics)")
    out = subprocess.run(["vmalert", f"-rule={RULES_FILE}", "-dryRun"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]


# -- against the real TSDBs ---------------------------------------------------------------------------------

@pytest.mark.service
def test_prometheus_recorded_buckets_equal_the_raw_ones() -> None:
    state = _state(RULES_PROM_URL, RULES_PROM_DIR)
    raw, raw_problems, raw_src = _pull(RULES_PROM_URL, state, "off")
    rec, rec_problems, rec_src = _pull(RULES_PROM_URL, state, "on")
    assert raw_src.read_recorded == 0 and rec_src.read_recorded == RECORDED_BUCKETS
    assert len(raw) > 400
    # identical: every field (values, samples, observed seconds, labels), floats bit for bit
    assert _rows(rec) == _rows(raw)
    assert rec_problems.items == raw_problems.items  # the NaN bucket quarantined alike, once
    assert rec_src.notes == raw_src.notes == []  # recorded series are not "GPUs with unstored metrics"
    compare(rec, expected_buckets(state, 300, nan="bucket"))  # and both are the generator's buckets
    auto, _, auto_src = _pull(RULES_PROM_URL, state, "auto")
    assert auto_src.read_recorded == RECORDED_BUCKETS and _rows(auto) == _rows(raw)


@pytest.mark.service
def test_prometheus_recorded_chunks_and_subsets_equal_the_raw_ones() -> None:
    state = _state(RULES_PROM_URL, RULES_PROM_DIR)
    opts = {"max_points_per_query": 7, "chunk_hours": 1, "metrics": ["sm_active", "gpu_util", "fb_used_mib"]}
    raw, _, _ = _pull(RULES_PROM_URL, state, "off", **opts)
    rec, _, src = _pull(RULES_PROM_URL, state, "on", **opts)
    assert src.read_recorded == RECORDED_BUCKETS and _rows(rec) == _rows(raw)


@pytest.mark.service
def test_prometheus_window_the_rules_cover_whole() -> None:
    """From hour 1 on every bucket is recorded (60 of them): the look-up for GPUs with only unstored metrics
    then asks the recorded series which GPUs have stored ones; it must find the same (none: the
    nvidia_gpu_exporter GPU's nvidia_smi_index has stored metrics beside it)."""
    state = _state(RULES_PROM_URL, RULES_PROM_DIR)
    raw, _, raw_src = _pull(RULES_PROM_URL, state, "off", from_hour=1)
    rec, _, rec_src = _pull(RULES_PROM_URL, state, "on", from_hour=1)
    assert rec_src.read_recorded == 60 and _rows(rec) == _rows(raw)
    assert rec_src.notes == raw_src.notes == []


@pytest.mark.service
def test_victoriametrics_recorded_buckets_equal_the_raw_ones() -> None:
    state = _state(RULES_VM_URL, RULES_VM_DIR)
    raw, raw_problems, _ = _pull(RULES_VM_URL, state, "off")
    rec, rec_problems, src = _pull(RULES_VM_URL, state, "on")
    assert src.read_recorded == RECORDED_BUCKETS
    want, got = _rows(raw), _rows(rec)
    assert set(got) == set(want) and len(want) > 400
    # VictoriaMetrics stores a recorded float as a decimal of 12 significant digits (0.0298204 for the raw
    # path's 0.029820400000000004): values agree to 1e-11 relative, everything else exactly
    loose = 0
    for key, row in want.items():
        for f, v in row.items():
            if isinstance(v, float) and f not in ("samples", "observed_s"):
                assert math.isclose(got[key][f], v, rel_tol=1e-11, abs_tol=1e-15), (key, f, got[key][f], v)
                loose += got[key][f] != v
            else:
                assert got[key][f] == v, (key, f, got[key][f], v)
    assert loose > 0  # the tolerance is used (else this test would not need it)
    assert rec_problems.items == raw_problems.items == []
    _, _, covered = _pull(RULES_VM_URL, state, "on", from_hour=1)  # every bucket recorded (see above)
    assert covered.read_recorded == 60 and covered.notes == []


@pytest.mark.service
def test_rules_need_five_minute_buckets_and_their_heartbeat() -> None:
    state = _state(RULES_PROM_URL, RULES_PROM_DIR)
    with pytest.raises(SourceError, match=r"recording_rules = on: the recording rules compute 300-s buckets, "
                                          r"not 600-s ones"):
        _pull(RULES_PROM_URL, state, "on", bucket_s=600)
    auto, _, src = _pull(RULES_PROM_URL, state, "auto", bucket_s=600)
    raw, _, _ = _pull(RULES_PROM_URL, state, "off", bucket_s=600)
    assert src.read_recorded == 0 and _rows(auto) == _rows(raw)
    # the test Prometheus has no rules: `on` fails in one line, `auto` reads the raw series
    need_tsdb(PROM_URL, PROM_DIR)
    plain = json.loads((PROM_DIR / "state.json").read_text())
    with pytest.raises(SourceError, match=r"recording_rules = on: no gpu_audit:recording_rules:version series"):
        _pull(PROM_URL, plain, "on")
    auto, _, src = _pull(PROM_URL, plain, "auto")
    assert src.read_recorded == 0 and _rows(auto) == _rows(_pull(PROM_URL, plain, "off")[0])



@pytest.mark.service
def test_matchers_select_the_heartbeat_that_vouches_for_the_series() -> None:
    """The heartbeat of one Prometheus (no labels) vouches for the series whatever ``matchers`` select on
    labels it lacks: the recorded view of a subset equals the raw one."""
    state = _state(RULES_PROM_URL, RULES_PROM_DIR)
    opts = {"matchers": 'job="dcgm-exporter",Hostname!="node-c"'}
    raw, _, _ = _pull(RULES_PROM_URL, state, "off", **opts)
    rec, _, src = _pull(RULES_PROM_URL, state, "on", **opts)
    assert src.read_recorded == RECORDED_BUCKETS and _rows(rec) == _rows(raw)
    assert {b.host for b in raw} == {"node-a", "node-b"}  # node-c left out, node-d is another job


def test_recorded_series_are_not_taken_for_gpus_with_unstored_metrics() -> None:
    """Recorded names look like GPU metrics (``gpu_audit:...``) but are the rules' own: no look-up for GPUs
    with only unstored metrics is made for them (the server here refuses connections: a query would raise)."""
    from helpers import free_port

    src = build("prometheus", "telemetry", {"url": f"http://127.0.0.1:{free_port()}", "retries": 0},
                Context("test"))
    win = Window(datetime(2026, 1, 1, tzinfo=UTC), datetime(2026, 1, 1, 1, tzinfo=UTC), 300)
    have = {"DCGM_FI_PROF_SM_ACTIVE", recording.recorded("DCGM_FI_PROF_SM_ACTIVE", "avg"), recording.HEARTBEAT}
    assert src.unstored_gpus(win, have, Problems()) == []
    with pytest.raises(SourceError, match="cannot connect"):  # the same call with an unstored GPU metric queries
        src.unstored_gpus(win, have | {"DCGM_FI_DEV_GPU_TEMP_X"}, Problems())


# -- heartbeats that must not vouch: a private Prometheus with hand-written series -----------------------------

T0 = (int(time.time()) - 2 * 86400) // 3600 * 3600  # two days ago, a whole hour
GPU = 'gpu="0",UUID="GPU-r0",Hostname="node-r",cluster="a"'


def _hand_written() -> str:
    """Five hours of one GPU's GPU_UTIL at 90 % every 30 s, with recorded series that say 50 % (so a bucket
    read from them shows) and heartbeats at bucket ends + 100 s (inside their reading windows
    [end + 60 s, end + 360 s)): hour 0 from another cluster's rules (cluster="b"), hour 2 label-less but of
    version 2, hour 4 from this cluster's rules (cluster="a", version 1: the control that does vouch); none
    in hours 1 and 3, so each test hour sees only its own."""
    raw = [f"DCGM_FI_DEV_GPU_UTIL{{{GPU}}} 90 {t}" for t in range(T0, T0 + 5 * 3600, 30)]
    ends = range(T0 + 300, T0 + 5 * 3600 + 1, 300)
    avg = [f"gpu_audit:DCGM_FI_DEV_GPU_UTIL:avg5m{{{GPU}}} 50 {e + 100}" for e in ends]
    count = [f"gpu_audit:DCGM_FI_DEV_GPU_UTIL:count5m{{{GPU}}} 10 {e + 100}" for e in ends]
    beats = {'{cluster="b"} 1': range(0, 12), " 2": range(24, 36), '{cluster="a"} 1': range(48, 60)}
    hb = [f"gpu_audit:recording_rules:version{labels} {T0 + 300 * (i + 1) + 100}"
          for labels, idx in beats.items() for i in idx]
    families = [("DCGM_FI_DEV_GPU_UTIL", raw), ("gpu_audit:DCGM_FI_DEV_GPU_UTIL:avg5m", avg),
                ("gpu_audit:DCGM_FI_DEV_GPU_UTIL:count5m", count), ("gpu_audit:recording_rules:version", hb)]
    return "".join(f"# TYPE {name} gauge\n" + "\n".join(lines) + "\n" for name, lines in families) + "# EOF\n"


@pytest.fixture(scope="module")
def hand_prom(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from test_infra_prometheus import private_prometheus

    with private_prometheus(tmp_path_factory.mktemp("rules"), _hand_written()) as url:
        yield url


def _hour(url: str, hour: int, mode: str) -> tuple[list, Any]:
    src = build("prometheus", "telemetry", {"url": url, "recording_rules": mode, "matchers": 'cluster="a"'},
                Context("test"))
    start = datetime.fromtimestamp(T0 + hour * 3600, UTC)
    return list(src.collect(Window(start, start + timedelta(hours=1), 300), Problems())), src


@pytest.mark.service
def test_heartbeats_of_another_cluster_or_version_do_not_vouch(hand_prom: str,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    control, src = _hour(hand_prom, 4, "on")  # this cluster's rules: the recorded 50 % is read
    assert src.read_recorded == 12 and [b.gpu_util for b in control] == [0.5] * 12
    for mode in ("auto", "on"):  # cluster="b"'s heartbeat: raw 90 % (`on` may also refuse: Prometheus lists
        # names per 2-hour block, so whether hour 2's label-less heartbeat is listed depends on T0's hour)
        try:
            buckets, src = _hour(hand_prom, 0, mode)
        except SourceError as exc:
            assert mode == "on" and "no gpu_audit:recording_rules:version series" in str(exc)
            continue
        assert src.read_recorded == 0 and [b.gpu_util for b in buckets] == [0.9] * 12
        assert all(b.samples == 10 for b in buckets)
    with pytest.raises(SourceError, match=r"recording_rules = on: gpu_audit:recording_rules:version = 2: the rules "
                                          r"installed are not the version this gpu-audit reads \(1\)"):
        _hour(hand_prom, 2, "on")
    buckets, src = _hour(hand_prom, 2, "auto")
    assert src.read_recorded == 0 and [b.gpu_util for b in buckets] == [0.9] * 12
    assert "not the version this gpu-audit reads" in caplog.text
