"""The bucket verdict, defined once (docs/definitions.md "Observed seconds and the verdict").

Every place that judges telemetry (the audit on each engine, idle episodes, idle reservations, what-if)
takes its SQL from here, generated from the :class:`~auditor.config.Thresholds` of the run, so a threshold
or a rule cannot drift between copies. Thresholds are inlined as literals moved down by :data:`EPS`:
``v < t`` is ``v < t - 1e-9`` and ``v >= t`` is ``v >= t - 1e-9``, so a value exactly at a boundary after a
unit conversion (GPU-Util 5 % read as 0.05, or as 0.05000000000000001) is *not* below it.

The verdict of the observed seconds of one bucket:

====  =================  ==============================================================================
code  verdict            rule
====  =================  ==============================================================================
0     unknown            no samples (or no observed seconds): never idle
1     idle               SM-verified: SM < idle_sm and DRAM, Tensor (when measured) below theirs
2     idle_by_util      no SM activity: fallback on, GPU-Util < idle_util (and power < idle_power_w)
3     mirage             idle by SM, but GPU-Util >= mirage_gpu_util or GR engine >= mirage_gr_engine
4     low                SM-verified, idle_sm <= SM < working_sm
5     working            SM-verified, SM >= working_sm
6     busy_unverified   no SM activity and not idle by GPU-Util: observed, work not verifiable
====  =================  ==============================================================================
"""

from __future__ import annotations

import math
from collections.abc import Callable

from auditor.config import Thresholds

EPS = 1e-9
UNKNOWN, IDLE, IDLE_BY_UTIL, MIRAGE, LOW, WORKING, BUSY_UNVERIFIED = range(7)
NAMES = {UNKNOWN: "unknown", IDLE: "idle", IDLE_BY_UTIL: "idle_by_util", MIRAGE: "mirage", LOW: "low",
         WORKING: "working", BUSY_UNVERIFIED: "busy_unverified"}
#: verdicts whose seconds count as idle (idle_s includes idle-by-util; mirage is billed as idle too)
IDLE_CODES = (IDLE, IDLE_BY_UTIL, MIRAGE)
#: SM-verified verdicts (the GPU reported SM activity)
VERIFIED_CODES = (IDLE, MIRAGE, LOW, WORKING)

Col = Callable[[str], str]


def _lit(x: float) -> str:
    """A threshold as an SQL literal both engines read as a double."""
    if not math.isfinite(x):
        raise ValueError(f"threshold {x!r} is not a finite number")
    return repr(float(x))


def below(expr: str, t: float) -> str:
    """``expr < t`` with the boundary rule (a value at ``t`` is not below it)."""
    return f"{expr} < {_lit(t - EPS)}"


def at_least(expr: str, t: float) -> str:
    """``expr >= t`` with the boundary rule."""
    return f"{expr} >= {_lit(t - EPS)}"


def is_below(value: float, t: float) -> bool:
    """Python's ``value < t`` with the boundary rule of :func:`below` (for figures read back from the store)."""
    return value < t - EPS


def prefixed(alias: str) -> Col:
    """Column names of a table alias, e.g. ``prefixed("b")("sm_active") == "b.sm_active"``."""
    return lambda name: f"{alias}.{name}" if alias else name


def idle_ish(th: Thresholds, c: Col) -> str:
    """SM-verified idle (idle or mirage): SM decides; a missing DRAM or Tensor reading does not prevent it."""
    return (f"{below(c('sm_active'), th.idle_sm)}"
            f" AND ({c('dram_active')} IS NULL OR {below(c('dram_active'), th.idle_dram)})"
            f" AND ({c('tensor_active')} IS NULL OR {below(c('tensor_active'), th.idle_tensor)})")


def mirage_reading(th: Thresholds, c: Col) -> str:
    """GPU-Util or GR engine reads busy (a missing reading counts as not busy: NULL >= t is not true, and
    this is only ever used as a WHEN condition)."""
    return (f"({at_least(c('gpu_util'), th.mirage_gpu_util)}"
            f" OR {at_least(c('gr_engine'), th.mirage_gr_engine)})")


def idle_by_util(th: Thresholds, c: Col) -> str:
    """The low-confidence fallback for buckets without SM activity ("0 = 1" when it is switched off)."""
    if not th.util_fallback:
        return "0 = 1"
    cond = f"{c('gpu_util')} IS NOT NULL AND {below(c('gpu_util'), th.idle_util)}"
    if th.idle_power_w is not None:
        cond += f" AND {c('power_w')} IS NOT NULL AND {below(c('power_w'), th.idle_power_w)}"
    return cond


def case(th: Thresholds, c: Col, *, observed: str | None = None, working_first: bool = False) -> str:
    """The verdict code (table above) of one bucket as an SQL ``CASE``. ``observed``: a condition that is
    false for a bucket without samples (its seconds are unknown); default ``samples > 0``. ``working_first``
    tests SM >= working_sm first (faster on SQLite; same result whenever working_sm >= idle_sm)."""
    observed = observed or f"{c('samples')} > 0"
    sm = c("sm_active")
    first = ""
    if working_first and th.working_sm >= th.idle_sm:
        first = f" WHEN {at_least(sm, th.working_sm)} THEN {WORKING}"  # NULL: not taken
    return (f"CASE WHEN NOT ({observed}) THEN {UNKNOWN}{first}"
            f" WHEN {sm} IS NOT NULL THEN"
            f" CASE WHEN {idle_ish(th, c)} THEN CASE WHEN {mirage_reading(th, c)} THEN {MIRAGE} ELSE {IDLE} END"
            f" WHEN {at_least(sm, th.working_sm)} THEN {WORKING} ELSE {LOW} END"
            f" WHEN {idle_by_util(th, c)} THEN {IDLE_BY_UTIL} ELSE {BUSY_UNVERIFIED} END")


def in_codes(expr: str, codes: tuple[int, ...]) -> str:
    return f"{expr} IN ({', '.join(str(x) for x in codes)})"
