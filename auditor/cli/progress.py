"""Progress of long work on a terminal (rich): ``collect`` shows the source being read, its records (rows)
and their rate,
and the sources done with an ETA; ``audit`` shows the step it is in. Only when stderr is a terminal: under
cron, a pipe or ``--json`` nothing is drawn, and each source is summed up once, on its own output line.

The bar is transient: when the work ends it is erased, so what stays on the screen is the summary lines."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import click


def on_terminal(as_json: bool) -> bool:
    """Whether to draw progress: stderr is a terminal and the output is for a person."""
    return not as_json and click.get_text_stream("stderr").isatty()


class CollectProgress:
    """The ``progress`` callback of :func:`auditor.collect.collect` drawn as one live line: the source being
    read with its rows so far and rows per second, and a bar of sources done (of ``sources``) with an ETA."""

    def __init__(self, sources: int, console: Any = None) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            SpinnerColumn,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self.bar = Progress(SpinnerColumn(), TextColumn("collecting {task.description}"), BarColumn(),
                            MofNCompleteColumn(), TextColumn("sources"), TextColumn("{task.fields[rows]}"),
                            TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
                            console=console or Console(stderr=True), transient=True)
        self.task = self.bar.add_task("", total=max(sources, 1), rows="")
        self.since = time.monotonic()  # when the source being read began: when the one before it ended
        self.done: set[str] = set()

    def __call__(self, what: str, n: int, done: bool) -> None:
        now = time.monotonic()
        rate = n / max(now - self.since, 1e-3)
        first = done and what not in self.done  # a retried source reports its end once per attempt
        if first:
            self.done.add(what)
            self.since = now
        # drawn now, not at rich's next tick: a fast source would otherwise show only its end (one redraw per
        # report, and a source reports every 5,000 records)
        self.bar.update(self.task, description=what, rows=f"{n:,} records ({rate:,.0f}/s)",
                        advance=1 if first else 0, refresh=not done)

    def __enter__(self) -> CollectProgress:
        self.since = time.monotonic()
        self.bar.start()
        self.logs = _logs_above(self.bar)
        self.logs.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.logs.__exit__(None, None, None)
        self.bar.stop()


@contextmanager
def _logs_above(bar: Any) -> Iterator[None]:
    """While ``bar`` is drawn, log lines go through its console (printed above the bar, not through it): rich
    swaps sys.stderr for a proxy while it draws, and gpu-audit's log handler writes to the stream it had."""
    import sys

    handlers = [h for h in logging.getLogger("gpu_audit").handlers
                if isinstance(h, logging.StreamHandler) and h.stream is sys.__stderr__]
    for h in handlers:
        h.setStream(sys.stderr)
    try:
        yield
    finally:
        for h in handlers:
            h.setStream(sys.__stderr__)


@contextmanager
def collect_progress(as_json: bool, sources: int) -> Iterator[CollectProgress | None]:
    """A :class:`CollectProgress` on a terminal, else None (no progress at all). The per-source summary the
    collector logs (for the daemon) is held back meanwhile: the command prints it as its own line."""
    from auditor.collect import SUMMARY

    key = next(iter(SUMMARY))
    quiet = _Drop(key)
    handlers = logging.getLogger("gpu_audit").handlers
    for h in handlers:
        h.addFilter(quiet)
    try:
        if on_terminal(as_json):
            with CollectProgress(sources) as p:
                yield p
        else:
            yield None
    finally:
        for h in handlers:
            h.removeFilter(quiet)


class _Drop(logging.Filter):
    """Drops the log records marked with ``key`` (set through ``extra``)."""

    def __init__(self, key: str) -> None:
        super().__init__()
        self.key = key

    def filter(self, record: logging.LogRecord) -> bool:
        return not getattr(record, self.key, False)


@contextmanager
def audit_progress(as_json: bool, what: str = "auditing") -> Iterator[None]:
    """On a terminal, a live line naming the audit step under way and the time spent; nothing otherwise."""
    from auditor.audit import timing

    if not on_terminal(as_json):
        yield
        return
    from rich.console import Console
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    bar = Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                   console=Console(stderr=True), transient=True)
    task = bar.add_task(what, total=None)

    def step(name: str) -> None:
        bar.update(task, description=f"{what}: {name}")
        bar.refresh()  # each step is drawn, however short

    timing.watch(step)
    try:
        with bar, _logs_above(bar):
            yield
    finally:
        timing.watch(None)
