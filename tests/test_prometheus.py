"""Prometheus connector against a REAL Prometheus (scripts/testbed-prometheus.sh up), compared with buckets
computed here, independently, from the generator's raw samples; plus faults (down, slow, 400/422, 5xx,
partial answers, NaN) from the real server where it can produce them and a tiny local server otherwise."""

from __future__ import annotations

import importlib.util
import json
import logging
import math
import os
import threading
import time
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from conftest import need_tsdb
from helpers import free_port

from auditor.errors import SourceError
from connectors import build
from connectors.base import Context, Problems, Window
from connectors.prometheus import PrometheusTelemetry


@pytest.fixture(autouse=True)
def _short_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    """Retries 10 ms apart (connectors.retry.BACKOFF_S, an option until issue 45), so the fault tests run fast."""
    from connectors import retry

    monkeypatch.setattr(retry, "BACKOFF_S", 0.01)

ROOT = Path(__file__).resolve().parent.parent
PROM_URL = os.environ.get("GPU_AUDIT_TEST_PROM_URL", "http://127.0.0.1:19090")
PROM_DIR = Path(os.environ.get("GPU_AUDIT_TEST_PROM_DIR", "/var/lib/gpu-audit-testbed/test"))

#: The generated metric names -> (bucket field, divisor to the stored unit): written out here on purpose
#: instead of reusing connectors.aliases, so the expectation does not share code with the connector.
FIELDS = {"DCGM_FI_DEV_GPU_UTIL": ("gpu_util", 100.0), "DCGM_FI_PROF_SM_ACTIVE": ("sm_active", 1.0),
          "DCGM_FI_PROF_SM_OCCUPANCY": ("sm_occupancy", 1.0),
          "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": ("tensor_active", 1.0),
          "DCGM_FI_PROF_DRAM_ACTIVE": ("dram_active", 1.0), "DCGM_FI_DEV_FB_USED": ("fb_used_mib", 1.0),
          "DCGM_FI_DEV_POWER_USAGE": ("power_w", 1.0), "DCGM_FI_PROF_PCIE_TX_BYTES": ("pcie_tx_bps", 1.0),
          "nvidia_smi_utilization_gpu_ratio": ("gpu_util", 1.0),
          "nvidia_smi_memory_used_bytes": ("fb_used_mib", 1024.0 * 1024.0),
          "nvidia_smi_power_draw_watts": ("power_w", 1.0)}
RATIOS = {"gpu_util", "sm_active", "sm_occupancy", "tensor_active", "dram_active"}


def generator() -> Any:
    spec = importlib.util.spec_from_file_location("gen_dcgm", ROOT / "scripts" / "gen_dcgm_openmetrics.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def expected_buckets(state: dict, bucket_s: int, nan: str) -> dict[tuple, dict[str, Any]]:
    """Buckets from the raw samples, one per GPU, bucket and job label: per instant the max over series copies,
    then the bucket mean (fb: max);
    ratios clamped at 1; ``nan="bucket"``: a NaN spoils its bucket's value (server-side avg), ``"sample"``:
    only the sample is dropped (scrape files). samples = SM_ACTIVE instants, else GPU_UTIL instants."""
    per: dict[tuple, dict[str, dict[int, float]]] = defaultdict(lambda: defaultdict(dict))
    labels: dict[tuple, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    raw = list(generator().samples(state))
    index = {lab["uuid"]: int(v) for m, lab, v, _ in raw if m == "nvidia_smi_index"}
    for metric, lab, value, ts in raw:
        if metric == "nvidia_smi_index":
            continue
        host = lab.get("Hostname") or lab.get("hostname") or lab["instance"].split(":")[0]
        gpu = int(lab["gpu"]) if "gpu" in lab else index[lab["uuid"]]
        # series of one GPU with different job labels are separate rows (definitions.md "sub-rows")
        job = lab.get("hpc_job") or (f"{lab.get('namespace', '')}/{lab['pod']}" if lab.get("pod") else "")
        key = (host, gpu, lab.get("GPU_I_ID", ""), ts - ts % bucket_s, job)
        fname, div = FIELDS[metric]
        old = per[key][fname].get(ts)
        v = value / div
        per[key][fname][ts] = v if old is None or math.isnan(v) else max(old, v)
        for k in ("hpc_job", "pod", "namespace", "container"):
            if lab.get(k):
                labels[key][k].add(lab[k])
    out: dict[tuple, dict[str, Any]] = {}
    for key, fields in per.items():
        row: dict[str, Any] = {k: ",".join(sorted(v)) for k, v in labels[key].items()}
        for fname, by_ts in fields.items():
            vals = list(by_ts.values())
            if any(math.isnan(v) for v in vals):
                if nan == "bucket":
                    continue
                vals = [v for v in vals if not math.isnan(v)]
            agg = max(vals) if fname == "fb_used_mib" else sum(vals) / len(vals)
            row[fname] = min(agg, 1.0) if fname in RATIOS else agg
        row["samples"] = len(fields.get("sm_active") or fields["gpu_util"]) if nan == "bucket" else \
            len({ts for by_ts in fields.values() for ts in by_ts})
        out[key] = row
    return out


def compare(buckets: list, expected: dict[tuple, dict[str, Any]]) -> None:
    got = {(b.host, b.gpu, b.gpu_instance, int(b.start.timestamp()), b.job_key()): b for b in buckets}
    assert len(got) == len(buckets), "duplicate buckets"
    assert set(got) == set(expected)
    for key, row in expected.items():
        b = got[key]
        for fname in set(FIELDS.values()):
            want = row.get(fname[0])
            have = getattr(b, fname[0])
            assert (have is None) == (want is None), (key, fname[0], have, want)
            if want is not None:
                assert have == pytest.approx(want, rel=1e-6, abs=1e-9), (key, fname[0])
        assert b.samples == row["samples"], key
        for k in ("hpc_job", "pod", "namespace", "container"):
            assert getattr(b, k) == row.get(k), (key, k)


@pytest.fixture(scope="module")
def state() -> dict:
    need_tsdb(PROM_URL, PROM_DIR)  # the testbed itself (its marker and reported TSDB path), not any Prometheus
    return json.loads((PROM_DIR / "state.json").read_text())


def window(state: dict, hours: float | None = None) -> Window:
    start = datetime.fromtimestamp(state["start"], UTC)
    return Window(start, start + timedelta(hours=hours or state["hours"]), 300)


def pull(state: dict, win: Window | None = None, **opts: Any) -> tuple[list, Problems]:
    src = build("prometheus", "telemetry", {"url": PROM_URL, **opts}, Context("test"))
    problems = Problems()
    return list(src.collect(win or window(state), problems)), problems


@pytest.mark.service
def test_buckets_match_independent_computation(state: dict) -> None:
    buckets, problems = pull(state)
    compare(buckets, expected_buckets(state, 300, nan="bucket"))
    assert all(b.seconds == 300 and b.start.tzinfo == UTC and b.cluster == "test" for b in buckets)
    # the NaN sample spoils exactly one bucket of node-a gpu1, reported once, not once per hpc_job copy
    nan_ts = state["start"] + 37 * state["interval"]  # the generator's nan_at
    nan_bucket = datetime.fromtimestamp(nan_ts - nan_ts % 300, UTC).isoformat()
    assert [loc for _, loc, _, _ in problems.items] == [f"node-a/gpu1 @ {nan_bucket}"]


@pytest.mark.service
def test_labels_aliases_rename_gap_mig_and_fallback(state: dict) -> None:
    buckets, problems = pull(state)
    by_gpu = defaultdict(list)
    for b in buckets:
        by_gpu[(b.host, b.gpu, b.gpu_instance)].append(b)
    spin = by_gpu[("node-a", 0, "")]
    assert all(b.gpu_util > 0.95 and b.sm_active < 0.05 for b in spin)  # the util mirage
    assert {(b.pod, b.namespace, b.container) for b in spin} == {("spin-7f9c", "team-a", "main")}
    idle = by_gpu[("node-a", 1, "")]
    # two job series of one GPU: two sub-rows per bucket (never merged), same device-wide values;
    # 10 samples at 30 s in a full 300 s bucket -> observed 300 s (interval estimated as 300 / 10)
    assert {b.hpc_job for b in idle} == {"101", "102"} and {b.fb_used_mib for b in idle} == {30000.0}
    assert {b.job for b in idle} == {"101", "102"} and len(idle) == 2 * len({b.start for b in idle})
    assert {b.observed_s for b in idle if b.samples == 10} == {300.0}
    work = sorted(by_gpu[("node-b", 0, "")], key=lambda b: b.start)
    start = state["start"]
    hours = {int((b.start.timestamp() - start) // 3600) for b in work}
    assert hours == {0, 1, 3, 4, 5}  # gap from hour 2 to 3: no buckets, so unknown, never idle
    assert len(work) == 60 and all(b.samples == 10 for b in work)  # Hostname and hostname halves both
    mig = by_gpu[("node-c", 0, "1")]
    assert mig and all(b.sm_active == 1.0 and "1g.10gb" in (b.model or "") for b in mig)
    assert sum(problems.clamped.values()) == len(mig)
    smi = by_gpu[("node-d", 3, "")]  # nvidia_gpu_exporter: uuid only; index via nvidia_smi_index
    assert len(smi) == 72 and all(b.gpu_util > 0.9 and b.sm_active is None and b.samples == 10
                                  and b.fb_used_mib == pytest.approx(2.0e10 / 2**20) for b in smi)
    util_only = by_gpu[("node-c", 1, "")]
    assert all(b.sm_active is None and b.gpu_util is not None and b.power_w is not None
               and b.samples == 10 for b in util_only)


@pytest.mark.service
def test_chunking_gives_the_same_buckets_without_duplicates(state: dict) -> None:
    whole, _ = pull(state)
    chunked, _ = pull(state, max_points_per_query=7)
    key = [(b.host, b.gpu, b.gpu_instance, b.start, b.job) for b in chunked]
    assert len(key) == len(set(key)) and sorted(key) == sorted(
        (b.host, b.gpu, b.gpu_instance, b.start, b.job) for b in whole)
    hourly, _ = pull(state, chunk_hours=1)
    assert {(b.host, b.gpu, b.start, b.sm_active, b.samples) for b in hourly} == \
        {(b.host, b.gpu, b.start, b.sm_active, b.samples) for b in whole}


@pytest.mark.service
def test_window_alignment_subset_and_matchers(state: dict) -> None:
    start = datetime.fromtimestamp(state["start"], UTC)
    win = Window(start + timedelta(minutes=7), start + timedelta(minutes=20), 300)
    buckets, _ = pull(state, win, metrics=["sm_active", "gpu_util"], matchers='instance="node-a:9400"')
    assert {b.host for b in buckets} == {"node-a"}
    assert sorted({b.start for b in buckets}) == [start + timedelta(minutes=m) for m in (5, 10, 15)]
    assert all(b.power_w is None and b.fb_used_mib is None for b in buckets)
    assert all(b.sm_active is not None for b in buckets if b.gpu == 0)  # gpu1 has the NaN at 15:15
    ten, _ = pull(state, Window(start, start + timedelta(hours=1), 600))
    assert {b.seconds for b in ten} == {600} and {b.samples for b in ten if b.host == "node-a"} == {20}


@pytest.mark.service
def test_scrape_files_of_the_same_data_agree(state: dict, tmp_path: Path) -> None:
    """The generated OpenMetrics read as scrape files give the same buckets (NaN drops only its sample)."""
    gen = generator()
    gen.write(state, tmp_path)
    src = build("scrape", "telemetry", {"paths": ["data.om"]}, Context("test", tmp_path))
    problems = Problems()
    buckets = list(src.collect(window(state), problems))
    compare(buckets, expected_buckets(state, 300, nan="sample"))
    assert problems.total == 2  # the NaN sample, once per hpc_job copy, each with file:line


@pytest.mark.service
def test_bad_query_is_a_one_line_400(state: dict) -> None:
    with pytest.raises(SourceError) as err:
        pull(state, matchers='instance=~"("', retries=0)
    msg = str(err.value)
    assert "HTTP 400" in msg and "bad_data" in msg and "\n" not in msg and not err.value.transient


def test_down_is_a_transient_source_error() -> None:
    src = PrometheusTelemetry(Context("c"), PrometheusTelemetry.Options(
        url=f"http://127.0.0.1:{free_port()}", retries=1))
    t0 = time.monotonic()
    with pytest.raises(SourceError, match="cannot connect") as err:
        list(src.collect(Window(datetime(2026, 1, 1, tzinfo=UTC), datetime(2026, 1, 2, tzinfo=UTC)),
                         Problems()))
    assert err.value.transient and time.monotonic() - t0 < 5


class Fault(BaseHTTPRequestHandler):
    """Answers every API call the way ``server.mode`` says; records the Authorization header."""

    def do_POST(self) -> None:  # noqa: N802 (http.server naming)
        srv: Any = self.server
        srv.hits += 1
        srv.auth.append(self.headers.get("Authorization"))
        srv.queries.append(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
        mode = srv.mode if srv.mode != "422" or "query_range" in self.path else "ok"
        if mode == "slow":
            time.sleep(2)
        if mode == "flaky" and srv.hits <= 2:
            return self.answer(503, b"upstream unavailable")
        status, body = {
            "422": (422, {"status": "error", "errorType": "execution",
                          "error": "query processing would load too many samples into memory in query "
                                   "execution"}),
            "garbage": (200, "<html>login</html>"),
        }.get(mode, (200, None))
        if body is None:
            body = {"status": "success", "data": {"resultType": "matrix", "result": [
                {"metric": {"Hostname": "n1", "gpu": "0"}, "values": [[1795705499.999, "0.5"]]},
                {"metric": {"instance": "n2:9400"}, "values": [[1795705499.999, "0.5"]]}]}}
            if self.path.split("?")[0].endswith("/values"):
                body = {"status": "success", "data": ["DCGM_FI_PROF_SM_ACTIVE"]}
            if mode == "partial":
                body["warnings"] = ["store gateway 3 unreachable: partial response"]
        self.answer(status, body if isinstance(body, str) else json.dumps(body))

    do_GET = do_POST  # noqa: N815 (the label-values listing is a GET)

    def answer(self, status: int, body: str | bytes) -> None:
        data = body.encode() if isinstance(body, str) else body
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        return None


@pytest.fixture
def fault() -> Any:
    srv: Any = ThreadingHTTPServer(("127.0.0.1", 0), Fault)
    srv.mode, srv.hits, srv.auth, srv.queries = "ok", 0, [], []
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv
    srv.shutdown()
    srv.server_close()


def fault_pull(srv: Any, mode: str, **opts: Any) -> tuple[list, Problems]:
    srv.mode = mode
    src = PrometheusTelemetry(Context("c"), PrometheusTelemetry.Options(
        url=f"http://127.0.0.1:{srv.server_port}", **opts))
    problems = Problems()
    start = datetime.fromtimestamp(1795705200, UTC)
    return list(src.collect(Window(start, start + timedelta(minutes=5)), problems)), problems


def test_slow_server_times_out(fault: Any) -> None:
    with pytest.raises(SourceError, match=r"no answer within 0.3 s") as err:
        fault_pull(fault, "slow", timeout_s=0.3, retries=0)
    assert err.value.transient


def test_422_shows_the_error_body_on_one_line(fault: Any) -> None:
    with pytest.raises(SourceError, match="HTTP 422: execution: query processing would load") as err:
        fault_pull(fault, "422")
    asked = [q for q in fault.queries if q]
    assert asked and len(asked) == len(set(asked)) and not err.value.transient  # a 4xx is not retried


def test_5xx_is_retried_then_succeeds_and_bad_series_quarantined(fault: Any) -> None:
    buckets, problems = fault_pull(fault, "flaky", retries=3)
    assert fault.hits > 2 and [(b.host, b.gpu, b.sm_active) for b in buckets] == [("n1", 0, 0.5)]
    assert [reason for _, _, reason, _ in problems.items] == ["series without host or gpu label"]


def test_partial_answer_is_recorded_and_garbage_rejected(fault: Any) -> None:
    buckets, problems = fault_pull(fault, "partial")
    assert buckets and any("partial answer: store gateway 3" in r for _, _, r, _ in problems.items)
    with pytest.raises(SourceError, match="not JSON"):
        fault_pull(fault, "garbage")


def test_secrets_are_sent_but_never_shown(fault: Any, monkeypatch: pytest.MonkeyPatch,
                                          tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("PROM_TOKEN", "s3cret-token")
    fault_pull(fault, "ok", bearer_token={"env": "PROM_TOKEN"})
    assert fault.auth[-1] == "Bearer s3cret-token"
    pw = tmp_path / "pw"
    pw.write_text("hunter2\n")
    pw.chmod(0o600)
    caplog.set_level(logging.WARNING)
    with pytest.raises(SourceError) as err:
        fault_pull(fault, "422", username="audit", password={"file": str(pw)}, verify_tls=False)
    assert fault.auth[-1].startswith("Basic ")
    assert "hunter2" not in str(err.value) and "hunter2" not in caplog.text
    assert "TLS certificate verification is disabled" in caplog.text


def test_every_option_is_documented() -> None:
    doc = (ROOT / "docs" / "telemetry.md").read_text()
    for field in PrometheusTelemetry.Options.model_fields:
        assert f"| `prometheus.{field}` |" in doc, field


def test_options_refuse_unknown_fields_and_braced_matchers() -> None:
    with pytest.raises(ValueError, match="unknown field 'sm_util'"):
        PrometheusTelemetry.Options(url="http://x", metrics=["sm_util"])
    with pytest.raises(ValueError, match="without braces"):
        PrometheusTelemetry.Options(url="http://x", matchers='{cluster="a"}')


def test_job_rows_get_observed_seconds_from_their_samples() -> None:
    """Merge output for one GPU: job A's series fills bucket 0 (10 samples), job B's series starts late in
    bucket 1 (2 samples). Interval estimated as 300 / 10 = 30 s: A observed 300 s, B 2 x 30 = 60 s, each
    its own row. With sample_interval_s = 15: A min(300, 150) = 150 s, B 30 s."""
    from connectors.prometheus import Merge

    def rows() -> dict:
        return {(0, "A"): {"_meta": (None, None, (("hpc_job", "A"),)), "_count_sm_active": {"c": 10},
                           "sm_active": 0.0},
                (300, "B"): {"_meta": (None, None, (("hpc_job", "B"),)), "_count_sm_active": {"c": 2},
                             "sm_active": 0.9}}

    got = [(b.job, b.hpc_job, b.samples, b.observed_s) for b in Merge._gpu("c", 300, "n1", 0, "", rows())]
    assert got == [("A", "A", 10, 300.0), ("B", "B", 2, 60.0)]
    got = [(b.job, b.observed_s) for b in Merge._gpu("c", 300, "n1", 0, "", rows(), 15.0)]
    assert got == [("A", 150.0), ("B", 30.0)]
