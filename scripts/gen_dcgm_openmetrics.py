"""Generate DCGM-shaped OpenMetrics for backfilling a test Prometheus with promtool.

Deterministic: the samples are a pure function of the state (profile, seed, start, hours, interval, gpus),
which is written as JSON next to the data so a test can regenerate the exact raw samples with
:func:`samples` and compute expected buckets on its own.

Profile ``test`` (six GPUs on three nodes, exact dcgm-exporter label names):

* node-a gpu0 spins one kernel: GPU_UTIL ~99, SM_ACTIVE ~0.03 (the "mirage"); pod/namespace/container set.
* node-a gpu1 is idle but holds 30 GB, its series duplicated per ``hpc_job`` (101 and 102); one NaN sample.
* node-b gpu0 works (SM_ACTIVE ~0.8); its exporter was upgraded half-way, so ``Hostname`` becomes
  ``hostname``; it has a telemetry gap (no samples) from hour 2 to hour 3.
* node-c gpu0 is a MIG instance (GPU_I_ID 1, 1g.10gb) whose SM_ACTIVE reads slightly above 1.
* node-c gpu1 has no profiling fields at all (GPU_UTIL, FB_USED and power only: the util fallback).
* node-d gpu3 is watched by nvidia_gpu_exporter (uuid-only labels, index from ``nvidia_smi_index``).

Profile ``bench``: ``gpus`` GPUs (8 per node), the 8 bench metrics, one sample per ``interval``.

Profile ``jobstats`` (Princeton jobstats' exporter names: ``nvidia_gpu_duty_cycle`` 0-100, memory in bytes,
power in milliwatts, labels ``minor_number``/``uuid``/``name``/``cluster``, and the job on each GPU as the
*value* of ``nvidia_gpu_jobId``, 0 = none), the schedule in :data:`JOBSTATS_JOBS`:

* della-g01 GPU 0 works (~95 %) for job 5001 in hours 0-3 and job 5003 in hours 3-6.
* della-g01 GPU 1 idles (0 %) holding 30 GB for job 5001 in hours 0-3, then no job.
* della-g02 GPU 0 reads 0-4 % (idle by GPU-Util) for job 5002 in hours 1-5.

Usage: python scripts/gen_dcgm_openmetrics.py --out DIR [--profile test|bench] [--start EPOCH]
       [--hours H] [--interval S] [--gpus N] [--seed N]   (writes DIR/data.om and DIR/state.json)
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time
from collections.abc import Iterator
from pathlib import Path

DRIVER = "550.54.15"
BENCH_METRICS = ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_PROF_SM_OCCUPANCY",
                 "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "DCGM_FI_PROF_DRAM_ACTIVE", "DCGM_FI_DEV_FB_USED",
                 "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_PROF_PCIE_TX_BYTES")

#: behaviour -> metric -> (centre, jitter); GPU_UTIL and FB_USED are integers like dcgm-exporter's.
BEHAVIOURS: dict[str, dict[str, tuple[float, float]]] = {
    "spin": {"DCGM_FI_DEV_GPU_UTIL": (99, 1), "DCGM_FI_PROF_SM_ACTIVE": (0.03, 0.005),
             "DCGM_FI_PROF_SM_OCCUPANCY": (0.01, 0.003), "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": (0.0, 0.0),
             "DCGM_FI_PROF_DRAM_ACTIVE": (0.002, 0.001), "DCGM_FI_DEV_FB_USED": (2100, 20),
             "DCGM_FI_DEV_POWER_USAGE": (92.0, 3.0), "DCGM_FI_PROF_PCIE_TX_BYTES": (2.0e5, 5.0e4)},
    "idle_mem": {"DCGM_FI_DEV_GPU_UTIL": (0, 0), "DCGM_FI_PROF_SM_ACTIVE": (0.0, 0.0),
                 "DCGM_FI_PROF_SM_OCCUPANCY": (0.0, 0.0), "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": (0.0, 0.0),
                 "DCGM_FI_PROF_DRAM_ACTIVE": (0.0, 0.0), "DCGM_FI_DEV_FB_USED": (30000, 0),
                 "DCGM_FI_DEV_POWER_USAGE": (61.0, 1.5), "DCGM_FI_PROF_PCIE_TX_BYTES": (1.0e4, 2.0e3)},
    "work": {"DCGM_FI_DEV_GPU_UTIL": (100, 0), "DCGM_FI_PROF_SM_ACTIVE": (0.8, 0.1),
             "DCGM_FI_PROF_SM_OCCUPANCY": (0.45, 0.05), "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": (0.5, 0.1),
             "DCGM_FI_PROF_DRAM_ACTIVE": (0.4, 0.05), "DCGM_FI_DEV_FB_USED": (40000, 500),
             "DCGM_FI_DEV_POWER_USAGE": (350.0, 30.0), "DCGM_FI_PROF_PCIE_TX_BYTES": (3.0e9, 5.0e8)},
    "mig": {"DCGM_FI_PROF_SM_ACTIVE": (1.01, 0.01), "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": (0.3, 0.05),
            "DCGM_FI_PROF_DRAM_ACTIVE": (0.2, 0.05)},
    "smi": {"nvidia_smi_utilization_gpu_ratio": (0.98, 0.02), "nvidia_smi_memory_used_bytes": (2.0e10, 0),
            "nvidia_smi_power_draw_watts": (300.0, 20.0), "nvidia_smi_index": (3, 0)},
    "util_only": {"DCGM_FI_DEV_GPU_UTIL": (3, 2), "DCGM_FI_DEV_FB_USED": (500, 0),
                  "DCGM_FI_DEV_POWER_USAGE": (40.0, 2.0)},
}
INTEGER_METRICS = frozenset({"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "nvidia_smi_index",
                             "nvidia_gpu_duty_cycle", "nvidia_gpu_power_usage_milliwatts"})
BEHAVIOURS |= {
    "js_work": {"nvidia_gpu_duty_cycle": (95, 3), "nvidia_gpu_memory_used_bytes": (4.0e10, 0),
                "nvidia_gpu_memory_total_bytes": (8.5e10, 0), "nvidia_gpu_power_usage_milliwatts": (250000, 10000)},
    "js_idle": {"nvidia_gpu_duty_cycle": (0, 0), "nvidia_gpu_memory_used_bytes": (3.0e10, 0),
                "nvidia_gpu_memory_total_bytes": (8.5e10, 0), "nvidia_gpu_power_usage_milliwatts": (60000, 1000)},
    "js_low": {"nvidia_gpu_duty_cycle": (2, 2), "nvidia_gpu_memory_used_bytes": (1.0e9, 0),
               "nvidia_gpu_memory_total_bytes": (8.5e10, 0), "nvidia_gpu_power_usage_milliwatts": (70000, 2000)},
}
#: jobstats profile: (host, minor) -> [(from hour, to hour, Slurm job id)]
JOBSTATS_JOBS: dict[tuple[str, int], list[tuple[float, float, int]]] = {
    ("della-g01", 0): [(0, 3, 5001), (3, 6, 5003)],
    ("della-g01", 1): [(0, 3, 5001)],
    ("della-g02", 0): [(1, 5, 5002)],
}


def gpus(state: dict) -> list[dict]:
    """The GPUs of a profile: host, gpu index, behaviour and the extra labels of each series copy."""
    if state["profile"] == "bench":
        return [{"host": f"n{i // 8:04d}", "gpu": i % 8, "behaviour": ("work", "idle_mem", "spin")[i % 3],
                 "copies": [{}], "model": "NVIDIA H100 80GB HBM3"} for i in range(state["gpus"])]
    if state["profile"] == "jobstats":
        return [{"host": h, "gpu": g, "behaviour": b, "copies": [{}], "model": "NVIDIA A100 80GB PCIe",
                 "exporter": "jobstats"}
                for h, g, b in (("della-g01", 0, "js_work"), ("della-g01", 1, "js_idle"), ("della-g02", 0, "js_low"))]
    k8s = {"container": "main", "namespace": "team-a", "pod": "spin-7f9c"}
    return [
        {"host": "node-a", "gpu": 0, "behaviour": "spin", "copies": [k8s], "model": "NVIDIA A100-SXM4-80GB"},
        {"host": "node-a", "gpu": 1, "behaviour": "idle_mem", "nan_at": 37,
         "copies": [{"hpc_job": "101"}, {"hpc_job": "102"}], "model": "NVIDIA A100-SXM4-80GB"},
        {"host": "node-b", "gpu": 0, "behaviour": "work", "rename_at": 0.5, "gap_hours": (2.0, 3.0),
         "copies": [{}], "model": "NVIDIA H100 80GB HBM3"},
        {"host": "node-c", "gpu": 0, "behaviour": "mig", "copies": [{}], "model": "NVIDIA A100-SXM4-40GB",
         "mig": {"GPU_I_PROFILE": "1g.10gb", "GPU_I_ID": "1"}},
        {"host": "node-c", "gpu": 1, "behaviour": "util_only", "copies": [{}],
         "model": "NVIDIA A100-SXM4-40GB"},
        {"host": "node-d", "gpu": 3, "behaviour": "smi", "copies": [{}], "model": "NVIDIA H100 80GB HBM3",
         "exporter": "nvidia_gpu_exporter"},
    ]


def _uuid(host: str, gpu: int) -> str:
    r = random.Random(f"{host}/{gpu}")
    h = "".join(r.choice("0123456789abcdef") for _ in range(32))
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def _labels(g: dict, copy: dict, renamed: bool, bench: bool) -> dict[str, str]:
    """dcgm-exporter's label order (gpu, UUID, pci_bus_id, device, modelName, Hostname) + scrape labels;
    nvidia_gpu_exporter's series carry only ``uuid`` (no GPU- prefix) besides the scrape labels."""
    if g.get("exporter") == "jobstats":
        return {"cluster": "della", "instance": f"{g['host']}:9445", "job": "jobstats-gpu",
                "minor_number": str(g["gpu"]), "name": g["model"], "uuid": _uuid(g["host"], g["gpu"])}
    if g.get("exporter") == "nvidia_gpu_exporter":
        return {"uuid": _uuid(g["host"], g["gpu"])[4:], "instance": f"{g['host']}:9835",
                "job": "nvidia_gpu_exporter"}
    host_key = "hostname" if renamed else "Hostname"
    out = {"gpu": str(g["gpu"]), "UUID": _uuid(g["host"], g["gpu"])}
    if not bench:
        out |= {"pci_bus_id": f"00000000:{0x18 + g['gpu']:02X}:00.0", "device": f"nvidia{g['gpu']}"}
    out |= {"modelName": g["model"], host_key: g["host"]}
    if not bench:
        out["DCGM_FI_DRIVER_VERSION"] = DRIVER
    out |= g.get("mig", {})
    out |= copy
    out |= {"instance": f"{g['host']}:9400", "job": "dcgm-exporter"}
    return out


def instants(state: dict) -> range:
    """Sample times (epoch seconds) of the whole span, gaps not yet removed."""
    start = int(state["start"])
    return range(start, start + int(state["hours"] * 3600), int(state["interval"]))


def series(state: dict) -> Iterator[tuple[str, dict[str, str], list[tuple[int, float]]]]:
    """Every series (metric, labels, [(epoch s, value)]), grouped by metric; gaps already removed."""
    bench = state["profile"] == "bench"
    span = instants(state)
    if state["profile"] == "jobstats":
        yield from _jobstats_series(state)
        return
    metrics = BENCH_METRICS if bench else sorted({m for b in BEHAVIOURS.values() for m in b
                                                  if not m.startswith("nvidia_gpu_")})
    for metric in metrics:
        for g in gpus(state):
            shape = BEHAVIOURS[g["behaviour"]].get(metric)
            if shape is None:
                continue
            centre, jitter = shape
            rng = random.Random(f"{state['seed']}/{g['host']}/{g['gpu']}/{metric}")
            integer = metric in INTEGER_METRICS
            values = [max(0.0, centre + rng.uniform(-jitter, jitter)) for _ in span]
            values = [float(round(v)) if integer else round(v, 6) for v in values]
            if "nan_at" in g and metric == "DCGM_FI_PROF_SM_ACTIVE":
                values[g["nan_at"]] = math.nan
            points = list(zip(span, values, strict=True))
            if "gap_hours" in g:
                lo, hi = (span.start + h * 3600 for h in g["gap_hours"])
                points = [(ts, v) for ts, v in points if not lo <= ts < hi]
            parts = [points]
            if "rename_at" in g:  # the exporter upgrade: Hostname before, hostname after
                cut = span.start + g["rename_at"] * (span.stop - span.start)
                parts = [[p for p in points if p[0] < cut], [p for p in points if p[0] >= cut]]
            for copy in g["copies"]:
                for renamed, part in enumerate(parts):
                    if part:
                        yield metric, _labels(g, copy, bool(renamed), bench), part


def job_at(host: str, gpu: int, hour: float) -> int:
    """The Slurm job on a GPU of the jobstats profile at ``hour`` after the start (0 = none)."""
    return next((j for lo, hi, j in JOBSTATS_JOBS.get((host, gpu), ()) if lo <= hour < hi), 0)


def _jobstats_series(state: dict) -> Iterator[tuple[str, dict[str, str], list[tuple[int, float]]]]:
    span = instants(state)
    for metric in ("nvidia_gpu_duty_cycle", "nvidia_gpu_memory_used_bytes", "nvidia_gpu_memory_total_bytes",
                   "nvidia_gpu_power_usage_milliwatts", "nvidia_gpu_jobId"):
        for g in gpus(state):
            labels = _labels(g, {}, False, False)
            if metric == "nvidia_gpu_jobId":
                yield metric, labels, [(ts, float(job_at(g["host"], g["gpu"], (ts - span.start) / 3600)))
                                       for ts in span]
                continue
            centre, jitter = BEHAVIOURS[g["behaviour"]][metric]
            rng = random.Random(f"{state['seed']}/{g['host']}/{g['gpu']}/{metric}")
            values = [max(0.0, centre + rng.uniform(-jitter, jitter)) for _ in span]
            values = [float(round(v)) if metric in INTEGER_METRICS else round(v, 6) for v in values]
            yield metric, labels, list(zip(span, values, strict=True))


def samples(state: dict) -> Iterator[tuple[str, dict[str, str], float, int]]:
    """Every raw sample (metric, labels, value, epoch seconds), grouped by metric then series then time."""
    for metric, labels, points in series(state):
        for ts, v in points:
            yield metric, labels, v, ts


def _fmt(labels: dict[str, str]) -> str:
    return ",".join(f'{k}="{v}"' for k, v in labels.items())


def write(state: dict, out: Path) -> int:
    """Write DIR/data.om (OpenMetrics, seconds timestamps, ``# EOF``) and DIR/state.json; returns samples."""
    out.mkdir(parents=True, exist_ok=True)
    n = 0
    current = None
    with (out / "data.om").open("w", encoding="utf-8") as fh:
        for metric, labels, points in series(state):
            if metric != current:
                fh.write(f"# TYPE {metric} gauge\n")
                current = metric
            head = f"{metric}{{{_fmt(labels)}}} "
            fh.writelines(f"{head}{'NaN' if v != v else repr(v)} {ts}\n" for ts, v in points)
            n += len(points)
        fh.write("# EOF\n")
    (out / "state.json").write_text(json.dumps(state, indent=1) + "\n", encoding="utf-8")
    return n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--profile", choices=("test", "bench", "jobstats"), default="test")
    ap.add_argument("--start", type=int, help="first sample, epoch s (default: 3 days ago, whole hour)")
    ap.add_argument("--hours", type=float, default=6.0)
    ap.add_argument("--interval", type=int, default=30)
    ap.add_argument("--gpus", type=int, default=1024, help="bench profile only")
    ap.add_argument("--seed", type=int, default=42)
    a = ap.parse_args()
    start = a.start if a.start is not None else (int(time.time()) - 3 * 86400) // 3600 * 3600
    state = {"profile": a.profile, "seed": a.seed, "start": start, "hours": a.hours,
             "interval": a.interval, "gpus": a.gpus}
    n = write(state, a.out)
    print(f"wrote {n} samples to {a.out / 'data.om'}")


if __name__ == "__main__":
    main()
