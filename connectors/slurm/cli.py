"""The ``cli`` backend: Slurm's own commands, run as argument lists with a timeout, under ``TZ=UTC`` so every
time they print is UTC. Running jobs (with GPU indices) come from ``scontrol -d -o show job``, history from
``sacct --json`` or ``sacct -P``, nodes and reservations from ``scontrol -o show`` and ``sacctmgr``."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from auditor.errors import SourceError
from connectors.base import Problems, Window
from connectors.slurm import events as ev
from connectors.slurm import inventory as inv
from connectors.slurm import jobs, quotas
from connectors.slurm.parse import scontrol_records
from connectors.slurm.reading import Reading

if TYPE_CHECKING:
    from connectors.slurm import SlurmAllocations

log = logging.getLogger("gpu_audit.slurm")

SACCTMGR_FIELDS = ("Name", "ID", "TRES", "TimeStart", "TimeEnd", "NodeNames", "Flags")


def accounting_has_gpu(config_text: str) -> bool | None:
    """``scontrol show config`` -> does ``AccountingStorageTRES`` list ``gres/gpu``? None when absent."""
    for line in config_text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() == "AccountingStorageTRES":
            return any(t.strip().startswith("gres/gpu") for t in value.split(","))
    return None


_VERSION = re.compile(r"^slurm(?:-wlm)?\s+(\d+)\.(\d+)", re.MULTILINE)


def parse_version(text: str) -> tuple[int, int] | None:
    """``slurm 25.11.0`` / ``slurm-wlm 22.05.8`` (what ``sacct --version`` prints) -> (25, 11); None else."""
    m = _VERSION.search(text or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


def _ts(dt: datetime) -> str:
    return dt.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S")


class CliBackend:
    """Reads one cluster through sacct/scontrol/sacctmgr. Never changes Slurm."""

    def __init__(self, owner: SlurmAllocations) -> None:
        self.o = owner.options
        self.cluster = owner.context.cluster
        self.name = owner.name
        self.live = Reading()  # where the slurmctld listing goes (the read's Reading)
        self._versions: dict[str, tuple[int, int] | None] = {}

    def version(self, binary: str) -> tuple[int, int] | None:
        """The Slurm release of ``binary --version`` (cached); None when it cannot be run or read (then
        only what every release prints is asked for)."""
        if binary not in self._versions:
            try:
                self._versions[binary] = parse_version(self.run(binary, "--version"))
            except SourceError as exc:
                log.info("%s: %s --version: %s", self.name, binary, exc.reason)
                self._versions[binary] = None
        return self._versions[binary]

    # --- running commands -------------------------------------------------------------------------------
    def run(self, binary: str, *args: str) -> str:
        """Run one command; any failure is a one-line SourceError naming the command, never a traceback."""
        argv = [binary, *args]
        shown = " ".join([os.path.basename(binary), *args[:3]]) + (" …" if len(args) > 3 else "")
        env = {**os.environ, "TZ": "UTC", "SLURM_TIME_FORMAT": "standard"}
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=self.o.timeout_s,  # noqa: S603
                                  env=env, check=False)
        except FileNotFoundError:
            raise SourceError(self.name, f"{binary}: command not found", transient=False) from None
        except PermissionError:
            raise SourceError(self.name, f"{binary}: permission denied", transient=False) from None
        except subprocess.TimeoutExpired:
            raise SourceError(self.name, f"`{shown}` timed out after {self.o.timeout_s:g}s",
                              transient=True) from None
        if proc.returncode != 0:
            first = next((ln.strip() for ln in proc.stderr.splitlines() if ln.strip()), "no message")
            raise SourceError(self.name, f"`{shown}` exited {proc.returncode}: {first[:200]}", transient=True)
        return proc.stdout

    def _m(self) -> list[str]:
        return ["-M", self.o.cluster_name] if self.o.cluster_name else []

    # --- reading ----------------------------------------------------------------------------------------
    def read(self, window: Window, problems: Problems) -> Reading:
        now = datetime.now(UTC)
        reading = Reading()
        src = f"{self.name}:scontrol show node"
        text = self.run(self.o.scontrol, *self._m(), "-o", "show", "node")
        for i, rec in enumerate(scontrol_records(text), 1):
            if rec.startswith("No nodes"):
                continue
            try:
                reading.inventory.extend(inv.from_scontrol_node(rec, self.cluster, now))
                if (sh := inv.node_shards(rec)) is not None:
                    reading.shards[sh[0]] = sh[1]
            except (ValueError, KeyError) as exc:
                problems.skip(src, f"record {i}", str(exc), rec)
        reading.running_at = datetime.now(UTC)
        self.live = reading  # slurmctld's listing files its jobs into running, pending and ended
        reading.running, reading.running_complete = self._running(problems)
        resv_names = self._reservations(window, reading, problems)
        reading.history = self._history(window, problems, resv_names)
        reading.gpu_accounted = self._gpu_accounted()
        reading.quotas = self._quotas(problems)
        reading.events = self._events(window, problems)
        return reading

    def _quotas(self, problems: Problems) -> list:
        """GPU quotas of QOS and accounts (sacctmgr); unreadable accounting costs the quotas only."""
        now = datetime.now(UTC)
        out = []
        for what, fields in (("qos", quotas.QOS_FIELDS), ("assoc", quotas.ASSOC_FIELDS)):
            src = f"{self.name}:sacctmgr show {what}"
            try:
                text = self.run(self.o.sacctmgr, "-n", "-P", "show", what, f"format={','.join(fields)}")
            except SourceError as exc:
                log.warning("%s (GPU quotas of %s skipped)", exc, what)
                continue

            def bad(lineno: int, why: str, row: str, src: str = src) -> None:
                problems.skip(src, f"line {lineno}", why, row)

            rows = jobs.sacct_rows(text, fields)
            out += (quotas.from_qos_rows(rows, self.cluster, now, bad) if what == "qos" else
                    quotas.from_assoc_rows(rows, self.cluster, self.o.cluster_name, now, bad))
        return out

    def _events(self, window: Window, problems: Problems) -> list:
        """Nodes drained or down in the window, from slurmdbd (:mod:`connectors.slurm.events`); accounting
        unreachable: logged, no events (the jobs above still count)."""
        args = ["-n", "-P", "show", "event", "event=node", f"start={_ts(window.since)}", f"end={_ts(window.until)}",
                f"format={','.join(ev.EVENT_FIELDS)}"]
        if self.o.cluster_name:
            args.insert(4, f"cluster={self.o.cluster_name}")
        try:
            text = self.run(self.o.sacctmgr, *args)
        except SourceError as exc:
            log.warning("%s (node events skipped)", exc)
            return []
        return list(ev.parse_events(text, self.cluster, problems, f"{self.name}:sacctmgr show event"))

    def _gpu_accounted(self) -> bool | None:
        """Whether slurmdbd records GPU counts (AccountingStorageTRES has gres/gpu); None if unreadable."""
        try:
            text = self.run(self.o.scontrol, *self._m(), "show", "config")
        except SourceError as exc:
            log.info("%s: cannot read AccountingStorageTRES (%s)", self.name, exc.reason)
            return None
        return accounting_has_gpu(text)

    def _running(self, problems: Problems) -> tuple[list, bool]:
        """Jobs holding GPUs now; ``complete`` stays False when any record could not be read."""
        if self.o.running_from == "squeue":
            return self._running_squeue(problems)
        src = f"{self.name}:scontrol show job"
        text = self.run(self.o.scontrol, *self._m(), "-d", "-o", "show", "job")
        ok = True
        for i, rec in enumerate(scontrol_records(text), 1):
            if rec.startswith("No jobs"):
                continue
            try:
                a = jobs.from_scontrol_job(rec, self.cluster)
            except (ValueError, KeyError) as exc:
                ok = False
                problems.skip(src, f"record {i}", str(exc), rec)
                continue
            self.live.add_live(a)
        return self.live.running, ok

    def _running_squeue(self, problems: Problems) -> tuple[list, bool]:
        src = f"{self.name}:squeue --json"
        try:
            data = json.loads(self.run(self.o.squeue, *self._m(), "--json"))
        except json.JSONDecodeError as exc:
            raise SourceError(self.name, f"squeue --json: invalid JSON ({exc.msg})", transient=True) from None
        if not isinstance(data, dict) or not isinstance(data.get("jobs"), list):
            raise SourceError(self.name, "squeue --json: no jobs list in output", transient=True)
        ok = True
        for i, job in enumerate(data["jobs"]):
            try:
                a = jobs.from_json_job(job, self.cluster)
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                ok = False
                problems.skip(src, f"jobs[{i}]", f"bad job object: {exc}", json.dumps(job)[:200])
                continue
            self.live.add_live(a)
        return self.live.running, ok

    def _reservations(self, window: Window, reading: Reading, problems: Problems) -> dict[str, str]:
        """Current reservations from slurmctld (users/accounts), past ones from sacctmgr; returns the
        reservation id -> name map that sacct's ReservationId needs (22.05 leaves the name empty)."""
        per_node = inv.gpus_per_node(reading.inventory)
        src = f"{self.name}:scontrol show reservation"
        seen: dict[str, object] = {}
        text = self.run(self.o.scontrol, *self._m(), "-o", "show", "reservation")
        for i, rec in enumerate(scontrol_records(text), 1):
            if rec.startswith("No reservations"):
                continue
            try:
                r = inv.from_scontrol_reservation(rec, self.cluster, per_node)
            except (ValueError, KeyError) as exc:
                problems.skip(src, f"record {i}", str(exc), rec)
                continue
            seen[r.name] = r
        try:
            names, pieces = self.past_reservations(window, per_node, problems)
        except SourceError as exc:  # accounting copy is a bonus; slurmctld's view above still counts
            log.warning("%s (past reservations and ids skipped)", exc)
            names, pieces = {}, []
        reading.reservations = inv.merge_reservations(list(seen.values()), pieces,  # type: ignore[arg-type]
                                                  window, datetime.now(UTC))
        return names

    def past_reservations(self, window: Window, per_node: dict[str, int], problems: Problems
                          ) -> tuple[dict[str, str], list]:
        """Accounting's reservations from the day before the window on (``sacctmgr show reservation``):
        the id -> name map sacct's ReservationId needs and the reservations assembled from their pieces,
        ended ones included. Raises SourceError when sacctmgr cannot be run."""
        names: dict[str, str] = {}
        src = f"{self.name}:sacctmgr show reservation"
        args = ["-n", "-P", "show", "reservation", f"start={_ts(window.since - timedelta(days=1))}",
                f"end={_ts(window.until)}", f"format={','.join(SACCTMGR_FIELDS)}"]
        if self.o.cluster_name:
            args.insert(4, f"cluster={self.o.cluster_name}")
        text = self.run(self.o.sacctmgr, *args)
        pieces = []
        for lineno, row in jobs.sacct_rows(text, SACCTMGR_FIELDS):
            if isinstance(row, str):
                problems.skip(src, f"line {lineno}", "wrong number of columns", row)
                continue
            names[row["ID"]] = row["Name"]
            try:
                pieces.append(inv.from_sacctmgr_row({**row, "NodeName": row["NodeNames"]}, self.cluster,
                                                    per_node))
            except (ValueError, KeyError) as exc:
                problems.skip(src, f"line {lineno}", str(exc), "|".join(row.values()))
        return names, inv.assemble_pieces(pieces)

    def _history(self, window: Window, problems: Problems, resv_names: dict[str, str]) -> list:
        since, until = _ts(window.since), _ts(window.until)
        fmt = self.o.history_format
        if fmt in ("auto", "json"):
            try:
                text = self.run(self.o.sacct, *self._m(), "-a", "-X", "--json", "-S", since, "-E", until)
                data = json.loads(text)
                return self._history_json(data, problems, resv_names)
            except (SourceError, json.JSONDecodeError) as exc:
                if fmt == "json":
                    if isinstance(exc, SourceError):
                        raise
                    raise SourceError(self.name, f"sacct --json: invalid JSON ({exc.msg})",
                                      transient=True) from None
                log.info("%s: sacct --json unusable (%s); using sacct -P", self.name, exc)
        fields = jobs.sacct_fields(self.version(self.o.sacct))
        text = self.run(self.o.sacct, *self._m(), "-a", "-X", "-P", "-n", "--noconvert", "-S", since,
                        "-E", until, "-o", ",".join(fields))
        return list(self.history_text(text, problems, resv_names, fields))

    def history_text(self, text: str, problems: Problems, resv_names: dict[str, str],
                     fields: tuple[str, ...] | None):
        src = f"{self.name}:sacct"
        for lineno, row in jobs.sacct_rows(text, fields):
            if isinstance(row, str):
                problems.skip(src, f"line {lineno}", "wrong number of columns", row)
                continue
            try:
                yield jobs.from_sacct_row(row, self.cluster, resv_names)
            except (ValueError, KeyError) as exc:
                problems.skip(src, f"line {lineno}", f"bad value: {exc}", "|".join(row.values()))

    def _history_json(self, data: dict, problems: Problems, resv_names: dict[str, str]) -> list:
        src = f"{self.name}:sacct --json"
        if not isinstance(data, dict) or not isinstance(data.get("jobs"), list):
            raise SourceError(self.name, "sacct --json: no jobs list in output", transient=True)
        out = []
        for i, job in enumerate(data["jobs"]):
            try:
                out.append(jobs.from_json_db_job(job, self.cluster, resv_names))
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                problems.skip(src, f"jobs[{i}]", f"bad job object: {exc}", json.dumps(job)[:200])
        return out

