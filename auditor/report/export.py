"""The full JSON export and the findings CSV, streamed from the store in chunks (issue 20).

Both files list every finding of a run; a large run has tens of thousands. Building them as Python lists
(and the report context a second time with ``full=True``) made rendering scale with memory and time. Here
the findings are read once, in the order every table uses (cost, idle GPU-hours, GPU-hours, id), each row
converted once (:func:`auditor.report.context.finding_row`) and written in chunks to the CSV and to one
spool file per JSON table (the order within a table is the global order filtered by kind). The JSON is then
assembled from the cut report context (:func:`auditor.report.context.build_context`, built once for all
formats) with its long tables replaced by the spooled rows. The bytes are those of
``render_json(build_context(..., full=True), compact=True)`` and of ``write_csv(findings_csv_rows(...))``;
tests/test_report_export.py checks that against both.
"""

from __future__ import annotations

import csv
import json
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import IO, Any

from sqlalchemy import Connection, text

from auditor import jsonsafe
from auditor.audit import goodput, kinds
from auditor.config import Config
from auditor.report import context as report
from auditor.report.outfile import open_output
from auditor.store.engine import Store

CHUNK = 2000  # rows converted and written at a time: memory is one chunk, not the run
CSV_DEFAULT_FIELDS = ["id", "kind", "cluster", "job_id", "job_name", "user", "account", "team", "gpu_hours",
                      "idle_gpu_hours", "cost"]
# evidence no report row shows (finding_row reads job, reservation, gpus, means, coverage, rule, hints and the
# sparkline): SQLite drops it before Python decodes the JSON (nearly half of each finding's evidence); its
# json_remove copies the numbers that remain as written, so the decoded values are the same
UNSHOWN = "'$.thresholds', '$.right_size'"
# a sparkline (an object of arrays of numbers) goes to the JSON export as SQLite writes it: minified, the
# numbers as stored (i.e. as Python wrote them), which is what decoding and encoding it again would give
_IS_SPARK = "json_type(f.evidence, '$.sparkline') IN ('object', 'array')"
_SQLITE_EVIDENCE = (f"CASE WHEN {_IS_SPARK} THEN json_remove(f.evidence, {UNSHOWN}, '$.sparkline') "
                    f"ELSE json_remove(f.evidence, {UNSHOWN}) END AS evidence, "
                    f"CASE WHEN {_IS_SPARK} THEN json_extract(f.evidence, '$.sparkline') END AS sparkline_json,")
ORDER = " ORDER BY f.cost DESC, f.idle_gpu_hours DESC, f.gpu_hours DESC, f.id"


_ENCODER = json.JSONEncoder(separators=(",", ":"), default=str, ensure_ascii=False, allow_nan=False)
_NO_SPARKLINE = ',"sparkline":null}'


def _dumps(obj: Any) -> str:
    """Compact JSON exactly as render_json(..., compact=True) writes each part (one encoder for all)."""
    try:
        return _ENCODER.encode(obj)
    except ValueError:  # a NaN or infinity: jsonsafe writes null for it
        return jsonsafe.dumps(obj, separators=(",", ":"), default=str, ensure_ascii=False)


class Spooled:
    """A table whose rows were written to a spool file as JSON (comma-separated, no brackets)."""

    def __init__(self, spool: IO[str], count: int, total: int, totals: dict[str, Any]) -> None:
        self.spool, self.count, self.total, self.totals = spool, count, total, totals

    def write(self, out: IO[str]) -> None:
        out.write('{"rows":[')
        self.spool.seek(0)
        shutil.copyfileobj(self.spool, out, 1 << 20)
        out.write(f'],"total":{self.total},"shown":{self.count},"cut":{_dumps(self.total > self.count)},'
                  f'"totals":{_dumps(self.totals)}}}')


class _Spool:
    """Rows of one table appended in chunks to a temporary file (disk, not memory)."""

    def __init__(self, stack: ExitStack) -> None:
        self.fh: IO[str] = stack.enter_context(tempfile.TemporaryFile("w+", encoding="utf-8"))
        self.count = 0
        self.pending: list[str] = []

    def add(self, row: dict[str, Any], sparkline: str | None = None) -> None:
        """``row`` as JSON; ``sparkline``, when given, is the JSON text of its sparkline (the row's own
        ``sparkline``, its last key, is then None), written as it is rather than decoded and encoded."""
        text = _dumps(row)
        if sparkline is not None:
            if not text.endswith(_NO_SPARKLINE):
                raise ValueError("a finding row must end with its sparkline")
            text = text[:-len(_NO_SPARKLINE)] + ',"sparkline":' + sparkline + "}"
        self.pending.append(text)
        if len(self.pending) >= CHUNK:
            self.flush()

    def flush(self) -> None:
        if self.pending:
            self.fh.write(("," if self.count else "") + ",".join(self.pending))
            self.count += len(self.pending)
            self.pending = []

    def done(self, table: dict[str, Any]) -> Spooled:
        self.flush()
        return Spooled(self.fh, self.count, table["total"], table["totals"])


def _findings(conn: Connection, names: tuple[str, ...], run_id: int) -> Iterator[dict[str, Any]]:
    """The run's findings of ``kinds`` in table order. The order is taken over ids alone, then the rows
    (evidence of a few KB each) are read by id in chunks: sorting the whole rows made the database move
    every evidence blob through its sorter. Memory: the ids (one integer per finding) and one chunk."""
    marks = ", ".join(f":k{i}" for i in range(len(names)))
    params = {"run": run_id, **{f"k{i}": k for i, k in enumerate(names)}}
    ids = [r[0] for r in conn.execute(text(
        f"SELECT f.id FROM findings f WHERE f.run_id = :run AND f.kind IN ({marks})" + ORDER), params)]
    sql = report.FINDING_SQL.format(kinds=marks)
    if conn.dialect.name == "sqlite":  # PostgreSQL's driver decodes the json column itself
        if "f.evidence," not in sql:
            raise ValueError("FINDING_SQL must select f.evidence")
        sql = sql.replace("f.evidence,", _SQLITE_EVIDENCE, 1)
    for i in range(0, len(ids), CHUNK):
        part = ids[i:i + CHUNK]  # integers read from the store: safe to write into the statement
        by_id = text(sql + f" AND f.id IN ({', '.join(map(str, map(int, part)))})")
        got = {m["id"]: dict(m) for m in conn.execute(by_id, params).mappings().all()}
        yield from (got[x] for x in part if x in got)  # one pruned meanwhile is left out, not an error


def _stream(conn: Connection, sql: str, params: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Rows of ``sql`` as dicts, fetched in chunks (a server-side cursor on PostgreSQL)."""
    res = conn.execution_options(stream_results=True, yield_per=CHUNK).execute(text(sql), params)
    for part in res.mappings().partitions(CHUNK):
        yield from (dict(m) for m in part)


def all_kinds() -> tuple[str, ...]:
    """Every finding kind (the registry, :mod:`auditor.audit.kinds`): the CSV lists them all."""
    return tuple(sorted(kinds.NAMES))


class _CsvOut:
    """The findings CSV: header from the first row's columns (sparkline left out), cells made safe."""

    def __init__(self, fh: IO[str], cell: Callable[[Any], Any]) -> None:
        self.fh, self.w, self.cell = fh, csv.writer(fh), cell
        self.fields: list[str] | None = None
        self.pending: list[list[Any]] = []

    def add(self, row: dict[str, Any]) -> None:
        if self.fields is None:
            self.fields = [k for k in row if k != "sparkline"]
            self.w.writerow(self.fields)
        cell = self.cell  # only text needs escaping; numbers and None pass as they are
        self.pending.append([cell(v) if isinstance(v, str) else v for v in map(row.__getitem__, self.fields)])
        if len(self.pending) >= CHUNK:
            self.flush()

    def flush(self) -> None:
        self.w.writerows(self.pending)
        self.pending = []

    def close(self) -> None:
        if self.fields is None:
            self.w.writerow(CSV_DEFAULT_FIELDS)
        self.flush()


def write_exports(store: Store, cfg: Config, run_id: int, ctx: dict[str, Any], *, csv_path: Path,
                  cell: Callable[[Any], Any], json_path: Path | None = None,
                  groups: dict[str, Any] | None = None) -> None:
    """Write the findings CSV (each cell through ``cell``, the escaping of :mod:`auditor.report.render`)
    and, when ``json_path`` is given, the full JSON export of ``ctx``'s run; ``groups`` are its uncut team
    and account tables when the caller has them (``build_context(keep=...)``)."""
    tz = report._tz(cfg)
    names = all_kinds()
    section = {k: "top_idle" for k in report.IDLE_KINDS}
    section.update({k: key for key, ks in report.SECTION_KINDS.items() for k in ks})
    with ExitStack() as files, store.engine.connect() as conn:
        spools = ({key: _Spool(files) for key in ("top_idle", "ghosts", *report.SECTION_KINDS)} if json_path
                  else {})
        out = _CsvOut(open_output(csv_path, files, named=False), cell)
        for m in _findings(conn, names, run_id):
            spark = m.pop("sparkline_json", None)
            row = report.finding_row(m, tz)
            out.add(row)
            if spools and row["kind"] in section:
                key = section[row["kind"]]
                if key == "top_idle" and row["allocation_id"] is None:
                    key = "ghosts"  # ghost_busy on a GPU nobody held: its own table
                spools[key].add(row, spark)
        out.close()
        if json_path is None:
            return
        doc = dict(ctx, full=True)
        if groups is None:
            totals = ctx["teams"]["totals"]
            groups = {"teams": report.usage_group_rows(conn, run_id, ["u.team"]),
                      "accounts": report.usage_group_rows(conn, run_id, ["a.cluster", "a.account", "u.team"])}
            groups = {k: report.group_table(v, totals, full=True, top_n=0) for k, v in groups.items()}
        doc["teams"], doc["accounts"] = groups["teams"], groups["accounts"]
        run = report.load_run(conn, run_id)
        doc.update(report.summary_sections(conn, run_id, dict(run["summary"] or {}),
                                           dict(run["thresholds"] or cfg.thresholds.model_dump()), tz,
                                           full=True, top_n=0, fabric_nodes=report.fabric_named(cfg)))
        doc["goodput"] = report.goodput_section(conn, cfg, run_id, dict(run["thresholds"] or {}), tz, full=True,
                                                top_n=0, tensor_rows=False)
        tensor = _Spool(files)  # every allocation's Tensor-pipe proxy: spooled, not held
        for row in goodput.tensor_rows(conn, run_id):
            tensor.add(row)
        doc["goodput"]["tensor"]["allocations"] = tensor.done(doc["goodput"]["tensor"]["allocations"])
        for key, sp in spools.items():
            doc[key] = sp.done(ctx[key])
        doc["coverage"] = dict(ctx["coverage"], silent=_silent(conn, ctx, files))
        _write_doc(doc, open_output(json_path, files, named=False))


def _silent(conn: Connection, ctx: dict[str, Any], stack: ExitStack) -> Spooled:
    """Every inventory GPU without samples in the window (the cut context keeps top_n of them)."""
    sp = _Spool(stack)
    run = ctx["run"]
    for m in _stream(conn, report.SILENT_ROWS, {"s": run["since_ts"], "u": run["until_ts"]}):
        sp.add(m)
    return sp.done(ctx["coverage"]["silent"])


def _write_doc(doc: dict[str, Any], out: IO[str]) -> None:
    """``doc`` as compact JSON, Spooled tables (at any depth) copied from their spool files."""
    def spooled(v: Any) -> bool:
        return isinstance(v, Spooled) or isinstance(v, dict) and any(spooled(x) for x in v.values())

    def value(v: Any) -> None:
        if isinstance(v, Spooled):
            v.write(out)
        elif isinstance(v, dict) and spooled(v):
            sep = "{"
            for k, x in v.items():
                out.write(sep + json.dumps(str(k), ensure_ascii=False) + ":")
                value(x)
                sep = ","
            out.write("}" if sep == "," else "{}")
        else:
            out.write(_dumps(v))

    value(doc)
    out.write("\n")
