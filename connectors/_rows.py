"""Row readers for the file connector: CSV, JSON / JSON Lines and saved ``sacct -P`` output, each yielding
(location, row) with a string in place of a row that could not be read, so the caller quarantines that one
record and carries on."""

from __future__ import annotations

import csv
import glob
import json
import logging
import os
import stat
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

from auditor.errors import SourceError
from auditor.records import Allocation
from auditor.timeutil import parse_time
from connectors.base import Context, Problems

MAX_FILE_BYTES = 256 * 1024 * 1024  # a scrape or saved listing larger than this is not one
READ_TIME_LIMIT_S = 60.0  # reading one file longer than this (a stalled network mount) is an error


def fixed_dir(pattern: Path) -> Path:
    """The directory part of a glob pattern before its first wildcard (``/a/b/*/x*.prom`` -> ``/a/b``)."""

    parts = pattern.parts
    for i, part in enumerate(parts):
        if glob.has_magic(part):
            return Path(*parts[:i]) if i else Path(".")
    return pattern.parent


def check_regular(path: Path, inside: Path | None = None) -> None:
    """Only regular files are read: a FIFO would block forever, ``/dev/zero`` never ends, a directory is
    no file. Links are followed to what they point at, which must be a regular file too and, for a file a
    glob pattern found (``inside`` = the pattern's directory), stay inside that directory."""
    if inside is not None:
        try:
            path.resolve().relative_to(inside.resolve())
        except ValueError:
            raise SourceError(str(path), f"a link leading outside {inside}; not read") from None
        except OSError as exc:
            raise SourceError(str(path), f"cannot read: {exc.strerror}") from None
    try:
        st = path.stat()
    except FileNotFoundError:
        raise SourceError(str(path), "no such file") from None
    except OSError as exc:
        raise SourceError(str(path), f"cannot read: {exc.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        what = "a FIFO" if stat.S_ISFIFO(st.st_mode) else "a directory" if stat.S_ISDIR(st.st_mode) else \
            "a device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) else "not a regular file"
        raise SourceError(str(path), f"not a regular file ({what}{', through a link' if path.is_symlink() else ''})")


def read_bounded(path: Path, max_bytes: int = MAX_FILE_BYTES, time_limit_s: float = READ_TIME_LIMIT_S) -> bytes:
    """The whole of a regular file, at most ``max_bytes``, read within ``time_limit_s``. Opened without
    blocking (a file swapped for a FIFO after the check cannot hang the open) and checked again on the
    open descriptor."""
    check_regular(path)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        raise SourceError(str(path), f"cannot read: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise SourceError(str(path), "not a regular file")
        deadline = time.monotonic() + time_limit_s
        chunks: list[bytes] = []
        size = 0
        while chunk := f.read(1 << 20):
            size += len(chunk)
            if size > max_bytes:
                raise SourceError(str(path), f"larger than {max_bytes:,} bytes; not read")
            if time.monotonic() > deadline:
                raise SourceError(str(path), f"not read within {time_limit_s:g} s", transient=True)
            chunks.append(chunk)
    return b"".join(chunks)


log = logging.getLogger("gpu_audit.input")


def read_sacct_file(path: Path, cluster: str, problems: Problems) -> Iterator[tuple[str, Allocation]]:
    """Saved ``sacct -P`` output (header line first), through the Slurm connector's own parser.
    Jobs that held no GPU are not allocations and are passed over silently."""
    from connectors.slurm.jobs import from_sacct_row, sacct_rows

    try:
        text = read_bounded(path).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SourceError(str(path), f"cannot read: {exc}") from None
    cpu_only, first = 0, first_data_line(text)
    for lineno, row in sacct_rows(text):
        loc = f"line {lineno}"
        if isinstance(row, str):
            problems.skip(str(path), loc, "wrong number of '|'-separated fields for the header", row)
            continue
        if lineno == first:
            check_sacct_header(path, list(row))
        if "." in (row.get("JobID") or ""):
            continue  # a step line (sacct without -X): its job's own line carries the allocation
        try:
            alloc = from_sacct_row(row, cluster)
        except (ValueError, KeyError, TypeError, ArithmeticError, RecursionError) as exc:
            problems.skip(str(path), loc, str(exc).strip("'") or type(exc).__name__, "|".join(row.values()))
            continue
        if alloc.gpus:
            yield loc, alloc
        elif alloc.start is not None:  # a job that never started holds nothing yet
            cpu_only += 1
    if cpu_only:
        log.info("%s: %d jobs without GPUs (CPU-only) skipped", path, cpu_only)


def first_data_line(text: str) -> int:
    """Line number of the first row after the header (captured ``$ cmd`` lines and blanks skipped)."""
    seen_header = False
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.startswith("$ ") or line.strip().startswith("[rc="):
            continue
        if seen_header:
            return n
        seen_header = True
    return 0


def check_sacct_header(path: Path, columns: list[str]) -> None:
    """A header without the columns a job needs is a one-line error naming them, not N bad records."""
    from connectors.slurm.jobs import SACCT_FIELDS

    missing = [c for c in ("Start", "End", "NodeList", "AllocTRES") if c not in columns]
    if not ({"JobID", "JobIDRaw"} & set(columns)):
        missing.insert(0, "JobID")
    if missing:
        raise SourceError(str(path), f"sacct header lacks {', '.join(missing)} (expected columns: "
                          f"{','.join(SACCT_FIELDS)}; save `sacct -P -X -o {','.join(SACCT_FIELDS)}` "
                          f"with its header line); header seen: {'|'.join(columns)[:120]}")


def read_rows(path: Path, fmt: str) -> Iterator[tuple[str, dict[str, Any] | str]]:
    """Rows with their location ("line 12" / "item 3"); a string instead of a row is a parse error.
    A BOM is accepted; an undecodable or oversized line costs that line only, never the rest of the file."""
    check_regular(path)
    try:
        handle = path.open(encoding="utf-8-sig", errors="replace", newline="")
    except OSError as exc:
        raise SourceError(str(path), f"cannot read: {exc.strerror}") from None
    with handle:
        if fmt == "csv":
            yield from csv_rows(handle)
            return
        text = handle.read()
    stripped = text.lstrip()
    if stripped.startswith("["):
        try:
            items = json.loads(text)
        except json.JSONDecodeError as exc:
            raise SourceError(str(path), f"invalid JSON at line {exc.lineno}: {exc.msg}") from None
        except RecursionError:
            raise SourceError(str(path), "JSON nested too deeply") from None
        for i, item in enumerate(items):
            yield f"item {i}", item if isinstance(item, dict) else "not a JSON object"
        return
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        if "\ufffd" in line:
            yield f"line {n}", "invalid UTF-8 bytes"
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            yield f"line {n}", f"invalid JSON: {exc.msg}"
            continue
        except RecursionError:
            yield f"line {n}", "JSON nested too deeply"
            continue
        yield f"line {n}", item if isinstance(item, dict) else "not a JSON object"


def csv_rows(handle: Any) -> Iterator[tuple[str, dict[str, Any] | str]]:
    reader = csv.reader(handle)
    try:
        header = next(reader)
    except StopIteration:
        return
    except csv.Error as exc:
        yield "line 1", f"unreadable CSV header: {exc}"
        return
    header = [h.strip() for h in header]
    if any("\ufffd" in h for h in header):
        yield "line 1", "invalid UTF-8 bytes in the header: not a CSV file of this format"
        return
    width = len(header)
    while True:
        try:
            fields = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            yield f"line {reader.line_num}", f"unreadable CSV: {exc}"
            continue
        joined = "".join(fields)  # one scan of the line's text for the two checks below, not one per field
        if not joined.strip():
            continue
        loc = f"line {reader.line_num}"
        if "\ufffd" in joined:
            yield loc, "invalid UTF-8 bytes"
        elif len(fields) > width:
            yield loc, "more fields than the header"
        elif len(fields) == width:
            yield loc, dict(zip(header, fields, strict=True))
        else:
            yield loc, dict(zip(header, [*fields, *[""] * (width - len(fields))], strict=True))


def row_time(value: Any, what: str) -> datetime | None:
    """A time cell of a file row: empty, "None" or "Unknown" is no time; anything else must parse (the error
    names the field)."""
    if value in (None, "", "None", "Unknown"):
        return None
    try:
        return parse_time(str(value))
    except ValueError:
        raise ValueError(f"{what}: cannot parse time {str(value)[:40]!r}") from None


def unmatched(ctx: Context, patterns: list[str]) -> list[str]:
    """Why each of ``paths`` that names no file names none: a glob pattern that matches nothing, a file that
    is not there (``config check``, ``--probe`` and ``collect`` all refuse such a source, issue 44)."""
    out = []
    for p in patterns:
        full = ctx.path(p)
        if glob.has_magic(p):
            if not glob.glob(str(full)):
                out.append(f"paths {p!r} matches no file (looked in {fixed_dir(full)})")
        elif not os.path.lexists(full):
            out.append(f"{full}: no such file")
    return out


def files_matching(ctx: Context, patterns: list[str]) -> list[Path]:
    """The files a connector's ``paths`` name (globs expanded, sorted), each checked to be a regular file; a
    pattern that matches no file is an error (:func:`unmatched`), never an empty source."""
    out: list[Path] = []
    for p in patterns:
        full = ctx.path(p)
        matches = sorted(Path(x) for x in glob.glob(str(full))) if any(c in p for c in "*?[") else [full]
        if not matches:
            raise SourceError("paths", unmatched(ctx, [p])[0])
        for m in matches:
            check_regular(m, fixed_dir(full) if m is not full else None)
            out.append(m)
    return out


def error_reason(exc: BaseException) -> str:
    """The first line of an exception's message, for a quarantine reason."""
    text = str(exc).strip("'").strip()
    return text.splitlines()[0] if text else type(exc).__name__
