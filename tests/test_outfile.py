"""Outputs never destroy what they write to (auditor.report.outfile): ``chargeback --out`` and the report
exports replace a regular file atomically, write through a symlink (the link stays), a device node or a
FIFO, and refuse a directory with one line."""

from __future__ import annotations

import csv
import io
import os
import stat
import threading
from contextlib import ExitStack
from pathlib import Path

import pytest
from test_chargeback import W0, W1, cli, mixed

from auditor.errors import GpuAuditError
from auditor.report.outfile import open_output, write_text
from auditor.store.engine import Store

ARGS = ("chargeback", "--since", W0.isoformat(), "--until", W1.isoformat(), "--by", "team", "--format", "csv")


@pytest.fixture
def filled(tmp_path: Path) -> Store:
    s = Store.open(f"sqlite:///{tmp_path / 'a.db'}")  # the file cli() points its config at
    s.upgrade()
    s.ingest(mixed())
    return s


def owners(text: str) -> set[str]:
    return {r["owner"] for r in csv.DictReader(io.StringIO(text))}


def test_chargeback_through_a_symlink_keeps_the_link(filled: Store, tmp_path: Path) -> None:
    share = tmp_path / "finance-share"
    share.mkdir()
    (share / "cb.csv").write_text("last month\n")
    link = tmp_path / "cb.csv"
    link.symlink_to(share / "cb.csv")
    res = cli(tmp_path, *ARGS, "--out", str(link))
    assert res.exit_code == 0, res.output
    assert link.is_symlink() and os.readlink(link) == str(share / "cb.csv")  # before: a regular file
    assert owners((share / "cb.csv").read_text()) == {"ml", "(unmapped)"}
    assert not list(tmp_path.glob(".*.tmp")) and not list(share.glob(".*.tmp"))


def test_chargeback_into_a_fifo_writes_through(filled: Store, tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[str] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_text()), daemon=True)
    reader.start()
    res = cli(tmp_path, *ARGS, "--out", str(fifo))
    reader.join(10)
    assert res.exit_code == 0, res.output
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)  # before: replaced by a regular file, the reader starved
    assert owners(got[0]) == {"ml", "(unmapped)"}


@pytest.mark.skipif(os.geteuid() != 0, reason="making a device node needs root")
def test_chargeback_to_a_null_device_keeps_the_node(filled: Store, tmp_path: Path) -> None:
    """``--out /dev/null`` as root, on a private node with /dev/null's numbers (1, 3)."""
    null = tmp_path / "null"
    os.mknod(null, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    res = cli(tmp_path, *ARGS, "--out", str(null))
    assert res.exit_code == 0, res.output
    st = os.lstat(null)
    assert stat.S_ISCHR(st.st_mode) and st.st_rdev == os.makedev(1, 3)  # before: a regular file of rows
    assert null.read_text() == ""


def test_regular_file_replaced_atomically_keeping_its_mode(tmp_path: Path) -> None:
    p = tmp_path / "report.csv"
    p.write_text("old\n")
    p.chmod(0o640)
    old = os.lstat(p).st_ino
    with pytest.raises(RuntimeError), ExitStack() as stack:
        open_output(p, stack, named=True).write("half")
        raise RuntimeError("export failed midway")
    assert p.read_text() == "old\n" and not list(tmp_path.glob(".*.tmp"))  # a failure leaves the old file
    write_text(p, "new\n", named=True)
    assert p.read_text() == "new\n" and os.lstat(p).st_ino != old and stat.S_IMODE(os.lstat(p).st_mode) == 0o640
    write_text(tmp_path / "fresh.csv", "x", named=True)
    assert (tmp_path / "fresh.csv").read_text() == "x"


def test_directory_and_dangling_link(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    with pytest.raises(GpuAuditError, match=r"cannot write .*d: it is a directory$"):
        write_text(tmp_path / "d", "x", named=True)
    (tmp_path / "to-d").symlink_to(tmp_path / "d")
    with pytest.raises(GpuAuditError, match=r"a link to .*d\): it is a directory$"):
        write_text(tmp_path / "to-d", "x", named=True)
    dangling = tmp_path / "new-link"
    dangling.symlink_to(tmp_path / "target.csv")
    write_text(dangling, "rows\n", named=True)
    assert dangling.is_symlink() and (tmp_path / "target.csv").read_text() == "rows\n"


def test_report_exports_through_a_symlink(filled: Store, tmp_path: Path) -> None:
    """The findings CSV of ``gpu-audit report`` goes through the same writer."""
    from test_chargeback import cfg

    from auditor.audit.run import run_audit
    from auditor.report.render import write_reports

    run_id = run_audit(filled, cfg(), W0, W1).run_id
    out = tmp_path / "reports"
    out.mkdir()
    kept = tmp_path / "kept.csv"
    kept.write_text("")
    (out / f"findings-{run_id}.csv").symlink_to(kept)
    (out / f"report-{run_id}.md").symlink_to(tmp_path / "kept.md")
    write_reports(filled, cfg(), run_id, out, ["md", "json"])
    assert (out / f"findings-{run_id}.csv").is_symlink() and (out / f"report-{run_id}.md").is_symlink()
    assert kept.read_text().startswith("id,") and (tmp_path / "kept.md").read_text().startswith("#")
