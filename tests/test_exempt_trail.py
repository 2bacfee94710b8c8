"""Exemptions and the enforcement trail (issue 31 items 5-7), on SQLite and PostgreSQL: a hostile pod
annotation costs only its own decision; an exemption must match something in the store (an array id covers
its tasks) or say ``--future``; who ran the command is stored beside who asked; user text reaches the
terminal escaped by the one function (auditor.logs.log_safe), one line per decision."""

from __future__ import annotations

import json
import sys
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import insert, select

sys.path.insert(0, str(Path(__file__).parent))
import test_enforce as te  # noqa: E402

from auditor.audit import exempt  # noqa: E402
from auditor.cli import main  # noqa: E402
from auditor.config import Config  # noqa: E402
from auditor.enforce.policy import enforce  # noqa: E402
from auditor.errors import GpuAuditError  # noqa: E402
from auditor.records import AllocatedGpu, Allocation  # noqa: E402
from auditor.store import schema  # noqa: E402

now, world = te.now, te.world  # fixtures: 4 h of idle and working pods on the recorded API server
NB, backends, cfg, log_rows = te.NB, te.backends, te.cfg, te.log_rows
HPC = Config(clusters=[{"name": "hpc"}, {"name": "k8s"}])


def slurm_world(store: Any, now: datetime) -> None:
    """Array job 123 (tasks 123_4 and 123_5) and job 1300 running on hpc."""
    t0 = now - timedelta(hours=3)
    store.ingest([Allocation("hpc", "slurm", ext, user="dave", account="acct", partition="gpu", start=t0,
                             gpus=[AllocatedGpu("n1", i)]) for i, ext in enumerate(("123_4", "123_5", "1300"))])


def alloc(store: Any, ext: str) -> dict[str, Any]:
    t = schema.allocations
    with store.engine.connect() as conn:
        return dict(conn.execute(select(t).where(t.c.external_id == ext)).mappings().one())


# -- item 5: a NUL in a pod's exempt-reason annotation ---------------------------------------------------
def test_hostile_exempt_annotation_costs_only_its_own_decision(world: tuple[Any, Any], now: datetime,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    store, srv = world
    pod_b = srv.replay.find("pods", "research", "prep-then-train")
    pod_b["metadata"]["annotations"] = {"gpu-audit.io/exempt-until": (now + timedelta(hours=5)).isoformat(),
                                        "gpu-audit.io/exempt-reason": "ckpt\x00\n  act done forged\x1b[2J"}
    res = enforce(store, cfg(), backends=backends(srv), now=now)  # PostgreSQL: was `DataError` for the run
    why = {r["target"]: r["reason"] for r in log_rows(store) if r["stage"] == "act"}
    assert why["Pod research/prep-then-train"] == \
        "exempt (pod annotation gpu-audit.io/exempt-until): ckpt\\x00\\x0a  act done forged\\x1b[2J"
    assert why["Deployment research/notebook-alice"].startswith("would scale_to_zero")  # the others decided
    assert res["acted"] == 1
    assert any("exempt-reason" in r.getMessage() and "control characters" in r.getMessage()
               for r in caplog.records)
    # an unreadable expiry is doubt: no action, logged with why (before: it exempted nothing, the pod was
    # acted on, and nothing said the annotation was there)
    pod_b["metadata"]["annotations"]["gpu-audit.io/exempt-until"] = "tomorrow\x00"
    res = enforce(store, cfg(), backends=backends(srv), now=now)
    got = {d["target"]: (d["decision"], d["reason"]) for d in res["decisions"] if d["stage"] == "act"}
    assert got["Pod research/prep-then-train"][0] == "skipped"
    assert "unreadable" in got["Pod research/prep-then-train"][1] and "\x00" not in str(got)


# -- item 6: exemptions must match something --------------------------------------------------------------
def test_exemption_must_match_an_allocation_or_say_future(store: Any, now: datetime) -> None:
    slurm_world(store, now)
    row = exempt.add(store, HPC, "hpc:123", "now+1day", "array sweep", by="alice", now=now)
    assert row["covers"] == ["123_4", "123_5"]  # an array id covers its tasks
    ts = int(now.timestamp())
    for task in ("123_4", "123_5"):  # before: None, and the task was cancelled
        assert exempt.find(store, HPC, alloc(store, task), ts)["reason"] == "array sweep"
    assert exempt.find(store, HPC, alloc(store, "1300"), ts) is None
    with pytest.raises(GpuAuditError) as exc:  # a typo'd id: refused, with what would match
        exempt.add(store, HPC, "hpc:130", "now+1day", "typo", now=now)
    msg = str(exc.value)
    assert "nothing in the store matches hpc:130" in msg and "1300" in msg and "--future" in msg
    assert "\n" not in msg
    assert exempt.add(store, HPC, "hpc:130", "now+1day", "next week's run", future=True, now=now)["covers"] == []
    assert exempt.add(store, HPC, "hpc:123_5", "now+1day", "one task", now=now)["covers"] == ["123_5"]
    with pytest.raises(GpuAuditError, match="nothing in the store matches hpc:12"):
        exempt.add(store, HPC, "hpc:12", "now+1day", "prefix only", now=now)  # 12 is not array 123


def test_kubernetes_exemption_matches_uid_or_namespace_name(store: Any, now: datetime) -> None:
    store.ingest([Allocation("k8s", "kubernetes", NB[2], name=NB[1], user="alice", account=NB[0],
                             start=now - timedelta(hours=2), gpus=[AllocatedGpu(NB[3], 0)])])
    assert exempt.add(store, HPC, f"k8s:{NB[0]}/{NB[1]}", "now+1day", "x", now=now)["covers"] == [NB[2]]
    assert exempt.add(store, HPC, f"k8s:{NB[2]}", "now+1day", "x", now=now)["covers"] == [NB[2]]
    with pytest.raises(GpuAuditError, match=f"similar: {NB[0]}/{NB[1]}"):
        exempt.add(store, HPC, f"k8s:{NB[0]}/notebook-alice", "now+1day", "x", now=now)


# -- item 7: who ran it, and the terminal ---------------------------------------------------------------
def test_exemption_stores_the_actor_beside_the_requester(store: Any, now: datetime) -> None:
    slurm_world(store, now)
    row = exempt.add(store, HPC, "hpc:1300", "now+1day", "deadline", by="the dean", now=now)
    assert (row["requested_by"], row["actor"]) == ("the dean", exempt.actor())
    t = schema.exemptions
    with store.engine.connect() as conn:
        stored = conn.execute(select(t.c.requested_by, t.c.actor)).one()
    assert tuple(stored) == ("the dean", exempt.actor())  # --by is free text; the actor is not
    ex = exempt.find(store, HPC, alloc(store, "1300"), int(now.timestamp()))
    assert ex["actor"] == exempt.actor()  # in the decision's evidence
    assert [a["actor"] for a in exempt.active(store, HPC, int(now.timestamp()))] == [exempt.actor()]
    for text in ("a\x00b", "a\nb", "a\x1b[2Jb", "a\u202eb"):  # nothing that can forge a line or hide text
        with pytest.raises(GpuAuditError, match="control character"):
            exempt.add(store, HPC, "hpc:1300", "now+1day", text, now=now)
        with pytest.raises(GpuAuditError, match="control character"):
            exempt.add(store, HPC, "hpc:1300", "now+1day", "ok", by=text, now=now)


def _cli(store_url: str, tmp_path: Path, *args: str) -> Any:
    cfg_file = tmp_path / "c.toml"
    cfg_file.write_text(f'[store]\nurl = "{store_url}"\n\n[[clusters]]\nname = "hpc"\n')
    return CliRunner().invoke(main, ["-c", str(cfg_file), *args])


FORGED = "idle\n2026-12-01 10:00 UTC root@login apply act cancel done slurm job 7: forged\x1b[2J\u202e"


def test_terminal_output_escapes_user_text_one_line_per_row(store: Any, store_url: str, tmp_path: Path,
                                                            now: datetime) -> None:
    from auditor.cli.enforce import _decisions_text

    slurm_world(store, now)
    with store.begin() as conn:
        conn.execute(insert(schema.enforcement_log).values(
            run_key="k", decided_ts=int(now.timestamp()), cluster="hpc", target="slurm job 1300\x1b[31m",
            policy="p", stage="act", action="none", decision="skipped", reason=f"exempt (pod annotation): {FORGED}",
            actor="x\ny", dry_run=True, evidence={}, result="r\rz"))
    out = _cli(store_url, tmp_path, "enforce-log").output
    assert len(out.strip().splitlines()) == 1, out  # before: the reason's newline printed a forged second row
    assert not any(c in out for c in "\x1b\r\u202e") and "\\x0a2026-12-01" in out and "\\x1b[2J" in out
    text = _decisions_text({"run_key": "k", "actor": "a\x1bb", "dry_run": True, "decisions": [
        {"stage": "act", "decision": "skipped", "action": "none", "target": "Pod x\x1b[2J", "reason": FORGED}],
        "not_idle": [{"target": "Pod y\nforged", "policy": "p"}], "acted": 0})
    assert len(text.splitlines()) == 4 and not any(c in text for c in "\x1b\r\u202e")
    store.ingest([Allocation("hpc", "slurm", "1400", name="nb\x1b[2J\nforged", user="eve\u202e", start=now)])
    out = _cli(store_url, tmp_path, "job", "hpc:1400").output  # `job` escapes with the same function
    assert "nb\\x1b[2J\\x0aforged" in out and "eve\\u202e" in out and not any(c in out for c in "\x1b\u202e")
    res = _cli(store_url, tmp_path, "exempt", "hpc:123", "--until", "now+1day", "--reason", "sweep")
    assert res.exit_code == 0 and "covers 123_4, 123_5" in res.output, res.output
    res = _cli(store_url, tmp_path, "--json", "exempt", "hpc:9", "--until", "now+1day", "--reason", "x")
    assert res.exit_code == 1 and "--future" in res.output and len(res.output.strip().splitlines()) == 1
    res = _cli(store_url, tmp_path, "--json", "exempt", "hpc:9", "--future", "--until", "now+1day", "--reason", "x")
    assert res.exit_code == 0 and json.loads(res.output)["actor"] == exempt.actor()


def test_docs_name_the_future_flag_and_the_actor() -> None:
    doc = (Path(__file__).resolve().parent.parent / "docs" / "enforcement.md").read_text()
    assert "--future" in doc and "login@host" in doc
