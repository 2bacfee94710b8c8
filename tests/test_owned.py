"""Data a user owns (issue 44): gpu-audit never deletes or replaces a file it did not write, except an output
path the user named. The demo writes only into a directory it made (or an empty one) and removes only what it
recorded writing; every writer (demo inputs, report, notify --dry-run --out, fleet export, chargeback --out)
leaves a user's files byte-identical."""

from __future__ import annotations

import json
import shutil
import string
from pathlib import Path

import pytest
from conftest import run_cli
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import connectors
from auditor.errors import GpuAuditError
from auditor.store.engine import Store

NOW = "2026-11-29T00:00"
SINCE, UNTIL = "2026-11-22T00:00:00+00:00", "2026-11-29T00:00:00+00:00"


def _demo(out: Path, *args: str) -> dict:
    res = run_cli("--json", "demo", "--out", str(out), "--now", NOW, *args)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("owned") / "demo"
    _demo(out)
    return out


def test_fresh_removes_only_what_the_demo_wrote(demo_dir: Path, tmp_path: Path) -> None:
    """Before: --fresh deleted every reports/report-*.* and findings-*.csv, a user's budget sheet too."""
    again = tmp_path / "again"
    shutil.copytree(demo_dir, again)
    mine = {again / "reports" / "report-2026-budget.xlsx": b"PK\x03\x04 the budget",
            again / "reports" / "findings-q4.csv": b"mine,1\n", again / "notes.txt": b"my notes\n"}
    for p, body in mine.items():
        p.write_bytes(body)
    _demo(again, "--fresh")
    for p, body in mine.items():
        assert p.read_bytes() == body, p
    assert sorted(p.name for p in (again / "reports").glob("report-1.*")) == [
        "report-1.html", "report-1.json", "report-1.md", "report-1.txt"]


def test_demo_refuses_a_directory_of_a_users_files(tmp_path: Path) -> None:
    """Before: `demo --out DIR` wrote its demo.toml and CSVs over the user's files of the same names."""
    out = tmp_path / "work"
    out.mkdir()
    (out / "demo.toml").write_text("# my config\n")
    (out / "hpc-allocations.csv").write_text("my,jobs\n")
    res = run_cli("demo", "--out", str(out), "--now", NOW)
    assert res.returncode == 1 and len(res.stderr.splitlines()) == 1, res.stderr
    assert "gpu-audit did not write" in res.stderr and "choose another directory" in res.stderr
    assert (out / "demo.toml").read_text() == "# my config\n"
    assert (out / "hpc-allocations.csv").read_text() == "my,jobs\n"
    assert sorted(p.name for p in out.iterdir()) == ["demo.toml", "hpc-allocations.csv"]


def test_demo_refuses_a_file_changed_since_it_wrote_it(demo_dir: Path, tmp_path: Path) -> None:
    """A user who edited the demo's config keeps the edit: --fresh refuses before it deletes anything."""
    again = tmp_path / "again"
    shutil.copytree(demo_dir, again)
    (again / "demo.toml").write_text("# edited by me\n")
    db = (again / "gpu-audit-demo.db").read_bytes()
    res = run_cli("demo", "--out", str(again), "--now", NOW, "--fresh")
    assert res.returncode == 1 and len(res.stderr.splitlines()) == 1, res.stderr
    assert "refusing to replace" in res.stderr and "demo.toml" in res.stderr
    assert (again / "demo.toml").read_text() == "# edited by me\n"
    assert (again / "gpu-audit-demo.db").read_bytes() == db


def test_report_refuses_a_users_file_of_its_name(store_url: str, tmp_path: Path) -> None:
    """`report --out DIR`, `notify --dry-run --out DIR` and `export --out DIR` on both engines: a user's file
    of a name they write is refused in one line and left as it was; their own files are replaced."""
    out = tmp_path / "demo"
    data = _demo(out, "--store", store_url)
    cfg = str(out / "demo.toml")
    run = data["run_id"]
    rep = tmp_path / "rep"
    rep.mkdir()
    (rep / f"report-{run}.md").write_text("my report\n")
    res = run_cli("-c", cfg, "report", "--run", str(run), "--out", str(rep))
    assert res.returncode == 1 and len(res.stderr.splitlines()) == 1, res.stderr
    assert f"refusing to replace {rep / f'report-{run}.md'}" in res.stderr
    assert (rep / f"report-{run}.md").read_text() == "my report\n" and not (rep / f"report-{run}.html").exists()
    (rep / f"report-{run}.md").unlink()
    for _ in range(2):  # its own files, again
        assert run_cli("-c", cfg, "report", "--run", str(run), "--out", str(rep)).returncode == 0
    box = tmp_path / "box"
    res = run_cli("--json", "-c", cfg, "notify", "--dry-run", "--run", str(run), "--out", str(box))
    assert res.returncode == 0, res.stderr
    eml = Path(json.loads(res.stdout)["sent"][0]["file"])
    eml.write_text("my draft\n")
    res = run_cli("-c", cfg, "notify", "--dry-run", "--run", str(run), "--out", str(box), "--no-teams",
                  "--no-users")
    assert res.returncode == 1 and "refusing to replace" in res.stderr and len(res.stderr.splitlines()) == 1
    assert eml.read_text() == "my draft\n"
    exp = tmp_path / "exp"
    res = run_cli("--json", "-c", cfg, "export", "--out", str(exp), "--since", SINCE, "--until", UNTIL)
    assert res.returncode == 0, res.stderr
    part = exp / json.loads(res.stdout)["files"][0]
    part.write_bytes(b"not parquet: mine")
    res = run_cli("-c", cfg, "export", "--out", str(exp), "--since", SINCE, "--until", UNTIL)
    assert res.returncode == 1 and "refusing to replace" in res.stderr and len(res.stderr.splitlines()) == 1
    assert part.read_bytes() == b"not parquet: mine"


# -- the property: random pre-existing files in every output directory are byte-identical afterwards -------------

@pytest.fixture(scope="module")
def filled(demo_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The demo's config and store (a copy), and the names each writer writes (the collisions to plant)."""
    base = tmp_path_factory.mktemp("filled")
    shutil.copytree(demo_dir, base / "demo")
    cfg_path = base / "demo" / "demo.toml"
    cfg_path.write_text(cfg_path.read_text().replace(str(demo_dir.resolve()), str((base / "demo").resolve())))
    cfg = connectors.load_config(cfg_path)
    run = run_cli("--json", "-c", str(cfg_path), "notify", "--dry-run", "--out", str(base / "box"))
    assert run.returncode == 0, run.stderr
    emls = [Path(m["file"]).name for m in json.loads(run.stdout)["sent"]]
    res = run_cli("--json", "-c", str(cfg_path), "export", "--out", str(base / "exp"), "--since", SINCE,
                  "--until", UNTIL)
    assert res.returncode == 0, res.stderr
    run_id = 1  # the demo's audit of a fresh store
    names = {
        "inputs": ["demo.toml", "hpc-allocations.csv", "hpc-telemetry.csv", "k8s-nodes.csv", "gpu-audit-demo.db"],
        "reports": [f"report-{run_id}.html", f"report-{run_id}.md", f"findings-{run_id}.csv"],
        "outbox": emls[:3],
        "export": ["_gpu_audit_export.json", *json.loads(res.stdout)["files"][:2]],
        "named": ["cb.csv"],
    }
    return {"cfg": cfg, "cfg_path": cfg_path, "run_id": run_id, "names": names}


_body = st.binary(min_size=0, max_size=64)
_free = st.text(string.ascii_letters + string.digits + "-_.", min_size=1, max_size=12).filter(
    lambda s: s not in (".", ".."))


def _writers(cfg, run_id: int, root: Path) -> dict[str, Exception | None]:
    """Every writer into its directory under ``root``; what each raised (a refusal) or None."""
    from auditor.demo import generate
    from auditor.report import chargeback as cb
    from auditor.report import fleet
    from auditor.report.notify import notify
    from auditor.report.render import write_reports
    from auditor.timeutil import parse_time

    store = Store.open(cfg.store.resolved_url())
    since, until = parse_time(SINCE), parse_time(UNTIL)
    jobs = {
        "inputs": lambda: generate(root / "inputs", now=until, days=1),
        "reports": lambda: write_reports(store, cfg, run_id, root / "reports", ["html", "md"]),
        "outbox": lambda: notify(store, cfg, run_id, dry_run=True, out_dir=root / "outbox", teams=False),
        "export": lambda: fleet.export(store, cfg, root / "export", since, until),
        "named": lambda: cb.write(cb.chargeback(store, cfg, since, until, "account"), root / "named" / "cb.csv",
                                  "csv", since=since, until=until, by="account", period=None, currency="USD"),
    }
    got: dict[str, Exception | None] = {}
    try:
        for key, job in jobs.items():
            try:
                job()
                got[key] = None
            except GpuAuditError as exc:
                assert len(str(exc).splitlines()) == 1, exc
                got[key] = exc
    finally:
        store.engine.dispose()
    return got


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(data=st.data())
def test_writers_leave_a_users_files_byte_identical(filled: dict, tmp_path_factory: pytest.TempPathFactory,
                                                    data: st.DataObject) -> None:
    """Plant random files (the writers' own names among them, at any depth they write) in every output
    directory, maybe after the writers ran there once; run every writer: each planted file holds the same bytes
    afterwards, except the chargeback file the user named as --out. Before: the demo, report, notify and export
    wrote over them."""
    root = tmp_path_factory.mktemp("prop")
    if data.draw(st.booleans(), label="writers ran there before"):
        _writers(filled["cfg"], filled["run_id"], root)
    planted: dict[Path, bytes] = {}
    for key, names in filled["names"].items():
        for name in data.draw(st.lists(st.sampled_from(names) | _free, max_size=3, unique=True), label=key):
            p = root / key / name
            if p.is_dir():
                continue
            p.parent.mkdir(parents=True, exist_ok=True)
            planted[p] = data.draw(_body, label=f"{key}/{name}")
            p.write_bytes(planted[p])
    got = _writers(filled["cfg"], filled["run_id"], root)
    for p, body in planted.items():
        if p == root / "named" / "cb.csv":
            assert p.read_text().startswith("period,"), p.read_text()[:80]
        else:
            assert p.read_bytes() == body, p
    assert got["named"] is None
    if not any(p.parent == root / "reports" and p.name in filled["names"]["reports"] for p in planted):
        assert got["reports"] is None  # a writer refuses only for a user's file in its way
    if not any(p.parts[len(root.parts)] == "inputs" for p in planted):
        assert got["inputs"] is None
