"""The sharded PostgreSQL store (auditor/store/shards.py, docs/scale-out.md) on real servers: the test database
as coordinator and the clusters of scripts/testbed-pgshards.sh as shards, each identified before use.

- `db shard` builds the layout, is idempotent, and refuses a database it cannot identify as its shard;
- the oracle's fleets give the oracle's figures on the sharded store, and the same usage rows and findings
  (hashed) as on one server;
- ingest, `db prune` and the judged aggregate's upkeep leave on the shards exactly the rows one server holds;
- a shard that is down fails the audit in one line naming it, never with a partial total (shard cluster 3,
  which no other test uses, is stopped here and started again).
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import need_pg, pgshard_testbed_info, shard_url
from helpers import migrated_store
from hypothesis import HealthCheck, given, settings
from oracle_fleets import Fleet, detect, fleets
from pgshards import clear as clear_sharded
from pgshards import drop_servers, ensure_fdw, in_schema, shard_schemas, sharded_store
from sqlalchemy import text
from test_oracle import check, run_code

from auditor.audit.run import run_audit
from auditor.config import Config
from auditor.errors import StoreError
from auditor.records import AllocatedGpu, Allocation, GpuBucket
from auditor.store import sharding, shards
from auditor.store.engine import Store
from auditor.store.retention import prune
from bench.audit import run_digest

pytestmark = pytest.mark.service

EXAMPLES = int(os.environ.get("GPU_AUDIT_SHARD_ORACLE_EXAMPLES", "25"))
T0 = datetime(2026, 11, 2, tzinfo=UTC)  # a Monday


def _buckets(hosts: int = 3, gpus: int = 4, hours: int = 6, start: datetime = T0, job: str | None = None,
             sm: float = 0.3, samples: int = 10) -> list[GpuBucket]:
    out = []
    for h in range(hosts):
        for g in range(gpus):
            for i in range(hours * 12):
                out.append(GpuBucket(cluster="c", host=f"n{h}", gpu=g, start=start + timedelta(minutes=5 * i),
                                     seconds=300, samples=samples, sm_active=sm if (h + g + i) % 3 else 0.01,
                                     gpu_util=0.9, hpc_job=job, uuid=f"GPU-{h}-{g}", model="A100"))
    return out


def _allocs(hosts: int = 3, gpus: int = 4, hours: int = 6) -> list[Allocation]:
    return [Allocation(cluster="c", source="slurm", external_id=str(100 + h), name="train", user="u", account="a",
                       partition="gpu", start=T0 + timedelta(minutes=7),
                       end=T0 + timedelta(hours=hours, minutes=-11), state="COMPLETED",
                       gpus=[AllocatedGpu(node=f"n{h}", index=g) for g in range(gpus)])
            for h in range(hosts)]


def _rows(store: Store, table: str, order: str) -> list[tuple]:
    with store.engine.connect() as conn:
        return [tuple(r) for r in conn.execute(text(f"SELECT * FROM {table} ORDER BY {order}"))]


def _on_shards(store: Store, sql: str) -> list[list[tuple]]:
    return shards.on_each(store, lambda c: [tuple(r) for r in c.execute(text(sql))])


@pytest.fixture
def one(tmp_path: Path) -> Iterator[Store]:
    with migrated_store("postgresql", tmp_path, "one") as s:
        yield s


@pytest.fixture
def sharded() -> Iterator[Store]:
    with sharded_store((1, 2)) as s:
        yield s


# -- layout ------------------------------------------------------------------------------------------------

def test_db_shard_makes_foreign_partitions_and_is_idempotent(sharded: Store) -> None:
    with sharded.engine.connect() as conn:
        parts = conn.execute(text(
            "SELECT p.relname, c.relname, c.relkind, pg_get_expr(c.relpartbound, c.oid), t.partstrat "
            "FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid JOIN pg_class p ON p.oid = i.inhparent "
            "JOIN pg_partitioned_table t ON t.partrelid = p.oid WHERE p.relname IN ('gpu_buckets', "
            "'judged_hours', 'judged_dirty') AND p.relnamespace = current_schema()::regnamespace "
            "ORDER BY 1, 2")).all()
        kind = conn.execute(text("SELECT relkind FROM pg_class WHERE oid = to_regclass('judged_sets')")).scalar()
        rows = shards.listed(conn)
    assert [(p, c, k, t) for p, c, k, _b, t in parts] == [
        (t, f"{t}_s{k}", "f", "h") for t in ("gpu_buckets", "judged_dirty", "judged_hours") for k in (1, 2)]
    assert [b for *_x, b, _t in parts][:2] == ["FOR VALUES WITH (modulus 2, remainder 0)",
                                                "FOR VALUES WITH (modulus 2, remainder 1)"]
    assert kind == "v"  # judged_sets: the sets every shard holds
    assert [r.shard for r in rows] == [1, 2] and all("15441" in rows[0].location for _ in [0])
    # again, with the same URLs: nothing changes, nothing is moved
    urls = _shard_urls(sharded)
    again = sharding.setup(sharded, urls)
    assert [s["state"] for s in again["shards"]] == ["already shard of this store"] * 2
    assert again["moved_rows"] == 0
    with pytest.raises(StoreError, match="sharded over 2 shards, not 1"):
        sharding.setup(sharded, urls[:1])
    with pytest.raises(StoreError, match="listed twice"):
        sharding.setup(sharded, [urls[0], urls[0]])
    with pytest.raises(StoreError, match=r"shard 1 \(.*15442.*refused: it is shard 2 of this store"):
        sharding.setup(sharded, [urls[1], urls[0]])
    # a foreign server lost with its dependants (its mapping, its partitions, the judged_sets view): run again
    sharded.ingest([*_allocs(), *_buckets()], seen_at_ts=int(T0.timestamp()))
    held = sum(n for part in _on_shards(sharded, "SELECT count(*) FROM gpu_buckets") for (n,) in part)
    with sharded.engine.begin() as conn:
        conn.execute(text(f'DROP SERVER "{rows[1].server}" CASCADE'))
        conn.execute(text("CREATE SERVER lookalike FOREIGN DATA WRAPPER postgres_fdw"))  # not the shard's
        conn.execute(text(f'ALTER SERVER lookalike RENAME TO "{rows[1].server}"'))
    shards.forget(sharded.engine)
    with pytest.raises(StoreError, match="gpu_buckets has 1 of its 2 foreign partitions: run `gpu-audit db shard`"), \
            sharded.engine.connect() as conn:
        shards.layout(conn)  # never a partial read: the audit stops here
    shards.forget(sharded.engine)
    assert sharding.setup(sharded, urls)["moved_rows"] == 0
    assert _rows(sharded, "store_shards", "shard") and sharded.count("gpu_buckets") == held == 3 * 4 * 72
    with sharded.engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM judged_sets")).scalar() == 0


def _shard_urls(store: Store) -> list[str]:
    """The URLs `db shard` was given for ``store`` (the testbed cluster by the port in each location)."""
    ports = (pgshard_testbed_info() or {})["ports"].split(",")
    with store.engine.connect() as conn:
        rows = shards.listed(conn)
    return [in_schema(shard_url(ports.index(r.location.split("/")[0].rsplit(":", 1)[1]) + 1), r.schema_name)
            for r in rows]


def test_db_shard_refuses_what_it_did_not_make(one: Store) -> None:
    """A shard must be an empty schema or this store's shard: another store's shard, a gpu-audit store of its
    own and a schema with someone's tables are refused, and nothing is changed on the coordinator."""
    ensure_fdw(need_pg())
    with shard_schemas((1,), "x") as (fresh,), shard_schemas((2,), "y") as (stranger,), \
            sharded_store((1, 2)) as other:
        from sqlalchemy import create_engine

        eng = create_engine(stranger)
        with eng.begin() as conn:
            conn.execute(text("CREATE TABLE payroll (id int)"))
        eng.dispose()
        with pytest.raises(StoreError, match=r"shard 2 \(.*15442.*refused: schema \S+ holds 1 tables"):
            sharding.setup(one, [fresh, stranger])
        probe = create_engine(fresh)  # shard 1 was fine, and is left as it was: every shard is checked first
        with probe.connect() as conn:
            assert conn.execute(text("SELECT to_regclass('store_meta')")).scalar() is None
        probe.dispose()
        with pytest.raises(StoreError, match="refused: it is shard 1 of another store"):
            sharding.setup(one, _shard_urls(other)[:1] + [fresh])
        own = Store.open(stranger)
        with own.begin() as conn:
            conn.execute(text("DROP TABLE payroll"))
        own.upgrade()
        own.engine.dispose()
        with pytest.raises(StoreError, match="refused: it is a gpu-audit store of its own"):
            sharding.setup(one, [fresh, stranger])
        with one.engine.connect() as conn:
            assert shards.listed(conn) == []
            assert conn.execute(text("SELECT partstrat FROM pg_partitioned_table WHERE partrelid = "
                                     "to_regclass('gpu_buckets')")).scalar() == "r"
    drop_servers(one)


def test_cli_shard_keeps_passwords_out_of_arguments_and_output(one: Store, tmp_path: Path) -> None:
    """`db shard` takes URLs with passwords only from a file or the environment, and never prints them;
    `db shards` lists each server; `db upgrade` goes through the shards."""
    from auditor.cli import main

    ensure_fdw(need_pg())
    password = Path((pgshard_testbed_info() or {})["password_file"]).read_text().strip()
    cfg = tmp_path / "c.toml"
    url = one.engine.url.render_as_string(hide_password=False)
    cfg.write_text(f'[store]\nurl = "{url}"\n')
    with shard_schemas((1, 2), "cli") as urls:
        run = CliRunner().invoke(main, ["-c", str(cfg), "db", "shard", *urls])
        assert run.exit_code == 1 and "password on the command line" in run.output and password not in run.output
        f = tmp_path / "shards.txt"
        f.write_text("# shard 1 first\n" + "\n".join(urls) + "\n")
        f.chmod(0o600)
        for _ in range(2):
            run = CliRunner().invoke(main, ["-c", str(cfg), "db", "shard", "--urls-file", str(f)])
            assert run.exit_code == 0, run.output
            assert password not in run.output
        assert "shard 2: 127.0.0.1:15442/gpu_audit_shard_test schema cli_" in run.output
        assert "already shard of this store" in run.output
        run = CliRunner().invoke(main, ["-c", str(cfg), "--json", "db", "shards"])
        assert run.exit_code == 0 and password not in run.output and '"shard 2"' in run.output
        run = CliRunner().invoke(main, ["-c", str(cfg), "db", "upgrade"])
        assert run.exit_code == 0 and password not in run.output
        bad = tmp_path / "bad.txt"
        bad.write_text("\n".join(u.replace(password, "wrong-" + password[:6]) for u in urls))
        bad.chmod(0o600)
        run = CliRunner().invoke(main, ["-c", str(cfg), "db", "shard", "--urls-file", str(bad)])
        assert run.exit_code == 1 and "shard 1" in run.output and "password" in run.output.lower()
        assert "wrong-" not in run.output and len(run.output.strip().splitlines()) == 1
        drop_servers(one)


# -- the figures ----------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def oracle_pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Store, Store]]:
    with migrated_store("postgresql", tmp_path_factory.mktemp("one"), "oone") as one, \
            sharded_store((1, 2), "osh") as sh:
        yield one, sh


def _last_digest(store: Store) -> dict[str, object]:
    with store.engine.connect() as conn:
        rid = conn.execute(text("SELECT max(id) FROM audit_runs")).scalar()
    return run_digest(store, int(rid))


@pytest.mark.slow
def test_oracle_fleets_on_shards_equal_the_oracle_and_one_server(oracle_pair: tuple[Store, Store]) -> None:
    """Generated fleets (ingest, re-ingest, prune, audit): the sharded store gives the oracle's figures, and
    usage rows and findings identical to one server's (hash of every column, floats to 9 digits)."""
    one, sh = oracle_pair
    done = []

    @settings(max_examples=EXAMPLES, derandomize=True, database=None, deadline=None, print_blob=False,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                     HealthCheck.filter_too_much, HealthCheck.large_base_example])
    @given(fleets(detect()))
    def both(fleet: Fleet) -> None:
        check(sh, fleet, clear_sharded)
        run_code(one, fleet)
        assert _last_digest(sh) == _last_digest(one), f"sharded and one server differ on\n{fleet!r}"
        done.append(fleet)

    both()
    assert len(done) >= EXAMPLES * 0.9


def test_ingest_on_shards_leaves_one_servers_rows(one: Store, sharded: Store) -> None:
    """New rows, a re-collected window (the merge), labelled rows, a second source for the same GPUs: the
    coordinator's foreign partitions read the rows one server holds, each GPU on the shard PostgreSQL
    routes it to, its telemetry_gpus row copied there with the same labels flag, and its hours marked."""
    batches = [_allocs(), _buckets(), _buckets(hours=3, sm=0.9), _buckets(hosts=1, job="100"),
               _buckets(start=T0 + timedelta(hours=5), hours=2)]
    for s in (one, sharded):
        s.batch_rows = 100  # many batches, each split over the shards
        for recs in batches:
            s.ingest(recs, seen_at_ts=int(T0.timestamp()))
    order = "gpu_id, bucket_ts, job"
    assert _rows(sharded, "gpu_buckets", order) == _rows(one, "gpu_buckets", order)
    assert _rows(sharded, "telemetry_gpus", "id") == _rows(one, "telemetry_gpus", "id")
    assert sorted(_rows(sharded, "judged_dirty", "gpu_id, hour"))[0][:2] == sorted(_rows(one, "judged_dirty",
                                                                                        "gpu_id, hour"))[0][:2]
    per = _on_shards(sharded, "SELECT DISTINCT gpu_id FROM gpu_buckets")
    with sharded.engine.connect() as conn:
        lay = shards.layout(conn)
        assert lay is not None
        routes = shards.route(conn, lay, [g for part in per for (g,) in part])
    assert all(routes[g] == k for k, part in enumerate(per, 1) for (g,) in part)
    assert all(part for part in per), "both shards hold GPUs"
    copies = _on_shards(sharded, "SELECT id, has_jobs FROM telemetry_gpus")
    coord = dict((r[0], r[-1]) for r in _rows(sharded, "telemetry_gpus", "id"))
    assert all(coord[i] == flag for part in copies for i, flag in part) and any(coord.values())


def test_prune_on_shards_leaves_one_servers_rows(one: Store, sharded: Store) -> None:
    """`db prune`: a whole week exchanged on each shard, the partial week rolled up row-wise: the same rows
    as one server, and the coordinator knows how far it is rolled up."""
    recs = [*_buckets(hours=24 * 9, hosts=2, gpus=2), *_buckets(hosts=1, gpus=2, job="100", hours=30)]
    now = int((T0 + timedelta(days=9)).timestamp())
    got = []
    for s in (one, sharded):
        s.ingest(recs, seen_at_ts=now)
        got.append(prune(s, now=now, keep_weeks=0.25, keep_runs_days=1))
        assert prune(s, now=now, keep_weeks=0.25, keep_runs_days=1).fine_rows_rolled == 0
    assert got[0].fine_rows_rolled == got[1].fine_rows_rolled > 0
    assert got[0].hourly_rows_written == got[1].hourly_rows_written > 0
    order = "gpu_id, bucket_ts, job"
    assert _rows(sharded, "gpu_buckets", order) == _rows(one, "gpu_buckets", order)
    with one.engine.connect() as c1, sharded.engine.connect() as c2:
        q = text("SELECT value FROM store_meta WHERE key = 'rolled_up_before'")
        assert c1.execute(q).scalar() == c2.execute(q).scalar() is not None


def test_aggregate_upkeep_on_shards(one: Store, sharded: Store) -> None:
    """The judged aggregate is built on each shard by the first audit, re-judged after a late ingest into a
    judged hour (more samples: the merge takes its values), and gives one server's figures each time; the
    coordinator's judged_sets shows the set every shard holds."""
    since, until = T0, T0 + timedelta(hours=6)
    digests: list[list[dict[str, object]]] = [[], []]
    for i, s in enumerate((one, sharded)):
        s.ingest([*_allocs(), *_buckets()], seen_at_ts=int(T0.timestamp()))
        for late in (None, _buckets(hosts=2, hours=2, sm=0.95, samples=12, start=T0 + timedelta(hours=1))):
            if late:
                s.ingest(late, seen_at_ts=int(T0.timestamp()))
            rid = run_audit(s, Config(), since, until).run_id
            digests[i].append(run_digest(s, rid))
    assert digests[0] == digests[1] and digests[0][0] != digests[0][1]
    held = _on_shards(sharded, "SELECT ths, count(*) FROM judged_hours GROUP BY ths")
    assert all(len(part) == 1 and part[0][1] > 0 for part in held)
    assert _on_shards(sharded, "SELECT count(*) FROM judged_dirty WHERE unfit = 0") == [[(0,)], [(0,)]]
    with sharded.engine.connect() as conn:
        assert conn.execute(text("SELECT ths FROM judged_sets")).scalars().all() == [held[0][0][0]]
        # a read of the judged aggregate through the foreign partitions (pushed down, grouped per shard)
        n = conn.execute(text("SELECT count(*) FROM judged_hours")).scalar()
    assert n == sum(part[0][1] for part in held)


# -- a shard that is down ------------------------------------------------------------------------------------

def _cluster(number: int, action: str) -> None:
    m = pgshard_testbed_info() or {}
    name = m["clusters"].split(",")[number - 1]
    subprocess.run(["pg_ctlcluster", "--skip-systemctl-redirect", m.get("version", "15"), name, action],
                   check=True, capture_output=True, timeout=120)


def _wait_up(number: int) -> None:
    from sqlalchemy import create_engine

    deadline = time.monotonic() + 60
    while True:
        eng = create_engine(shard_url(number))
        try:
            with eng.connect():
                return
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
        finally:
            eng.dispose()


def test_a_shard_that_is_down_fails_the_audit_naming_it(tmp_path: Path) -> None:
    """Shard cluster 3 (used by no other test) as shard 2, stopped: the audit fails in one line naming shard 2
    and its place, the run is marked failed with no usage rows (no partial total); a read through the
    foreign partitions names the shard's server; started again, the same audit runs."""
    from auditor.cli import main

    shard_url(3)  # identified before it is stopped
    with sharded_store((1, 3), "down") as s:
        s.ingest([*_allocs(), *_buckets()], seen_at_ts=int(T0.timestamp()))
        cfg = tmp_path / "c.toml"
        cfg.write_text(f'[store]\nurl = "{s.engine.url.render_as_string(hide_password=False)}"\n')
        _cluster(3, "stop")
        try:
            with pytest.raises(StoreError) as err:
                run_audit(s, Config(), T0, T0 + timedelta(hours=6))
            msg = str(err.value)
            assert len(msg.splitlines()) == 1 and msg.startswith("shard 2 (127.0.0.1:15443/"), msg
            with s.engine.connect() as conn:
                runs = conn.execute(text("SELECT status FROM audit_runs")).scalars().all()
                assert runs == ["failed"]
                assert conn.execute(text("SELECT count(*) FROM usage_gpu")).scalar() == 0
                assert conn.execute(text("SELECT count(*) FROM usage_allocation")).scalar() == 0
            # past the aggregate's upkeep: the judging's own shard connections fail the same way
            from auditor.audit import usage

            real = usage.refresh_aggregate
            usage.refresh_aggregate = lambda *a, **k: {}  # type: ignore[assignment]
            try:
                with pytest.raises(StoreError, match=r"shard 2 \(127\.0\.0\.1:15443/|gpu_audit_shard2_"):
                    run_audit(s, Config(), T0, T0 + timedelta(hours=6))
            finally:
                usage.refresh_aggregate = real
            with s.engine.connect() as conn:
                assert conn.execute(text("SELECT count(*) FROM usage_gpu")).scalar() == 0
            with pytest.raises(StoreError, match=r'could not connect to shard 2 \(127\.0\.0\.1:15443/.* \(server '
                               r'gpu_audit_shard2_'):
                with s.begin() as conn:
                    conn.execute(text("SELECT count(*) FROM gpu_buckets"))
            run = CliRunner().invoke(main, ["-c", str(cfg), "audit", "--since", T0.isoformat(), "--until",
                                            (T0 + timedelta(hours=6)).isoformat()])
            assert run.exit_code == 1
            err_lines = [ln for ln in run.output.splitlines() if ln.startswith("gpu-audit: error:")]
            assert len(err_lines) == 1 and "shard 2 (127.0.0.1:15443/" in err_lines[0], run.output
        finally:
            _cluster(3, "start")
            _wait_up(3)
        assert run_audit(s, Config(), T0, T0 + timedelta(hours=6)).summary


def test_clear_keeps_the_layout(sharded: Store) -> None:
    """The oracle test empties the sharded store between fleets: data gone on every server, layout kept."""
    sharded.ingest([*_allocs(), *_buckets()], seen_at_ts=int(T0.timestamp()))
    clear_sharded(sharded)
    assert _on_shards(sharded, "SELECT count(*) FROM gpu_buckets") == [[(0,)], [(0,)]]
    with sharded.engine.connect() as conn:
        assert len(shards.listed(conn)) == 2
