"""Telemetry from any Prometheus-compatible HTTP API (Prometheus, Thanos, Mimir, VictoriaMetrics).

Buckets are computed server-side: per field one ``query_range`` whose step is the bucket length,
``avg_over_time(M[300s] offset 1ms)`` evaluated at each bucket's end, so every point covers exactly the
bucket's samples [start, start + 300 s); raw 30 s samples are never pulled. ``samples`` comes from
``count_over_time`` of the first activity field a GPU (or MIG instance) reports, in the order of
:data:`connectors.aliases.ACTIVITY_FIELDS` (SM activity, GR engine, Tensor, DRAM, GPU-Util: a stock GPU
Operator fleet has no SM activity, a MIG instance no GPU-Util). Gaps return no points,
so they produce no bucket: the audit calls them unknown.

One row per GPU, bucket and job: dcgm-exporter repeats a GPU's series per ``hpc_job`` and per time-sliced
pod; series with different job labels stay separate rows (the audit takes the rows that name the
allocation, so the next job's minutes in a shared bucket are never credited to the one before). Copies of
one job's series (aliases, the ``Hostname``/``hostname`` rename) are combined with ``max``, never summed.
A row's observed seconds are its samples times the scrape interval (``sample_interval_s``, else estimated),
what overruns its bucket carried into the series' next bucket (docs/definitions.md).
With the recording rules of :mod:`connectors.recording` installed in the TSDB (``recording_rules``), the
buckets those rules evaluated are read from the recorded series instead (one point per series and bucket,
not ten raw samples), the others raw; both give the same buckets (values, counts, observed seconds).
Where a GPU exports DCGM 4.x's SM cycle counters, a bucket's SM activity is ``increase(ACTIVE[300s])`` over
``increase(ELAPSED[300s])`` (:mod:`connectors._cycles`), read raw like the faults: exact, resets handled by the
server; Prometheus extrapolates both increases to the bucket's edges by the same factor (one scrape reads both
counters), so the ratio is that of the cycles between the bucket's first and last scrape.
That fold is done here, per series, not with ``max by (...)`` in PromQL:
Prometheus 2.x evaluates an aggregation per step, which made each query ~8x slower on 1,024 GPUs
(measured, bench/bench_prometheus.py) for answers of the same size. :class:`Merge` folds the answers of one
chunk into those rows; it and the HTTP side need each other, so they share this module.
"""

from __future__ import annotations

import contextvars
import json
import logging
import math
import re
import statistics
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit, urlunsplit

import httpx
from pydantic import Field, field_validator

from auditor.config import SecretRef
from auditor.errors import SourceError
from auditor.intparse import INT32_MAX, uint_or_none
from auditor.records import LABEL_FIELDS, METRIC_FIELDS, GpuBucket, NodeEvent
from connectors import recording
from connectors._cycles import ratio
from connectors._faults import Hits, promql, reason, to_events
from connectors._unstored import MAX_GPU_WARNINGS, UnstoredGpus
from connectors.aliases import (
    CYCLE_COUNTERS,
    FAULT_ALIASES,
    JOB_ID_METRICS,
    LABEL_ALIASES,
    METRIC_ALIASES,
    RATIO_FIELDS,
    SM_CYCLES_ACTIVE,
    BadValue,
    host_from_instance,
    names_for,
    normalise,
    pick_label,
)
from connectors.base import Context, Options, Problems, Window
from connectors.workload import Workload, WorkloadOptions, shared_copy

#: Queries in flight at once: answers are decoded while the next ones are computed; more only loads the server
#: (a `prometheus.` option until issue 45)
CONCURRENCY = 2

log = logging.getLogger("gpu_audit.prometheus")

#: Labels kept by the server-side aggregation; ``hostname`` is folded into ``Hostname`` first.
#: Labels that identify one GPU (or MIG instance): each activity field's count skips GPUs that have an earlier one.
GPU_LABELS: tuple[str, ...] = tuple(name for key in ("host", "gpu", "uuid", "gpu_instance")
                                    for name in LABEL_ALIASES[key])
COUNT_FIELDS = recording.COUNT_FIELDS
#: labels naming one whole GPU (host, index, UUID): a MIG instance's series belong to their GPU
IDENTITY_LABELS: tuple[str, ...] = tuple(name for key in ("host", "gpu", "uuid") for name in LABEL_ALIASES[key])
GPU_LOOKING = re.compile(r"gpu|dcgm|nvidia|nvml", re.IGNORECASE)
#: label names in a `matchers` string (``cluster="a",env=~"p.*"`` -> cluster, env)
MATCHER_LABEL = re.compile(r'(?:^|,)\s*([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)\s*"')

try:  # optional: 3-5x faster decoding of large answers; the stdlib parser is the fallback
    from orjson import loads as json_loads
except ImportError:  # pragma: no cover - depends on the environment
    json_loads = json.loads


def _transport_reason(exc: BaseException) -> str:
    """A connection error's first line, with any secret the library quoted scrubbed."""
    from auditor.logs import scrub

    text = str(exc).strip()
    return scrub(text.splitlines()[0]) if text else type(exc).__name__


def check_matchers(v: str) -> str:
    """A ``matchers`` option: label matchers to put inside a selector's braces (so without braces)."""
    if "{" in v or "}" in v:
        raise ValueError("write the matchers without braces, e.g. cluster=\"a\"")
    return v.strip().strip(",")


#: labels a scrape adds that say which scrape read a series, not which source it is (issue 44): two scrape
#: jobs reading one exporter give the same series twice, differing only in these
SCRAPE_LABELS = ("job",)
SCRAPE_LABELS_HELP = ("Labels that name the scrape, not the source (default `[\"job\"]`): series of one target "
                      "that differ only in these (node_exporter or an engine scraped by two Prometheus jobs) are "
                      "one series read twice, merged (the larger reading), never added; add e.g. "
                      "`\"prometheus_replica\"` or a relabelled scrape label.")


def check_label_names(v: list[str]) -> list[str]:
    """``scrape_labels``: Prometheus label names (``[a-zA-Z_][a-zA-Z0-9_]*``)."""
    bad = [x for x in v if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", x)]
    if bad:
        raise ValueError(f"{bad[0][:40]!r} is not a label name")
    return list(dict.fromkeys(v))


def without_scrape(inner: str, scrape_labels: Iterable[str], keep: str | None = None) -> str:
    """``inner`` with the copies of one series that scrape labels alone tell apart merged: ``max without
    (job, ...)`` (the larger of two readings of one counter or gauge; a copy is never added), ``keep`` (the
    label naming the node) never dropped."""
    drop = [x for x in scrape_labels if x != keep]
    return f"max without ({', '.join(drop)}) ({inner})" if drop else inner


def safe_url(url: str) -> str:
    """The URL without user:password, for messages."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=parts.hostname + (f":{parts.port}" if parts.port else "")))\
        if parts.username or parts.password else url


class ApiOptions(Options):
    """How to reach a Prometheus-compatible API: the options every source that reads one takes (``prometheus``,
    and ``node_exporter`` and ``inference`` through this connector's HTTP side), defined and documented once,
    under ``prometheus`` (docs/telemetry.md)."""

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
    retries: int = Field(2, ge=0, le=10, description="Retries of a request that failed with a "
                         "connection error, timeout, 429 or 5xx.")
    chunk_hours: float = Field(24.0, gt=0, description="Longest span of one query (bounds memory "
                               "and response size; 1,024 GPUs x 24 h x 5 min is ~300k points).")
    scrape_labels: list[str] = Field(list(SCRAPE_LABELS), description=SCRAPE_LABELS_HELP)

    @field_validator("matchers")
    @classmethod
    def _matchers(cls, v: str) -> str:
        return check_matchers(v)

    @field_validator("scrape_labels")
    @classmethod
    def _scrape(cls, v: list[str]) -> list[str]:
        return check_label_names(v)


class PrometheusTelemetry:
    """Pulls per-GPU buckets from a Prometheus HTTP API (see module docstring for the queries)."""

    class Options(WorkloadOptions, ApiOptions):
        url: str = Field(description="Base URL of the Prometheus-compatible API, e.g. "
                         "`https://prometheus:9090` (Thanos/Mimir: the querier's prefix).")
        max_points_per_query: int = Field(11000, ge=2, le=11000, description="Most points per series in "
                                          "one query_range; longer windows are chunked.")
        compression: bool = Field(True, description="Ask for gzip answers (about 5x smaller); turn off "
                                  "on loopback or fast links, where compressing costs more than it saves.")
        sample_interval_s: float | None = Field(None, gt=0, description="Scrape interval of the exporter, in "
                                                "seconds: a bucket's observed seconds are its samples times this, "
                                                "what overruns a bucket carried into the next (a job that ran 1 "
                                                "minute of a bucket is 1 minute observed). Unset = estimated per "
                                                "GPU as the median seconds per sample of its inner buckets (samples in "
                                                "the buckets before and after) in the chunk.")
        metrics: list[str] | None = Field(None, description="Bucket fields to pull (e.g. `[\"sm_active\", "
                                          "\"gpu_util\"]`); unset = every field.")
        host_label: str | None = Field(None, description="Take the node name from this label only (e.g. "
                                       "`instance` when Hostname is the exporter pod); unset = Hostname/"
                                       "hostname, node, then instance.")
        recording_rules: Literal["auto", "on", "off"] = Field(
            "auto", description="Read the series recorded by deploy/prometheus-recording-rules.yml for the "
            "buckets the rules evaluated (raw series for the rest): auto = when they exist (one name listing "
            "per collect), on = fail when they are missing or buckets are not 5 minutes, off = raw only.")

        @field_validator("metrics")
        @classmethod
        def _known(cls, v: list[str] | None) -> list[str] | None:
            bad = [m for m in v or [] if m not in METRIC_FIELDS]
            if bad:
                raise ValueError(f"unknown field {bad[0]!r} (one of {', '.join(METRIC_FIELDS)})")
            return v

    name = "prometheus"

    def __init__(self, context: Context, options: PrometheusTelemetry.Options) -> None:
        self.context, self.options = context, options
        self.source = f"prometheus:{safe_url(options.url)}"
        self._client: httpx.Client | None = None
        self.index_of: dict[tuple[str, str], int] = {}
        self.workload = Workload(options)
        #: namespace/pod of the pods the cluster's allocations source saw holding GPUs (set by collect)
        self.gpu_holders: frozenset[str] = frozenset()

    # -- HTTP -------------------------------------------------------------------------------------

    def client(self) -> httpx.Client:
        if self._client is None:
            o = self.options
            headers = {"Accept": "application/json",
                       "Accept-Encoding": "gzip" if o.compression else "identity"}
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

    def request(self, path: str, data: dict[str, Any], method: str = "POST") -> bytes:
        """Call the API (POST form, or GET query) under the shared retry policy (:mod:`connectors.retry`:
        ``retries`` + 1 attempts, backoff doubling from :data:`connectors.retry.BACKOFF_S` or the server's
        Retry-After, within the source's time budget); returns the body of a 200 answer."""
        from connectors import retry

        o = self.options

        def once() -> bytes:
            try:
                resp = self.client().post(path, data=data) if method == "POST" else \
                    self.client().get(path, params=data)
            except httpx.LocalProtocolError:  # its message quotes the offending header value: never shown
                raise SourceError(self.source, f"{path}: request not sent: a header value is invalid (check "
                                  "bearer_token, username and password; values not shown)") from None
            except httpx.TimeoutException:
                raise SourceError(self.source, f"{path}: no answer within {o.timeout_s:g} s "
                                  f"(prometheus.timeout_s)", transient=True) from None
            except httpx.TransportError as exc:
                raise SourceError(self.source, f"{path}: cannot connect: {_transport_reason(exc)}",
                                  transient=True) from None
            except (httpx.InvalidURL, httpx.UnsupportedProtocol, ValueError) as exc:
                # a header value the HTTP library refuses is quoted in its message: never show it
                raise SourceError(self.source, f"{path}: request not sent: {type(exc).__name__} (check url, "
                                  "bearer_token and password; values not shown)") from None
            if resp.status_code == 200:
                return resp.content
            transient = resp.status_code == 429 or resp.status_code >= 500
            raise SourceError(self.source, f"{path}: HTTP {resp.status_code}: {_error_text(resp)}",
                              transient=transient, retry_after=retry.retry_after(resp.headers.get("Retry-After")))

        return retry.call(once, attempts=o.retries + 1, sleep=lambda s: time.sleep(s))

    def api(self, path: str, data: dict[str, Any], problems: Problems, method: str = "POST") -> Any:
        return self.decode(self.request(path, data, method), path, problems)

    def decode(self, body: bytes, path: str, problems: Problems) -> Any:
        try:
            doc = json_loads(body)
        except ValueError:
            raise SourceError(self.source, f"{path}: answer is not JSON: {body[:80]!r}") from None
        if not isinstance(doc, dict) or doc.get("status") != "success":
            what = doc.get("error", doc) if isinstance(doc, dict) else doc
            raise SourceError(self.source, f"{path}: {_one_line(str(what))}")
        for warning in doc.get("warnings") or []:
            problems.skip(self.source, path, f"partial answer: {_one_line(str(warning))}")
        return doc.get("data")

    # -- queries ----------------------------------------------------------------------------------

    def selector(self, names: list[str]) -> str:
        regex = "|".join(re.escape(n) for n in names)
        extra = f",{self.options.matchers}" if self.options.matchers else ""
        return f'{{__name__=~"{regex}"{extra}}}'

    def query(self, fn: str, names: list[str], bucket_s: int) -> str:
        """Per series, per bucket: the window function over exactly [start, start + bucket)."""
        return f"{fn}({self.selector(names)}[{bucket_s}s] offset 1ms)"

    def existing_names(self, window: Window, problems: Problems) -> set[str]:
        """Metric names the server has in the window (one cheap call), so absent aliases cost nothing."""
        data: dict[str, Any] = {"start": f"{window.since.timestamp():.3f}",
                                "end": f"{window.until.timestamp():.3f}"}
        if self.options.matchers:
            data["match[]"] = f"{{{self.options.matchers}}}"
        try:
            names = self.api("/api/v1/label/__name__/values", data, problems, "GET")
        except SourceError as exc:
            if exc.transient:
                raise
            log.info("%s: cannot list metric names (%s); querying every alias", self.source, exc.reason)
            return set(METRIC_ALIASES)
        return set(names or ())

    def workload_probe(self, at: float, span_s: int = 3600) -> str:
        """``config check --probe``: the workload labels of the GPU series of the last ``span_s`` seconds
        before ``at`` (one series listing of the SM_ACTIVE and GPU_UTIL names), in one line."""
        names = names_for("sm_active") + names_for("gpu_util")
        data = self.api("/api/v1/series", {"match[]": self.selector(names), "start": f"{at - span_s:.3f}",
                                           "end": f"{at:.3f}"}, Problems(), "GET")
        metrics = [m for m in data or () if isinstance(m, dict)]
        work = Workload(self.options)
        work.scan(metrics, _gpu_of)
        labelled = sum(1 for m in metrics if work.labels(m))
        return work.note() or (f"workload labels: {labelled} of {len(metrics)} GPU series of the last hour name "
                               "a workload pod" if metrics else "workload labels: no GPU series in the last hour")

    def uuid_index(self, window: Window, have: set[str], problems: Problems) -> dict[tuple[str, str], int]:
        """nvidia_gpu_exporter labels its series with uuid only: (host, uuid) -> index from nvidia_smi_index."""
        if "nvidia_smi_index" not in have:
            return {}
        span = max(1, math.ceil((window.until - window.since).total_seconds()))
        extra = f"{{{self.options.matchers}}}" if self.options.matchers else ""
        data = self.api("/api/v1/query", {"query": f"last_over_time(nvidia_smi_index{extra}[{span}s])",
                                          "time": str(window.until.timestamp())}, problems)
        out: dict[tuple[str, str], int] = {}
        for item in (data or {}).get("result") or ():
            metric, value = item.get("metric") or {}, item.get("value") or (0, "NaN")
            host, uuid = pick_label(metric, "host"), pick_label(metric, "uuid")
            if host and uuid and uint_or_none(value[1], hi=INT32_MAX) is not None:
                out[(host_from_instance(host) if host == metric.get("instance") else host, uuid)] = \
                    int(value[1])
        return out

    def unstored_gpus(self, window: Window, have: set[str], problems: Problems,
                      recorded_buckets: tuple[int, int] | None = None) -> list[str]:
        """GPUs that have GPU-looking series in the window but none of a stored metric: one instant query
        finds them (usually none), a series listing of the first few gives their metric names; each is
        warned about (:mod:`connectors._unstored`), since the bucket queries never see them. When the
        recording rules evaluated every bucket (``recorded_buckets``: the first and last bucket start), the
        GPUs with stored metrics are the ones with recorded series there, read instead of the raw samples."""
        other = sorted(n for n in have if n not in METRIC_ALIASES and n not in FAULT_ALIASES
                       and n not in JOB_ID_METRICS and not recording.is_recorded(n) and GPU_LOOKING.search(n))
        if not other:
            return []
        span = max(1, math.ceil((window.until - window.since).total_seconds()))
        on = ", ".join(IDENTITY_LABELS)
        stored = sorted(n for n in have if n in METRIC_ALIASES)
        at, back = f"{window.until.timestamp():.3f}", ""
        if recorded_buckets and stored:
            # evaluated where the last bucket's recorded points are read; the raw side looks back to `until`
            first, last = recorded_buckets
            end = last + window.bucket_seconds + recording.READ_SHIFT_S
            at, back = str(end), f" offset {max(1, round((end - window.until.timestamp()) * 1000))}ms"
            names = [recording.recorded(n, recording.value_fn(n)) for n in stored]
            has = f"last_over_time({self.selector(names)}[{last - first + window.bucket_seconds}s] offset 1ms)"
        else:
            has = f"last_over_time({self.selector(stored)}[{span}s])"
        q = f"group by ({on}) (last_over_time({self.selector(other)}[{span}s]{back}))"
        if stored:
            q += f" unless on ({on}) group by ({on}) ({has})"
        try:
            data = self.api("/api/v1/query", {"query": q, "time": at}, problems)
        except SourceError as exc:
            if exc.transient:
                raise
            log.info("%s: cannot look for GPUs with only unstored metrics (%s)", self.source, exc.reason)
            return []
        found = UnstoredGpus()
        keyer = Merge(self, window.bucket_seconds, Problems())  # the buckets' own (host, gpu) rule
        gpus = [m for item in (data or {}).get("result") or () if (m := item.get("metric") or {})]
        for metric in gpus[:MAX_GPU_WARNINGS]:
            key = keyer.key(metric)
            uuid = pick_label(metric, "uuid")
            if key is None and not uuid:
                continue
            host = key[0] if key else (pick_label(metric, "host") or "?")
            match = ",".join(f'{k}="{_quote(v)}"' for k, v in sorted(metric.items()))
            series = self.api("/api/v1/series", {"match[]": f'{{__name__=~"{"|".join(map(re.escape, other))}",'
                                                              f"{match}}}",
                                                 "start": f"{window.since.timestamp():.3f}",
                                                 "end": f"{window.until.timestamp():.3f}"}, problems, "GET")
            for ser in series or ():
                if all(ser.get(k, "") == v for k, v in metric.items()) and ser.get("__name__"):
                    found.seen(host, key[1] if key else None, uuid, ser["__name__"])
        notes = found.report(self.source)
        if len(gpus) > MAX_GPU_WARNINGS:
            more = f"{len(gpus) - MAX_GPU_WARNINGS} more GPUs have only metrics gpu-audit does not store"
            log.warning("%s: %s", self.source, more)
            notes.append(more)
        return notes

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
                out.append(("value", f"{fname}:{unit}:{names[0]}", self.query(fn, names, bucket_s)))
        # jobstats: the job holding a GPU is the *value* of nvidia_gpu_jobId; min and max per bucket give
        # both jobs when the GPU changed hands inside it (comma-joined, like dcgm-exporter's hpc_job)
        for name in sorted(JOB_ID_METRICS & have):
            for fn in ("min_over_time", "max_over_time"):
                out.append(("jobid", f"{fn}:{name}", self.query(fn, [name], bucket_s)))
        # One count per exported name (a GPU exporting two aliases must not count twice). Each activity field
        # is counted only where no earlier one is (``unless``): a GPU counts the samples of its strongest field.
        before: list[str] = []
        for fname in COUNT_FIELDS:
            names = [n for n in names_for(fname) if n in have]
            for name in names:
                q = self.query("count_over_time", [name], bucket_s)
                for prev in before:  # one name per operand: two names of one GPU would share a labelset
                    q = f"{q} unless on ({', '.join(GPU_LABELS)}) {self.query('count_over_time', [prev], bucket_s)}"
                out.append(("count", f"{fname}:{name}", q))
            before += names
        return out

    # -- recorded series (connectors.recording) -------------------------------------------------------------

    def heartbeats(self) -> list[str]:
        """Selectors of the rules' heartbeat that vouch for the series ``matchers`` select: one matching them
        (Thanos/Mimir external labels), or one without any of their labels (a single Prometheus whose rules
        saw all its series; a heartbeat labelled for another cluster vouches for nothing here)."""
        m = self.options.matchers
        if not m:
            return [f'{{__name__="{recording.HEARTBEAT}"}}']
        unset = ",".join(f'{name}=""' for name in dict.fromkeys(MATCHER_LABEL.findall(m)))
        return [f'{{__name__="{recording.HEARTBEAT}",{m}}}', f'{{__name__="{recording.HEARTBEAT}",{unset}}}']

    def recorded_names(self, window: Window, problems: Problems) -> set[str]:
        """Names of recorded series from the window's start to the reading time of its last bucket (the
        rules record a bucket up to :data:`recording.READ_SHIFT_S` + one bucket after its end)."""
        extra = f",{self.options.matchers}" if self.options.matchers else ""
        data: dict[str, Any] = {"start": f"{window.since.timestamp():.3f}",
                                "end": f"{window.until.timestamp() + recording.READ_SHIFT_S + recording.BUCKET_S:.3f}",
                                "match[]": [f'{{__name__=~"{re.escape(recording.PREFIX)}.+"{extra}}}',
                                            *self.heartbeats()]}
        try:
            names = self.api("/api/v1/label/__name__/values", data, problems, "GET")
        except SourceError as exc:
            if exc.transient or self.options.recording_rules == "on":
                raise
            log.info("%s: cannot list recorded series (%s); reading raw series", self.source, exc.reason)
            return set()
        return {n for n in names or () if recording.is_recorded(n)}

    def recorded_plan(self, have: set[str], rec: set[str], bucket_s: int) -> list[tuple[str, str, str]] | None:
        """The :meth:`plan` over recorded series (same kinds and labels, so :class:`Merge` folds both alike),
        or None when the rules cannot stand in for the raw series: buckets other than 5 minutes, no rules'
        heartbeat, or a raw name in the window without its recorded series (rules older than the alias
        table). ``on`` turns each of these into an error."""
        mode = self.options.recording_rules
        if mode == "off":
            return None

        def refuse(why: str) -> None:
            if mode == "on":
                raise SourceError(self.source, f"recording_rules = on: {why}")
            log.info("%s: %s; reading raw series", self.source, why)

        if bucket_s != recording.BUCKET_S:
            refuse(f"the recording rules compute {recording.BUCKET_S}-s buckets, not {bucket_s}-s ones")
            return None
        if recording.HEARTBEAT not in rec:
            refuse(f"no {recording.HEARTBEAT} series in the window (install deploy/prometheus-recording-rules.yml"
                   " in Prometheus or vmalert; with `matchers`, it must match them or lack their labels)")
            return None
        missing: list[str] = []

        def read(names: list[str], fn: str) -> str:
            return self.query("last_over_time", [recording.recorded(n, fn) for n in names], recording.BUCKET_S)

        def present(names: Iterable[str], fn: str) -> list[str]:
            out = []
            for n in names:
                if recording.recorded(n, fn) in rec:
                    out.append(n)
                elif n in have:
                    missing.append(recording.recorded(n, fn))
            return out

        out: list[tuple[str, str, str]] = []
        for fname in self.options.metrics or list(METRIC_FIELDS):
            by_unit: dict[str, list[str]] = {}
            fn = "max" if fname == "fb_used_mib" else "avg"  # as plan(): FB_USED takes the bucket's max
            for name in present(names_for(fname), fn):
                by_unit.setdefault(METRIC_ALIASES[name].unit, []).append(name)
            for unit, names in by_unit.items():
                out.append(("value", f"{fname}:{unit}:{names[0]}", read(names, fn)))
        for name in sorted(JOB_ID_METRICS):
            for fn in ("min", "max"):
                if present([name], fn):
                    out.append(("jobid", f"{fn}_over_time:{name}", read([name], fn)))
        before: list[str] = []
        for fname in COUNT_FIELDS:  # as plan(): each activity field where no earlier one is
            names = present(names_for(fname), "count")
            for name in names:
                q = read([name], "count")
                for prev in before:
                    q = f"{q} unless on ({', '.join(GPU_LABELS)}) {read([prev], 'count')}"
                out.append(("count", f"{fname}:{name}", q))
            before += names
        if missing:
            refuse(f"{len(missing)} raw metric(s) in the window have no recorded series (e.g. {missing[0]}: "
                   "rules older than this gpu-audit? regenerate them)")
            return None
        return out

    def recorded_runs(self, first: int, last: int, problems: Problems) -> list[tuple[int, int, bool]]:
        """Bucket starts [first, last] of one chunk cut into runs (lo, hi, recorded): recorded where every
        heartbeat series of the rules has a point of :data:`recording.VERSION` in the bucket's reading
        window (the rule group evaluated that bucket), raw elsewhere (not evaluated yet, rules installed
        later, a missed evaluation)."""
        b = recording.BUCKET_S
        shift = b + recording.READ_SHIFT_S
        q = " or ".join(f"last_over_time({sel}[{b}s] offset 1ms)" for sel in self.heartbeats())
        data = self.api("/api/v1/query_range", {"query": q, "start": str(first + shift), "end": str(last + shift),
                                                "step": str(b)}, problems)
        per_series: list[dict[int, float]] = [
            {int(t) - shift: float(v) for t, v in series.get("values") or ()}
            for series in (data or {}).get("result") or ()]
        versions = {v for points in per_series for v in points.values()} - {float(recording.VERSION)}
        if versions:
            why = (f"{recording.HEARTBEAT} = {min(versions):g}: the rules installed are not the version this "
                   f"gpu-audit reads ({recording.VERSION}); regenerate deploy/prometheus-recording-rules.yml")
            if self.options.recording_rules == "on":
                raise SourceError(self.source, f"recording_rules = on: {why}")
            log.warning("%s: %s; reading raw series where they differ", self.source, why)
        runs: list[tuple[int, int, bool]] = []
        for start in range(first, last + b, b):
            ok = bool(per_series) and all(p.get(start) == recording.VERSION for p in per_series)
            if runs and runs[-1][2] == ok and runs[-1][1] == start - b:
                runs[-1] = (runs[-1][0], start, ok)
            else:
                runs.append((start, start, ok))
        return runs

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

    def fault_hits(self, merged: Merge, name: str, what: str, data: Any, hits: Hits) -> None:
        """Faulty buckets of one fault query (:mod:`connectors._faults`) into ``hits``."""
        spec = FAULT_ALIASES[name]
        for series in (data or {}).get("result") or ():
            gkey = merged.key(series.get("metric") or {})
            if gkey is None:
                continue
            for t, text in series.get("values") or ():
                v = float(text)
                if math.isfinite(v):
                    hits[(gkey[0], gkey[1], spec.kind)][int(t) - merged.bucket_s].add(reason(spec, what, v))

    def collect(self, window: Window, problems: Problems) -> Iterable[GpuBucket | NodeEvent]:
        self.workload = Workload(self.options, self.gpu_holders)  # what this collect's series carry (its note)
        try:
            have = self.existing_names(window, problems)
            todo = self.plan(have, window.bucket_seconds)
            step = max(1, int(self.options.sample_interval_s or 30))
            faults = [(name, what, q) for name, spec in FAULT_ALIASES.items() if name in have
                      for what, q in promql(self.selector([name]), spec, window.bucket_seconds, step)]
            cycles = [(name, self.query("increase", [name], window.bucket_seconds))
                      for name in sorted(CYCLE_COUNTERS)] if CYCLE_COUNTERS <= have else []
            self.index_of = self.uuid_index(window, have, problems)
            rec = None if self.options.recording_rules == "off" else \
                self.recorded_plan(have, self.recorded_names(window, problems), window.bucket_seconds)
            self.read_recorded = 0  # buckets read from recorded series (the rest raw)
            if not todo and not rec:
                gpuish = sorted(n for n in have if GPU_LOOKING.search(n) and not recording.is_recorded(n))
                log.warning("%s: no GPU metric of the alias table in this window%s", self.source,
                            f"; GPU-looking names present: {', '.join(gpuish[:8])}" if gpuish else
                            f" ({len(have)} metric names present, none GPU-looking)")
            # which buckets the rules evaluated, chunk by chunk (one small query each), before anything else reads
            chunks = [(first, last, self.recorded_runs(first, last, problems) if rec else [(first, last, False)])
                      for first, last in self.chunks(window)]
            covered = all(use for _, _, runs in chunks for _, _, use in runs) and bool(chunks) and rec
            self.notes = self.unstored_gpus(window, have, problems,
                                            (chunks[0][0], chunks[-1][1]) if covered else None)
            b = window.bucket_seconds
            with ThreadPoolExecutor(CONCURRENCY, "prometheus") as pool:
                for first, last, runs in chunks:
                    # points at bucket end with `offset 1ms`: each covers exactly [start, start + b); recorded
                    # series are read READ_SHIFT_S later, where the rules wrote each bucket (connectors.recording)
                    jobs: list[tuple[str, str, str, int, int, int]] = []
                    for lo, hi, use in runs:
                        back = b + (recording.READ_SHIFT_S if use else 0)
                        jobs += [(kind, what, q, lo, hi, back) for kind, what, q in (rec if use and rec else todo)]
                        self.read_recorded += (hi - lo) // b + 1 if use else 0
                    jobs += [("cycles", name, q, first, last, b) for name, q in cycles]
                    jobs += [("fault", what, q, first, last, b) for _, what, q in faults]
                    # each query runs in the collector's context: its retries share the source's time budget
                    futures = [pool.submit(contextvars.copy_context().run, self.request, "/api/v1/query_range",
                                           {"query": q, "start": str(lo + back), "end": str(hi + back),
                                            "step": str(b)}) for _, _, q, lo, hi, back in jobs]
                    n_values = len(jobs) - len(faults)
                    try:
                        merged = Merge(self, b, problems)
                        for (kind, what, _, _, _, back), fut in zip(jobs[:n_values], futures[:n_values], strict=True):
                            merged.add(kind, what, self.decode(fut.result(), "query_range", problems), back)
                        hits: Hits = defaultdict(lambda: defaultdict(set))
                        for (name, what, _), fut in zip(faults, futures[n_values:], strict=True):
                            self.fault_hits(merged, name, what, self.decode(fut.result(), "query_range", problems),
                                            hits)
                    finally:
                        for fut in futures:
                            fut.cancel()
                    yield from merged.buckets()
                    yield from to_events(self.context.cluster, b, hits, "prometheus")
            note = self.workload.note()
            if note:
                log.info("%s: %s", self.source, note)  # the collect output prints it as a note
                self.notes.append(note)
        finally:
            self.close()


def _quote(value: str) -> str:
    """A label value inside a PromQL double-quoted string."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _one_line(text: str, limit: int = 300) -> str:
    return " ".join(text.split())[:limit]


def _error_text(resp: httpx.Response) -> str:
    """Prometheus error bodies are JSON ({errorType, error}); show them on one line."""
    try:
        doc = resp.json()
        return _one_line(f"{doc.get('errorType', '')}: {doc.get('error', '')}".strip(": "))
    except ValueError:
        return _one_line(resp.text) or resp.reason_phrase



# -- folding the answers into buckets ---------------------------------------------------------------------

class Merge:
    """Folds the per-field answers of one chunk into one GpuBucket per (host, gpu, instance, start).

    The hot loop runs once per returned point (millions for a fleet), so it stays flat: the series key
    and labels are worked out once per series, and values take a fast path unless they need clamping
    or quarantine (then :func:`normalise` decides)."""

    def __init__(self, src: PrometheusTelemetry, bucket_s: int, problems: Problems) -> None:
        self.src, self.bucket_s, self.problems = src, bucket_s, problems
        self.rows: dict[tuple[str, int, str], dict[tuple[int, str], dict[str, Any]]] = {}
        self.jobs: dict[tuple[str, int, str], dict[int, set[str]]] = {}  # jobstats' jobId values
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
        if gpu is None and host:
            index = self.src.index_of.get((host, pick_label(metric, "uuid") or ""))
            gpu = None if index is None else str(index)
        if not host or not gpu or uint_or_none(gpu, hi=INT32_MAX) is None:
            sig = json.dumps(metric, sort_keys=True)
            if sig not in self._dropped:
                self._dropped.add(sig)
                self.problems.skip(self.src.source, "query_range", "series without host or gpu label",
                                   sig)
            return None
        return host, int(gpu), pick_label(metric, "gpu_instance") or ""

    def meta(self, metric: dict[str, str]) -> tuple[str | None, str | None, tuple[tuple[str, str], ...]]:
        model, profile = pick_label(metric, "model"), pick_label(metric, "gpu_profile")
        if profile:
            model = f"{model} MIG {profile}" if model else f"MIG {profile}"
        work = self.src.workload.labels(metric)  # pod/namespace/container: connectors.workload
        labels = tuple((k, v) for k in LABEL_FIELDS
                       if (v := pick_label(metric, k) if k == "hpc_job" else work.get(k)))
        return pick_label(metric, "uuid"), model, labels

    def add(self, kind: str, what: str, data: Any, back: int | None = None) -> None:
        """Fold one answer; a point at t is the bucket starting at t - ``back`` (default: the bucket length,
        points at bucket ends; recorded series are read later, see :mod:`connectors.recording`)."""
        if not isinstance(data, dict) or data.get("resultType") != "matrix":
            raise SourceError(self.src.source, f"query_range answered {str(data)[:60]!r}, not a matrix")
        back = self.bucket_s if back is None else back
        if kind == "jobid":
            self.add_jobs(data, back)
            return
        if kind == "cycles":
            self.add_cycles(what, data, back)
            return
        if kind == "value":
            fname, unit, metric_name = what.split(":")
        else:
            field, metric_name = what.split(":")
            fname, unit = "_count_" + field, ""
        div = 1.0 / normalise(fname, unit, 1.0)[0] if kind == "value" else 1.0  # type: ignore[arg-type]
        bounded, counting = fname in RATIO_FIELDS, kind == "count"
        scrape = self.src.options.scrape_labels
        self.src.workload.scan((s.get("metric") or {} for s in data.get("result") or ()), _gpu_of)
        for series in data.get("result") or ():
            metric = series.get("metric") or {}
            gkey = self.key(metric)
            if gkey is None:
                continue
            if not counting and shared_copy(metric, fname):
                continue  # the whole shared GPU's value on a sharing pod's series: its count still counts
            rows = self.rows.setdefault(gkey, {})
            meta = self.meta(metric)
            # a series read by two scrape jobs is two copies (their counts: the larger, never the sum); a
            # series split by a relabel within one scrape adds up
            copy = (metric_name, meta[2], tuple(metric.get(x, "") for x in scrape))
            job = job_of(meta[2])
            for t, text in series.get("values") or ():
                start = int(t) - back
                row = rows.get((start, job))
                if row is None:
                    row = rows[(start, job)] = {"_meta": meta}
                elif row["_meta"] is not meta and row["_meta"] != meta:
                    row["_meta"] = _merge_meta(row["_meta"], meta)
                v = float(text)
                if counting:  # series split by a relabel (Hostname rename) add up; copies and aliases do not
                    per_copy = row.get(fname)
                    if per_copy is None:
                        per_copy = row[fname] = {}
                    per_copy[copy] = per_copy.get(copy, 0) + int(v)
                    continue
                if v >= 0.0 and v != math.inf:
                    v /= div
                    if bounded and v > 1.0:
                        v = self.slow(fname, unit, v * div, metric_name, gkey, start)
                else:
                    v = self.slow(fname, unit, v, metric_name, gkey, start)
                if v is None:
                    continue
                old = row.get(fname)
                if old is None or v > old:  # copies of one GPU: max, never summed
                    row[fname] = v

    def add_jobs(self, data: dict[str, Any], back: int) -> None:
        """Job ids from nvidia_gpu_jobId values (jobstats publishes the job as a value, 0 = no job), per GPU
        and bucket: they become the job key of that bucket's unlabelled row (comma-joined when the GPU
        changed hands inside the bucket)."""
        for series in data.get("result") or ():
            gkey = self.key(series.get("metric") or {})
            if gkey is None:
                continue
            per_bucket = self.jobs.setdefault(gkey, {})
            for t, text in series.get("values") or ():
                try:
                    job = int(float(text))
                except ValueError:
                    continue
                if job > 0:
                    per_bucket.setdefault(int(t) - back, set()).add(str(job))

    def add_cycles(self, name: str, data: dict[str, Any], back: int) -> None:
        """A bucket's increase of one SM cycle counter into the rows the value answers made (copies: max)."""
        key = "_cyc_active" if name == SM_CYCLES_ACTIVE else "_cyc_elapsed"
        for series in data.get("result") or ():
            gkey = self.key(series.get("metric") or {})
            rows = self.rows.get(gkey) if gkey is not None else None
            if rows is None or (series.get("metric") or {}).get("vgpu"):  # a shared GPU's cycles on a pod
                continue
            job = job_of(self.meta(series.get("metric") or {})[2])
            for t, text in series.get("values") or ():
                row, v = rows.get((int(t) - back, job)), float(text)
                if row is not None and v >= 0.0 and v != math.inf and v > row.get(key, -1.0):
                    row[key] = v

    def slow(self, fname: str, unit: str, raw: float, metric_name: str, gkey: tuple[str, int, str],
             start: int) -> float | None:
        """Clamp (counted) or quarantine (one problem per GPU bucket and field) a value off the fast path."""
        if fname.startswith("_count_"):
            return raw if raw == raw else None
        try:
            v, clamped = normalise(fname, unit, raw)  # type: ignore[arg-type]
        except BadValue as exc:
            host, gpu, inst = gkey
            when = datetime.fromtimestamp(start, UTC).isoformat()
            where = f"{host}/gpu{gpu}{'/' + inst if inst else ''} @ {when}"
            if (where, fname) not in self._dropped:
                self._dropped.add((where, fname))
                self.problems.skip(self.src.source, where, str(exc), metric_name)
            return None
        if clamped:
            self.problems.clamp(self.src.source, f"{fname}>1")
        return v

    def buckets(self) -> Iterator[GpuBucket]:
        cluster, seconds = self.src.context.cluster, self.bucket_s
        interval = self.src.options.sample_interval_s
        for (host, gpu, inst), rows in sorted(self.rows.items()):
            valued = self.jobs.get((host, gpu, inst))
            if valued:  # jobstats: the unlabelled row of a bucket takes the job ids its jobId series gave
                for (start, job) in [k for k in rows if k[1] == "" and k[0] in valued]:
                    ids = ",".join(sorted(valued[start], key=lambda j: (len(j), j)))
                    row = rows.pop((start, job))
                    uuid, model, labels = row["_meta"]
                    row["_meta"] = (uuid, model, (*labels, ("hpc_job", ids)))
                    rows[(start, ids)] = row
            yield from self._gpu(cluster, seconds, host, gpu, inst, rows, interval)

    @staticmethod
    def _gpu(cluster: str, seconds: int, host: str, gpu: int, inst: str,
             rows: dict[tuple[int, str], dict[str, Any]], interval: float | None = None) -> Iterator[GpuBucket]:
        counted = []
        for (start, job), row in sorted(rows.items()):
            uuid, model, labels = row.pop("_meta")
            found = [row.pop(f"_count_{f}", None) for f in COUNT_FIELDS]  # the strongest field counted
            counts = next((c for c in found if c), None) or {0: 0}
            exact = ratio(row.pop("_cyc_active", None), row.pop("_cyc_elapsed", None))
            if exact is not None and exact <= 2.0:  # SM activity from the cycle counters, before the sampled mean
                row["sm_active"], row["sm_exact"] = min(exact, 1.0), True
            counted.append((start, job, row, uuid, model, labels, max(counts.values())))
        observed = carried(seconds, [(start, job, samples) for start, job, _r, _u, _m, _l, samples in counted],
                           interval)
        for start, job, row, uuid, model, labels, samples in counted:
            joined: dict[str, set[str]] = {}
            for k, v in labels:
                joined.setdefault(k, set()).add(v)
            yield GpuBucket(cluster=cluster, host=host, gpu=gpu, gpu_instance=inst, seconds=seconds,
                            start=datetime.fromtimestamp(start, UTC), samples=samples, uuid=uuid, model=model,
                            observed_s=observed[(start, job)], job=job,
                            **row, **{k: ",".join(sorted(vs)) for k, vs in joined.items()})


def carried(seconds: int, rows: list[tuple[int, str, int]],
            interval: float | None) -> dict[tuple[int, str], float | None]:
    """Observed seconds per (bucket start, job) of one GPU from sample counts (docs/definitions.md): each
    sample covers one interval, carried into the series' next bucket (at most one interval) when the
    counts cover more than their bucket. The interval is ``sample_interval_s``, else estimated as the
    median of the seconds per sample of the GPU's inner buckets (those whose series has samples in the
    bucket before and after: the queries return counts, not instants; one bucket with a dropped scrape
    does not move it); else the bucket length over the most samples."""
    have = {(start, job) for start, job, n in rows if n > 0}
    inner = [n for start, job, n in rows if n > 0 and (start - seconds, job) in have
             and (start + seconds, job) in have]
    most = max((n for _s, _j, n in rows), default=0)
    step = interval or (statistics.median(seconds / n for n in inner) if inner else seconds / most if most > 0
                        else None)
    out: dict[tuple[int, str], float | None] = {}
    carry: dict[str, tuple[int, float]] = {}  # job -> (bucket start it reaches, seconds carried)
    for start, job, n in sorted(rows):
        if step is None:
            out[(start, job)] = None
            continue
        reach, extra = carry.pop(job, (start, 0.0))
        avail = n * step + (extra if reach == start and n > 0 else 0.0)
        out[(start, job)] = min(float(seconds), avail)
        if n > 0 and avail > seconds:
            carry[job] = (start + seconds, min(step, avail - seconds))
    return out


def _gpu_of(metric: dict[str, str]) -> tuple[str, str] | None:
    """A series' node and GPU as its labels name them (for grouping one answer's series by node)."""
    host, gpu = pick_label(metric, "host"), pick_label(metric, "gpu") or pick_label(metric, "uuid")
    return (host, gpu) if host and gpu else None


def job_of(labels: tuple[tuple[str, str], ...]) -> str:
    """The job key of a series: its hpc_job label, else namespace/pod, else "" (no job label)."""
    d = dict(labels)
    if d.get("hpc_job"):
        return d["hpc_job"]
    if d.get("pod"):
        return f"{d.get('namespace', '')}/{d['pod']}"
    return ""


def _merge_meta(a: tuple, b: tuple) -> tuple:
    """Two series of one GPU bucket (hpc_job / pod copies): first uuid and model, all labels."""
    return (a[0] or b[0], a[1] or b[1], tuple(dict.fromkeys(a[2] + b[2])))


TELEMETRY = PrometheusTelemetry
