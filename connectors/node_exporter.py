"""Host telemetry (node_exporter, and the Lustre client exporter) through a Prometheus-compatible API: what
each node's host did per bucket, for the host side of "Where the waiting goes" (docs/node-telemetry.md).

Per field and chunk one ``query_range`` whose step is the bucket, evaluated at each bucket's end with
``offset 1ms``, so a point covers exactly [start, start + bucket) as in :mod:`connectors.prometheus`.
Counters become per-second rates over the bucket (``rate``: Prometheus handles counter resets and
extrapolates to the bucket's edges); a bucket with fewer than two samples of a counter has no rate, so that
field is not measured there, never 0. Copies of one series that only scrape labels tell apart (node_exporter
scraped by two Prometheus jobs: ``scrape_labels``) are merged first (``max without (job)``), so a core is
never counted twice. Unlike the GPU queries, these aggregate on the server (``sum by``
the host label): a node exports one CPU series per core and mode (a 128-core node: 1,024) and one disk
series per device, and the audit needs the node's total, so the answer is 100-1,000x smaller.

- ``cpus``: cores reporting (``count`` of the idle-mode series); ``samples``: samples per series;
- ``cpu_busy``, ``cpu_iowait``: cores busy (user, nice, system, irq, softirq) and in I/O wait;
- ``cpu_pegged``: cores busy at least ``PEGGED_CORE_BUSY`` of the bucket (0 where none is, when cores report);
- ``disk_*``: read and written bytes/s summed over devices, the busiest device's busy share (``io_time``);
  device-mapper, md, loop and the like are left out by ``DISK_EXCLUDE`` (their I/O is the disks' again);
- ``ib_*``, ``nfs_*``, ``lustre_*``: InfiniBand port, NFS client (mountstats bytes; all-procedure requests)
  and Lustre client (llite) bytes/s, summed over devices, ports and mounts.

Per InfiniBand or RoCE port (:data:`PORT_QUERIES`, one more query per field and chunk, ``by`` the host label,
``device`` and ``port``): its transmit wait as a share of the bucket (:func:`wait_share`), its link errors and, on
RoCE, the share of its received packets marked congested (:func:`ecn_share`), as
:class:`auditor.records.PortBucket` (issue 48 §2, the congested link).

The node name is the host label's value (``instance`` without its port by default), as GPU telemetry and the
schedulers name the node: that ties a node bucket to the allocations on it. Records only; the store is never
touched.
"""

from __future__ import annotations

import ipaddress
import math
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from typing import Any

from pydantic import Field

from auditor.errors import SourceError
from auditor.records import NODE_FIELDS, NodeBucket, PortBucket
from connectors._api_or_files import ApiOrFiles, ApiOrFilesSource, cell, csv_records
from connectors.aliases import host_from_instance
from connectors.base import Problems, Window
from connectors.prometheus import carried, without_scrape

#: A core is pegged in a bucket when it was busy (user, nice, system, irq, softirq) at least this share of it: a
#: data loader or input thread that cannot keep up (a `node_exporter.` option until issue 45)
PEGGED_CORE_BUSY = 0.9
#: Disk devices left out of the disk fields (RE2, whole name): device-mapper, md, loop and the like are volumes
#: stacked on other disks and would count their I/O twice (a `node_exporter.` option until issue 45)
DISK_EXCLUDE = "(dm-|md|loop|ram|zram|sr|fd|nbd|drbd).*"

CPU = "node_cpu_seconds_total"
BUSY_MODES = 'mode!~"idle|iowait|steal"'  # steal: the hypervisor's, not this host's work
#: field -> (aggregation, function, metric name, extra label matchers): the node's total per bucket
QUERIES: dict[str, tuple[str, str, str, str]] = {
    "samples": ("max", "count_over_time", CPU, 'mode="idle"'),
    "cpus": ("count", "count_over_time", CPU, 'mode="idle"'),
    "cpu_busy": ("sum", "rate", CPU, BUSY_MODES),
    "cpu_iowait": ("sum", "rate", CPU, 'mode="iowait"'),
    "cpu_pegged": ("count", "rate", CPU, BUSY_MODES),  # per core first, see NodeTelemetry.promql
    "disk_read_bps": ("sum", "rate", "node_disk_read_bytes_total", "{disk}"),
    "disk_write_bps": ("sum", "rate", "node_disk_written_bytes_total", "{disk}"),
    "disk_busy": ("max", "rate", "node_disk_io_time_seconds_total", "{disk}"),
    "ib_rx_bps": ("sum", "rate", "node_infiniband_port_data_received_bytes_total", ""),
    "ib_tx_bps": ("sum", "rate", "node_infiniband_port_data_transmitted_bytes_total", ""),
    "nfs_read_bps": ("sum", "rate", "node_mountstats_nfs_total_read_bytes_total", ""),
    "nfs_write_bps": ("sum", "rate", "node_mountstats_nfs_total_write_bytes_total", ""),
    "nfs_ops": ("sum", "rate", "node_nfs_requests_total", ""),
    "lustre_read_bps": ("sum", "rate", "lustre_read_bytes_total", 'component="client"'),
    "lustre_write_bps": ("sum", "rate", "lustre_write_bytes_total", 'component="client"'),
}
#: shares that cannot exceed 1 (a rate's extrapolation may overshoot by a little: clipped)
SHARES = ("disk_busy",)

# -- per InfiniBand port (issue 48 §2) ----------------------------------------------------------------------------
# Names from prometheus/node_exporter collector/infiniband_linux.go at commit
# a7dcc3a01545180d4f2087db70994cbc3abfed13 (2026-08-08): the metric table and the pushCounter/pushMetric lines of
# Update, every family labelled ``device`` and ``port``; the values from prometheus/procfs sysfs/class_infiniband.go
# at cff69b9d9aa77a0793276da74310e38422864e28 (PortXmitWait is the raw counters/port_xmit_wait, not scaled; Rate
# is the port's rate file in bytes/s). Provenance and a written exposition: tests/fixtures/node_exporter.
#: "Number of ticks during which the port had data to transmit but no data was sent during the entire tick"
TRANSMIT_WAIT = "node_infiniband_port_transmit_wait_total"
#: the port's signalling rate, bytes/s (a gauge: "Maximum signal transfer rate")
PORT_RATE = "node_infiniband_rate_bytes_per_second"
#: the link error counters summed into ``link_errors`` (their increase over the bucket)
LINK_ERRORS = ("node_infiniband_symbol_error_total", "node_infiniband_link_error_recovery_total",
               "node_infiniband_link_downed_total", "node_infiniband_port_errors_received_total")
#: Bytes the port could have sent in one tick of the transmit-wait counter. The tick is hardware-defined (the
#: IBA spec: a multiple of the symbol time, per device); NVIDIA's ibdiagnet manual ("Congestion Assessment on
#: InfiniBand Links") gives its Quantum-class hardware as one tick per 8 bytes of the port ("lost bytes per port =
#: counter x (tick + 1)", tick 7). gpu-audit uses that ratio for every port: the wait share is the bytes not sent
#: (ticks x 8) over what the port's rate sends in the bucket. On hardware with another tick the share is off by
#: that factor, the ranking of ports on one fabric is not.
BYTES_PER_TICK = 8
#: RoCE (RDMA over Converged Ethernet): node_exporter lists a RoCE HCA's ports with the InfiniBand ones (its
#: collector reads /sys/class/infiniband, where the RDMA driver puts both link layers; a RoCE port's data and
#: packet counters count its RDMA traffic). On Ethernet a congested switch queue marks packets (ECN) instead of
#: holding the sender back in ticks, so a RoCE port's congestion is the share of the packets it received that
#: were marked: the mlx5 hardware counter np_ecn_marked_roce_packets (Update's HwCounters lines, the same commit)
#: over its received packets
ECN_MARKED = "node_infiniband_np_ecn_marked_roce_packets_received_total"
#: "Number of packets received on all VLs by this port (including errors)"
RX_PACKETS = "node_infiniband_port_packets_received_total"
#: field -> (function over the bucket, metric name): per port
PORT_QUERIES: dict[str, tuple[str, str]] = {
    "xmit_wait": ("rate", TRANSMIT_WAIT), "rate_bps": ("max_over_time", PORT_RATE),
    "ecn_marked": ("rate", ECN_MARKED), "rx_packets": ("rate", RX_PACKETS),
    **{f"errors:{n}": ("increase", n) for n in LINK_ERRORS}}


def wait_share(ticks_per_s: float | None, rate_bps: float | None) -> float | None:
    """The share of a bucket an InfiniBand port waited to send: ticks/s x :data:`BYTES_PER_TICK` / its rate in
    bytes/s, at most 1; None when either is not measured (or the rate is 0: a port down)."""
    if ticks_per_s is None or not rate_bps:
        return None
    return min(1.0, ticks_per_s * BYTES_PER_TICK / rate_bps)


def ecn_share(marked_per_s: float | None, packets_per_s: float | None) -> float | None:
    """The share of the packets a RoCE port received that a switch marked congested (ECN): marked/s over
    received/s, at most 1; None when either is not measured or nothing was received (no share of nothing)."""
    if marked_per_s is None or not packets_per_s:
        return None
    return min(1.0, marked_per_s / packets_per_s)


class NodeTelemetry(ApiOrFilesSource):
    """Per node and bucket: CPU cores busy, in I/O wait and pegged; disk, InfiniBand, NFS, Lustre bytes/s."""

    class Options(ApiOrFiles):
        url: str | None = Field(None, description="Base URL of the Prometheus-compatible API that scrapes "
                                "node_exporter, e.g. `https://prometheus:9090` (or `paths`).")
        paths: list[str] | None = Field(None, description="Instead of `url`: CSV files (or glob patterns, relative "
                                        "to the config file) of per-bucket rows, `start,node,` then any of the "
                                        "node_buckets fields (docs/node-telemetry.md).")
        host_label: str = Field("instance", pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", description="Label naming the "
                                "node (`instance`: its host part, the port dropped), as GPU telemetry and the "
                                "schedulers name it; e.g. `node` where relabelling adds the Kubernetes node.")
        strip_domain: bool = Field(False, description="Keep the node name up to its first dot (`gpu-01.example."
                                   "org` -> `gpu-01`) where the scrape targets are FQDNs and the schedulers use "
                                   "short names; IP addresses are kept whole.")
        port_paths: list[str] | None = Field(None, description="With `paths`: CSV files (or glob patterns) of "
                                             "per-port rows, `start,node,device,port,wait_share,link_errors` "
                                             "(and `ecn_share` for a RoCE port) "
                                             "(docs/node-telemetry.md \"Per port\"); with `url` the ports are "
                                             "read from the API.")
        sample_interval_s: float | None = Field(None, gt=0, description="Scrape interval of node_exporter, "
                                                "seconds: a bucket's observed seconds are its samples times this. "
                                                "Unset = estimated per node (median seconds per sample of its "
                                                "inner buckets).")

    name = "node_exporter"

    options: NodeTelemetry.Options  # (ApiOrFilesSource sets it)

    # -- queries ----------------------------------------------------------------------------------

    def selector(self, name: str, extra: str) -> str:
        exclude = DISK_EXCLUDE.replace("\\", "\\\\")  # inside a PromQL string
        parts = [p for p in (extra.replace("{disk}", f'device!~"{exclude}"'),
                             self.options.matchers) if p]
        return f"{name}{{{','.join(parts)}}}"

    def promql(self, fname: str, bucket_s: int) -> str:
        """The query of one field: per series over exactly the bucket, then the node's total."""
        agg, fn, name, extra = QUERIES[fname]
        by = self.options.host_label
        inner = without_scrape(f"{fn}({self.selector(name, extra)}[{bucket_s}s] offset 1ms)",
                               self.options.scrape_labels, by)
        if fname == "cpu_pegged":  # cores, not series: the modes of one core first
            return f"count by ({by}) (sum by ({by}, cpu) ({inner}) >= {PEGGED_CORE_BUSY:g})"
        return f"{agg} by ({by}) ({inner})"

    def port_promql(self, fname: str, bucket_s: int) -> str:
        """The query of one per-port field: per series over exactly the bucket, then per node, device and port."""
        fn, name = PORT_QUERIES[fname]
        by = self.options.host_label
        inner = without_scrape(f"{fn}({self.selector(name, '')}[{bucket_s}s] offset 1ms)",
                               self.options.scrape_labels, by)
        return f"sum by ({by}, device, port) ({inner})"

    def present(self, window: Window, problems: Problems) -> set[str]:
        """The metric names of :data:`QUERIES` and :data:`PORT_QUERIES` the server has in the window (one
        listing), so an absent collector costs no query; all of them when the server cannot list names."""
        names = sorted({q[2] for q in QUERIES.values()} | {q[1] for q in PORT_QUERIES.values()})
        assert self.http is not None
        data: dict[str, Any] = {"start": f"{window.since.timestamp():.3f}", "end": f"{window.until.timestamp():.3f}",
                                "match[]": self.selector("", f'__name__=~"{"|".join(names)}"')}
        try:
            got = self.http.api("/api/v1/label/__name__/values", data, problems, "GET")
        except SourceError as exc:
            if exc.transient:
                raise
            return set(names)
        return {n for n in got or () if n in names}

    def node_name(self, metric: dict[str, str]) -> str | None:
        value = metric.get(self.options.host_label)
        if not value:
            return None
        if self.options.host_label == "instance":
            value = host_from_instance(value)
        if self.options.strip_domain:
            try:
                ipaddress.ip_address(value)
            except ValueError:
                value = value.split(".", 1)[0]
        return value or None

    def collect(self, window: Window, problems: Problems) -> Iterable[NodeBucket | PortBucket]:
        if self.http is None:
            yield from self.read_files(window, problems)
            return
        b = window.bucket_seconds
        try:
            have = self.present(window, problems)
            fields = [f for f, q in QUERIES.items() if q[2] in have]
            pfields = [f for f, q in PORT_QUERIES.items() if q[1] in have and (f != "rx_packets" or ECN_MARKED in have)
                       ] if TRANSMIT_WAIT in have or ECN_MARKED in have else []
            if not fields and not pfields:
                self.notes = ["no node_exporter metric in the window (node_cpu_seconds_total, node_disk_*, "
                              "node_infiniband_*, node_mountstats_nfs_*, node_nfs_requests_total, lustre_*)"]
                return
            unnamed = 0
            for first, last in self.http.chunks(window):
                rows: dict[str, dict[int, dict[str, float]]] = {}
                for fname in fields:
                    data = self.http.api("/api/v1/query_range", {"query": self.promql(fname, b),
                                                                 "start": str(first + b), "end": str(last + b),
                                                                 "step": str(b)}, problems)
                    unnamed += self.fold(rows, fname, data, b, problems)
                yield from self.buckets(rows, window)
                yield from self.port_buckets(first, last, pfields, window, problems)
            self.notes = [f"node telemetry without the label {self.options.host_label!r} (in {unnamed} of "
                          f"{len(fields)} fields): not tied to a node"] if unnamed else []
        finally:
            self.close()

    def fold(self, rows: dict[str, dict[int, dict[str, float]]], fname: str, data: Any, b: int,
             problems: Problems) -> int:
        """One field's answer into ``rows`` (node -> bucket start -> field); returns 1 when some series had no
        node label (the answer is per node: they fold into one), else 0."""
        unnamed = 0
        for series in self._matrix(data):
            node = self.node_name(series.get("metric") or {})
            if node is None:
                unnamed = 1
                continue
            per = rows.setdefault(node, {})
            for end, value in self._rates(series, fname, node, b, problems):
                per.setdefault(end - b, {})[fname] = min(value, 1.0) if fname in SHARES else value
        return unnamed

    def _matrix(self, data: Any) -> list[dict[str, Any]]:
        """The series of a query_range answer; anything but a matrix fails the source in one line."""
        if not isinstance(data, dict) or data.get("resultType") != "matrix":
            raise SourceError(self.source, f"query_range answered {str(data)[:60]!r}, not a matrix")
        return data.get("result") or []

    def _rates(self, series: dict[str, Any], fname: str, where: str, b: int,
               problems: Problems) -> Iterator[tuple[int, float]]:
        """A series' points as (end, value); a point that is no point or no rate (negative, not finite) is
        quarantined with where and why, never dropped silently."""
        for point in series.get("values") or ():
            try:
                end, value = int(float(point[0])), float(point[1])
            except (TypeError, ValueError, IndexError):
                problems.skip(self.source, "query_range", f"{fname}: not a point", str(point)[:80])
                continue
            if not math.isfinite(value) or value < 0:
                problems.skip(self.source, f"{where} @ {end - b}", f"{fname}: {value!r} is not a rate")
                continue
            yield end, value

    def buckets(self, rows: dict[str, dict[int, dict[str, float]]], window: Window) -> Iterator[NodeBucket]:
        b = window.bucket_seconds
        since, until = window.since.timestamp(), window.until.timestamp()
        for node, per in sorted(rows.items()):
            observed = carried(b, [(start, "", int(v.get("samples", 0))) for start, v in per.items()],
                               self.options.sample_interval_s)
            for start, v in sorted(per.items()):
                if not since <= start < until:
                    continue
                if v.get("cpus") and "cpu_pegged" not in v:
                    v["cpu_pegged"] = 0.0  # cores reported and none was pegged: the count has no point
                samples = int(v.get("samples", 0))
                yield NodeBucket(cluster=self.context.cluster, node=node, start=datetime.fromtimestamp(start, UTC),
                                 seconds=b, samples=samples, observed_s=observed.get((start, "")) if samples else None,
                                 **{f: v.get(f) for f in NODE_FIELDS})

    def port_buckets(self, first: int, last: int, pfields: list[str], window: Window,
                     problems: Problems) -> Iterator[PortBucket]:
        """The per-port fields of one chunk, as port buckets (a series without its node, device or port is
        left out: a port is named by all three)."""
        assert self.http is not None
        b = window.bucket_seconds
        ports: dict[tuple[str, str, str], dict[int, dict[str, float]]] = {}
        for fname in pfields:
            data = self.http.api("/api/v1/query_range", {"query": self.port_promql(fname, b), "start": str(first + b),
                                                         "end": str(last + b), "step": str(b)}, problems)
            for series in self._matrix(data):
                metric = series.get("metric") or {}
                node, dev, port = self.node_name(metric), metric.get("device"), metric.get("port")
                if node is None or not dev or not port:
                    continue
                per = ports.setdefault((node, dev, port), {})
                for end, value in self._rates(series, fname, f"{node} {dev}/{port}", b, problems):
                    per.setdefault(end - b, {})[fname] = value
        since, until = window.since.timestamp(), window.until.timestamp()
        for (node, dev, port), per in sorted(ports.items()):
            for start, v in sorted(per.items()):
                if not since <= start < until:
                    continue
                errs = [v[f] for f in v if f.startswith("errors:")]
                yield PortBucket(cluster=self.context.cluster, node=node, device=dev, port=port,
                                 start=datetime.fromtimestamp(start, UTC), seconds=b,
                                 wait_share=wait_share(v.get("xmit_wait"), v.get("rate_bps")),
                                 link_errors=sum(errs) if errs else None,
                                 ecn_share=ecn_share(v.get("ecn_marked"), v.get("rx_packets")))

    # -- the file form ----------------------------------------------------------------------------

    def read_files(self, window: Window, problems: Problems) -> Iterator[NodeBucket | PortBucket]:
        """Per-bucket rows of CSV files (a bucket of ``window.bucket_seconds`` starting at ``start``); a bad
        row is skipped with one line naming the file and line, the rest read."""
        since, until = window.since.timestamp(), window.until.timestamp()
        for nb in csv_records(self.context, self.options.paths or [], self.source, problems,
                              lambda rec: self.file_row(rec, window.bucket_seconds)):
            if since <= nb.start.timestamp() < until:
                yield nb
        for pb in csv_records(self.context, self.options.port_paths or [], self.source, problems,
                              lambda rec: self.port_row(rec, window.bucket_seconds)):
            if since <= pb.start.timestamp() < until:
                yield pb

    def port_row(self, rec: dict[str, str], bucket_s: int) -> PortBucket:
        """One per-port CSV row (``start,node,device,port,wait_share,link_errors``, and ``ecn_share`` for a RoCE
        port)."""
        from auditor.timeutil import parse_time

        node, dev, port = ((rec.get(k) or "").strip() for k in ("node", "device", "port"))
        if not node or not dev or not port:
            raise ValueError("node, device, port: a row must name all three")
        shares = {f: cell(rec, f, "share") for f in ("wait_share", "ecn_share")}
        for f, share in shares.items():
            if share is not None and share > 1:
                raise ValueError(f"{f}: {share:g} is not a share (0-1)")
        return PortBucket(cluster=self.context.cluster, node=node, device=dev, port=port,
                          start=parse_time(rec["start"]).astimezone(UTC), seconds=bucket_s,
                          link_errors=cell(rec, "link_errors", "count"), **shares)

    def file_row(self, rec: dict[str, str], bucket_s: int) -> NodeBucket:
        from auditor.timeutil import parse_time

        def num(k: str) -> float | None:
            return cell(rec, k, "rate")

        node = (rec.get("node") or "").strip()
        if not node:
            raise ValueError("node: empty (a row must name its node)")
        observed = num("observed_s")
        samples = int(num("samples") or (1 if observed is None or observed > 0 else 0))
        return NodeBucket(cluster=self.context.cluster, node=node, start=parse_time(rec["start"]).astimezone(UTC),
                          seconds=bucket_s, samples=samples, observed_s=observed,
                          **{f: num(f) for f in NODE_FIELDS})


TELEMETRY = NodeTelemetry
