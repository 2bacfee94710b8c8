"""Slurm actions: cancel (``scancel``, or ``DELETE /slurm/vX/job/ID`` with the rest backend) or requeue
(``scontrol requeue``), after checking that the job still runs and that none of its nodes is in trouble.

Reuses the read backends of :mod:`connectors.slurm` for command running and the slurmrestd client (same
timeouts, one-line errors, tokens from files or environment, never printed)."""

from __future__ import annotations

import re
from typing import Any

import httpx

from auditor.config import EnforceConfig, Policy
from auditor.errors import SourceError
from auditor.intparse import UINT
from connectors.actions import LiveState
from connectors.base import Context
from connectors.slurm import SlurmAllocations, SlurmOptions
from connectors.slurm.parse import expand_hostlist, kv_pairs, parse_time, scontrol_records, sluid

#: Slurm node states that mark infrastructure trouble: an allocation on such a node is never acted on (Slurm's
#: own state names; an `[enforce]` setting until issue 45)
INFRA_NODE_STATES = ("DOWN", "DRAIN", "DRAINING", "DRAINED", "FAIL", "FAILING", "MAINT", "NOT_RESPONDING", "REBOOT",
                     "POWER_DOWN", "POWERING_DOWN")

#: the first release whose squeue prints a job's SLUID (``%s``) and whose slurmrestd job objects carry it
#: (``step_id.sluid``, OpenAPI v0.0.44): SchedMD/slurm doc/man/man1/squeue.1 of slurm-25-11-0-1
SLUID_SINCE = (25, 11)
SLUID_REST = ("v0.0.44", "v0.0.45", "v0.0.46")

_JOB_ID = re.compile(rf"{UINT}(_{UINT})?(\+{UINT})?")  # ASCII only, whole string (fullmatch)


def _states(value: Any) -> set[str]:
    """Node state words from ``IDLE+DRAIN``, ``["IDLE", "DRAIN"]`` or ``"mixed"`` + ``state_flags``."""
    items = value if isinstance(value, list) else re.split(r"[+ ,]", str(value or ""))
    return {str(s).strip().upper().rstrip("*~#!%$@^-") for s in items if str(s).strip()}


class SlurmActions:
    """Act on one Slurm cluster through the backend its allocation source uses (cli or rest)."""

    def __init__(self, cluster: str, options: SlurmOptions, enforce: EnforceConfig) -> None:
        self.cluster, self.o, self.enforce = cluster, options, enforce
        self.reader = SlurmAllocations(Context(cluster), options)
        self.backend = self.reader.backend
        if options.backend == "pyslurm":
            raise SourceError("slurm", "enforcement supports the cli and rest backends, not pyslurm",
                              transient=False)

    # -- live state ---------------------------------------------------------------------------------
    def inspect(self, alloc: dict[str, Any], policy: Policy) -> LiveState:
        """The job now: state, nodes, start time, user and, where Slurm shows one (25.11+), its SLUID (its
        identity, compared with the judged job by the enforcement's proof: a requeued or moved job is not the
        one judged), and node trouble. ``identity["sluid"]`` is present only when this Slurm can show a SLUID
        (None then means it showed none)."""
        job = str(alloc["external_id"])
        if not _JOB_ID.fullmatch(job):
            return LiveState(False, blocked=f"not a Slurm job id: {job[:40]!r}")
        state, nodes, start, user, run = self._rest_job(job) if self.o.backend == "rest" else self._cli_job(job)
        action = "requeue" if policy.slurm_action == "requeue" else "cancel"
        identity: dict[str, Any] = {"job_id": job, "start_ts": start, "nodes": sorted(nodes), "user": user}
        if run is not False:
            identity["sluid"] = run
        live = LiveState(state == "RUNNING", state=state or "gone", target=f"slurm job {job}", action=action,
                         detail={"nodes": nodes}, identity=identity)
        if live.running and self.o.backend == "rest" and action == "requeue":
            live.blocked = "requeue needs the cli backend (slurmrestd has no requeue call)"
        if live.running:
            live.infra = self._node_trouble(nodes)
        return live

    @staticmethod
    def _epoch(value: Any) -> int | None:
        try:
            t = parse_time(value)
        except (ValueError, TypeError):
            return None
        return int(t.timestamp()) if t is not None else None

    def _cli_job(self, job: str) -> tuple[str, list[str], int | None, str, str | None | bool]:
        """(state, nodes, start, user, SLUID: False when this squeue cannot print one)."""
        version = self.backend.version(self.o.squeue)
        shows = version is not None and version >= SLUID_SINCE  # before 25.11 %s is another field or invalid
        fmt = "%T|%N|%S|%u" + ("|%s" if shows else "")
        out = self.backend.run(self.o.squeue, *self._m(), "-h", "-j", job, "-o", fmt)
        line = next((ln for ln in out.splitlines() if ln.strip()), "")
        if not line:
            return "", [], None, "", False
        state, nodelist, start, user, run = ([*line.split("|"), "", "", "", ""])[:5]
        nodelist = nodelist.strip()
        return (state.strip().upper(), expand_hostlist(nodelist) if nodelist else [], self._epoch(start.strip()),
                user.strip(), sluid(run) if shows else False)

    def _rest_job(self, job: str) -> tuple[str, list[str], int | None, str, str | None | bool]:
        with self.backend._client() as client:
            v = self.backend._negotiate(client)
            data = self.backend.get(client, f"/slurm/{v}/job/{job}", missing_ok=True) or {}
        jobs = data.get("jobs") or []
        if not jobs:
            return "", [], None, "", False
        j = jobs[0]
        st = j.get("job_state")
        state = (st[0] if isinstance(st, list) and st else st or "")
        nodes = expand_hostlist(j.get("nodes") or "") if j.get("nodes") else []
        step = j.get("step_id") if isinstance(j.get("step_id"), dict) else {}
        run = sluid(step.get("sluid")) if v in SLUID_REST else False  # v0.0.44+: step_id.sluid
        return str(state).upper(), nodes, self._epoch(j.get("start_time")), str(j.get("user_name") or ""), run

    def _node_trouble(self, nodes: list[str]) -> str:
        bad_states = set(INFRA_NODE_STATES)
        trouble = []
        for node in nodes:
            states = self._rest_node(node) if self.o.backend == "rest" else self._cli_node(node)
            hit = sorted(states & bad_states)
            if hit:
                trouble.append(f"{node} {'+'.join(hit)}")
        return ("node " + ", ".join(trouble)) if trouble else ""

    def _cli_node(self, node: str) -> set[str]:
        out = self.backend.run(self.o.scontrol, *self._m(), "-o", "show", "node", node)
        states: set[str] = set()
        for rec in scontrol_records(out):
            for k, v in kv_pairs(rec):
                if k == "State":
                    states |= _states(v)
        return states

    def _rest_node(self, node: str) -> set[str]:
        with self.backend._client() as client:
            v = self.backend._negotiate(client)
            data = self.backend.get(client, f"/slurm/{v}/node/{node}", missing_ok=True) or {}
        out: set[str] = set()
        for n in data.get("nodes") or []:
            out |= _states(n.get("state")) | _states(n.get("state_flags") or [])
        return out

    def _m(self) -> list[str]:
        return ["-M", self.o.cluster_name] if self.o.cluster_name else []

    # -- acting -------------------------------------------------------------------------------------
    def execute(self, alloc: dict[str, Any], live: LiveState) -> str:
        job = str(alloc["external_id"])
        if live.action == "requeue":
            self.backend.run(self.o.scontrol, *self._m(), "requeue", job)
            return f"scontrol requeue {job}: ok"
        if self.o.backend == "rest":
            return self._rest_cancel(job)
        self.backend.run(self.enforce.scancel, *self._m(), job)
        return f"scancel {job}: ok"

    def _rest_cancel(self, job: str) -> str:
        with self.backend._client() as client:
            v = self.backend._negotiate(client)
            path = f"/slurm/{v}/job/{job}"
            try:
                resp = client.delete(path)
            except httpx.HTTPError as exc:
                raise SourceError(self.reader.name, f"DELETE {path}: {type(exc).__name__}", transient=True) from None
        try:
            errors = (resp.json() or {}).get("errors") or []
        except ValueError:
            errors = []
        if resp.status_code >= 400 or errors:
            first = errors[0] if errors and isinstance(errors[0], dict) else {}
            what = " ".join(str(first.get(k, "")) for k in ("error", "description")).strip()[:200]
            raise SourceError(self.reader.name, f"DELETE {path}: HTTP {resp.status_code} {what}".strip(),
                              transient=True)
        return f"DELETE {path}: HTTP {resp.status_code}"
