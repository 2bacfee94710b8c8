"""A stand-in ``sacct`` that answers from a saved ``sacct -a -P`` file (with its header line), for feeding a
peer tool the same job rows gpu-audit reads (``bench.bench_jobstats``): Job Defense Shield runs ``sacct`` by
name through the shell, so a directory holding this as ``sacct`` goes first on its PATH.

It honours what such a caller asks: ``-o`` (the fields, in that order, matched to the header case-blind),
``-X`` (no step lines), ``-n`` (no header), ``-P`` (``|``-separated; the only output it writes), ``-S``/``-E``
(jobs that ran in that window, as sacct selects them) and ``SLURM_TIME_FORMAT=%s`` (times as epoch seconds);
``-a``, ``-M`` and ``-r`` are accepted (one cluster and one partition in the file). The file is named by
``GPU_AUDIT_SACCT_REPLAY``.

Run: GPU_AUDIT_SACCT_REPLAY=saved.txt python -m bench.sacct_replay -a -X -P -n -o jobid,start,end
"""

from __future__ import annotations

import os
import sys
from datetime import UTC, datetime

TIMES = {"submit", "eligible", "start", "end"}
_FMT = "%Y-%m-%dT%H:%M:%S"


def _epoch(text: str) -> int | None:
    try:
        return int(datetime.strptime(text, _FMT).replace(tzinfo=UTC).timestamp())
    except ValueError:
        return None


def main(argv: list[str]) -> int:
    fields: list[str] = []
    steps, header, since, until = True, True, None, None
    i = 0
    while i < len(argv):
        a = argv[i]
        if a in ("-o", "--format"):
            fields, i = argv[i + 1].split(","), i + 1
        elif a in ("-S", "--starttime"):
            since, i = _epoch(argv[i + 1]), i + 1
        elif a in ("-E", "--endtime"):
            until, i = _epoch(argv[i + 1]), i + 1
        elif a in ("-M", "--clusters", "-r", "--partition"):
            i += 1
        elif a in ("-X", "--allocations"):
            steps = False
        elif a in ("-n", "--noheader"):
            header = False
        i += 1
    epoch = os.environ.get("SLURM_TIME_FORMAT") == "%s"
    out = sys.stdout
    with open(os.environ["GPU_AUDIT_SACCT_REPLAY"], encoding="utf-8") as fh:
        cols = fh.readline().rstrip("\n").split("|")
        where = {c.lower(): k for k, c in enumerate(cols)}
        want = [where[f.lower()] for f in fields] if fields else list(range(len(cols)))
        names = [cols[k].lower() for k in want]
        s_at, e_at, id_at = where["start"], where["end"], where["jobid"]
        if header:
            out.write("|".join(cols[k] for k in want) + "\n")
        for line in fh:
            row = line.rstrip("\n").split("|")
            if not steps and "." in row[id_at]:
                continue
            s, e = _epoch(row[s_at]), _epoch(row[e_at])
            if since is not None and e is not None and e < since or until is not None and s is not None and s > until:
                continue
            vals = [row[k] for k in want]
            if epoch:
                vals = [str(_epoch(v) or v) if n in TIMES else v for n, v in zip(names, vals, strict=True)]
            out.write("|".join(vals) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
