"""Every file gpu-audit writes for people (chargeback, report exports) goes through :func:`open_output`, so
no output destroys what it writes to.

A regular file (or a path not there yet) is replaced atomically: written beside it and renamed over it, so
finance never reads half a file; the old file's permission bits are kept. A symbolic link is followed to
its final target and that target is treated the same way, so the link stays a link (a share mounted
through it gets the file). A character or block device or a FIFO (``--out /dev/null``, a pipe) is written
through, never replaced. A directory or a socket is refused with one line.

That is for an output path the user named (``chargeback --out FILE``). A file gpu-audit names itself in a
directory (``report-<run>.html`` in report.out_dir, the findings CSV) is written only where no file is, or over
one gpu-audit recorded writing there (:mod:`auditor.owned`), and recorded when done: ``named=False``."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import IO, Any

from auditor import owned
from auditor.errors import GpuAuditError


def _kind(path: Path) -> tuple[str, os.stat_result | None]:
    """("absent" | "regular" | "through" | what it is that cannot be written, its lstat)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return "absent", None
    except OSError as exc:
        raise GpuAuditError(f"cannot write {path}: {exc.strerror}") from None
    mode = st.st_mode
    if stat.S_ISREG(mode):
        return "regular", st
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) or stat.S_ISFIFO(mode):
        return "through", st
    if stat.S_ISDIR(mode):
        return "a directory", st
    if stat.S_ISSOCK(mode):
        return "a socket", st
    return "not a regular file", st


def target(path: Path) -> tuple[Path, str, os.stat_result | None]:
    """Where writing ``path`` lands (a link's final target), how ("absent", "regular" or "through"), and its
    stat; refuses what cannot be written with one line."""
    real = Path(os.path.realpath(path)) if os.path.islink(path) else path
    kind, st = _kind(real)
    if kind not in ("absent", "regular", "through"):
        shown = f"{path} (a link to {real})" if real != path else str(path)
        raise GpuAuditError(f"cannot write {shown}: it is {kind}")
    return real, kind, st


def open_output(path: Path, stack: ExitStack, *, named: bool) -> IO[str]:
    """A text handle for ``path``, finished when ``stack`` closes: renamed over a regular (or absent) target
    when the block ended without error (the temporary removed otherwise), written straight into a device or
    FIFO. ``named``: the user named ``path``; otherwise it must be absent or gpu-audit's own (refused in one
    line before anything is written), and is recorded as gpu-audit's once written."""
    if not named:
        owned.check(path.parent, [path])
    real, kind, st = target(path)
    if kind == "through":
        try:
            return stack.enter_context(open(real, "w", newline="", encoding="utf-8"))  # noqa: SIM115
        except OSError as exc:
            raise GpuAuditError(f"cannot write {path}: {exc.strerror}") from None
    tmp = real.with_name(f".{real.name}.{os.getpid()}.tmp")
    try:
        fh = open(tmp, "w", newline="", encoding="utf-8")  # noqa: SIM115 - closed by the callback below
    except OSError as exc:
        raise GpuAuditError(f"cannot write {path}: {exc.strerror} ({tmp.parent})") from None
    if st is not None:  # the replaced file's permission bits, not the umask's
        os.chmod(fh.fileno(), stat.S_IMODE(st.st_mode))

    def finish(exc_type: Any, *_: Any) -> None:
        fh.close()
        if exc_type is None:
            os.replace(tmp, real)
            if not named:
                owned.record(path.parent, [path])
        else:
            tmp.unlink(missing_ok=True)

    stack.push(lambda et, ev, tb: finish(et))
    return fh


@contextmanager
def output(path: Path, *, named: bool) -> Iterator[IO[str]]:
    """:func:`open_output` as a ``with`` block of its own."""
    with ExitStack() as stack:
        yield open_output(path, stack, named=named)


def write_text(path: Path, body: str, *, named: bool) -> Path:
    """Write ``body`` to ``path`` by the rules above; returns ``path``."""
    with output(path, named=named) as fh:
        fh.write(body)
    return path
