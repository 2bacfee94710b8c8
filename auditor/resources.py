"""Where the shipped resources are: templates (the report, the e-mails, the web UI), migrations and the deploy
files. The wheel puts them under ``auditor/<name>`` (pyproject.toml ``package-dir``); a source checkout has
them at the top level (templates/, migrations/, deploy/), where a reader looks for them."""

from __future__ import annotations

from pathlib import Path

from auditor.errors import GpuAuditError


def resource_dir(name: str) -> Path:
    """Directory of a shipped resource (``templates``, ``migrations``, ``deploy``): ``auditor/<name>`` in a
    wheel, ``<checkout>/<name>`` in a source checkout."""
    here = Path(__file__).resolve().parent  # auditor/
    for candidate in (here / name, here.parent / name):
        if candidate.is_dir():
            return candidate
    raise GpuAuditError(f"resource directory {name!r} not found next to {here}")
