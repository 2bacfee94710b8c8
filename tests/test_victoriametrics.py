"""The Prometheus telemetry connector against a REAL VictoriaMetrics (scripts/testbed-victoriametrics.sh up),
holding the same generated samples as the Prometheus testbed: the buckets equal the ones computed here
independently from the generator's raw samples, and the ones the real Prometheus gives (service tests)."""

from __future__ import annotations

import json
import math
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from conftest import need_tsdb
from test_prometheus import PROM_DIR, PROM_URL, compare, expected_buckets

from connectors import build
from connectors.base import Context, Problems, Window

VM_URL = os.environ.get("GPU_AUDIT_TEST_VM_URL", "http://127.0.0.1:19093")
VM_DIR = Path(os.environ.get("GPU_AUDIT_TEST_VM_DIR", "/var/lib/gpu-audit-testbed/victoriametrics"))


@pytest.fixture(scope="module")
def vm_state() -> dict:
    need_tsdb(VM_URL, VM_DIR)  # the testbed itself (its marker and reported data path)
    return json.loads((VM_DIR / "state.json").read_text())


def _pull(url: str, state: dict, **opts: Any) -> tuple[list, Problems]:
    start = datetime.fromtimestamp(state["start"], UTC)
    win = Window(start, start + timedelta(hours=state["hours"]), 300)
    src = build("prometheus", "telemetry", {"url": url, **opts}, Context("test"))
    problems = Problems()
    return list(src.collect(win, problems)), problems


def _key(b: Any) -> tuple:
    return (b.host, b.gpu, b.gpu_instance, b.start, b.job_key(), b.samples, b.observed_s, b.span_start,
            b.span_end, b.gpu_util, b.sm_active, b.sm_occupancy, b.tensor_active, b.dram_active, b.fb_used_mib,
            b.power_w, b.pcie_tx_bps, b.hpc_job, b.pod, b.namespace, b.container, b.model, b.uuid)


def _close(a: tuple, b: tuple) -> bool:
    """Equal keys, with floats equal to 1e-9 (relative) or 1e-12: fields one by one, since pytest.approx
    refuses a tuple that holds strings (pytest 9.2)."""
    return len(a) == len(b) and all(
        math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-12) if isinstance(x, float) and isinstance(y, float) else x == y
        for x, y in zip(a, b, strict=True))


def _nan_bucket(state: dict) -> int:
    nan_ts = state["start"] + 37 * state["interval"]  # the generator's nan_at (node-a gpu1 SM_ACTIVE)
    return nan_ts - nan_ts % 300


@pytest.mark.service
def test_vm_buckets_match_independent_computation(vm_state: dict) -> None:
    buckets, problems = _pull(VM_URL, vm_state)
    # VictoriaMetrics does not keep the NaN sample (Prometheus does, and its avg_over_time turns NaN): the
    # bucket is the mean of the other samples ("sample" rule, as for scrape files) and counts 9 of 10
    want = expected_buckets(vm_state, 300, nan="sample")
    nan_keys = [k for k in want if k[0] == "node-a" and k[1] == 1 and k[3] == _nan_bucket(vm_state)]
    assert len(nan_keys) == 2  # hpc_job 101 and 102 copies of the series
    for k in nan_keys:
        want[k]["samples"] = 9
    compare(buckets, want)
    assert not problems.items


@pytest.mark.service
def test_vm_chunked_queries_give_the_same_buckets(vm_state: dict) -> None:
    whole, _ = _pull(VM_URL, vm_state)
    chunked, _ = _pull(VM_URL, vm_state, max_points_per_query=7, chunk_hours=1)
    assert sorted(map(_key, chunked), key=repr) == sorted(map(_key, whole), key=repr)


@pytest.mark.service
def test_vm_equals_the_real_prometheus(vm_state: dict) -> None:
    need_tsdb(PROM_URL, PROM_DIR)
    prom_state = json.loads((PROM_DIR / "state.json").read_text())
    assert prom_state == vm_state  # the VictoriaMetrics testbed takes the Prometheus testbed's start
    vm, _ = _pull(VM_URL, vm_state)
    prom, _ = _pull(PROM_URL, prom_state)
    assert len(vm) == len(prom) > 0
    got = {k[:5]: k for k in map(_key, vm)}
    ref = {k[:5]: k for k in map(_key, prom)}
    assert set(got) == set(ref)
    nan_at = datetime.fromtimestamp(_nan_bucket(vm_state), UTC)
    differ = set()
    for k, row in ref.items():
        if not _close(row, got[k]):  # floats summed in another order
            differ.add(k)
    # the one NaN sample: Prometheus spoils that bucket's SM activity (None, 10 samples), VictoriaMetrics
    # drops the sample (9 samples, 270 s observed, SM activity from the other 9: 0.0 on this idle GPU)
    assert differ == {("node-a", 1, "", nan_at, job) for job in ("101", "102")}
    for k in differ:
        assert (got[k][5], got[k][6], got[k][10]) == (9, 270.0, 0.0)
        assert (ref[k][5], ref[k][6], ref[k][10]) == (10, 300.0, None)
