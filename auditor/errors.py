"""Named exceptions: the CLI turns each into one line (sqlite-utils style); nothing else escapes."""

from __future__ import annotations

#: Exit codes of every command, `gpu-audit run` and the daemon's steps included (docs/operations.md): 0 ok;
#: 1 an error; 3 the run finished but some cluster sources failed (partial)
EXIT_OK, EXIT_ERROR, EXIT_PARTIAL = 0, 1, 3


class GpuAuditError(Exception):
    """Base of every error gpu-audit raises on purpose; the CLI prints it as one line."""


class ConfigError(GpuAuditError):
    """The configuration file is missing, unreadable or invalid; the message names the key path."""


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
