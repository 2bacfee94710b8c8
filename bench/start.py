"""The fixed cost of a run (issue 46): CPU seconds of ``gpu-audit --version``, ``--help`` and ``gpu-audit job
REF`` on the demo store, each its own process (the median of ``--repeat`` runs after one warm-up run that
writes the byte-code caches: PYTHONDONTWRITEBYTECODE is removed from the children's environment, as an
installed package has its .pyc files), and a new store's creation: from the models and stamped at the head
(``Store.upgrade()`` on an empty store) against running every migration (``upgrade(via_migrations=True)``),
each in its own process, CPU and wall, on SQLite (and PostgreSQL with ``--pg-url``).

Run: python -m bench.start [--repeat 5] [--out DIR] [--pg-url URL]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.table import Row

TARGET_START_CPU_S = 0.25  # --version, --help
TARGET_JOB_CPU_S = 0.4  # gpu-audit job REF on the demo
DEMO_JOB = "1001"  # the demo's llama-pretrain job on cluster hpc


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def child_cpu(cmd: list[str], repeat: int) -> dict[str, float]:
    """Median CPU (user + system) and wall seconds of ``cmd`` in its own process, after one warm-up run."""
    cpus, walls = [], []
    for i in range(repeat + 1):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False, env=_env())  # noqa: S603
        wall = time.perf_counter() - t
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if proc.returncode != 0:
            raise SystemExit(f"bench.start: {' '.join(cmd)} failed: {proc.stderr.strip()[-500:]}")
        if i:  # the first run writes the byte-code caches
            cpus.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
            walls.append(wall)
    return {"cpu_s": statistics.median(cpus), "wall_s": statistics.median(walls), "runs": repeat}


def demo_store(out: Path) -> Path:
    """The demo's config, built once per migration head under ``out`` (``gpu-audit demo``, about a minute)."""
    from auditor.store.engine import head_revision

    where = out / f"demo-{head_revision()}"
    cfg = where / "demo.toml"
    if not cfg.exists():
        subprocess.run([sys.executable, "-m", "auditor", "demo", "--out", str(where)], check=True,  # noqa: S603
                       capture_output=True, env=_env())
    return cfg


CREATE = ("import json, resource, sys, time\n"
          "t = time.perf_counter()\n"
          "from auditor.store.engine import Store\n"
          "s = Store.open(sys.argv[1]); s.upgrade(via_migrations=sys.argv[2] == 'migrations')\n"
          "r = resource.getrusage(resource.RUSAGE_SELF)\n"
          "print(json.dumps({'cpu_s': r.ru_utime + r.ru_stime, 'wall_s': time.perf_counter() - t}))\n")


def create_cpu(url_for: Any, how: str, repeat: int) -> dict[str, float]:
    """A new store created ``how`` ('models' or 'migrations'), whole process (start and imports included)."""
    cpus, walls = [], []
    for i in range(repeat + 1):
        with url_for() as url:
            proc = subprocess.run([sys.executable, "-c", CREATE, url, how], capture_output=True, text=True,  # noqa: S603
                                  check=False, env=_env())
        if proc.returncode != 0:
            raise SystemExit(f"bench.start: creating a store ({how}) failed: {proc.stderr.strip()[-500:]}")
        if i:
            r = json.loads(proc.stdout.strip().splitlines()[-1])
            cpus.append(r["cpu_s"])
            walls.append(r["wall_s"])
    return {"cpu_s": statistics.median(cpus), "wall_s": statistics.median(walls), "runs": repeat}


def _sqlite_url() -> Any:
    from contextlib import contextmanager

    @contextmanager
    def url() -> Any:
        with tempfile.TemporaryDirectory(prefix="bench-start-") as tmp:
            yield f"sqlite:///{tmp}/store.db"

    return url


def _pg_url(base: str) -> Any:
    import uuid
    from contextlib import contextmanager

    from sqlalchemy import create_engine, text

    @contextmanager
    def url() -> Any:
        name = f"bench_start_{uuid.uuid4().hex[:10]}"
        eng = create_engine(base)
        with eng.begin() as conn:
            conn.execute(text(f'CREATE SCHEMA "{name}"'))
        try:
            yield f"{base}{'&' if '?' in base else '?'}options=-csearch_path%3D{name}"
        finally:
            with eng.begin() as conn:
                conn.execute(text(f'DROP SCHEMA "{name}" CASCADE'))
            eng.dispose()

    return url


def measure(out: Path, repeat: int = 5, pg_url: str | None = None, job: bool = True) -> dict[str, Any]:
    """Every figure; ``job`` False skips `gpu-audit job` (it needs the demo store built: a minute)."""
    exe = [sys.executable, "-m", "auditor"]
    res: dict[str, Any] = {"version": child_cpu([*exe, "--version"], repeat),
                           "help": child_cpu([*exe, "--help"], repeat)}
    if job:
        res["job"] = child_cpu([*exe, "-c", str(demo_store(out)), "job", DEMO_JOB], repeat)
    engines = {"sqlite": _sqlite_url()}
    if pg_url:
        engines["postgresql"] = _pg_url(pg_url)
    for name, url_for in engines.items():
        res[f"create_{name}"] = {how: create_cpu(url_for, how, max(1, repeat // 2)) for how in ("models", "migrations")}
    return res


def report(r: dict[str, Any]) -> str:
    lines = [f"gpu-audit {k}: CPU {r[k]['cpu_s']:.3f} s, wall {r[k]['wall_s']:.3f} s (median of {r[k]['runs']})"
             for k in ("version", "help", "job") if k in r]
    for k, v in r.items():
        if k.startswith("create_"):
            lines.append(f"new {k[7:]} store, whole process: from the models CPU {v['models']['cpu_s']:.3f} s "
                         f"(wall {v['models']['wall_s']:.3f} s) | by the migrations CPU "
                         f"{v['migrations']['cpu_s']:.3f} s (wall {v['migrations']['wall_s']:.3f} s)")
    return "\n".join(lines)


def rows(r: dict[str, Any]) -> list[Row]:
    out = [Row("CLI start: gpu-audit --version, CPU", r["version"]["cpu_s"], "s", TARGET_START_CPU_S),
           Row("CLI start: gpu-audit --help, CPU", r["help"]["cpu_s"], "s", TARGET_START_CPU_S),
           Row("gpu-audit job REF on the demo, CPU", r["job"]["cpu_s"] if "job" in r else None, "s",
               TARGET_JOB_CPU_S, note="" if "job" in r else "not measured (--quick)")]
    for k, v in r.items():
        if k.startswith("create_"):
            label = {"sqlite": "SQLite", "postgresql": "PostgreSQL"}[k[7:]]
            out += [Row(f"new {label} store from the models (process CPU)", v["models"]["cpu_s"], "s"),
                    Row(f"new {label} store by the migrations (process CPU, before)", v["migrations"]["cpu_s"], "s")]
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.start", description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--out", default=None, help="Cache directory of the demo store (default: bench's).")
    ap.add_argument("--pg-url", default=None, help="Also time a new PostgreSQL store (a schema, dropped after).")
    a = ap.parse_args(argv)
    from bench import fleet
    from bench.table import table

    r = measure(Path(a.out or fleet.OUT), a.repeat, a.pg_url)
    print(report(r))
    print(table(rows(r)))


if __name__ == "__main__":
    main()
