"""Telemetry from any Prometheus-compatible HTTP API (Prometheus, Thanos, Mimir, VictoriaMetrics).

Buckets are computed server-side: per field one ``query_range`` whose step is the bucket length, e.g.
``max by (Hostname, instance, gpu, UUID, GPU_I_ID, ...) (avg_over_time(M[300s]))``, evaluated at
``bucket_start + bucket - 1 ms`` so each point covers exactly the bucket's samples; raw 30 s samples are
never pulled. ``samples`` comes from ``count_over_time`` of SM_ACTIVE (GPU_UTIL where a GPU has no
profiling fields). Gaps return no points, so they produce no bucket: the audit calls them unknown.

One value per GPU: dcgm-exporter repeats a GPU's series per ``hpc_job`` and per time-sliced pod; the copies
are device-wide values, so they are combined with ``max`` (never summed), server-side and client-side.
"""

from __future__ import annotations

import json
import logging
import math
import re
import time
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
from pydantic import Field, field_validator

from auditor.aliases import (
    LABEL_ALIASES,
    METRIC_ALIASES,
    BadValue,
    host_from_instance,
    normalise,
    pick_label,
)
from auditor.config import SecretRef
from auditor.errors import SourceError
from auditor.records import LABEL_FIELDS, METRIC_FIELDS, GpuBucket
from connectors.base import Context, Options, Problems, Window

log = logging.getLogger("gpu_audit.prometheus")

#: Labels kept by the server-side aggregation; ``hostname`` is folded into ``Hostname`` first.
GROUP_LABELS: tuple[str, ...] = tuple(dict.fromkeys(
    name for key in ("host", "gpu", "uuid", "model", "gpu_instance", "gpu_profile", *LABEL_FIELDS)
    for name in LABEL_ALIASES[key] if name != "hostname"))
COUNT_FIELDS = ("sm_active", "gpu_util")
EPS = 0.001  # evaluate 1 ms before the bucket end: the range then holds exactly [start, end)


def safe_url(url: str) -> str:
    """The URL without user:password, for messages."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=parts.hostname + (f":{parts.port}" if parts.port else "")))\
        if parts.username or parts.password else url


class PrometheusTelemetry:
    """Pulls per-GPU buckets from a Prometheus HTTP API (see module docstring for the queries)."""

    class Options(Options):
        url: str = Field(description="Base URL of the Prometheus-compatible API, e.g. "
                         "`https://prometheus:9090` (Thanos/Mimir: the querier's prefix).")
        bearer_token: SecretRef | None = Field(None, description="Bearer token: `{env = \"VAR\"}` or "
                                               "`{file = \"/path\"}`.")
        username: str | None = Field(None, description="Basic-auth user (password from `password`).")
        password: SecretRef | None = Field(None, description="Basic-auth password: `{env}` or `{file}`.")
        verify_tls: bool = Field(True, description="Verify the server certificate (turning it off is "
                                 "logged as a warning).")
        ca_file: Path | None = Field(None, description="CA bundle to verify the server with.")
        matchers: str = Field("", description="Extra label matchers added to every selector, PromQL "
                              "syntax without braces, e.g. `cluster=\"a\",env=~\"prod.*\"`.")
        timeout_s: float = Field(60.0, gt=0, description="Timeout of one HTTP request, in seconds.")
        max_points_per_query: int = Field(11000, ge=2, le=11000, description="Most points per series in "
                                          "one query_range; longer windows are chunked.")
        chunk_hours: float = Field(24.0, gt=0, description="Longest span of one query (bounds memory "
                                   "and response size; 1,024 GPUs x 24 h x 5 min is ~300k points).")
        retries: int = Field(2, ge=0, le=10, description="Retries of a request that failed with a "
                             "connection error, timeout, 429 or 5xx.")
        backoff_s: float = Field(1.0, ge=0, le=60, description="First retry delay; doubles each retry.")
        metrics: list[str] | None = Field(None, description="Bucket fields to pull (e.g. `[\"sm_active\", "
                                          "\"gpu_util\"]`); unset = every field.")
        host_label: str | None = Field(None, description="Take the node name from this label only (e.g. "
                                       "`instance` when Hostname is the exporter pod); unset = Hostname/"
                                       "hostname, node, then instance.")

        @field_validator("metrics")
        @classmethod
        def _known(cls, v: list[str] | None) -> list[str] | None:
            bad = [m for m in v or [] if m not in METRIC_FIELDS]
            if bad:
                raise ValueError(f"unknown field {bad[0]!r} (one of {', '.join(METRIC_FIELDS)})")
            return v

        @field_validator("matchers")
        @classmethod
        def _matchers(cls, v: str) -> str:
            if "{" in v or "}" in v:
                raise ValueError("write the matchers without braces, e.g. cluster=\"a\"")
            return v.strip().strip(",")

    name = "prometheus"

    def __init__(self, context: Context, options: PrometheusTelemetry.Options) -> None:
        self.context, self.options = context, options
        self.source = f"prometheus:{safe_url(options.url)}"
        self._client: httpx.Client | None = None
        #: Optional hook called with each raw response body (the benchmark saves them).
        self.on_body: Callable[[bytes], None] | None = None

    # -- HTTP -------------------------------------------------------------------------------------

    def client(self) -> httpx.Client:
        if self._client is None:
            o = self.options
            headers = {"Accept": "application/json"}
            auth = None
            if o.bearer_token:
                token = o.bearer_token.resolve("prometheus.bearer_token")
                headers["Authorization"] = f"Bearer {token}"
            if o.username:
                pw = o.password.resolve("prometheus.password") if o.password else ""
                auth = httpx.BasicAuth(o.username, pw or "")
            verify: bool | str = str(o.ca_file) if o.ca_file else o.verify_tls
            if not o.verify_tls:
                log.warning("%s: TLS certificate verification is disabled (prometheus.verify_tls = false)",
                            self.source)
                verify = False
            self._client = httpx.Client(base_url=o.url.rstrip("/"), headers=headers, auth=auth,
                                        verify=verify, timeout=o.timeout_s)
        return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def request(self, path: str, data: dict[str, Any]) -> bytes:
        """POST a form to the API with bounded retries; returns the body of a 200 answer."""
        o = self.options
        delay = o.backoff_s
        for attempt in range(o.retries + 1):
            last = attempt == o.retries
            try:
                resp = self.client().post(path, data=data)
            except httpx.TimeoutException:
                if last:
                    raise SourceError(self.source, f"{path}: no answer within {o.timeout_s:g} s "
                                      f"(prometheus.timeout_s)", transient=True) from None
            except httpx.TransportError as exc:
                if last:
                    reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                    raise SourceError(self.source, f"{path}: cannot connect: {reason}",
                                      transient=True) from None
            else:
                if resp.status_code == 200:
                    return resp.content
                if resp.status_code != 429 and resp.status_code < 500 or last:
                    raise SourceError(self.source, f"{path}: HTTP {resp.status_code}: {_error_text(resp)}",
                                      transient=resp.status_code == 429 or resp.status_code >= 500)
            time.sleep(delay)
            delay *= 2
        raise AssertionError("unreachable")

    def api(self, path: str, data: dict[str, Any], problems: Problems) -> Any:
        body = self.request(path, data)
        if self.on_body is not None:
            self.on_body(body)
        return self.decode(body, path, problems)

    def decode(self, body: bytes, path: str, problems: Problems) -> Any:
        try:
            doc = json.loads(body)
        except ValueError:
            raise SourceError(self.source, f"{path}: answer is not JSON: {body[:80]!r}") from None
        if not isinstance(doc, dict) or doc.get("status") != "success":
            raise SourceError(self.source, f"{path}: {_one_line(str(doc.get('error', doc)))}")
        for warning in doc.get("warnings") or []:
            problems.skip(self.source, path, f"partial answer: {_one_line(str(warning))}")
        return doc.get("data")

    # -- queries ----------------------------------------------------------------------------------

    def selector(self, names: list[str]) -> str:
        regex = "|".join(re.escape(n) for n in names)
        extra = f",{self.options.matchers}" if self.options.matchers else ""
        return f'{{__name__=~"{regex}"{extra}}}'

    def query(self, fn: str, names: list[str], agg: str, bucket_s: int) -> str:
        inner = f"{fn}({self.selector(names)}[{bucket_s}s])"
        folded = f'label_replace({inner}, "Hostname", "$1", "hostname", "(.+)")'
        return f"{agg} by ({', '.join(GROUP_LABELS)}) ({folded})"

    def existing_names(self, window: Window, problems: Problems) -> set[str]:
        """Metric names the server has in the window (one cheap call), so absent aliases cost nothing."""
        data: dict[str, Any] = {"start": f"{window.since.timestamp():.3f}",
                                "end": f"{window.until.timestamp():.3f}"}
        if self.options.matchers:
            data["match[]"] = f"{{{self.options.matchers}}}"
        try:
            names = self.api("/api/v1/label/__name__/values", data, problems)
        except SourceError as exc:
            if exc.transient:
                raise
            log.info("%s: cannot list metric names (%s); querying every alias", self.source, exc.reason)
            return set(METRIC_ALIASES)
        return set(names or ()) & set(METRIC_ALIASES)

    def plan(self, have: set[str], bucket_s: int) -> list[tuple[str, str, str]]:
        """(kind, field-or-unit, query): one value query per field and source unit, plus the counts."""
        fields = self.options.metrics or list(METRIC_FIELDS)
        out: list[tuple[str, str, str]] = []
        for fname in fields:
            by_unit: dict[str, list[str]] = {}
            for name, spec in METRIC_ALIASES.items():
                if spec.field == fname and name in have:
                    by_unit.setdefault(spec.unit, []).append(name)
            fn = "max_over_time" if fname == "fb_used_mib" else "avg_over_time"
            for unit, names in by_unit.items():
                out.append(("value", f"{fname}:{unit}:{names[0]}", self.query(fn, names, "max", bucket_s)))
        for fname in COUNT_FIELDS:
            first = next((n for n, s in METRIC_ALIASES.items() if s.field == fname and n in have), None)
            if first:  # one name only, summed: series split by the Hostname rename add up, not max
                out.append(("count", fname, self.query("count_over_time", [first], "sum", bucket_s)))
        return out

    def chunks(self, window: Window) -> Iterator[tuple[int, int]]:
        """Aligned bucket starts [first, last] per query, at most max_points and chunk_hours long."""
        b = window.bucket_seconds
        first = int(window.since.timestamp()) // b * b
        until = window.until.timestamp()
        per = max(1, min(self.options.max_points_per_query, int(self.options.chunk_hours * 3600 // b)))
        while first < until:
            last = min(first + (per - 1) * b, math.ceil(until / b) * b - b)
            yield first, last
            first = last + b

    def collect(self, window: Window, problems: Problems) -> Iterable[GpuBucket]:
        try:
            have = self.existing_names(window, problems)
            todo = self.plan(have, window.bucket_seconds)
            if not todo:
                log.warning("%s: no GPU metric of the alias table in this window", self.source)
            for first, last in self.chunks(window):
                merged = Merge(self, window.bucket_seconds, problems)
                for kind, what, q in todo:
                    data = self.api("/api/v1/query_range", {
                        "query": q, "start": f"{first + window.bucket_seconds - EPS:.3f}",
                        "end": f"{last + window.bucket_seconds - EPS:.3f}",
                        "step": str(window.bucket_seconds)}, problems)
                    merged.add(kind, what, data)
                yield from merged.buckets()
        finally:
            self.close()


class Merge:
    """Folds the per-field answers of one chunk into one GpuBucket per (host, gpu, instance, start)."""

    def __init__(self, src: PrometheusTelemetry, bucket_s: int, problems: Problems) -> None:
        self.src, self.bucket_s, self.problems = src, bucket_s, problems
        self.rows: dict[tuple[str, int, str, int], dict[str, Any]] = {}
        self._dropped: set[object] = set()  # problems already reported (one line per series/bucket)

    def key(self, metric: dict[str, str]) -> tuple[str, int, str] | None:
        label = self.src.options.host_label
        if label:
            host = metric.get(label)
            host = host_from_instance(host) if host and label == "instance" else host
        else:
            host = pick_label(metric, "host")
            if host and not any(metric.get(k) for k in LABEL_ALIASES["host"][:-1]):
                host = host_from_instance(host)
        gpu = pick_label(metric, "gpu")
        if not host or not gpu or not gpu.isdigit():
            sig = json.dumps(metric, sort_keys=True)
            if sig not in self._dropped:
                self._dropped.add(sig)
                self.problems.skip(self.src.source, "query_range", "series without host or gpu label",
                                   sig)
            return None
        return host, int(gpu), pick_label(metric, "gpu_instance") or ""

    def add(self, kind: str, what: str, data: Any) -> None:
        if not isinstance(data, dict) or data.get("resultType") != "matrix":
            raise SourceError(self.src.source, f"query_range answered {str(data)[:60]!r}, not a matrix")
        fname, unit, metric_name = what.split(":") if kind == "value" else (what, "", "")
        for series in data.get("result") or ():
            metric = series.get("metric") or {}
            key = self.key(metric)
            if key is None:
                continue
            host, gpu, inst = key
            for t, text in series.get("values") or ():
                start = int(round(float(t) + EPS)) - self.bucket_s
                row = self.rows.get((host, gpu, inst, start))
                if row is None:
                    row = self.rows[(host, gpu, inst, start)] = {"_labels": {}}
                    self._meta(row, metric)
                elif kind == "value":
                    self._meta(row, metric)
                value = float(text)
                if kind == "count":
                    row["_count_" + fname] = max(row.get("_count_" + fname, 0), int(value))
                    continue
                try:
                    v, clamped = normalise(fname, unit, value)  # type: ignore[arg-type]
                except BadValue as exc:
                    when = datetime.fromtimestamp(start, UTC).isoformat()
                    where = f"{host}/gpu{gpu}{'/' + inst if inst else ''} @ {when}"
                    if (where, fname) not in self._dropped:
                        self._dropped.add((where, fname))
                        self.problems.skip(self.src.source, where, str(exc), metric_name)
                    continue
                if clamped:
                    self.problems.clamp(self.src.source, f"{fname}>1")
                old = row.get(fname)
                row[fname] = v if old is None else max(old, v)

    @staticmethod
    def _meta(row: dict[str, Any], metric: dict[str, str]) -> None:
        row["uuid"] = row.get("uuid") or pick_label(metric, "uuid")
        model, profile = pick_label(metric, "model"), pick_label(metric, "gpu_profile")
        if profile:
            model = f"{model} MIG {profile}" if model else f"MIG {profile}"
        row["model"] = row.get("model") or model
        for k in LABEL_FIELDS:
            v = pick_label(metric, k)
            if v:
                row["_labels"].setdefault(k, set()).add(v)

    def buckets(self) -> Iterator[GpuBucket]:
        cluster = self.src.context.cluster
        for (host, gpu, inst, start), row in sorted(self.rows.items()):
            samples = row.get("_count_sm_active", row.get("_count_gpu_util", 0))
            b = GpuBucket(cluster=cluster, host=host, gpu=gpu, gpu_instance=inst, seconds=self.bucket_s,
                          start=datetime.fromtimestamp(start, UTC), samples=samples, uuid=row["uuid"],
                          model=row["model"])
            for fname in METRIC_FIELDS:
                if fname in row:
                    setattr(b, fname, row[fname])
            for k, vs in row["_labels"].items():
                setattr(b, k, ",".join(sorted(vs)))
            yield b


def _one_line(text: str, limit: int = 300) -> str:
    return " ".join(text.split())[:limit]


def _error_text(resp: httpx.Response) -> str:
    """Prometheus error bodies are JSON ({errorType, error}); show them on one line."""
    try:
        doc = resp.json()
        return _one_line(f"{doc.get('errorType', '')}: {doc.get('error', '')}".strip(": "))
    except ValueError:
        return _one_line(resp.text) or resp.reason_phrase


TELEMETRY = PrometheusTelemetry
