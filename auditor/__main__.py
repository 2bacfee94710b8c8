"""``python -m auditor`` is ``gpu-audit``."""

from auditor.cli import main

main()
