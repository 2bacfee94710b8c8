"""GPU quotas from Slurm accounting (docs/definitions.md "Idle quota"): a QOS or an account association with
``GrpTRES`` ``gres/gpu=N`` holds N GPUs for its jobs whether or not they use them. Read with
``sacctmgr -n -P show qos format=Name,GrpTRES`` and ``sacctmgr -n -P show assoc
format=Cluster,Account,User,GrpTRES``; user-level associations (a User column) are not quotas of a team and
are left out."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import datetime

from auditor.records import GpuQuota
from connectors.slurm.parse import parse_tres, tres_gpus

QOS_FIELDS = ("Name", "GrpTRES")
ASSOC_FIELDS = ("Cluster", "Account", "User", "GrpTRES")
Bad = Callable[[int, str, str], None]


def _gpus(grp_tres: str) -> int:
    """GPUs a GrpTRES allows (0 = no GPU limit). Raises ValueError on a malformed count."""
    return tres_gpus(parse_tres(grp_tres))[0] if grp_tres.strip() else 0


def from_qos_rows(rows: Iterator[tuple[int, dict[str, str] | str]], cluster: str, seen: datetime,
                  bad: Bad) -> Iterator[GpuQuota]:
    """QOS rows -> quotas of the QOS with a GPU limit; ``bad(lineno, why, text)`` for unreadable lines."""
    for lineno, row in rows:
        if isinstance(row, str):
            bad(lineno, "wrong number of columns", row)
            continue
        try:
            n = _gpus(row["GrpTRES"])
        except (ValueError, KeyError) as exc:
            bad(lineno, f"bad GrpTRES: {exc}", "|".join(row.values()))
            continue
        if n > 0 and row["Name"]:
            yield GpuQuota(cluster=cluster, kind="qos", name=row["Name"], gpus=float(n), seen_at=seen)


def from_assoc_rows(rows: Iterator[tuple[int, dict[str, str] | str]], cluster: str, slurm_cluster: str | None,
                    seen: datetime, bad: Bad) -> Iterator[GpuQuota]:
    """Account associations (no user) with a GPU limit, of ``slurm_cluster`` when one is configured."""
    for lineno, row in rows:
        if isinstance(row, str):
            bad(lineno, "wrong number of columns", row)
            continue
        if row.get("User") or not row.get("Account"):
            continue
        if slurm_cluster and row.get("Cluster") not in ("", slurm_cluster):
            continue
        try:
            n = _gpus(row["GrpTRES"])
        except (ValueError, KeyError) as exc:
            bad(lineno, f"bad GrpTRES: {exc}", "|".join(row.values()))
            continue
        if n > 0:
            yield GpuQuota(cluster=cluster, kind="account", name=row["Account"], gpus=float(n), seen_at=seen)
