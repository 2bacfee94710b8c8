"""Inference servers (vLLM, TGI, SGLang, Triton) through a Prometheus-compatible API: what each serving pod
generated.

Per engine, per series the one alias table names (:data:`connectors.aliases.INFERENCE_ALIASES`) and 5-minute
bucket, one ``query_range`` each (step = the bucket, evaluated at the bucket's end with ``offset 1ms``, so a
point covers exactly [start, start + bucket) as in :mod:`connectors.prometheus`):

- generated tokens: ``increase(<tokens counter>[300s])`` (counter resets handled by Prometheus);
- requests running (the concurrency), requests waiting, batch size: ``avg_over_time(<gauge>[300s])``.

Series are tied to the GPU allocation of their pod by the ``namespace`` and ``pod`` labels the scrape's
Kubernetes service discovery adds, the job key the GPU telemetry uses (:func:`connectors._coverage.job_key`);
several series of one pod (vLLM's data-parallel ``engine`` label, Triton's models) add up, but copies of one
series that only scrape labels tell apart (the pod scraped by two Prometheus jobs: ``scrape_labels``) are
merged first (``max without (job)``), never added. A series without
pod labels cannot be tied to a GPU: it is counted in :attr:`notes`, never guessed. Records only; the store is
never touched.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from typing import Any

from pydantic import Field, field_validator

from auditor.errors import SourceError
from auditor.records import InferenceBucket
from connectors._api_or_files import ApiOrFiles, ApiOrFilesSource, cell, csv_records
from connectors._coverage import job_key
from connectors.aliases import INFERENCE_ALIASES, INFERENCE_MODEL_LABELS, InferenceRead
from connectors.base import Problems, Window
from connectors.prometheus import without_scrape

#: the engines the connector reads (their series: :data:`connectors.aliases.INFERENCE_ALIASES`)
ENGINES: tuple[str, ...] = tuple(INFERENCE_ALIASES)
#: fields that add up over the series of one pod (tokens, requests); the rest too: a pod's two engines
#: each running 1 request run 2
FIELDS = ("generated_tokens", "running_mean", "waiting_mean", "batch_mean", "cache_queries", "cache_hits",
          "cache_hit_rate")
#: fields that are a share, not a count: the mean over a pod's series (SGLang's data-parallel ranks each
#: report their own cache's hit rate), never their sum
SHARES = ("cache_hit_rate",)


class InferenceTelemetry(ApiOrFilesSource):
    """Per pod and bucket: tokens generated, mean requests running and waiting, mean batch size."""

    class Options(ApiOrFiles):
        url: str | None = Field(None, description="Base URL of the Prometheus-compatible API that scrapes the "
                                "inference servers, e.g. `https://prometheus:9090` (or `paths`).")
        paths: list[str] | None = Field(None, description="Instead of `url`: CSV files (or glob patterns, relative "
                                        "to the config file) of per-bucket rows, `start,engine,namespace,pod,"
                                        "generated_tokens,running,waiting,batch` and optionally `cache_queries,"
                                        "cache_hits,cache_hit_rate` (docs/inference.md).")
        engines: list[str] = Field(list(ENGINES), description="Engines whose metrics to read: `vllm`, `tgi`, "
                                   "`sglang`, `triton` (docs/inference.md \"What is read\").")

        @field_validator("engines")
        @classmethod
        def _known(cls, v: list[str]) -> list[str]:
            bad = [e for e in v if e not in ENGINES]
            if bad:
                raise ValueError(f"unknown engine {bad[0]!r} (one of {', '.join(ENGINES)})")
            return v

    name = "inference"

    options: InferenceTelemetry.Options  # (ApiOrFilesSource sets it)

    def query(self, read: InferenceRead, bucket_s: int) -> str:
        """``read``'s window function over exactly one bucket, its own matchers beside the configured ones."""
        assert self.http is not None
        sel = self.http.selector([read.name])
        if read.matchers:
            sel = sel[:-1] + f",{read.matchers}}}"
        return without_scrape(f"{read.fn}({sel}[{bucket_s}s] offset 1ms)", self.options.scrape_labels)

    def chunks(self, window: Window) -> Iterator[tuple[int, int]]:
        """Aligned bucket starts [first, last] per query, at most ``chunk_hours`` (and 11,000 points) long."""
        b = window.bucket_seconds
        first = int(window.since.timestamp()) // b * b
        until = window.until.timestamp()
        per = max(1, min(11000, int(self.options.chunk_hours * 3600 // b)))
        while first < until:
            last = min(first + (per - 1) * b, math.ceil(until / b) * b - b)
            yield first, last
            first = last + b

    def collect(self, window: Window, problems: Problems) -> Iterable[InferenceBucket]:
        if self.http is None:
            yield from self.read_files(window, problems)
            return
        b = window.bucket_seconds
        unlabelled: set[str] = set()
        for engine in self.options.engines:
            for first, last in self.chunks(window):
                rows: dict[tuple[str, int], dict[str, Any]] = {}
                answers: dict[InferenceRead, Any] = {}  # a series two fields read (TGI's batch) is asked once
                for fname, reads in INFERENCE_ALIASES[engine].items():
                    for read in reads:
                        if read not in answers:
                            assert self.http is not None
                            answers[read] = self.http.api("/api/v1/query_range", {
                                "query": self.query(read, b), "start": str(first + b), "end": str(last + b),
                                "step": str(b)}, problems)
                        self.fold(rows, engine, fname, answers[read], b, unlabelled, problems)
                for (job, start), row in sorted(rows.items()):
                    if not window.since.timestamp() <= start < window.until.timestamp():
                        continue
                    yield InferenceBucket(cluster=self.context.cluster, engine=engine, job=job,
                                          start=datetime.fromtimestamp(start, UTC), seconds=b,
                                          instance=",".join(sorted(row["instance"])),
                                          model=",".join(sorted(row["model"])),
                                          **{f: _value(row, f) for f in FIELDS})
        self.notes = [f"{len(unlabelled)} inference series without namespace/pod labels (not tied to a GPU "
                      f"allocation), e.g. {sorted(unlabelled)[0]}"] if unlabelled else []

    def read_files(self, window: Window, problems: Problems) -> Iterator[InferenceBucket]:
        """Per-bucket rows of CSV files (a bucket of ``window.bucket_seconds`` starting at ``start``); a bad
        row is skipped with one line naming the file and line, the rest read."""
        since, until = window.since.timestamp(), window.until.timestamp()
        for b in csv_records(self.context, self.options.paths or [], self.source, problems,
                             lambda rec: self.file_row(rec, window.bucket_seconds)):
            if since <= b.start.timestamp() < until and b.engine in self.options.engines:
                yield b

    def file_row(self, rec: dict[str, str], bucket_s: int) -> InferenceBucket:
        from auditor.timeutil import parse_time

        def num(k: str) -> float | None:
            return cell(rec, k, "count")

        ns, pod = (rec.get("namespace") or "").strip(), (rec.get("pod") or "").strip()
        if not pod:
            raise ValueError("pod: empty (a row must name its pod)")
        start = parse_time(rec["start"])
        return InferenceBucket(cluster=self.context.cluster, engine=(rec.get("engine") or "").strip(),
                               job=f"{ns}/{pod}", start=start.astimezone(UTC), seconds=bucket_s,
                               instance=(rec.get("instance") or "").strip(), model=(rec.get("model") or "").strip(),
                               generated_tokens=num("generated_tokens"), running_mean=num("running"),
                               waiting_mean=num("waiting"), batch_mean=num("batch"),
                               cache_queries=num("cache_queries"), cache_hits=num("cache_hits"),
                               cache_hit_rate=num("cache_hit_rate"))

    def fold(self, rows: dict[tuple[str, int], dict[str, Any]], engine: str, fname: str, data: Any, b: int,
             unlabelled: set[str], problems: Problems) -> None:
        """Add one field's answer into ``rows`` (per pod job key and bucket start): series of one pod add up."""
        if not isinstance(data, dict) or data.get("resultType") != "matrix":
            raise SourceError(self.source, f"query_range answered {str(data)[:60]!r}, not a matrix")
        for series in data.get("result") or []:
            metric = series.get("metric") or {}
            key = job_key(metric)
            if not key or "/" not in key:
                unlabelled.add(metric.get("instance") or metric.get("__name__") or engine)
                continue
            for point in series.get("values") or []:
                try:
                    end, value = int(float(point[0])), float(point[1])
                except (TypeError, ValueError, IndexError):
                    problems.skip(self.source, "query_range", f"{fname}: not a point", str(point)[:80])
                    continue
                if not math.isfinite(value) or value < 0:
                    problems.skip(self.source, "query_range", f"{fname}: value {value!r} is not a count",
                                  f"{key} at {end}")
                    continue
                row = rows.setdefault((key, end - b), {"instance": set(), "model": set()})
                row[fname] = row.get(fname, 0.0) + value
                row["n:" + fname] = row.get("n:" + fname, 0) + 1
                if metric.get("instance"):
                    row["instance"].add(metric["instance"])
                model = next((metric[k] for k in INFERENCE_MODEL_LABELS if metric.get(k)), "")
                if model:
                    row["model"].add(model)


def _value(row: dict[str, Any], f: str) -> float | None:
    """A field of one pod's bucket: the sum over its series, the mean for a share (:data:`SHARES`)."""
    v = row.get(f)
    return v / row["n:" + f] if v is not None and f in SHARES else v


TELEMETRY = InferenceTelemetry
