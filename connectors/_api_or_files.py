"""What the connectors of derived per-bucket figures share (``inference``, ``node_exporter``): they read either a
Prometheus-compatible API, through the Prometheus connector's HTTP side as it is (auth, TLS, retries, error
lines, chunking), or per-bucket CSV rows a site exported (the file form; the demo's)."""

from __future__ import annotations

import csv
import math
from collections.abc import Callable, Iterator
from typing import TypeVar

from pydantic import Field, model_validator

from connectors.base import Context, Problems
from connectors.prometheus import ApiOptions, PrometheusTelemetry, safe_url

T = TypeVar("T")


class ApiOrFiles(ApiOptions):
    """The options of a source read from a Prometheus API (``url``, with the connection options every such source
    takes: :class:`connectors.prometheus.ApiOptions`) or from CSV files (``paths``)."""

    url: str | None = Field(None, description="Base URL of the Prometheus-compatible API, e.g. "
                            "`https://prometheus:9090` (or `paths`).")
    paths: list[str] | None = Field(None, description="Instead of `url`: CSV files (or glob patterns, relative "
                                    "to the config file) of per-bucket rows.")

    @model_validator(mode="after")
    def _one_source(self) -> ApiOrFiles:
        if (self.url is None) == (self.paths is None):
            raise ValueError("give either url (a Prometheus API) or paths (CSV files)")
        return self


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
        url=o.url, recording_rules="off", **{k: getattr(o, k) for k in ApiOptions.model_fields}))
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
