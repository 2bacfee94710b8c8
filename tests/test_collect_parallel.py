"""Parallel collection (issue 20): several clusters in spawned worker processes store exactly what
collecting them one after another stores, on SQLite (writers queued on the write lock) and PostgreSQL
(concurrent writers); a cluster whose source fails or whose worker dies fails alone, the others land."""

from __future__ import annotations

import json
from contextlib import ExitStack
from datetime import UTC, datetime
from pathlib import Path

import pytest
from conftest import pg_schema, run_cli
from helpers_collect import dying_worker
from helpers_crash import REPO, generate, natural_rows

from auditor import collect as collect_mod
from auditor import config as config_mod
from auditor.store.engine import Store

UNTIL = datetime(2026, 11, 22, tzinfo=UTC)
ALLOCS = {"c1": 30, "c2": 20, "c3": 25}  # what generate() writes per cluster: the oracle of the counts


def clusters(tmp_path: Path, url: str, bad: str = "") -> Path:
    """Three clusters with their own generated files (different seeds, sizes); ``bad`` replaces c2's
    telemetry source."""
    text = f'[store]\nurl = "{url}"\nbatch_rows = 500\n'
    for i, (name, n) in enumerate(ALLOCS.items()):
        d = tmp_path / name
        d.mkdir(exist_ok=True)
        generate(d, rows=2000 + 500 * i, hosts=2, gpus=4, allocations=n, seed=i + 1)
        tel = bad if name == "c2" and bad else f"{name}/tel.csv"
        text += (f'[[clusters]]\nname = "{name}"\ninitial_days = 30\n'
                 f'[[clusters.allocations]]\nkind = "file"\npaths = ["{name}/alloc.csv"]\n'
                 f'[[clusters.telemetry]]\nkind = "file"\npaths = ["{tel}"]\n')
    path = tmp_path / "c.toml"
    path.write_text(text)
    return path


def open_store(url: str) -> Store:
    s = Store.open(url, 500)
    s.upgrade()
    return s


def second_url(store_url: str, tmp_path: Path, stack: ExitStack) -> str:
    if store_url.startswith("sqlite"):
        return f"sqlite:///{tmp_path / 'parallel.db'}"
    return stack.enter_context(pg_schema(store_url.split("?")[0]))


def per_cluster(store: Store) -> dict[str, int]:
    with store.engine.connect() as c:
        return dict(c.exec_driver_sql("SELECT cluster, COUNT(*) FROM allocations GROUP BY cluster").all())


def test_parallel_stores_what_sequential_stores(store_url: str, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = config_mod.load(clusters(tmp_path, store_url))
    pools: list[int] = []
    real = collect_mod.collect_parallel

    def counted(*args: object, **kw: object) -> object:
        pools.append(args[3])  # type: ignore[arg-type]
        return real(*args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(collect_mod, "collect_parallel", counted)
    with ExitStack() as stack:
        seq, par = open_store(store_url), open_store(second_url(store_url, tmp_path, stack))
        s1 = collect_mod.collect(seq, cfg, base_dir=tmp_path, until=UNTIL, now=UNTIL, parallel=1)
        s2 = collect_mod.collect(par, cfg, base_dir=tmp_path, until=UNTIL, now=UNTIL, parallel=3)
        assert s1.ok and s2.ok and pools == [3]  # the second run really used three workers
        assert [(r.cluster, r.source, r.stats) for r in s1.results] == \
            [(r.cluster, r.source, r.stats) for r in s2.results]
        assert per_cluster(par) == ALLOCS
        a, b = natural_rows(seq), natural_rows(par)
        assert a == b and len(b["gpu_buckets"]) > 1000
        seq.engine.dispose()
        par.engine.dispose()


def test_dead_worker_loses_only_its_cluster(store_url: str, tmp_path: Path) -> None:
    cfg = config_mod.load(clusters(tmp_path, store_url))
    store = open_store(store_url)
    results = collect_mod.collect_parallel(store, cfg, cfg.clusters, 2, base_dir=tmp_path, since=None,
                                           until=UNTIL, now=UNTIL, target=dying_worker)
    assert [r.cluster for r in results] == ["c1", "c1", "c2", "c3", "c3"]
    (dead,) = [r for r in results if not r.ok]
    assert dead.cluster == "c2" and "died (exit code 9)" in dead.error
    assert per_cluster(store) == {"c1": 30, "c3": 25}
    assert store.watermark("c2", "allocations[0]:file") is None
    store.engine.dispose()


@pytest.mark.parametrize("parallel", ["1", "3"])
def test_cli_failing_cluster_is_one_line_exit_3(tmp_path: Path, parallel: str) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    cfg = clusters(tmp_path, url, bad="missing.csv")
    open_store(url).engine.dispose()
    res = run_cli("-c", str(cfg), "collect", "--parallel", parallel, "--until", "2026-11-22", cwd=REPO)
    assert res.returncode == 3, res.stdout + res.stderr
    failed = [line for line in res.stdout.splitlines() if "FAILED" in line]
    assert len(failed) == 1 and failed[0].startswith("c2 telemetry[0]:file: FAILED") and "no such file" in failed[0]
    assert per_cluster(Store.open(url)) == ALLOCS  # c2's allocations source worked; only its telemetry failed
    js = run_cli("-c", str(cfg), "--json", "collect", "--parallel", parallel, "--until", "2026-11-22", cwd=REPO)
    assert json.loads(js.stdout)["ok"] is False and js.returncode == 3
