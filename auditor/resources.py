"""Where the shipped resources are: templates (the report, the e-mails, the web UI), migrations and the deploy
files, all inside the package (``auditor/templates``, ``auditor/migrations``, ``auditor/deploy``), so a wheel
and a source checkout find them in the same place. The checkout's top-level ``templates/``, ``migrations/`` and
``deploy/`` are links to them, where a reader looks first."""

from __future__ import annotations

from pathlib import Path

from auditor.errors import GpuAuditError


def resource_dir(name: str) -> Path:
    """Directory of a shipped resource (``templates``, ``migrations``, ``deploy``): ``auditor/<name>``."""
    path = Path(__file__).resolve().parent / name
    if not path.is_dir():
        raise GpuAuditError(f"resource directory {name!r} not found in {path.parent} (a broken install?)")
    return path
