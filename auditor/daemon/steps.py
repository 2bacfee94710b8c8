"""The pipeline's step names, in run order (a module of its own: `gpu-audit run --help` names them without
importing the pipeline and the store)."""

from __future__ import annotations

STEPS = ("collect", "audit", "report", "notify", "enforce", "chargeback")
