"""The finding kinds: one registry, read by the audit, the reports, the web UI, nudges, exports and the docs.

Each kind says who acts on it, where the report shows it, whether users are nudged about it and whether its
idle GPU-hours add to an idle total. Kinds whose hours only restate idle time that another kind (or the
headline) already counts do not add: a total that added them would count the same GPU-hours twice. The
table in docs/definitions.md ("Finding kinds") is checked against this registry by tests/test_finding_kinds.py.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Kind:
    """One finding kind (as Datasette's ``Setting``: data, documented, checked against the docs)."""

    name: str
    family: str  # allocation | episode | efficiency | coverage | reservation | hygiene | queue | infrastructure |
    #             goodput | inference
    audience: str  # user | operations: who acts on it (the evidence's recipient)
    section: str  # the report section (context key) that lists it
    nudged: bool  # users (and teams) get a nudge about it
    adds_to_idle: bool  # its idle GPU-hours add to an idle total (else they restate hours counted elsewhere)
    label: str  # what the report calls it
    help: str  # one line for the docs


KINDS: tuple[Kind, ...] = (
    Kind("idle_allocation", "allocation", "user", "top_idle", True, True, "Idle allocation",
         "Idle or mirage for most of its observed time: the whole allocation's idle hours."),
    Kind("util_mirage", "allocation", "user", "top_idle", True, True, "GPU-Util mirage",
         "Idle by SM activity while GPU-Util read busy: the whole allocation's idle hours."),
    Kind("hung_collective", "allocation", "user", "top_idle", True, True, "Hung collective (stuck, not slow)",
         "A mirage on 2+ GPUs at idle power with memory held: a stuck NCCL collective."),
    Kind("ghost_busy", "allocation", "operations", "top_idle", False, True, "Ghost busy (driver/hardware)",
         "GPU-Util high with no memory used: no process holds the GPU (also on GPUs nobody held: 0 idle hours)."),
    Kind("idle_gpus", "allocation", "user", "top_idle", True, True, "Idle GPUs in a multi-GPU job",
         "Some GPUs of a multi-GPU job idle while another worked: the idle GPUs' hours."),
    Kind("idle_episode", "episode", "user", "episodes", True, True, "Idle episode",
         "A long idle spell inside a job that otherwise worked: the episode's idle hours."),
    Kind("low_efficiency", "efficiency", "user", "low_efficiency", False, True, "Low efficiency",
         "Mean SM activity low over a job that was not idle as a whole; its idle hours are the job's."),
    Kind("unmonitored", "coverage", "operations", "unmonitored", False, False, "Unmonitored",
         "Too little of the reserved time had samples: unknown, never idle (0 idle hours)."),
    Kind("idle_reservation", "reservation", "user", "reservations", False, True, "Idle reservation",
         "Reserved GPU-hours no job used (they add to idle totals), plus the idle hours of jobs inside it "
         "(already counted with those jobs)."),
    Kind("request_hygiene", "hygiene", "user", "request_hygiene", False, False, "Request hygiene",
         "A user's time limits far above the runtimes; its hours restate the idle hours of the user's jobs."),
    Kind("idle_while_queued", "queue", "user", "queue_findings", False, False, "Idle while jobs waited",
         "Idle hours of a job while other GPU jobs waited: a part of that job's idle hours."),
    Kind("idle_quota", "queue", "operations", "queue_findings", False, False, "Idle quota (reclaim candidate)",
         "A quota holding more GPUs than its jobs use: unused quota, not reserved idle time."),
    Kind("lemon_node", "infrastructure", "operations", "nodes", False, False, "Lemon node",
         "A node with repeated faults: infrastructure time, never idle, never the users'."),
    Kind("failed_restarts", "goodput", "user", "goodput", False, False, "Failed and restarted",
         "A job requeued or restarted again and again: the GPU-hours its failed runs lost, never idle."),
    Kind("batching_headroom", "inference", "user", "inference", False, False, "Batching headroom",
         "An inference server at about one request at a time on a memory-bound or low chip: more tokens per "
         "GPU-hour from batching; never idle time (0 idle hours)."),
    Kind("straggler", "efficiency", "operations", "stragglers", False, False, "Straggler (holds a lockstep job up)",
         "A node or GPU of a multi-GPU job that computed while its peers waited: the job's hours, never idle; a "
         "node's finding names its InfiniBand port that waited most."),
)

BY_NAME: dict[str, Kind] = {k.name: k for k in KINDS}
NAMES: tuple[str, ...] = tuple(k.name for k in KINDS)
NUDGED: tuple[str, ...] = tuple(k.name for k in KINDS if k.nudged)
ADDS_TO_IDLE: frozenset[str] = frozenset(k.name for k in KINDS if k.adds_to_idle)
#: what a finding's ``cost`` holds where it is no idle cost (a kind that does not add to idle totals): the web
#: findings page names it so, in its own column, and never adds it to the idle cost (issue 44)
MONEY: dict[str, str] = {
    "failed_restarts": "lost to failed runs",
    "request_hygiene": "restates its jobs' idle cost",
    "idle_while_queued": "part of its job's idle cost",
    "idle_quota": "unused quota",
    "lemon_node": "infrastructure time",
    "batching_headroom": "the pod's reserved cost",
    "straggler": "the job's reserved cost",
    "unmonitored": "reserved, not monitored",
}


def money_of(name: str) -> str:
    """What a finding's cost column holds: "idle cost" for a kind whose hours add to idle totals, else
    :data:`MONEY`'s words (never idle money)."""
    return "idle cost" if name in ADDS_TO_IDLE else MONEY.get(name, "not idle")


def of_section(section: str) -> tuple[str, ...]:
    """The kinds a report section lists, in registry order."""
    return tuple(k.name for k in KINDS if k.section == section)


def audience(name: str) -> str:
    """Who acts on a finding of kind ``name`` (the evidence's ``recipient``)."""
    return BY_NAME[name].audience


def label(name: str) -> str:
    """The report's words for a kind; an unknown name (a newer store) reads as itself."""
    k = BY_NAME.get(name)
    return k.label if k is not None else name
