"""The test suite beside a live Slurm cluster that is NOT the project's testbed, as on a cluster's login node:
stand-in Slurm commands first on PATH answer as a healthy cluster ``prod`` (and would obey: sbatch prints a
job id, ``scontrol update`` succeeds) and record every call. A Slurm testbed marker naming the testbed's
cluster is there too, so identification, not absence, is what keeps the tests off. PostgreSQL points at a
scratch database that is not the dedicated test database, and HOME at a private directory. Afterwards: no
Slurm call that changes anything, no table in the scratch database, no SQLite file written outside the temp
dirs by the suite (in the checkout or its home; what other programs write meanwhile is theirs).

    python tests/foreign_cluster.py [--pg] [PYTEST ARGS...]     # e.g. -m "not service", or nothing: all

Exit status 0 when nothing was touched (the inner pytest's own result is printed, not judged: service tests
skip there, as they must). tests/test_foreign_cluster.py runs it on the Slurm test modules."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
COMMANDS = ("scontrol", "sbatch", "squeue", "scancel", "sinfo", "sacct", "sacctmgr", "srun", "salloc", "sreport",
            "sprio", "sshare", "sstat", "sdiag", "strigger", "scrontab")
# what changes a cluster: these commands always, scontrol and sacctmgr with these verbs
MUTATING = {"sbatch", "scancel", "srun", "salloc", "strigger", "scrontab"}
SCONTROL_VERBS = {"update", "create", "delete", "hold", "uhold", "release", "requeue", "requeuehold", "suspend",
                  "resume", "reconfigure", "shutdown", "takeover", "top", "notify", "reboot", "power", "abort",
                  "setdebug", "setdebugflags", "write"}
SACCTMGR_VERBS = {"add", "create", "modify", "update", "delete", "remove", "archive", "load", "reconfigure"}

_STAND_IN = r"""#!/bin/sh
# stand-in for a live cluster "prod" (tests/foreign_cluster.py): answers, obeys, records
printf '%s\n' "$(basename "$0") $*" >> "__LOG__"
case "$(basename "$0") $*" in
  "scontrol ping"*) echo "Slurmctld(primary) at prod-ctl is UP" ;;
  "scontrol show config"*) printf '%s\n' "Configuration data as of 2026-01-01T00:00:00" \
      "ClusterName             = prod" "SLURM_CONF              = /etc/slurm/slurm.conf" \
      "StateSaveLocation       = /var/spool/slurmctld" ;;
  "scontrol token"*) echo "SLURM_JWT=eyJforeign" ;;
  "scontrol show node"*|"scontrol -o show node"*) echo "NodeName=prod-gpu-01 State=IDLE Gres=gpu:h100:8" ;;
  "sinfo"*) echo "prod-gpu-01 idle gpu:h100:8" ;;
  "sbatch"*) echo "4242" ;;
esac
exit 0
"""


def mutating(call: str) -> bool:
    words = call.split()
    if not words:
        return False
    if words[0] in MUTATING:
        return True
    rest = {w.lower() for w in words[1:]}
    return (words[0] == "scontrol" and bool(rest & SCONTROL_VERBS)) or \
        (words[0] == "sacctmgr" and bool(rest & SACCTMGR_VERBS))


def make_cluster(root: Path) -> tuple[Path, Path, Path]:
    """Stand-in commands (bin), their call log, and a Slurm testbed marker naming the testbed's cluster."""
    bin_dir, base, log = root / "bin", root / "slurm-testbed", root / "calls.log"
    bin_dir.mkdir(parents=True)
    base.mkdir()
    log.touch()
    for name in COMMANDS:
        (bin_dir / name).write_text(_STAND_IN.replace("__LOG__", str(log)))
        (bin_dir / name).chmod(0o755)
    (base / "gpu-audit-testbed").write_text("kind=slurm\ncluster=auditlab\nstate=/var/lib/gpu-audit-slurm-testbed/"
                                            "state/slurmctld\n")
    return bin_dir, base, log


def _pg_scratch(create: bool) -> str | None:
    """A scratch database that is not the dedicated test one (created with --pg, else only named)."""
    name = f"gpu_audit_foreign_{uuid.uuid4().hex[:8]}"
    if create:
        subprocess.run(["psql", "-X", "-q", "-h", "127.0.0.1", "-U", "postgres", "-d", "postgres", "-c",
                        f"CREATE DATABASE {name}"], check=True, capture_output=True, timeout=60)
    return name


def _pg_tables(name: str) -> list[str]:
    out = subprocess.run(["psql", "-X", "-tA", "-h", "127.0.0.1", "-U", "postgres", "-d", name, "-c",
                          "SELECT table_schema || '.' || table_name FROM information_schema.tables WHERE "
                          "table_schema NOT IN ('pg_catalog', 'information_schema')"],
                         check=True, capture_output=True, text=True, timeout=60)
    return out.stdout.split()


def _new_sqlite(since: float, home: Path) -> list[str]:
    """SQLite files written since ``since`` where the suite itself could write outside the temp dirs: the
    checkout (its working directory) and ``home``, the private home directory it ran with. Never the real home:
    another program writing a .db there while the suite runs is no finding of the suite (issue 44)."""
    found = []
    for top in (REPO, home):
        for dirpath, dirnames, files in os.walk(top):
            dirnames[:] = [d for d in dirnames if not d.startswith(".") and d != "node_modules"]
            for f in files:
                p = Path(dirpath) / f
                if p.suffix in (".db", ".sqlite", ".sqlite3") or f.endswith((".db-wal", ".db-journal")):
                    try:
                        if p.stat().st_mtime >= since:
                            found.append(str(p))
                    except OSError:
                        pass
    return found


def run(pytest_args: list[str], *, pg: bool, out: Path | None = None) -> dict:
    with tempfile.TemporaryDirectory(prefix="foreign-cluster-") as tmp:
        bin_dir, base, log = make_cluster(Path(tmp))
        scratch = _pg_scratch(pg)
        env = {k: v for k, v in os.environ.items() if k not in ("CI", "GPU_AUDIT_TEST_GUARD")}
        guard_free = [p for p in env.get("PATH", "").split(os.pathsep) if "service-guard" not in p]
        home = Path(tmp) / "home"  # the suite's own home: what it writes under ~ is seen, nobody else's is
        home.mkdir()
        env.update(PATH=os.pathsep.join([str(bin_dir), *guard_free]), SLURM_TESTBED_BASE=str(base), HOME=str(home),
                   TESTBED_ROOT=str(Path(tmp) / "no-tsdb-testbed"), PYTHONPATH=str(REPO),
                   GPU_AUDIT_TEST_PG=f"postgresql+psycopg://postgres@127.0.0.1:5432/{scratch}")
        t0 = time.time()
        try:
            proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *pytest_args],
                                  cwd=REPO, env=env, capture_output=True, text=True, check=False)
            tables = _pg_tables(scratch) if pg else []
        finally:
            if pg:
                subprocess.run(["psql", "-X", "-q", "-h", "127.0.0.1", "-U", "postgres", "-d", "postgres", "-c",
                                f"DROP DATABASE IF EXISTS {scratch}"], capture_output=True, timeout=60, check=False)
        calls = log.read_text().splitlines()
        if out is not None:
            out.write_text(proc.stdout + proc.stderr)
        return {"pytest_rc": proc.returncode, "summary": (proc.stdout.strip().splitlines() or [""])[-1],
                "seconds": round(time.time() - t0, 1), "slurm_calls": len(calls),
                "mutating_calls": [c for c in calls if mutating(c)], "pg_tables": tables,
                "sqlite_outside_tmp": _new_sqlite(t0, home)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pg", action="store_true", help="create a scratch PostgreSQL database and check it stays empty")
    ap.add_argument("--out", type=Path, help="write the inner pytest's output here")
    args, rest = ap.parse_known_args()
    res = run(rest, pg=args.pg, out=args.out)
    print(json.dumps(res, indent=1))
    return 1 if res["mutating_calls"] or res["pg_tables"] or res["sqlite_outside_tmp"] else 0


if __name__ == "__main__":
    sys.exit(main())
