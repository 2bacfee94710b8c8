"""Worker targets for tests/test_collect_parallel.py, importable by a spawned worker process."""

from __future__ import annotations

import os
from typing import Any


def dying_worker(send: Any, url: str, batch_rows: int, cfg: Any, name: str, *rest: Any) -> None:
    """The real worker, except that cluster ``c2``'s process dies at once (an OOM kill, a segfault)."""
    if name == "c2":
        os._exit(9)
    from auditor.collect import _worker

    _worker(send, url, batch_rows, cfg, name, *rest)
