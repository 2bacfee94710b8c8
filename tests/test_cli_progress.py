"""Progress of long work: drawn on a terminal only (a pseudo-terminal here, as a person's shell), never under
cron or a pipe; each source summed up in one line either way."""

from __future__ import annotations

import io
import os
import pty
import subprocess
import sys
from pathlib import Path

from conftest import run_cli

ROOT = Path(__file__).resolve().parent.parent
ROWS = 12_000  # telemetry records of the file below: more than one progress report (every 5,000 records)


def _site(tmp_path: Path) -> Path:
    """Two clusters, three sources: allocations and telemetry of one, allocations of the other."""
    with (tmp_path / "t.csv").open("w") as f:
        f.write("timestamp,host,gpu,uuid,metric,value\n")
        for i in range(ROWS):  # 1,000 buckets x 12 GPUs, one sample each: one bucket record per row
            ts = 1_764_000_000 + (i // 12) * 300
            f.write(f"{ts},n0,{i % 12},GPU-{i % 12},DCGM_FI_DEV_GPU_UTIL,{i % 100}\n")
    (tmp_path / "a.csv").write_text("id,user,start,end,gpus\nj1,alice,2025-11-24T16:00:00Z,"
                                    "2025-11-24T18:00:00Z,n0:0-1\n")
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[store]\nurl = "sqlite:///{tmp_path / "s.db"}"\n'
                   '[[clusters]]\nname = "a"\n[[clusters.allocations]]\nkind = "file"\npaths = ["a.csv"]\n'
                   '[[clusters.telemetry]]\nkind = "file"\npaths = ["t.csv"]\n'
                   '[[clusters]]\nname = "b"\n[[clusters.allocations]]\nkind = "file"\npaths = ["a.csv"]\n')
    return cfg


ARGS = ("collect", "--since", "2025-11-24", "--until", "2025-11-29")


def test_collect_without_a_terminal_prints_one_line_per_source_and_no_progress(tmp_path: Path) -> None:
    cfg = _site(tmp_path)
    res = run_cli("-c", str(cfg), *ARGS)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert [ln.split(":", 1)[0] for ln in lines] == ["a allocations[0]", "a telemetry[0]", "b allocations[0]"]
    assert lines[0].startswith("a allocations[0]:file: ok (1 allocations, 0 buckets, 0 bad records skipped; "
                               "allocated_gpus 2"), lines
    assert "records" not in res.stderr and "collecting" not in res.stderr, res.stderr
    assert "a telemetry[0]" not in res.stderr  # the daemon's log line of each source is not printed twice


def _on_pty(*args: str, cwd: Path) -> tuple[int, str, str]:
    """``gpu-audit ARGS`` with stderr on a pseudo-terminal (stdout a pipe, as `gpu-audit collect | less`)."""
    master, slave = pty.openpty()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "160", "TERM": "xterm"}
    proc = subprocess.Popen([sys.executable, "-m", "auditor", *args], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=slave, cwd=cwd, env=env)
    os.close(slave)
    err = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        err += chunk
    out = proc.stdout.read() if proc.stdout else b""
    proc.wait(timeout=120)
    os.close(master)
    return proc.returncode, out.decode(), err.decode(errors="replace")


def test_collect_on_a_terminal_shows_rows_rate_and_eta(tmp_path: Path) -> None:
    cfg = _site(tmp_path)
    rc, out, err = _on_pty("-c", str(cfg), *ARGS, cwd=tmp_path)
    assert rc == 0, err
    assert "collecting a telemetry[0]:file" in err and f"{ROWS:,} records (" in err and "/s)" in err, err[-2000:]
    assert "5,000 records (" in err  # drawn while the source was read, not only at its end
    assert "3/3" in err and "ETA" in err
    assert len(out.splitlines()) == 3  # the summary on stdout, the same lines as without a terminal


def test_audit_on_a_terminal_names_its_step(tmp_path: Path) -> None:
    cfg = _site(tmp_path)
    assert run_cli("-c", str(cfg), *ARGS).returncode == 0
    rc, out, err = _on_pty("-c", str(cfg), "audit", "--since", "2025-11-24", "--until", "2025-11-29", cwd=tmp_path)
    assert rc == 0, err
    assert "auditing: judge buckets" in err and out.startswith("audit run 1:"), err[-2000:]
    res = run_cli("-c", str(cfg), "audit", "--since", "2025-11-24", "--until", "2025-11-29")
    assert res.returncode == 0 and "auditing" not in res.stderr


def test_the_progress_line_counts_each_source_once() -> None:
    """A retried source reports its end once per attempt: the bar still counts it once."""
    from rich.console import Console

    from auditor.cli.progress import CollectProgress

    buf = io.StringIO()
    p = CollectProgress(2, Console(file=buf, force_terminal=True, width=160))
    with p:
        p("a telemetry[0]:file", 5000, False)
        p("a telemetry[0]:file", 7000, True)
        p("a telemetry[0]:file", 7000, True)  # the second attempt
        p.bar.refresh()
        assert p.bar.tasks[0].completed == 1
        p("b allocations[0]:file", 3, True)
        assert p.bar.tasks[0].completed == 2
