"""The ``rest`` backend: slurmrestd with a JWT (``X-SLURM-USER-NAME`` / ``X-SLURM-USER-TOKEN``).

Versions do not overlap across releases (22.05 serves v0.0.36-38, 24.11 v0.0.40-42, 25.11 v0.0.44, 26.05
v0.0.45, 26.11 v0.0.46: SchedMD/slurm src/plugins/data_parser), so
unless ``rest_version`` is set the backend asks ``/slurm/vX/ping`` from the newest version it knows down
and keeps the first that answers. Job objects are the same shapes as ``squeue --json`` / ``sacct --json``,
parsed by :mod:`connectors.slurm.jobs`."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import httpx

from auditor.errors import ConfigError, SourceError
from connectors.base import Problems, Window
from connectors.slurm import events, jobs, quotas
from connectors.slurm import inventory as inv
from connectors.slurm.reading import Reading

if TYPE_CHECKING:
    from connectors.slurm import SlurmAllocations

log = logging.getLogger("gpu_audit.slurm")

KNOWN_VERSIONS = ("v0.0.46", "v0.0.45", "v0.0.44", "v0.0.43", "v0.0.42", "v0.0.41", "v0.0.40", "v0.0.39",
                  "v0.0.38")
#: slurmrestd parses query times in the server's local zone; read this much wider, then filter in UTC.
TZ_MARGIN = timedelta(hours=14)


class RestBackend:
    """Reads one cluster through slurmrestd. GET only."""

    def __init__(self, owner: SlurmAllocations) -> None:
        self.owner = owner
        self.notes: list[str] = []  # said under the source's line of collect output
        self.o = owner.options
        self.cluster = owner.context.cluster
        self.name = owner.name
        if not self.o.rest_url:
            raise ConfigError("slurm.rest_url: required for backend = \"rest\"")
        self.version = self.o.rest_version

    def _client(self) -> httpx.Client:
        token = self.o.rest_token.resolve("slurm.rest_token")
        headers = {"X-SLURM-USER-NAME": self.o.rest_user}
        if token:
            headers["X-SLURM-USER-TOKEN"] = token
        verify: bool | str = self.o.verify_tls
        if self.o.ca_file and self.o.verify_tls:
            verify = str(self.o.ca_file)
        return httpx.Client(base_url=self.o.rest_url.rstrip("/"), headers=headers, timeout=self.o.timeout_s,
                            verify=verify)

    def get(self, client: httpx.Client, path: str, params: dict[str, str] | None = None,
            missing_ok: bool = False) -> dict[str, Any] | None:
        """GET one endpoint; failures become one-line SourceErrors without the token or the body."""
        try:
            resp = client.get(path, params=params)
        except httpx.TimeoutException:
            raise SourceError(self.name, f"GET {path} timed out after {self.o.timeout_s:g}s",
                              transient=True) from None
        except httpx.HTTPError as exc:
            raise SourceError(self.name, f"GET {path}: {type(exc).__name__}", transient=True) from None
        if resp.status_code == 404 and missing_ok:
            return None
        if resp.status_code in (401, 403):
            raise SourceError(self.name, f"GET {path}: HTTP {resp.status_code} (token rejected or expired)",
                              transient=False)
        try:
            data = resp.json()
        except (json.JSONDecodeError, ValueError):
            raise SourceError(self.name, f"GET {path}: HTTP {resp.status_code}, not JSON",
                              transient=True) from None
        if resp.status_code >= 400:
            errors = data.get("errors") if isinstance(data, dict) else None
            text = json.dumps(errors)[:300] if errors else ""
            if "Nothing found" in text:  # 22.05 slurmdb answers an empty query with an error
                return {"jobs": []}
            from connectors.retry import retry_after

            raise SourceError(self.name, f"GET {path}: HTTP {resp.status_code} {text}".strip(),
                              transient=True, retry_after=retry_after(resp.headers.get("Retry-After")))
        if not isinstance(data, dict):
            raise SourceError(self.name, f"GET {path}: unexpected JSON", transient=True)
        return data

    def _negotiate(self, client: httpx.Client) -> str:
        if self.version:
            return self.version
        for v in KNOWN_VERSIONS:
            if self.get(client, f"/slurm/{v}/ping", missing_ok=True) is not None:
                self.version = v
                return v
        raise SourceError(self.name, f"slurmrestd answers none of {', '.join(KNOWN_VERSIONS)}",
                          transient=False)

    def read(self, window: Window, problems: Problems) -> Reading:
        now = datetime.now(UTC)
        reading = Reading()
        self.notes = []
        with self._client() as client:
            v = self._negotiate(client)
            nodes = self.get(client, f"/slurm/{v}/nodes") or {}
            nodes_ok = isinstance(nodes.get("nodes"), list)

            def node_parts(node: dict) -> tuple:
                return (inv.from_json_node(node, self.cluster, now), events.from_json_node(node, self.cluster, now),
                        inv.node_shards(node))

            bad_nodes: list[int] = []
            for gpus, ev, sh in self._each(nodes.get("nodes"), node_parts, f"/slurm/{v}/nodes", "nodes", problems,
                                           bad_nodes):
                reading.inventory.extend(gpus)
                if ev is not None:
                    reading.events.append(ev)
                if sh is not None:
                    reading.shards[sh[0]] = sh[1]
            nodes_ok = nodes_ok and not bad_nodes
            reading.running_at = datetime.now(UTC)
            live = self.get(client, f"/slurm/{v}/jobs") or {}
            bad_jobs: list[int] = []
            for a in self._each(live.get("jobs"), lambda job: jobs.from_json_job(job, self.cluster),
                                f"/slurm/{v}/jobs", "jobs", problems, bad_jobs):
                reading.add_live(a)
            reading.running_complete = isinstance(live.get("jobs"), list) and not bad_jobs
            if nodes_ok:  # the whole node list read: it is the current state, so it can end events
                reading.event_states = ("slurmrestd", events.REST_STATE_KINDS)
            per_node = inv.gpus_per_node(reading.inventory)
            resv = self.get(client, f"/slurm/{v}/reservations") or {}
            for res in self._each(resv.get("reservations"),
                                  lambda r: inv.from_json_reservation(r, self.cluster, per_node),
                                  f"/slurm/{v}/reservations", "reservations", problems):
                if res.start < window.until and res.end > window.since:
                    reading.reservations.append(res)
            names, past = self._db_reservations(client, v, per_node, problems, window)
            fmt = "%Y-%m-%dT%H:%M:%S"
            params = {"start_time": (window.since - TZ_MARGIN).strftime(fmt),
                      "end_time": (window.until + TZ_MARGIN).strftime(fmt)}
            hist = self.get(client, f"/slurmdb/{v}/jobs", params=params) or {}
            reading.history.extend(self._each(hist.get("jobs"),
                                              lambda job: jobs.from_json_db_job(job, self.cluster, names),
                                              f"/slurmdb/{v}/jobs", "jobs", problems))
            reading.quotas = self._quotas(client, v, problems, now)
        name_reservations(reading, names)
        reading.reservations = inv.merge_reservations(reading.reservations, past, window, now)
        return reading

    def _db_reservations(self, client: httpx.Client, v: str, per_node: dict[str, int],
                         problems: Problems, window: Window) -> tuple[dict[str, str], list]:
        """Accounting's reservations where slurmrestd serves them (``/slurmdb/vX/reservations``): the
        id -> name map and the past reservations, pieces assembled as from sacctmgr. 22.05's v0.0.38
        answers 404: then ``sacctmgr`` is asked, as the cli backend does, so a reservation that ended before
        its first collect and the jobs that ran in it keep their names; without sacctmgr that is said."""
        data = self.get(client, f"/slurmdb/{v}/reservations", missing_ok=True)
        if data is None:
            from connectors.slurm.cli import CliBackend

            try:
                return CliBackend(self.owner).past_reservations(window, per_node, problems)
            except SourceError as exc:
                note = (f"slurmrestd {v} serves no /slurmdb reservations and {exc.reason}: reservations that "
                        "ended before a collect saw them are not stored, and their jobs have no reservation name")
                log.warning("%s: %s", self.name, note)
                self.notes.append(note)
                return {}, []
        names: dict[str, str] = {}
        pieces = []
        convert = lambda r: inv.from_json_db_reservation(r, self.cluster, per_node)  # noqa: E731
        for res in self._each(data.get("reservations"), convert, f"/slurmdb/{v}/reservations", "reservations",
                              problems):
            if res.slurm_id:
                names[res.slurm_id] = res.name
            pieces.append(res)
        return names, inv.assemble_pieces(pieces)


    def _quotas(self, client: httpx.Client, v: str, problems: Problems, now: datetime) -> list:
        """GPU quotas of QOS and accounts from slurmdbd; an endpoint that fails costs the quotas only."""
        out = []
        for what in ("qos", "associations"):
            path = f"/slurmdb/{v}/{what}"
            try:
                data = self.get(client, path, missing_ok=True) or {}
            except SourceError as exc:
                log.warning("%s (GPU quotas of %s skipped)", exc, what)
                continue
            items = data.get("QOS") if what == "qos" and "QOS" in data else data.get(what)  # 22.05: "QOS"
            convert = ((lambda obj: quotas.from_json_qos(obj, self.cluster, now)) if what == "qos" else
                       (lambda obj: quotas.from_json_assoc(obj, self.cluster, self.o.cluster_name, now)))
            out += [q for q in self._each(items, convert, path, what, problems) if q is not None]
        return out

    def _each(self, items: Any, convert: Callable[[Any], Any], path: str, what: str, problems: Problems,
              failed: list[int] | None = None) -> Iterator[Any]:
        """Each object of a listing converted; one that does not convert is quarantined (where: path and
        index; why; an excerpt) and skipped, its index added to ``failed``. Not a list: nothing."""
        for i, obj in enumerate(items if isinstance(items, list) else []):
            try:
                yield convert(obj)
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                problems.skip(f"{self.name}:{path}", f"{what}[{i}]", str(exc), str(obj)[:200])
                if failed is not None:
                    failed.append(i)


def name_reservations(reading: Reading, names: dict[str, str]) -> None:
    """22.05's slurmdbd gives a job's reservation as an id with a garbage name. Where accounting's list of
    reservations is not served, learn id -> name from jobs the running view lists with ``resv_name`` and
    history lists with the id; name the history jobs, and give current reservations their id."""
    running = {a.external_id: a.reservation for a in reading.running if a.reservation}
    for h in reading.history:
        rid = str(h.labels.get("reservation_id") or "")
        if rid and running.get(h.external_id):
            names.setdefault(rid, running[h.external_id])
    for h in reading.history:
        rid = str(h.labels.get("reservation_id") or "")
        if rid and not h.reservation and rid in names:
            h.reservation = names[rid]
    ids = {name: rid for rid, name in names.items()}
    for r in reading.reservations:
        if not r.slurm_id and r.name in ids:
            r.slurm_id = ids[r.name]
