"""Retention of inference buckets (`gpu-audit db prune`, auditor/store/retention.py ``roll_inference``) on SQLite
and PostgreSQL: 5-minute buckets older than the cutoff become one row per pod and hour, the audit counts the
same tokens before and after (a pod name reused within the hour shared by the time each pod overlaps the
hour's span, never counted twice), pruning twice changes nothing, and a bucket re-collected for a rolled-up
hour is dropped at ingest.

The fleet, by hand (T0 = 2026-11-02 10:00 UTC, buckets of 5 min):

- ``serve/tgi-0`` (TGI, a StatefulSet pod restarted at 10:20, same name): pod A held its GPU 10:00-10:20, pod B
  10:20-12:00. 24 buckets 10:00-12:00, 1,000 tokens each; running 2 before 10:20, 4 after. Before the
  prune A has the buckets 10:00-10:15 (4,000 tokens), B the 20 from 10:20 (20,000). After it: hour 10 is one
  row of 12,000 tokens spanning 10:00-11:00, hour 11 another. A overlaps 20 of its 60 minutes: 4,000; B 40:
  8,000 + hour 11's 12,000 = 20,000. 24,000 in all, as before. Within an hour the means are the hour's after
  the roll-up (hour 10 running (4 x 2 + 8 x 4) / 12 = 3.33 for A and B alike), so one pod's concurrency in a
  shared hour is blurred, but the service's is kept: (3.33 x 3,600 s + 4 x 3,600 s) / 7,200 s = 3.67 =
  (2 x 1,200 s + 4 x 6,000 s) / 7,200 s before.
- ``serve/chat-1`` (vLLM) held 10:00-10:30, its 6 buckets 500 tokens each: 3,000. Rolled up: one row of hour
  10 spanning 10:00-10:30, so the pod overlaps all of its span: still 3,000 (by the clock hour it would be
  half). An audit window from 10:30 counts, before the prune, B's 18 buckets from 10:30 (18,000) and nothing
  of chat-1's; after it, half of hour 10's row (the window cuts its span in two: 6,000) and hour 11's 12,000:
  the same 18,000.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import text

from auditor.audit.run import run_audit
from auditor.config import Config
from auditor.records import AllocatedGpu, Allocation, InferenceBucket
from auditor.store.engine import Store
from auditor.store.retention import prune

T0 = datetime(2026, 11, 2, 10, 0, tzinfo=UTC)
M = timedelta(minutes=1)
NOW = int((T0 + 3 * 60 * M).timestamp())  # 13:00: with keep_weeks 0 the cutoff is 13:00


def fleet() -> list[Any]:
    def alloc(uid: str, pod: str, start: int, end: int, gpu: int) -> Allocation:
        return Allocation("c", "kubernetes", uid, name=pod, account="serve", user="u", start=T0 + start * M,
                          end=T0 + end * M, owner_workload=f"StatefulSet/{pod}", labels={"team": "t"},
                          gpus=[AllocatedGpu("n1", gpu)])

    tgi = [InferenceBucket("c", "tgi", "serve/tgi-0", T0 + 5 * i * M, 300, generated_tokens=1000.0,
                           running_mean=2.0 if i < 4 else 4.0, batch_mean=2.0 if i < 4 else 4.0) for i in range(24)]
    chat = [InferenceBucket("c", "vllm", "serve/chat-1", T0 + 5 * i * M, 300, generated_tokens=500.0,
                            running_mean=1.0, model="m") for i in range(6)]
    return [alloc("uid-a", "tgi-0", 0, 20, 0), alloc("uid-b", "tgi-0", 20, 120, 0), alloc("uid-c", "chat-1", 0, 30, 1),
            *tgi, *chat]


def audited(store: Store, since: datetime = T0 - 60 * M) -> tuple[dict[str, float], dict[str, float]]:
    """The audit's own figures (the run summary every surface reads): tokens per allocation uid, and each
    service's mean concurrency."""
    res = run_audit(store, Config(), since, T0 + 180 * M)
    with store.engine.connect() as conn:
        uids = {str(r.id): r.external_id for r in conn.execute(text("SELECT id, external_id FROM allocations"))}
    tokens = {uids[k]: v for k, v in res.summary["inference_tokens"].items()}
    return tokens, {s["service"]: s["concurrency"] for s in res.summary["inference"]}


def test_prune_rolls_inference_buckets_up_and_the_audit_counts_the_same_tokens(store: Store) -> None:
    store.ingest(fleet())
    half = audited(store, T0 + 30 * M)[0]  # a window from 10:30: B's buckets from 10:30, 18 x 1,000
    assert half == {"uid-b": pytest.approx(18000.0)}
    tokens, conc = audited(store)
    assert tokens == {"uid-a": pytest.approx(4000.0), "uid-b": pytest.approx(20000.0), "uid-c": pytest.approx(3000.0)}
    # StatefulSet/tgi-0 (pods A and B): (2 x 1,200 s + 4 x 6,000 s) / 7,200 s
    assert conc == {"StatefulSet/tgi-0": pytest.approx((2 * 1200 + 4 * 6000) / 7200),
                    "StatefulSet/chat-1": pytest.approx(1.0)}
    dry = prune(store, now=NOW, keep_weeks=0, dry_run=True)
    assert dry.inference_rows_rolled == 30 and dry.inference_hourly_rows_written == 0
    res = prune(store, now=NOW, keep_weeks=0)
    assert (res.inference_rows_rolled, res.inference_hourly_rows_written) == (30, 3)
    with store.engine.connect() as conn:
        rows = [tuple(r) for r in conn.execute(text(
            "SELECT engine, start_ts, seconds, observed_s, span_start, span_end, generated_tokens FROM "
            "inference_buckets ORDER BY engine, start_ts"))]
    h10, h11 = int(T0.timestamp()), int(T0.timestamp()) + 3600
    assert rows == [("tgi", h10, 3600, 3600.0, h10, h10 + 3600, 12000.0),
                    ("tgi", h11, 3600, 3600.0, h11, h11 + 3600, 12000.0),
                    ("vllm", h10, 3600, 1800.0, h10, h10 + 1800, 3000.0)]
    assert audited(store) == (tokens, conc)  # the same figures from the hourly rows
    # from 10:30 on the hourly rows: half of hour 10's span (6,000) + hour 11 (12,000); chat-1's span ends 10:30
    assert audited(store, T0 + 30 * M)[0] == half
    again = prune(store, now=NOW, keep_weeks=0)
    assert (again.inference_rows_rolled, again.inference_hourly_rows_written) == (0, 0)
    # the 10:00 and 10:05 buckets collected again: their hour is rolled up, so they are dropped, not added
    # (the 10:00 one would have overwritten the hourly row, which has the same key)
    late = [b for b in fleet() if isinstance(b, InferenceBucket) and b.job == "serve/tgi-0"][:2]
    assert store.ingest(late).inference == 0
    with store.engine.connect() as conn:
        assert conn.execute(text("SELECT SUM(generated_tokens), COUNT(*) FROM inference_buckets")).one() == \
            (27000.0, 3)
    assert audited(store) == (tokens, conc)


def test_prune_dry_run_and_the_cli_say_the_inference_buckets(store: Store, store_url: str, tmp_path: Any) -> None:
    from conftest import run_cli

    store.ingest(fleet())
    (tmp_path / "c.toml").write_text(f'[store]\nurl = "{store_url}"\n')
    out = run_cli("-c", str(tmp_path / "c.toml"), "db", "prune", "--keep-weeks", "0", "--now", "2026-11-02T13:00")
    assert out.returncode == 0, out.stderr
    assert "30 inference buckets into 3 hourly ones" in out.stdout, out.stdout


def test_a_statefulset_pod_replaced_inside_one_bucket_splits_its_tokens_by_time(store: Store) -> None:
    """Issue 44: ``serve/sglang-0`` replaced inside the 10:05 bucket: pod A held it 10:00-10:07, pod B
    10:07:30-10:20. Four buckets of 12,000 tokens: 48,000 generated, 48,000 counted (it read 60,000: the 10:05
    bucket whole for both). The 10:05 bucket splits by the seconds each held of it: A 120 s, B 150 s of the
    270 s held, 5,333.3 and 6,666.7; A 12,000 + 5,333.3 = 17,333.3, B 6,666.7 + 24,000 = 30,666.7."""
    def alloc(uid: str, start: timedelta, end: timedelta) -> Allocation:
        return Allocation("c", "kubernetes", uid, name="sglang-0", account="serve", user="u", start=T0 + start,
                          end=T0 + end, owner_workload="StatefulSet/sglang", labels={"team": "t"},
                          gpus=[AllocatedGpu("n1", 0)])

    store.ingest([alloc("uid-a", 0 * M, 7 * M), alloc("uid-b", 7.5 * M, 20 * M),
                  *[InferenceBucket("c", "sglang", "serve/sglang-0", T0 + 5 * i * M, 300, generated_tokens=12000.0,
                                    running_mean=8.0) for i in range(4)]])
    tokens, _ = audited(store)
    assert sum(tokens.values()) == pytest.approx(48000.0), tokens
    assert tokens == {"uid-a": pytest.approx(12000.0 + 12000.0 * 120 / 270),
                      "uid-b": pytest.approx(12000.0 * 150 / 270 + 24000.0)}
