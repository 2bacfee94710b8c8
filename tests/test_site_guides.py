"""The site guides (docs/sites/) are walked for real: their code blocks marked `test` run, in order, against the
Slurm and Prometheus testbeds, so a guide cannot drift from the tool.

The marking, documented at the top of each walked guide:

- a fenced block whose info string is ```` ```bash test ```` runs with ``bash -e -o pipefail`` in
  ``~/gpu-audit`` (HOME is this test's temporary directory; ``gpu-audit`` on PATH is this checkout's);
- ```` ```toml test file=NAME ```` is written to ``~/gpu-audit/NAME``;
- ``<!-- expect: REGEX -->`` lines right after a bash block must each match a line of its output (stdout and
  stderr, multiline ``re.search``);
- ``test-substitute: TEXT => KEY`` (inside an HTML comment) replaces TEXT in every tested block with the testbed
  address KEY names (``prometheus_url``: the Prometheus testbed of scripts/testbed-prometheus.sh, identified by
  its marker; ``jobstats_prometheus_url``: its jobstats profile).

Blocks not marked (installing from PyPI, restarting dcgm-exporter on nodes, sending mail) are not run. The
structural checks (every guide linked from the README and the guides' index, every config key a guide writes
exists) need no service.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from auditor import config as config_mod
from tests.conftest import TSDB_TESTBED_ROOT, need, need_slurm, need_tsdb, slurm_testbed

ROOT = Path(__file__).resolve().parent.parent
SITES = ROOT / "docs" / "sites"
GUIDES = sorted(p for p in SITES.glob("*.md") if p.name != "README.md")
#: substitution key -> (testbed URL, its directory): the addresses a walk may put in place of a guide's
TESTBEDS = {"prometheus_url": ("http://127.0.0.1:19090", TSDB_TESTBED_ROOT / "test"),
            "jobstats_prometheus_url": ("http://127.0.0.1:19092", TSDB_TESTBED_ROOT / "jobstats")}
FENCE = re.compile(r"^```(\S*)(.*)$")


def slurm_ready() -> bool:
    """The walks submit a job to the Slurm testbed: they run in the serial group (tests/conftest.py)."""
    return slurm_testbed() is None


@dataclass
class Block:
    line: int  # 1-based line of the opening fence
    lang: str
    flags: list[str]
    text: str
    expect: list[str] = field(default_factory=list)

    @property
    def tested(self) -> bool:
        return "test" in self.flags

    def option(self, name: str) -> str | None:
        return next((f.split("=", 1)[1] for f in self.flags if f.startswith(name + "=")), None)


def parse(path: Path) -> tuple[list[Block], dict[str, str]]:
    lines = path.read_text().splitlines()
    blocks: list[Block] = []
    subs: dict[str, str] = {}
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if m and m.group(1):
            start, body = i, []
            i += 1
            while i < len(lines) and lines[i] != "```":
                body.append(lines[i])
                i += 1
            blocks.append(Block(start + 1, m.group(1), m.group(2).split(), "\n".join(body) + "\n"))
        else:
            if (e := re.fullmatch(r"<!-- expect: (.*) -->", lines[i])) and blocks:
                blocks[-1].expect.append(e.group(1))
            if s := re.search(r"test-substitute: (\S+) => (\w+)", lines[i]):
                subs[s.group(1)] = s.group(2)
        i += 1
    return blocks, subs


def walked() -> list[Path]:
    return [g for g in GUIDES if any(b.tested for b in parse(g)[0])]


def test_guides_are_linked_and_walked() -> None:
    readme, index = (ROOT / "README.md").read_text(), (SITES / "README.md").read_text()
    names = {g.name for g in GUIDES}
    assert {"slurm-prometheus.md", "slurm-jobstats.md", "kubernetes-gpu-operator.md", "several-clusters.md"} <= names
    for g in GUIDES:
        assert f"docs/sites/{g.name}" in readme, f"README does not link {g.name}"
        assert f"({g.name})" in index, f"docs/sites/README.md does not link {g.name}"
    assert {"slurm-prometheus.md", "slurm-jobstats.md"} <= {g.name for g in walked()}


@pytest.mark.parametrize("guide", GUIDES, ids=lambda p: p.stem)
def test_guide_markup_and_config_are_valid(guide: Path, tmp_path: Path) -> None:
    """Every marked block is well formed, every expect follows a tested bash block, and each TOML block (tested
    or not, a whole config or a fragment) names only keys the config knows: a config the guide writes is checked by
    `gpu-audit config check` without a service."""
    import tomllib

    from connectors import validate_sources

    blocks, subs = parse(guide)
    assert set(subs.values()) <= set(TESTBEDS), f"unknown substitution keys {set(subs.values()) - set(TESTBEDS)}"
    for b in blocks:
        if b.expect:
            assert b.tested and b.lang == "bash", f"{guide.name}:{b.line}: expect after an untested block"
        if b.tested:
            assert b.lang in ("bash", "toml"), f"{guide.name}:{b.line}: cannot run a {b.lang} block"
            assert b.lang != "toml" or b.option("file"), f"{guide.name}:{b.line}: a tested toml block needs file="
        if b.lang == "toml":
            tomllib.loads(b.text)  # a fragment or a whole config: it parses
            if b.tested or "[[clusters]]" in b.text:  # unknown keys, connector options included, are errors
                (tmp_path / "c.toml").write_text(b.text)
                validate_sources(config_mod.load(tmp_path / "c.toml"), f"{guide.name}:{b.line}")
    for text in subs:
        assert any(text in b.text for b in blocks if b.tested), f"{guide.name}: {text} is in no tested block"


def _walk(guide: Path, tmp_path: Path) -> None:
    blocks, subs = parse(guide)
    for key in set(subs.values()):
        need_tsdb(*TESTBEDS[key])
    need_slurm()
    home = tmp_path / "home"
    work = home / "gpu-audit"
    work.mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPU_AUDIT_")}
    env |= {"HOME": str(home), "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
            "GPU_AUDIT_SMTP_PASSWORD": "not-used-by-a-dry-run"}
    ran = 0
    for b in blocks:
        if not b.tested:
            continue
        text = b.text
        for old, key in subs.items():
            text = text.replace(old, TESTBEDS[key][0])
        where = f"{guide.relative_to(ROOT)}:{b.line}"
        if b.lang == "toml":
            (work / str(b.option("file"))).write_text(text)
            continue
        res = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", text], cwd=work, env=env, capture_output=True,
                             text=True, timeout=300)
        out = res.stdout + res.stderr
        assert res.returncode == 0, f"{where}: the block exited {res.returncode}:\n{text}\n--- output:\n{out[-4000:]}"
        for pattern in b.expect:
            assert re.search(pattern, out, re.M), f"{where}: no line matches {pattern!r}:\n{out[-4000:]}"
        ran += 1
    assert ran >= 4, f"{guide.name}: only {ran} blocks ran"


@pytest.mark.service
@pytest.mark.slow
@pytest.mark.parametrize("guide", [g for g in GUIDES if g.name.startswith("slurm-")], ids=lambda p: p.stem)
def test_walk_the_guide(guide: Path, tmp_path: Path) -> None:
    need(guide in walked(), f"{guide.name} has no tested blocks")
    _walk(guide, tmp_path)
