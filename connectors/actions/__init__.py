"""Scheduler actions for enforcement (docs/enforcement.md). The collectors stay read-only; everything that
changes a scheduler lives here, is called only from :mod:`auditor.enforce.policy`, and first re-reads the live
state. A backend only REPORTS what the scheduler says now (identity, owner chain, the pods an action would
stop); whether that is provably the judged work is decided in one place, ``auditor.enforce.policy.Run.proof``,
so no backend can skip a check."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class LiveState:
    """What the scheduler says right now about one allocation, and what acting on it would mean."""

    running: bool
    state: str = ""
    target: str = ""  # e.g. "slurm job 1234", "Deployment research/notebook-alice"
    action: str = "none"  # cancel, requeue, scale_to_zero, suspend_job, delete_job, delete_pod, none
    blocked: str = ""  # why acting is impossible or unsafe (owner kind, node trouble), "" = fine
    infra: str = ""  # infrastructure trouble on its nodes, "" = none
    annotations: dict[str, str] = field(default_factory=dict)
    detail: dict[str, Any] = field(default_factory=dict)
    #: what the scheduler says the object is now. Slurm: job_id, start_ts, nodes (sorted), user;
    #: Kubernetes: uid, namespace, name, node. Compared with the judged allocation before any action.
    identity: dict[str, Any] = field(default_factory=dict)
    #: Kubernetes: the controller ownerReferences followed, pod first. One dict per link: kind, name and
    #: ref_uid as the child's reference says; uid, selector (a LabelSelector) as the object read says (uid
    #: None: not found); child_kind, child_labels: the child's kind and labels.
    chain: list[dict[str, Any]] = field(default_factory=list)
    #: the pods the action would stop (uid, name, annotations), read live; empty = only this allocation
    members: list[dict[str, Any]] = field(default_factory=list)


def from_config(cfg: Any, base_dir: Path) -> Callable[[str, str], Any]:
    """Actions from each cluster's first slurm / kubernetes allocation source (its connection settings)."""
    cache: dict[tuple[str, str], Any] = {}

    def get(cluster: str, source: str) -> Any:
        if (cluster, source) in cache:
            return cache[(cluster, source)]
        backend = None
        cl = next((c for c in cfg.clusters if c.name == cluster), None)
        src = next((s for s in (cl.allocations if cl else []) if s.kind == source), None)
        if src is not None and source == "slurm":
            from connectors.actions.slurm import SlurmActions
            from connectors.slurm import SlurmOptions

            backend = SlurmActions(cluster, SlurmOptions.model_validate(src.options()), cfg.enforce)
        elif src is not None and source == "kubernetes":
            from connectors.actions.kubernetes import KubernetesActions
            from connectors.kubernetes import KubernetesOptions

            backend = KubernetesActions(cluster, KubernetesOptions.model_validate(src.options()), base_dir)
        cache[(cluster, source)] = backend
        return backend

    return get
