"""Wall-clock seconds per audit step, so a slow audit says where its time went.

The audit opens one :class:`Steps` per run (``run_audit``); its steps and the finding rules call
:func:`step`. The split is logged at DEBUG (``gpu_audit.audit``), kept on the run's result and printed by
``python -m bench`` beside each audit time.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from contextvars import ContextVar

log = logging.getLogger("gpu_audit.audit")


class Steps:
    """Seconds per step name, in the order the steps first ran (a repeated step adds up)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def step(self, name: str) -> Iterator[None]:
        watcher = _watcher.get()
        if watcher is not None:  # the CLI's progress line on a terminal
            watcher(name)
        t = time.perf_counter()
        try:
            yield
        finally:
            spent = time.perf_counter() - t
            self.seconds[name] = self.seconds.get(name, 0.0) + spent
            log.debug("audit step %s: %.3f s", name, spent)


#: The running audit's split. A context variable, not a module global: two audits at once in one process
#: (the daemon's and a what-if run's, in two threads) each time into their own split.
_current: ContextVar[Steps | None] = ContextVar("gpu_audit_steps", default=None)


#: Told the name of each step as it starts, in this thread (``gpu-audit audit`` on a terminal shows it)
_watcher: ContextVar[Callable[[str], None] | None] = ContextVar("gpu_audit_step_watcher", default=None)


def watch(fn: Callable[[str], None] | None) -> None:
    """Have ``fn`` told each audit step's name as it starts in this thread or task (None: stop)."""
    _watcher.set(fn)


def start() -> Steps:
    """A fresh split for a new audit run in this thread or task (the last one stays readable through its
    result)."""
    steps = Steps()
    _current.set(steps)
    return steps


def step(name: str) -> AbstractContextManager[None]:
    """Time ``name`` into the current audit's split (nothing outside an audit, e.g. a finding rule called
    on its own)."""
    steps = _current.get()
    return steps.step(name) if steps is not None else nullcontext()
