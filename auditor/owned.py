"""The one rule for files gpu-audit writes into a directory (issue 44): never delete or replace a file gpu-audit
did not write, except an output path the user named (``chargeback --out FILE``).

Each directory gpu-audit writes files into on its own account (the demo's --out, a report directory, the
notify outbox, a fleet export root) holds a manifest, :data:`MANIFEST`, recording every file it wrote there:
its path relative to the directory and the SHA-256 of what was written (a store file, which the database
keeps changing, is recorded without a digest). A file may be replaced or removed only when it is absent, or
recorded with the digest it still has: a file a user put there, or one a user changed since, is refused in
one line. :func:`claim` is stricter, for the demo: it writes only into a directory it made (or an empty one
it then marks as its own)."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

from auditor.errors import GpuAuditError

#: The manifest of the files gpu-audit wrote into a directory
MANIFEST = ".gpu-audit-files.json"
#: Recorded instead of a digest for a file another program keeps writing (the demo's SQLite store)
STORE = "store"


def digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _read(root: Path) -> dict[str, str] | None:
    """The recorded files of ``root`` (relative path -> digest or STORE), None without a manifest."""
    try:
        doc = json.loads((root / MANIFEST).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise GpuAuditError(f"cannot read {root / MANIFEST}: {exc}") from None
    files = doc.get("files") if isinstance(doc, dict) else None
    if not isinstance(files, dict):
        raise GpuAuditError(f"{root / MANIFEST} is not a gpu-audit manifest")
    return {str(k): str(v) for k, v in files.items()}


@contextlib.contextmanager
def _locked(root: Path) -> Iterator[None]:
    """An exclusive lock on ``root`` itself (writers into one export root from several processes)."""
    fd = os.open(root, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _write(root: Path, files: dict[str, str]) -> None:
    tmp = root / f".{MANIFEST}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps({"tool": "gpu-audit", "files": dict(sorted(files.items()))}, indent=1) + "\n",
                   encoding="utf-8")
    os.replace(tmp, root / MANIFEST)


def _rel(root: Path, path: Path) -> str:
    try:
        return path.relative_to(root).as_posix()
    except ValueError:
        raise GpuAuditError(f"{path} is not under {root}") from None


def owns(root: Path, path: Path, files: dict[str, str] | None = None) -> bool:
    """Whether gpu-audit wrote ``path`` (under ``root``) and it still holds what was written."""
    files = _read(root) if files is None else files
    want = (files or {}).get(_rel(root, path))
    if want is None or not os.path.lexists(path) or os.path.islink(path) or not path.is_file():
        return False
    return want == STORE or want == digest(path)


def _refusal(root: Path, path: Path) -> GpuAuditError:
    return GpuAuditError(f"refusing to replace {path}: gpu-audit did not write it (it is not recorded in "
                         f"{root / MANIFEST}, or was changed since); move it away or write elsewhere")


def _user_placed(path: Path) -> bool:
    """A symbolic link, device or FIFO a user put at the name gpu-audit writes: the user's way of naming where
    that file goes (auditor.report.outfile writes through it and never replaces it)."""
    return os.path.islink(path) or (os.path.exists(path) and not path.is_file() and not path.is_dir())


def check(root: Path, paths: Iterable[Path]) -> None:
    """Refuse (one line, before anything is written) when one of ``paths`` is a file gpu-audit did not write
    (or a directory)."""
    files = _read(root) if root.is_dir() else None
    for p in paths:
        if os.path.lexists(p) and not _user_placed(p) and not owns(root, p, files):
            raise _refusal(root, p)


def record(root: Path, paths: Iterable[Path], *, store: bool = False) -> None:
    """Record ``paths`` (written just now under ``root``) in its manifest, with their digests."""
    root.mkdir(parents=True, exist_ok=True)
    with _locked(root):
        files = _read(root) or {}
        for p in paths:
            if not _user_placed(p):
                files[_rel(root, p)] = STORE if store else digest(p)
        _write(root, files)


def remove(root: Path, paths: Iterable[Path]) -> list[Path]:
    """Delete those of ``paths`` that gpu-audit wrote (and forget them); any other file is left as it is.
    Returns what was deleted."""
    if not root.is_dir():
        return []
    gone = []
    with _locked(root):
        files = _read(root) or {}
        for p in paths:
            if owns(root, p, files):
                p.unlink()
                gone.append(p)
            if not os.path.lexists(p):
                files.pop(_rel(root, p), None)
        if _read(root) is not None:
            _write(root, files)
    return gone


def recorded(root: Path) -> list[Path]:
    """The files recorded in ``root``'s manifest (whether or not they are still there)."""
    return [root / k for k in (_read(root) or {})] if root.is_dir() else []


def claim(root: Path, what: str) -> None:
    """Make ``root`` a directory gpu-audit may write into for ``what`` (e.g. "the demo"): created here, an
    empty one marked as gpu-audit's, or one that holds a manifest already. Anything else (a directory of a
    user's files, a file) is refused in one line."""
    if os.path.lexists(root) and not root.is_dir():
        raise GpuAuditError(f"{root} exists and is not a directory")
    if not root.exists():
        try:
            root.mkdir(parents=True)
        except OSError as exc:
            raise GpuAuditError(f"cannot create {root}: {exc.strerror}") from None
    if _read(root) is not None:
        return
    there = sorted(p.name for p in root.iterdir())
    if there:
        shown = ", ".join(there[:3]) + (f" and {len(there) - 3} more" if len(there) > 3 else "")
        raise GpuAuditError(f"{root} holds files gpu-audit did not write ({shown}): {what} writes only into a new "
                            f"or empty directory, or one it made (marked by {MANIFEST}); choose another directory")
    _write(root, {})
