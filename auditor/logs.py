"""Logging: one line per event; user-controlled text has control characters escaped so a job name cannot
forge log lines."""

from __future__ import annotations

import logging
import re

_CTRL = re.compile(r"[\x00-\x1f\x7f]")


def log_safe(text: object) -> str:
    """Escape control characters (newlines included) in text that came from users or schedulers."""
    return _CTRL.sub(lambda m: f"\\x{ord(m.group()):02x}", str(text))


class _SafeFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        record.msg = log_safe(record.getMessage())
        record.args = None
        return super().format(record)


def setup_logging(level: int = logging.INFO) -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(_SafeFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S"))
    root = logging.getLogger("gpu_audit")
    root.handlers[:] = [handler]
    root.setLevel(level)
    root.propagate = True  # handlers above (none in the CLI; pytest's caplog in tests) see records too
