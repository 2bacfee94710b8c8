"""Named exceptions: the CLI turns each into one line (sqlite-utils style); nothing else escapes."""

from __future__ import annotations


class GpuAuditError(Exception):
    """Base of every error gpu-audit raises on purpose; the CLI prints it as one line."""


class ConfigError(GpuAuditError):
    """The configuration file is missing, unreadable or invalid; the message names the key path."""


class InputError(GpuAuditError):
    """One input record is malformed. Carries where it came from so the user can find it."""

    def __init__(self, source: str, location: str, reason: str) -> None:
        self.source, self.location, self.reason = source, location, reason
        super().__init__(f"{source}:{location}: {reason}" if location else f"{source}: {reason}")


class SourceError(GpuAuditError):
    """A whole source (scheduler, API, exporter) failed: down, slow, refused or answered garbage."""

    def __init__(self, source: str, reason: str, *, transient: bool = False,
                 retry_after: float | None = None) -> None:
        self.source, self.reason, self.transient = source, reason, transient
        self.retry_after = retry_after  # seconds the server asked us to wait (Retry-After), if it did
        self.retried = False  # set once the retry policy has spent its attempts on it
        super().__init__(f"{source}: {reason}")


class StoreError(GpuAuditError):
    """The SQL store is unreachable, not migrated, or rejected a write."""
