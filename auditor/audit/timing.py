"""Wall-clock seconds per audit step, so a slow audit says where its time went.

The audit opens one :class:`Steps` per run (``run_audit``); its steps and the finding rules call
:func:`step`. The split is logged at DEBUG (``gpu_audit.audit``), kept on the run's result and printed by
``python -m bench`` beside each audit time.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager

log = logging.getLogger("gpu_audit.audit")


class Steps:
    """Seconds per step name, in the order the steps first ran (a repeated step adds up)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def step(self, name: str) -> Iterator[None]:
        t = time.perf_counter()
        try:
            yield
        finally:
            spent = time.perf_counter() - t
            self.seconds[name] = self.seconds.get(name, 0.0) + spent
            log.debug("audit step %s: %.3f s", name, spent)


_current = Steps()


def start() -> Steps:
    """A fresh split for a new audit run (the last one stays readable through its result)."""
    global _current
    _current = Steps()
    return _current


def step(name: str) -> contextmanager:  # type: ignore[valid-type]
    """Time ``name`` into the current audit's split."""
    return _current.step(name)
