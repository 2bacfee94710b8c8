"""Small, pure parsers for the strings Slurm prints: GRES, TRES, hostlists, index ranges, times, states and
``scontrol`` key=value records. Shared by every backend, so 22.05, 24.11 and 25.x outputs meet here.

Slurm spells one GPU allocation many ways (``gpu:h100:2(IDX:0-1)``, ``gpu(IDX:0,2-3,5)``, ``gpu:1(IDX:3)``,
``gres/gpu:h100=2``, ``gres:gpu:3``, ``gres/gpu:3``, ``gres/gpu=2``); they all become :class:`Gres`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

NULLS = frozenset({"", "(null)", "n/a", "none", "unknown", "none assigned", "(none)"})


@dataclass(frozen=True, slots=True)
class Gres:
    """One GRES item: ``name`` (e.g. gpu), optional ``type`` (model, e.g. h100), ``count`` and, when Slurm
    printed ``IDX``, the device indices."""

    name: str
    type: str | None
    count: int
    indices: tuple[int, ...] | None = None
    extra: dict[str, str] = field(default_factory=dict, compare=False)


def is_null(value: Any) -> bool:
    return value is None or (isinstance(value, str) and value.strip().lower() in NULLS)


def split_top(text: str, sep: str = ",") -> list[str]:
    """Split on ``sep`` outside brackets/parentheses (``a[1-2],b`` and ``gpu(IDX:0,2)`` stay whole)."""
    parts, depth, cur = [], 0, []
    for ch in text:
        if ch in "[(":
            depth += 1
        elif ch in "])":
            depth -= 1
        if ch == sep and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return [p for p in (x.strip() for x in parts) if p]


def parse_ranges(text: str) -> list[int]:
    """``0-2,4,6-7`` -> [0, 1, 2, 4, 6, 7]; ``N/A`` or empty -> []. Raises ValueError on garbage."""
    if is_null(text):
        return []
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            lo, hi = part.split("-", 1)
            a, b = int(lo), int(hi)
            if b < a:
                raise ValueError(f"bad range {part!r}")
            out.extend(range(a, b + 1))
        else:
            out.append(int(part))
    return out


_BRACKET = re.compile(r"\[([^\]]*)\]")


def _expand_one(name: str) -> list[str]:
    m = _BRACKET.search(name)
    if not m:
        return [name]
    head, tail = name[: m.start()], name[m.end():]
    values: list[str] = []
    for part in m.group(1).split(","):
        part = part.strip()
        if "-" in part:
            lo, hi = part.split("-", 1)
            width = len(lo)
            values.extend(str(i).zfill(width) for i in range(int(lo), int(hi) + 1))
        elif part:
            values.append(part)
    return [head + v + rest for v in values for rest in _expand_one(tail)]


def expand_hostlist(text: str | None) -> list[str]:
    """``gpu-node-[01-02],login1`` -> ["gpu-node-01", "gpu-node-02", "login1"] (zero padding kept)."""
    if is_null(text):
        return []
    out: list[str] = []
    for item in split_top(str(text)):
        out.extend(_expand_one(item))
    return out


_GRES_ITEM = re.compile(r"^(?P<body>[^()]*?)(?:\((?P<paren>[^)]*)\))?$")


def parse_gres(text: str | None) -> list[Gres]:
    """Parse a GRES/TRES-per-x string into items. Unknown shapes raise ValueError (callers quarantine)."""
    if is_null(text):
        return []
    items: list[Gres] = []
    for raw in split_top(str(text)):
        raw = raw.strip()
        for prefix in ("gres:", "gres/"):
            if raw.startswith(prefix):
                raw = raw[len(prefix):]
        m = _GRES_ITEM.match(raw)
        if not m:
            raise ValueError(f"unparsable GRES {raw!r}")
        body, paren = m.group("body"), m.group("paren")
        extra: dict[str, str] = {}
        indices: tuple[int, ...] | None = None
        if paren:
            for kv in re.split(r"[,\s]+(?=[A-Za-z_]+:)", paren):
                k, _, v = kv.partition(":")
                extra[k.strip()] = v.strip()
            if "IDX" in extra:
                indices = tuple(parse_ranges(extra["IDX"]))
        count: int | None = None
        if "=" in body:  # TRES style gpu:h100=2
            body, _, num = body.partition("=")
            count = _int(num)
        parts = [p for p in body.split(":") if p != ""]
        if not parts:
            raise ValueError(f"unparsable GRES {raw!r}")
        name, rest = parts[0], parts[1:]
        rest = [p for p in rest if p != "no_consume"]
        gtype: str | None = None
        if count is None and rest and rest[-1].isdigit():
            count = int(rest.pop())
        elif count is None and rest and re.fullmatch(r"\d+[kKmMgG]", rest[-1]):
            count = _int(rest.pop())
        if rest:
            gtype = rest[0]
        if count is None:
            count = len(indices) if indices is not None else 1
        items.append(Gres(name=name, type=gtype, count=count, indices=indices, extra=extra))
    return items


def _int(text: str) -> int:
    t = text.strip()
    mult = {"k": 1024, "m": 1024**2, "g": 1024**3}.get(t[-1:].lower(), 1) if t else 1
    return int(t[:-1]) * mult if mult != 1 else int(t)


def gpu_items(text: str | None) -> list[Gres]:
    """Only the ``gpu`` items of a GRES string."""
    return [g for g in parse_gres(text) if g.name == "gpu"]


def gpu_or_shard_items(text: str | None) -> list[Gres]:
    """The ``gpu`` and ``shard`` items (a shard is 1/N of a GPU, N = the node's shards per GPU)."""
    return [g for g in parse_gres(text) if g.name in ("gpu", "shard")]


_MIG_TYPE = re.compile(r"^(\d)g\.(\d+)gb(?:\+me)?$", re.IGNORECASE)


def mig_share(gres_type: str | None) -> float | None:
    """Share of a whole GPU for a MIG-typed GRES (``1g.10gb`` -> 1/7; A30's 6 GB slices -> 1/4), else None.
    The slice count is the profile's compute slices over the GPU's: 7 on A100/H100/H200/B200, 4 on A30."""
    m = _MIG_TYPE.match(gres_type or "")
    if not m:
        return None
    g, mem = int(m.group(1)), int(m.group(2))
    slices = 4 if mem == 6 * g else 7
    return min(1.0, g / slices)


def shards_per_gpu(gres: str | None) -> int | None:
    """``gpu:h100:8,shard:h100:64`` -> 8 shards per GPU (None when the node has no shards)."""
    items = parse_gres(gres)
    gpus = sum(g.count for g in items if g.name == "gpu")
    shards = sum(g.count for g in items if g.name == "shard")
    return max(1, shards // gpus) if gpus and shards else None


def parse_tres(text: str | None) -> dict[str, str]:
    """``cpu=1,gres/gpu=2,gres/gpu:h100=2`` -> dict (sacct and squeue order keys differently)."""
    out: dict[str, str] = {}
    if is_null(text):
        return out
    for part in str(text).split(","):
        k, sep, v = part.partition("=")
        if sep:
            out[k.strip()] = v.strip()
    return out


def tres_mig(tres: dict[str, str]) -> list[tuple[str, int]]:
    """MIG-typed GPU counts of a TRES (``gres/gpu:1g.10gb=2,gres/gpu:3g.40gb=1``), in key order."""
    return [(k[len("gres/gpu:"):], _int(v)) for k, v in tres.items()
            if k.startswith("gres/gpu:") and mig_share(k[len("gres/gpu:"):]) is not None and _int(v) > 0]


def tres_shards(tres: dict[str, str]) -> int:
    """``gres/shard=2`` -> 2 (0 when the job holds no shards or the site does not account them)."""
    return _int(tres["gres/shard"]) if tres.get("gres/shard") else 0


def tres_gpus(tres: dict[str, str]) -> tuple[int, str | None]:
    """(GPU count, model) from parsed TRES. The untyped ``gres/gpu`` count is the truth (typed counts were
    seen one short in 22.05); the model is the only typed key, when there is exactly one."""
    typed = {k[len("gres/gpu:"):]: _int(v) for k, v in tres.items() if k.startswith("gres/gpu:")}
    model = next(iter(typed)) if len(typed) == 1 else None
    if "gres/gpu" in tres:
        return _int(tres["gres/gpu"]), model
    return sum(typed.values()), model


def number(value: Any) -> int | float | None:
    """Slurm numbers: plain ints, or 24.x+ ``{"set": bool, "infinite": bool, "number": n}``."""
    if isinstance(value, dict):
        if not value.get("set", True) or value.get("infinite"):
            return None
        value = value.get("number")
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return value
    try:
        return int(str(value))
    except ValueError:
        return None


def _from_epoch(n: float) -> datetime:
    try:
        return datetime.fromtimestamp(n, UTC)
    except (OverflowError, OSError):
        raise ValueError(f"epoch time {n} is out of range") from None


def parse_time(value: Any) -> datetime | None:
    """Epoch int (0 = unset), ``{set, number}``, or ``2026-11-29T14:23:48`` (the CLI runs with TZ=UTC, so
    naive text is UTC) -> aware UTC datetime or None for Unknown/None/N/A."""
    if isinstance(value, dict | int | float) and not isinstance(value, bool):
        n = number(value)
        return _from_epoch(n) if n and n > 0 else None
    if is_null(value) or value == "0":
        return None
    text = str(value).strip()
    if text.isascii() and text.isdigit():
        return _from_epoch(int(text))
    dt = datetime.fromisoformat(text)
    return dt.replace(tzinfo=UTC) if dt.tzinfo is None else dt.astimezone(UTC)


def parse_duration(value: Any, unit_s: int = 60) -> int | None:
    """Time limits to seconds: ``[D-]HH:MM:SS``, ``MM:SS``, ``UNLIMITED`` -> None, ints are minutes."""
    if isinstance(value, dict) or isinstance(value, int | float):
        n = number(value)
        return None if n is None else int(n * unit_s)
    if is_null(value) or str(value).upper() in {"UNLIMITED", "INFINITE", "PARTITION_LIMIT"}:
        return None
    text = str(value).strip()
    if text.isdigit():
        return int(text) * unit_s
    days = 0
    if "-" in text:
        d, text = text.split("-", 1)
        days = int(d)
    parts = [int(p) for p in text.split(":")]
    while len(parts) < 3:
        parts.insert(0, 0)
    h, m, s = parts[-3:]
    return days * 86400 + h * 3600 + m * 60 + s


def parse_state(value: Any) -> str:
    """``RUNNING`` / ``["RUNNING"]`` / ``CANCELLED by 1003`` / ``mixed`` -> the base state, upper case."""
    if isinstance(value, list | tuple):
        value = value[0] if value else ""
    if isinstance(value, dict):  # sacct --json {"current": ..., "reason": ...}
        return parse_state(value.get("current"))
    text = str(value or "").strip()
    return text.split()[0].rstrip("+").upper() if text else ""


_KV = re.compile(r"(?:^|\s)([A-Za-z][\w/:.]*)=")


def kv_pairs(line: str) -> list[tuple[str, str]]:
    """Tokenise one ``scontrol -o`` record. Values may contain spaces (``OS=Linux 6.1 #1``) and ``=``
    (``TRES=cpu=1``): a value runs until whitespace followed by the next ``Key=``. Keys may repeat
    (``Nodes=… GRES=…`` once per node), so this returns pairs, not a dict."""
    marks = [(m.start(1), m.end(), m.group(1)) for m in _KV.finditer(line)]
    out = []
    for i, (_, vstart, key) in enumerate(marks):
        vend = marks[i + 1][0] if i + 1 < len(marks) else len(line)
        out.append((key, line[vstart:vend].strip()))
    return out


def scontrol_records(text: str) -> list[str]:
    """Records of ``scontrol [-o] show ...``: one per line with ``-o``; blank-line separated blocks
    otherwise (joined into one line). Captured ``$ cmd`` / ``[rc=N]`` lines are ignored."""
    records: list[str] = []
    block: list[str] = []
    for line in text.splitlines():
        if line.startswith("$ ") or re.fullmatch(r"\[rc=\d+\]", line.strip()):
            continue
        if not line.strip():
            if block:
                records.append(" ".join(block))
                block = []
            continue
        if line[:1].isspace():
            block.append(line.strip())
        else:
            if block:
                records.append(" ".join(block))
            block = [line.strip()]
    if block:
        records.append(" ".join(block))
    return records


_SLUID = re.compile(r"[sS][0-9A-Za-z]{13}")


def sluid(value: Any) -> str | None:
    """A SLUID as Slurm prints it (``s`` + 13 characters of Crockford's base 32, src/common/sluid.c
    ``print_sluid``) -> ``s`` + upper case; None for empty, 0, ``N/A`` or anything else (older Slurm prints
    no SLUID: the caller keeps the proof without it)."""
    text = str(value).strip() if isinstance(value, str) else ""
    if not _SLUID.fullmatch(text) or set(text[1:].upper()) - set("0123456789ABCDEFGHJKMNPQRSTVWXYZ"):
        return None
    return "s" + text[1:].upper()


def user_name(value: str) -> str:
    """``alice(1001)`` -> ``alice``."""
    return value.split("(", 1)[0] if value else ""


def split_list(value: Any) -> list[str]:
    """``alice,bob`` / ``(null)`` / a list -> list of names."""
    if isinstance(value, list | tuple):
        return [str(v) for v in value if not is_null(v)]
    if is_null(value):
        return []
    return [v.strip() for v in str(value).split(",") if v.strip() and not is_null(v)]
