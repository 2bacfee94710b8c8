"""The one retry policy every source uses (tenacity): transient :class:`SourceError` only, exponential
backoff (1 s, 2 s, ...) or the server's ``Retry-After`` when longer, and a time budget per source shared by
every retry made while collecting it, so a dead source costs about :data:`SOURCE_BUDGET_S`, never
attempts x attempts x timeouts.

No retry loop runs inside another: an error that was already retried where it happened (one HTTP request of
a Prometheus collection) leaves marked ``retried`` and the collector does not retry the whole source for it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextvars import ContextVar
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import TypeVar

from tenacity import RetryCallState, Retrying, retry_if_exception, stop_after_attempt, stop_before_delay

from auditor.errors import SourceError

T = TypeVar("T")

RETRIES = 3  # attempts of a source (the collector) or of one request (connectors that retry requests)
BACKOFF_S = 1.0  # first wait; doubles each retry
SOURCE_BUDGET_S = 120.0  # seconds one source may spend on failing attempts and waits, all retries together
MAX_RETRY_AFTER_S = 300.0  # a longer Retry-After is not waited for: the next collection comes sooner

#: monotonic time by which the source being collected must give up retrying (set by the collector)
_deadline: ContextVar[float | None] = ContextVar("gpu_audit_retry_deadline", default=None)


def retry_after(value: str | None, now: datetime | None = None) -> float | None:
    """Seconds from a ``Retry-After`` header (delta-seconds or an HTTP date); None when absent or garbage."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, min(float(value), MAX_RETRY_AFTER_S)) if value.replace(".", "", 1).isdigit() else \
            max(0.0, min((parsedate_to_datetime(value) - (now or datetime.now(UTC))).total_seconds(),
                         MAX_RETRY_AFTER_S))
    except (TypeError, ValueError, OverflowError):
        return None


def _retryable(exc: BaseException) -> bool:
    return isinstance(exc, SourceError) and exc.transient and not getattr(exc, "retried", False)


def _waiter(backoff_s: float | None) -> Callable[[RetryCallState], float]:
    def wait(state: RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome else None
        base = (BACKOFF_S if backoff_s is None else backoff_s) * 2 ** (state.attempt_number - 1)
        hinted = getattr(exc, "retry_after", None)
        return max(base, hinted) if hinted is not None else base

    return wait


def call(fn: Callable[[], T], *, attempts: int = RETRIES, sleep: Callable[[float], None] = time.sleep,
         before_retry: Callable[[int, BaseException, float], None] | None = None,
         backoff_s: float | None = None) -> T:
    """``fn()`` with the policy; the last error is raised marked ``retried`` when a retry was possible.

    ``before_retry(attempt, error, wait_s)`` is told of each retry (the collector logs it)."""
    deadline = _deadline.get()
    budget = max(0.0, deadline - time.monotonic()) if deadline is not None else SOURCE_BUDGET_S

    def log_it(state: RetryCallState) -> None:
        if before_retry and state.outcome and state.next_action:
            before_retry(state.attempt_number, state.outcome.exception(), state.next_action.sleep)

    retrying = Retrying(stop=stop_after_attempt(max(1, attempts)) | stop_before_delay(budget),
                        wait=_waiter(backoff_s), retry=retry_if_exception(_retryable), sleep=sleep, reraise=True,
                        before_sleep=log_it)
    try:
        return retrying(fn)
    except SourceError as exc:
        if exc.transient and attempts > 1:
            exc.retried = True  # type: ignore[attr-defined]
        raise


class budget:  # noqa: N801 - used as ``with retry.budget(seconds):``
    """Context manager: every :func:`call` inside shares one deadline ``seconds`` from now."""

    def __init__(self, seconds: float = SOURCE_BUDGET_S) -> None:
        self.seconds = seconds
        self._token = None

    def __enter__(self) -> budget:
        self._token = _deadline.set(time.monotonic() + self.seconds)  # type: ignore[assignment]
        return self

    def __exit__(self, *_exc: object) -> None:
        if self._token is not None:
            _deadline.reset(self._token)
