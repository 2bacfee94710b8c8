"""What the connectors of derived per-bucket figures share (``inference``, ``node_exporter``): they read either a
Prometheus-compatible API, through the Prometheus connector's HTTP side as it is (auth, TLS, retries, error
lines, chunking), or per-bucket CSV rows a site exported (the file form; the demo's)."""

from __future__ import annotations

import csv
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

from pydantic import Field, field_validator, model_validator

from auditor.config import SecretRef
from connectors.base import Context, Options, Problems
from connectors.prometheus import (
    SCRAPE_LABELS,
    SCRAPE_LABELS_HELP,
    PrometheusTelemetry,
    check_label_names,
    check_matchers,
    safe_url,
)

T = TypeVar("T")


class ApiOrFiles(Options):
    """The options of a source read from a Prometheus API (``url``) or from CSV files (``paths``)."""

    url: str | None = Field(None, description="Base URL of the Prometheus-compatible API, e.g. "
                            "`https://prometheus:9090` (or `paths`).")
    paths: list[str] | None = Field(None, description="Instead of `url`: CSV files (or glob patterns, relative "
                                    "to the config file) of per-bucket rows.")
    bearer_token: SecretRef | None = Field(None, description="Bearer token: `{env = \"VAR\"}` or "
                                           "`{file = \"/path\"}`.")
    username: str | None = Field(None, description="Basic-auth user (password from `password`).")
    password: SecretRef | None = Field(None, description="Basic-auth password: `{env}` or `{file}`.")
    verify_tls: bool = Field(True, description="Verify the server certificate.")
    ca_file: Path | None = Field(None, description="CA bundle to verify the server with.")
    matchers: str = Field("", description="Extra label matchers added to every selector, PromQL syntax "
                          "without braces, e.g. `cluster=\"a\"`.")
    timeout_s: float = Field(60.0, gt=0, description="Timeout of one HTTP request, in seconds.")
    retries: int = Field(2, ge=0, le=10, description="Retries of a request that failed transiently.")
    chunk_hours: float = Field(24.0, gt=0, description="Longest span of one query.")
    scrape_labels: list[str] = Field(list(SCRAPE_LABELS), description=SCRAPE_LABELS_HELP)

    @model_validator(mode="after")
    def _one_source(self) -> ApiOrFiles:
        if (self.url is None) == (self.paths is None):
            raise ValueError("give either url (a Prometheus API) or paths (CSV files)")
        return self

    @field_validator("matchers")
    @classmethod
    def _matchers(cls, v: str) -> str:
        return check_matchers(v)

    @field_validator("scrape_labels")
    @classmethod
    def _scrape(cls, v: list[str]) -> list[str]:
        return check_label_names(v)


class ApiOrFilesSource:
    """A source of such figures: ``source`` names it in messages (``<name>:<url>`` or ``<name>:files``),
    ``http`` is the Prometheus connector's HTTP side when it reads an API, ``notes`` what it could not tie."""

    name = "api_or_files"

    def __init__(self, context: Context, options: ApiOrFiles) -> None:
        self.context, self.options = context, options
        self.notes: list[str] = []
        self.http: PrometheusTelemetry | None = None
        if options.url is None:
            self.source = f"{self.name}:files"
            return
        self.source = f"{self.name}:{safe_url(options.url)}"
        self.http = http_side(context, options, self.source)

    def close(self) -> None:
        if self.http is not None:
            self.http.close()


def cell(rec: dict[str, str], key: str, what: str) -> float | None:
    """The number in column ``key`` of a CSV row: None when empty ("not reported"); ValueError naming the
    column when it is not a finite, non-negative ``what`` (a count, a rate)."""
    v = (rec.get(key) or "").strip()
    if not v:
        return None
    x = float(v)
    if not math.isfinite(x) or x < 0:
        raise ValueError(f"{key}: {v!r} is not a {what}")
    return x


def http_side(context: Context, o: ApiOrFiles, source: str) -> PrometheusTelemetry:
    """The Prometheus connector's HTTP side for ``o`` (raw series only: the recorded ones are GPU buckets),
    its messages naming ``source``."""
    assert o.url is not None
    http = PrometheusTelemetry(context, PrometheusTelemetry.Options(
        url=o.url, bearer_token=o.bearer_token, username=o.username, password=o.password,
        verify_tls=o.verify_tls, ca_file=o.ca_file, matchers=o.matchers, timeout_s=o.timeout_s,
        retries=o.retries, chunk_hours=o.chunk_hours, scrape_labels=o.scrape_labels,
        recording_rules="off"))
    http.source = source
    return http


def csv_records(context: Context, paths: list[str], source: str, problems: Problems,
                parse: Callable[[dict[str, str]], T]) -> Iterator[T]:
    """``parse`` of every row of the CSV files ``paths`` names; a row it refuses (KeyError, TypeError,
    ValueError) is skipped with one line naming the file and line, the rest read."""
    from connectors._rows import files_matching

    for path in files_matching(context, paths):
        with path.open(newline="", encoding="utf-8") as f:
            for no, rec in enumerate(csv.DictReader(f), start=2):
                try:
                    yield parse(rec)
                except (KeyError, TypeError, ValueError) as exc:
                    problems.skip(source, f"{path.name}:{no}", str(exc).splitlines()[0][:200], str(rec)[:120])
