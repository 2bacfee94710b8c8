"""Benchmark: list and convert 10,000 (and 50,000) pods through the Kubernetes connector.

The pods are copies of the real recorded pod shapes (tests/fixtures/kubernetes/pods-all.json, managed
fields included) with fresh names and UIDs, served over HTTP by tests/k8s_server.py in a separate process
so the measured process's peak RSS is the connector's own. For comparison it also times a list through
the typed client models (what the connector avoids by reading raw JSON).

Run: python -m bench.bench_kubernetes [--sizes 10000,50000] [--page-size 500]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import resource
import time
from datetime import UTC, datetime
from typing import Any

SCHEDULED_ONLY = "spec.nodeName!="


def synth_pods(n: int) -> list[dict[str, Any]]:
    """n pods cycling through the recorded shapes; only metadata is new, the rest is shared."""
    from tests.k8s_server import load

    shapes = load("pods-all.json")["items"]
    out = []
    for i in range(n):
        base = shapes[i % len(shapes)]
        meta = {**base["metadata"], "name": f"{base['metadata']['name']}-{i}", "uid": f"bench-{i:08d}"}
        out.append({**base, "metadata": meta})
    return out


def serve(n: int, port_q: Any, stop: Any) -> None:
    from tests.k8s_server import K8sReplay, K8sServer, load

    data = {"pods": synth_pods(n), "nodes": load("nodes-all.json")["items"],
            "jobs": load("jobs-all.json")["items"], "replicasets": load("replicasets-all.json")["items"]}
    with K8sServer(K8sReplay(data)) as srv:
        port_q.put(srv.url)
        stop.wait()


def rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def measure(url: str, page_size: int, typed: bool, out_q: Any) -> None:
    """Runs in a fresh process: one collection through the connector (or a typed-model list)."""
    from tests.k8s_server import TOKEN

    os.environ["GPU_AUDIT_BENCH_TOKEN"] = TOKEN
    import kubernetes.client  # noqa: F401  (imported before the baseline: count data, not code)

    import connectors.kubernetes  # noqa: F401
    from auditor.records import Allocation
    from connectors import build
    from connectors.base import Context, Problems, Window

    base_rss = rss_mib()
    start = time.perf_counter()
    if typed:
        from kubernetes import client

        cfg = client.Configuration(host=url)
        cfg.api_key = {"authorization": TOKEN}
        cfg.api_key_prefix = {"authorization": "Bearer"}
        core = client.CoreV1Api(client.ApiClient(cfg))
        token, count = None, 0
        while True:
            page = core.list_pod_for_all_namespaces(limit=page_size, _continue=token,
                                                    field_selector=SCHEDULED_ONLY)
            count += len(page.items)
            token = page.metadata.var_continue
            if not token:
                break
        out_q.put((count, 0, time.perf_counter() - start, base_rss, rss_mib()))
        return
    conn = build("kubernetes", "allocations", {"host": url, "token": {"env": "GPU_AUDIT_BENCH_TOKEN"}},
                 Context("bench"))
    conn.page_size = page_size  # connectors.kubernetes.PAGE_SIZE (500) unless the bench asks for another
    now = datetime.now(UTC)
    records = list(conn.collect(Window(now, now), Problems()))
    allocs = sum(isinstance(r, Allocation) for r in records)
    out_q.put((allocs, len(records), time.perf_counter() - start, base_rss, rss_mib()))


def run(n: int, page_size: int, typed: bool) -> tuple[int, int, float, float, float]:
    ctx = mp.get_context("fork")
    port_q, out_q, stop = ctx.Queue(), ctx.Queue(), ctx.Event()
    server = ctx.Process(target=serve, args=(n, port_q, stop), daemon=True)
    server.start()
    try:
        url = port_q.get(timeout=120)
        worker = ctx.Process(target=measure, args=(url, page_size, typed, out_q))
        worker.start()
        result = out_q.get(timeout=300)
        worker.join(30)
        return result
    finally:
        stop.set()
        server.join(10)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="10000,50000", help="comma-separated pod counts")
    ap.add_argument("--page-size", type=int, default=500)
    args = ap.parse_args()
    print(f"{'pods':>7} {'path':<22} {'GPU allocs':>10} {'seconds':>8} {'pods/s':>9} "
          f"{'RSS start MiB':>13} {'peak RSS MiB':>12} {'MiB/1k pods':>11}")
    for i, n in enumerate(int(s) for s in args.sizes.split(",")):
        paths = [("connector (raw JSON)", False)] + ([("typed client list only", True)] if i == 0 else [])
        results = {}
        for label, typed in paths:
            allocs, _, secs, base, peak = run(n, args.page_size, typed)
            results[label] = secs
            print(f"{n:>7} {label:<22} {allocs if not typed else '-':>10} {secs:>8.2f} {n / secs:>9.0f} "
                  f"{base:>13.0f} {peak:>12.0f} {(peak - base) / n * 1000:>11.1f}")
        if len(results) == 2:
            ratio = results["typed client list only"] / results["connector (raw JSON)"]
            print(f"{'':>7} typed-model list / connector list+convert time ratio: {ratio:.2f}x")


if __name__ == "__main__":
    main()
