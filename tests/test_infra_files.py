"""Node events through the real collection path from files (docs/file-formats.md): ``"type": "node_event"``
rows in an allocation file and GPU fault fields in a long telemetry CSV; a bad event is quarantined with
where and why, and the rest is stored (both engines)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy import select

from auditor import config as config_mod
from auditor.collect import collect
from auditor.store import schema
from auditor.store.engine import Store

SINCE, UNTIL = datetime(2026, 11, 20, tzinfo=UTC), datetime(2026, 11, 21, tzinfo=UTC)


def test_node_events_from_files_and_bad_ones_quarantined(store: Store, tmp_path: Path) -> None:
    rows = [
        {"type": "node_event", "node": "n1", "kind": "drain", "start": "2026-11-20T01:00:00Z",
         "end": "2026-11-20T02:00:00Z", "reason": "fan"},                                     # good
        {"type": "node_event", "node": "n1", "kind": "meteor", "start": "2026-11-20T01:00:00Z"},  # item 1: kind
        {"type": "node_event", "node": "n2", "kind": "down", "start": "2026-11-20T03:00:00Z",
         "end": "2026-11-20T02:00:00Z"},                                                     # item 2: end < start
        {"type": "node_event", "node": "n3", "kind": "xid", "gpu": 2**40, "start": "2026-11-20T01:00:00Z"},
        {"type": "node_event", "node": "n" * 600, "kind": "cordoned", "start": "2026-11-20T01:00:00Z"},
    ]
    (tmp_path / "alloc.json").write_text(json.dumps(rows))
    lines = ["timestamp,host,gpu,uuid,metric,value"]
    for i, xid in enumerate([0, 0, 13, 13, 13, 13]):  # a sample a minute: XID 13 from 2 min (bucket 0-5)
        lines.append(f"2026-11-20T05:{i:02d}:00Z,n4,1,GPU-x,DCGM_FI_DEV_XID_ERRORS,{xid}")
        lines.append(f"2026-11-20T05:{i:02d}:00Z,n4,1,GPU-x,DCGM_FI_DEV_GPU_UTIL,3")
    (tmp_path / "tele.csv").write_text("\n".join(lines) + "\n")
    cfg = config_mod.parse({"clusters": [{"name": "c", "allocations": [{"kind": "file", "paths": ["alloc.json"]}],
                                          "telemetry": [{"kind": "file", "paths": ["tele.csv"]}]}]})
    summary = collect(store, cfg, base_dir=tmp_path, since=SINCE, until=UNTIL, now=UNTIL)
    assert summary.ok, summary.as_dict()
    q = schema.quarantined_records
    e = schema.node_events
    with store.engine.connect() as conn:
        bad = sorted(conn.execute(select(q.c.location, q.c.reason)).all())
        events = conn.execute(select(e.c.node, e.c.gpu_index, e.c.kind, e.c.start_ts, e.c.end_ts, e.c.reason,
                                     e.c.source).order_by(e.c.node)).all()
    assert [loc for loc, _ in bad[:2]] == ["item 1", "item 2"]  # items count from 0
    assert "kind" in bad[0][1] and "start" in bad[1][1]
    refused = {loc.split(" at ")[0]: why for loc, why in bad[2:]}
    assert set(refused) == {"node event xid n3/1099511627776", "node event cordoned " + "n" * 80}
    assert "out of the storable range" in refused["node event xid n3/1099511627776"]
    assert "a key holds at most" in refused["node event cordoned " + "n" * 80]
    t = int(datetime(2026, 11, 20, 1, tzinfo=UTC).timestamp())
    t5 = int(datetime(2026, 11, 20, 5, tzinfo=UTC).timestamp())
    assert [tuple(r) for r in events] == [("n1", -1, "drain", t, t + 3600, "fan", "file"),
                                          ("n4", 1, "xid", t5, t5 + 300, "XID 13", "file")]
