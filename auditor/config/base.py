"""The building blocks of the settings: strict models (an unknown key is an error), references to secrets
(an environment variable or a file, never the value) and checks of values a later step would trip on."""

from __future__ import annotations

import os
import re
import stat
import warnings
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from auditor.errors import ConfigError
from auditor.intparse import uint_or_none


def parse_listen(text: str) -> tuple[str, int] | None:
    """A listen address (``web.listen``, ``--listen`` of the health and web servers): ``127.0.0.1:9464`` /
    ``:9464`` / ``[::1]:9464``; ``off`` or empty disables the server."""
    text = text.strip()
    if text.lower() in ("", "off", "none"):
        return None
    host, sep, port = text.rpartition(":")
    number = uint_or_none(port, hi=65535)
    if not sep or number is None:
        raise ValueError(f"--listen {text!r}: want HOST:PORT, e.g. 127.0.0.1:9464, or 'off'")
    return host.strip("[]") or "0.0.0.0", number  # noqa: S104 (":9464" asks for all interfaces)


def check_timezone(name: str) -> str:
    """An IANA time zone name, checked now so the daemon and the reports cannot fail on it later."""
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise ValueError(f"unknown time zone {name[:60]!r} (an IANA name such as Europe/Berlin)") from None
    return name


def check_url(value: str, what: str) -> None:
    """A URL whose port is a number in 1..65535 (urllib only notices when a request is made)."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(value.strip())
        parts.port  # noqa: B018 - raises ValueError on a port out of range or not a number
    except ValueError:
        raise ConfigError(f"{what}: bad port in URL (a number from 1 to 65535)") from None
    if parts.port == 0:
        raise ConfigError(f"{what}: bad port in URL (a number from 1 to 65535)")


def store_url(value: str) -> str:
    """``value`` in the form the store opens: ``postgresql://`` (SQLAlchemy's default spelling) and libpq's
    ``postgres://`` mean psycopg 3 here, the one PostgreSQL driver gpu-audit uses (issue 44); another explicit
    driver stays as given (and is refused by :func:`check_store_url`)."""
    v = value.strip()
    m = re.match(r"(?i)(postgres|postgresql)(\+psycopg)?://", v)
    return "postgresql+psycopg://" + v[m.end():] if m else v


def check_store_url(value: str, what: str | None = None) -> None:
    """A SQLAlchemy URL that parses, with a valid port, of a store gpu-audit can use; never echoes the URL (it
    may hold a password). ``what`` names the setting where the error's location does not (an environment
    variable's value)."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    where = f"{what}: " if what else ""
    try:
        u = make_url(store_url(value))
    except (ArgumentError, ValueError):
        raise ValueError(f"{where}not a valid SQLAlchemy URL (value not shown)") from None
    if u.port is not None and not 1 <= u.port <= 65535:
        raise ValueError(f"{where}port {u.port} is not in 1..65535")
    hint = store_url_hint(u.get_backend_name(), u.get_driver_name() if "+" in u.drivername else None)
    if hint:
        raise ValueError(f"{where}{hint}")


#: The store's PostgreSQL URL form: psycopg 3, the driver `pip install 'gpu-audit[postgres]'` installs (its COPY
#: protocol is what bulk ingest uses)
PG_FORM = "postgresql+psycopg://USER@HOST/DB"


def store_url_hint(backend: str, driver: str | None) -> str:
    """Why a store URL of this backend and driver cannot work, naming the form that does ("" when it can):
    gpu-audit stores in SQLite (any driver) or PostgreSQL through psycopg 3 (``postgresql://`` and
    ``postgres://`` are read as psycopg 3 by :func:`store_url`; another PostgreSQL driver is refused)."""
    if backend == "sqlite" or (backend == "postgresql" and driver == "psycopg"):
        return ""
    if backend in ("postgres", "postgresql"):
        given = f"{backend}+{driver}://" if driver else f"{backend}://"
        return (f"{given} is not a store URL gpu-audit can use; write {PG_FORM} (psycopg 3: pip install "
                "'gpu-audit[postgres]')")
    return (f"{backend}:// is not a supported store (SQLite or PostgreSQL); write sqlite:///PATH or "
            f"{PG_FORM}")


class Strict(BaseModel):
    """Unknown keys are errors: a typo must not silently fall back to a default."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)  # no NaN/inf anywhere


class SecretRef(Strict):
    """Where a secret lives: an environment variable or a file. Never the secret itself."""

    env: str | None = Field(None, description="Environment variable holding the secret.")
    file: Path | None = Field(None, description="File holding the secret (first line, stripped).")

    def resolve(self, what: str) -> str | None:
        """Read the secret now; the value never goes into config dumps, logs or exceptions."""
        if self.env:
            value = os.environ.get(self.env)
            if value is None:
                raise ConfigError(f"{what}: environment variable {self.env} is not set")
            return remember_secret(value.strip())  # a trailing newline would end up in a header
        if self.file:
            return remember_secret(read_secret_file(self.file, what))
        return None

    def __repr__(self) -> str:
        return f"SecretRef(env={self.env!r}, file={str(self.file) if self.file else None!r})"


def remember_secret(value: str) -> str:
    """Register a resolved secret so every log line and CLI error scrubs it (see auditor.logs.scrub)."""
    from auditor.logs import register_secret

    register_secret(value)
    return value


def read_secret_file(path: Path, what: str) -> str:
    """Read a secrets file, warning when others can read it (the value itself is never shown)."""
    try:
        mode = path.stat().st_mode
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{what}: cannot read secret file {path}: {exc.strerror}") from None
    if mode & (stat.S_IRGRP | stat.S_IROTH):
        warnings.warn(f"{what}: secret file {path} is readable by group/others; chmod 600 it",
                      stacklevel=2)
    return text.strip().splitlines()[0].strip() if text.strip() else ""
