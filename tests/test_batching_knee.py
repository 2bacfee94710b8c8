"""The batching knee (issue 48 §3; auditor/audit/inference.py ``knee``, docs/definitions.md "The batching knee"):
tokens per second against requests running per inference service, its knee, and what a service left of it
leaves on the chip; stored and audited on SQLite and PostgreSQL, shown in every report format and on the web
Services page; and the demo's triton service, by hand.

Planted (one pod, serve/chat-7d9f, vLLM, 24 buckets of 5 minutes): per cycle of 8 buckets, 4 at 1 request
running and 120 tokens/s, 2 at 2 running and 240 tokens/s, 1 at 4 running and 480, 1 at 8 running and 600.
By hand: points (1, 120), (2, 240), (4, 480), (8, 600); e0 = 120 / 1 = 120 tokens/s a request; gains 1 -> 2:
120, 2 -> 4: 240 / 2 = 120 (>= 0.5 x 120 = 60), 4 -> 8: 120 / 4 = 30 < 60: the knee at 4 running, 480 tokens/s.
Mean concurrency (4 x 1 + 2 x 2 + 4 + 8) / 8 = 20 / 8 = 2.5: left of the knee; the curve at 2.5 = 240 +
(480 - 240) x 0.5 / 2 = 300; it leaves 480 - 300 = 180 tokens/s, 180 / 480 = 37.5 %.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from test_inference import HOURS, NOW, T0, _allocations, _gpu_buckets

from auditor.audit.inference import KNEE_GAIN, knee
from auditor.audit.run import run_audit
from auditor.config import Config
from auditor.records import InferenceBucket
from auditor.report.context import build_context

CYCLE = (1, 1, 1, 1, 2, 2, 4, 8)
TPS = {1: 120.0, 2: 240.0, 4: 480.0, 8: 600.0}


def buckets() -> list[InferenceBucket]:
    return [InferenceBucket("c", "vllm", "serve/chat-7d9f", datetime.fromtimestamp(T0 + 300 * i, UTC), 300,
                            generated_tokens=TPS[CYCLE[i % 8]] * 300, running_mean=float(CYCLE[i % 8]))
            for i in range(24)]


def test_knee_by_hand(store: Any) -> None:
    store.ingest([*_allocations(), *_gpu_buckets(), *buckets()], seen_at_ts=NOW)
    start = datetime.fromtimestamp(T0, UTC)
    c = Config()
    rid = run_audit(store, c, start, start + timedelta(hours=HOURS)).run_id
    ctx = build_context(store, c, rid)
    (s,) = ctx["inference"]["rows"]
    k = s["knee"]
    assert [(p["running"], p["tokens_per_s"]) for p in k["points"]] == [
        (pytest.approx(1.0), pytest.approx(120.0)), (pytest.approx(2.0), pytest.approx(240.0)),
        (pytest.approx(4.0), pytest.approx(480.0)), (pytest.approx(8.0), pytest.approx(600.0))]
    assert s["concurrency"] == pytest.approx(2.5) and KNEE_GAIN == 0.5
    assert k["knee"] == pytest.approx({"running": 4.0, "tokens_per_s": 480.0})
    assert (k["left_of_knee"], k["at_tokens_per_s"], k["leaves_tokens_per_s"], k["leaves_share"]) == (
        True, pytest.approx(300.0), pytest.approx(180.0), pytest.approx(0.375))
    assert s["knee_words"] == ("left of its batching knee at 4.0 running, 480 tokens/s: at 2.5 running it makes 300 "
                               "tokens/s, leaving 180 tokens/s (38 %) a pod on the chip")
    assert ctx["inference"]["totals"]["left_of_knee"] == 1
    from starlette.testclient import TestClient

    from auditor.web.app import create_app

    page = TestClient(create_app(store, c)).get("/services").text
    assert '<svg xmlns="http://www.w3.org/2000/svg"' in page and "leaving 180 tokens/s" in page
    assert "<script" not in page.split('class="knee"')[1].split("</svg>")[0]


def test_no_knee_without_spread_and_rising_curve() -> None:
    """Two levels only: a curve, no knee. A straight line (every step gains e0): the highest point, rising."""
    two = knee([(300, 1, 100), (300, 2, 200)], 1.0)
    assert two is not None and two["knee"] is None and len(two["points"]) == 2
    line = knee([(300, c, 100 * c) for c in (1, 2, 4, 8)], 2.0)
    assert line is not None and line["rising"] and line["knee"] == {"running": 8.0, "tokens_per_s": 800.0}
    assert line["leaves_tokens_per_s"] == pytest.approx(600.0)  # 800 at 8 - 200 at 2
    assert knee([(300, 0.2, 5.0)], 0.2) is None  # about idle: no point


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path]:
    from auditor.cli import main

    out = tmp_path_factory.mktemp("demo")
    res = CliRunner().invoke(main, ["--json", "demo", "--out", str(out), "--now", "2026-11-29T00:00"])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout), out


def test_demo_triton_left_of_its_knee(demo: tuple[dict, Path]) -> None:
    """By hand (auditor/demo.py KNEE_CYCLE, KNEE_CURVE; 168 h = 2,016 buckets = 96 cycles of 21): points (1,
    100), (2, 200), (4, 400), (8, 560), (16, 600); e0 = 100; gains 100, 100, then 160 / 4 = 40 < 50: the knee
    at 4 running, 400 tokens/s. Mean concurrency 49 / 21 = 2.33; the curve there 200 + 100 x (7/3 - 2) =
    233.3; it leaves 400 - 233.3 = 166.7 tokens/s, 41.7 % (shown 42 %)."""
    data, out = demo
    (t,) = [s for s in data["inference"] if s["service"] == "StatefulSet/triton"]
    k = t["knee"]
    assert t["concurrency"] == pytest.approx(49 / 21)
    assert k["knee"] == pytest.approx({"running": 4.0, "tokens_per_s": 400.0})
    assert (k["leaves_tokens_per_s"], k["leaves_share"]) == (pytest.approx(400 - 700 / 3), pytest.approx(5 / 12))
    rid = data["run_id"]
    words = "left of its batching knee at 4.0 running, 400 tokens/s: at 2.3 running it makes 233 tokens/s, " \
            "leaving 167 tokens/s (42 %) a pod on the chip"
    for ext in ("txt", "md", "html"):
        assert words in (out / "reports" / f"report-{rid}.{ext}").read_text(), ext
    assert "1.0 running: 100 tokens/s; 2.0: 200; 4.0: 400 (knee); 8.0: 560; 16.0: 600" in \
        (out / "reports" / f"report-{rid}.md").read_text()
    assert 'class="knee"' in (out / "reports" / f"report-{rid}.html").read_text()
    doc = json.loads((out / "reports" / f"report-{rid}.json").read_text())
    (j,) = [s for s in doc["inference"]["rows"] if s["service"] == "StatefulSet/triton"]
    assert j["knee"]["leaves_tokens_per_s"] == pytest.approx(400 - 700 / 3)
