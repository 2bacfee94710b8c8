"""GPU quotas from Slurm accounting (docs/definitions.md "Idle quota"): a QOS or an account association with
``GrpTRES`` ``gres/gpu=N`` holds N GPUs for its jobs whether or not they use them. Read with
``sacctmgr -n -P show qos format=Name,GrpTRES`` and ``sacctmgr -n -P show assoc
format=Cluster,Account,User,GrpTRES`` (cli backend), or slurmrestd's ``/slurmdb/vX/qos`` and
``/slurmdb/vX/associations`` (rest backend); user-level associations (a User) are not quotas of a team and
are left out."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

from auditor.records import GpuQuota
from connectors.slurm.parse import parse_tres, tres_gpus

QOS_FIELDS = ("Name", "GrpTRES")
ASSOC_FIELDS = ("Cluster", "Account", "User", "GrpTRES")
Bad = Callable[[int, str, str], None]


def _gpus(grp_tres: str) -> int:
    """GPUs a GrpTRES allows (0 = no GPU limit). Raises ValueError on a malformed count."""
    return tres_gpus(parse_tres(grp_tres))[0] if grp_tres.strip() else 0


def _gpu_limits(rows: Iterator[tuple[int, dict[str, str] | str]], bad: Bad) -> Iterator[tuple[dict[str, str], float]]:
    """Each readable row with the GPU count of its GrpTRES (0: no GPU limit); ``bad`` hears of the others."""
    for lineno, row in rows:
        if isinstance(row, str):
            bad(lineno, "wrong number of columns", row)
            continue
        try:
            yield row, _gpus(row["GrpTRES"])
        except (ValueError, KeyError) as exc:
            bad(lineno, f"bad GrpTRES: {exc}", "|".join(row.values()))


def from_qos_rows(rows: Iterator[tuple[int, dict[str, str] | str]], cluster: str, seen: datetime,
                  bad: Bad) -> Iterator[GpuQuota]:
    """QOS rows -> quotas of the QOS with a GPU limit; ``bad(lineno, why, text)`` for unreadable lines."""
    for row, n in _gpu_limits(rows, bad):
        if n > 0 and row["Name"]:
            yield GpuQuota(cluster=cluster, kind="qos", name=row["Name"], gpus=float(n), seen_at=seen)


def from_assoc_rows(rows: Iterator[tuple[int, dict[str, str] | str]], cluster: str, slurm_cluster: str | None,
                    seen: datetime, bad: Bad) -> Iterator[GpuQuota]:
    """Account associations (no user) with a GPU limit, of ``slurm_cluster`` when one is configured."""
    for row, n in _gpu_limits(rows, bad):
        if row.get("User") or not row.get("Account"):
            continue
        if slurm_cluster and row.get("Cluster") not in ("", slurm_cluster):
            continue
        if n > 0:
            yield GpuQuota(cluster=cluster, kind="account", name=row["Account"], gpus=float(n), seen_at=seen)


def _json_gpus(tres: Any) -> int:
    """GPUs in a slurmdbd TRES list (``[{"type": "gres", "name": "gpu", "count": 6}]``): the untyped count,
    else the typed ones summed. Raises ValueError on a count that is not a whole number."""
    untyped = typed = 0
    for t in tres or []:
        if not isinstance(t, dict) or t.get("type") != "gres" or not str(t.get("name") or "").startswith("gpu"):
            continue
        n = t.get("count")
        if isinstance(n, bool) or not isinstance(n, int):
            raise ValueError(f"GPU count {n!r} is not a whole number")
        if t.get("name") == "gpu":
            untyped += n
        else:
            typed += n
    return untyped or typed


def from_json_qos(obj: dict[str, Any], cluster: str, seen: datetime) -> GpuQuota | None:
    """A slurmdbd QOS object (REST ``/slurmdb/vX/qos``): GrpTRES is ``limits.max.tres.total``."""
    n = _json_gpus(((obj.get("limits") or {}).get("max") or {}).get("tres", {}).get("total"))
    name = obj.get("name") or ""
    return GpuQuota(cluster=cluster, kind="qos", name=name, gpus=float(n), seen_at=seen) if n > 0 and name else None


def from_json_assoc(obj: dict[str, Any], cluster: str, slurm_cluster: str | None,
                    seen: datetime) -> GpuQuota | None:
    """A slurmdbd association (REST ``/slurmdb/vX/associations``) of an account without a user: GrpTRES is
    ``max.tres.total``."""
    if obj.get("user") or not obj.get("account"):
        return None
    if slurm_cluster and obj.get("cluster") not in (None, "", slurm_cluster):
        return None
    n = _json_gpus(((obj.get("max") or {}).get("tres") or {}).get("total"))
    return GpuQuota(cluster=cluster, kind="account", name=obj["account"], gpus=float(n), seen_at=seen) if n > 0 \
        else None
