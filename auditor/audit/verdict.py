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
7     idle_by_counters   no SM activity, stock counters (GR engine with Tensor or DRAM): all below idle
8     busy_by_counters   no SM activity, stock counters: Tensor >= idle_tensor or DRAM >= idle_dram (work)
9     engine_spin        no SM activity, stock counters: GR engine >= idle_gr_engine, Tensor and DRAM
                         below theirs: a spin or a wait, never verified work
====  =================  ==============================================================================

Evidence tiers (docs/definitions.md "Evidence tiers"), in order: SM activity (verified: codes 1, 3, 4, 5);
else the profiling fields a stock GPU Operator fleet exports (:func:`counters_measured`: codes 7, 8, 9);
else GPU-Util (low confidence: codes 2, 6). Codes are only ever appended (stored rows keep their meaning).
"""

from __future__ import annotations

import math
from collections.abc import Callable

from auditor.config import Thresholds

EPS = 1e-9
(UNKNOWN, IDLE, IDLE_BY_UTIL, MIRAGE, LOW, WORKING, BUSY_UNVERIFIED, IDLE_BY_COUNTERS, BUSY_BY_COUNTERS,
 ENGINE_SPIN) = range(10)
NAMES = {UNKNOWN: "unknown", IDLE: "idle", IDLE_BY_UTIL: "idle_by_util", MIRAGE: "mirage", LOW: "low",
         WORKING: "working", BUSY_UNVERIFIED: "busy_unverified", IDLE_BY_COUNTERS: "idle_by_counters",
         BUSY_BY_COUNTERS: "busy_by_counters", ENGINE_SPIN: "engine_spin"}
#: verdicts whose seconds count as idle (idle_s includes idle-by-util and idle-by-counters; mirage is billed
#: as idle too)
IDLE_CODES = (IDLE, IDLE_BY_UTIL, MIRAGE, IDLE_BY_COUNTERS)
#: SM-verified verdicts (the GPU reported SM activity)
VERIFIED_CODES = (IDLE, MIRAGE, LOW, WORKING)
#: verdicts of the stock-counter tier (no SM activity; GR engine with Tensor or DRAM)
COUNTER_CODES = (IDLE_BY_COUNTERS, BUSY_BY_COUNTERS, ENGINE_SPIN)
#: verdicts of the GPU-Util tier (low confidence)
UTIL_CODES = (IDLE_BY_UTIL, BUSY_UNVERIFIED)
#: evidence tier -> its verdicts, strongest first (docs/definitions.md "Evidence tiers")
TIERS = {"sm_active": VERIFIED_CODES, "counters": COUNTER_CODES, "gpu_util": UTIL_CODES}

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


def counters_measured(c: Col) -> str:
    """The stock-counter tier applies: the GR engine and Tensor or DRAM activity were read (what the GPU
    Operator's dcgm-exporter ships on, SM activity off; MIG instances report them per instance)."""
    return (f"{c('gr_engine')} IS NOT NULL AND ({c('tensor_active')} IS NOT NULL"
            f" OR {c('dram_active')} IS NOT NULL)")


def counters_busy(th: Thresholds, c: Col) -> str:
    """Tensor or DRAM activity at or above its idle threshold: work (a missing reading is not busy; only
    used as a WHEN condition)."""
    return (f"({at_least(c('tensor_active'), th.idle_tensor)}"
            f" OR {at_least(c('dram_active'), th.idle_dram)})")


def counters_case(th: Thresholds, c: Col) -> str:
    """The stock-counter tier's verdict (inside :func:`counters_measured`): work, idle, or an engine spin."""
    return (f"CASE WHEN {counters_busy(th, c)} THEN {BUSY_BY_COUNTERS}"
            f" WHEN {below(c('gr_engine'), th.idle_gr_engine)} THEN {IDLE_BY_COUNTERS} ELSE {ENGINE_SPIN} END")


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
            f" WHEN {counters_measured(c)} THEN {counters_case(th, c)}"
            f" WHEN {idle_by_util(th, c)} THEN {IDLE_BY_UTIL} ELSE {BUSY_UNVERIFIED} END")


def in_codes(expr: str, codes: tuple[int, ...]) -> str:
    return f"{expr} IN ({', '.join(str(x) for x in codes)})"
