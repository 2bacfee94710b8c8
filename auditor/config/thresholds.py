"""The thresholds of the verdict and the finding rules (``[thresholds]``; docs/definitions.md says what
each one decides). One model, used by every rule and recorded with each audit run."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field

from auditor.config.base import Strict

#: Node event kinds (:data:`auditor.records.NODE_EVENT_KINDS`)
InfraKind = Literal["xid", "throttle", "ecc_dbe", "row_remap", "drain", "down", "not_ready", "cordoned"]


class Thresholds(Strict):
    """Verdict and finding rules a site decides (docs/definitions.md); the rules' other constants are named in
    their own modules (issue 45: :data:`auditor.config.retired.RETIRED` lists them). Comparisons use a 1e-9
    tolerance: a value exactly at a threshold is not below it, even after a unit conversion."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    idle_sm: float = Field(0.05, ge=0, le=1, description="SM activity below this is idle.")
    idle_dram: float = Field(0.05, ge=0, le=1, description="...and DRAM activity below this.")
    idle_tensor: float = Field(0.01, ge=0, le=1, description="...and Tensor activity below this.")
    mirage_gpu_util: float = Field(0.5, ge=0, le=1, description="An idle bucket whose GPU-Util (0-1) is "
                                   "at least this is a mirage: reads busy, does no work.")
    mirage_gr_engine: float = Field(0.5, ge=0, le=1, description="...or whose GR engine activity is.")
    working_sm: float = Field(0.5, ge=0, le=1, description="SM activity at or above this is working; "
                              "between idle_sm and this is low.")
    idle_gr_engine: float = Field(0.05, ge=0, le=1, description="Stock counters (no SM activity; GR engine "
                                  "with Tensor or DRAM): GR engine activity below this, Tensor and DRAM below "
                                  "idle_tensor and idle_dram, is idle-by-counters; at or above it with Tensor "
                                  "and DRAM below theirs, an engine spin (never verified work).")
    util_fallback: bool = Field(True, description="Judge GPUs without profiling fields by GPU-Util "
                                "(low-confidence verdict idle-by-util). Off: such buckets are "
                                "busy_unverified (observed, never idle).")
    idle_util: float = Field(0.05, ge=0, le=1, description="Fallback: GPU-Util below this is idle-by-util.")
    idle_power_w: float | None = Field(None, ge=0, description="Fallback: and power below this (W); "
                                       "unset = power not required.")
    idle_allocation_fraction: float = Field(0.8, ge=0, le=1, description="idle_allocation: share of "
                                            "observed reserved time that is idle or mirage.")
    idle_allocation_min_gpu_hours: float = Field(1.0, ge=0, description="idle_allocation: minimum "
                                                 "reserved GPU-hours.")
    idle_gpus_fraction: float = Field(0.8, ge=0, le=1, description="idle_gpus: a GPU idle this share of "
                                      "its observed time while another GPU of the allocation works.")
    idle_gpus_worked_fraction: float = Field(0.5, ge=0, le=1, description="idle_gpus: a GPU counts as "
                                             "busy when low, working or busy-unverified this share of its "
                                             "observed time.")
    mirage_min_minutes: float = Field(30, ge=0, description="util_mirage (and hung_collective, ghost_busy): "
                                      "minimum mirage minutes of one GPU.")
    unmonitored_coverage: float = Field(0.5, ge=0, le=1, description="unmonitored: observed share of "
                                        "reserved time below this.")
    episode_hours: float = Field(2.0, gt=0, description="idle_episode: minimum contiguous idle span.")
    low_efficiency_sm: float = Field(0.25, ge=0, le=1, description="low_efficiency: mean SM activity "
                                     "below this.")
    low_efficiency_min_gpu_hours: float = Field(4.0, ge=0, description="low_efficiency: minimum observed "
                                                "GPU-hours.")
    min_finding_gpu_hours: float = Field(0.1, ge=0, description="Findings about fewer reserved GPU-hours "
                                         "than this are not listed (e.g. unmonitored 9-second array tasks).")
    infra_kinds: list[InfraKind] = Field(["xid", "throttle", "ecc_dbe", "row_remap", "drain", "down", "not_ready",
                                          "cordoned"], description="Node event kinds whose intervals are "
                                         "infrastructure-affected (their reserved time is `infra`, never idle "
                                         "and in no user finding); leave one out to judge its time as usual.")
    goodput_target: float = Field(0.9, ge=0, le=1, description="Goodput: the useful-time share the report "
                                  "compares each team against (Meta's Llama 3 run: above 90 %).")

    @classmethod
    def of_run(cls, stored: dict[str, Any] | None) -> Thresholds:
        """The thresholds an audit run recorded (``audit_runs.thresholds``): a run recorded before a threshold
        became a constant (issue 45) also holds that key, which is not a threshold any more and is left out."""
        return cls(**{k: v for k, v in (stored or {}).items() if k in cls.model_fields})
