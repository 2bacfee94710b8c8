"""Connectors are found through the ``gpu_audit.connectors`` entry points: the built-in kinds are registered
in pyproject.toml, and a site's own package can add a kind without editing gpu-audit. Each connector is
checked against the protocol of its role (connectors/base.py)."""

from __future__ import annotations

import re
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

import connectors
from auditor import config as config_mod
from auditor.errors import ConfigError
from connectors.base import AllocationSource, Context, TelemetrySource

ROOT = Path(__file__).resolve().parent.parent

PLUGIN = '''
from collections.abc import Iterable

from connectors.base import Options, Problems, Window


class SiteOptions(Options):
    url: str


class SiteTelemetry:
    """A site's own telemetry source."""

    Options = SiteOptions
    name = "sitekind"

    def __init__(self, context, options):
        self.context, self.options = context, options

    def collect(self, window: Window, problems: Problems) -> Iterable:
        return []


class Broken:
    """No collect(): does not satisfy the protocol."""

    Options = SiteOptions
    name = "broken"

    def __init__(self, context, options):
        pass


TELEMETRY = SiteTelemetry
ALLOCATIONS = Broken
'''


@pytest.fixture()
def site_plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A site package installed on sys.path with its dist-info naming an entry point, as pip would leave it."""
    (tmp_path / "site_conn.py").write_text(PLUGIN)
    info = tmp_path / "site_conn-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: site-conn\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[gpu_audit.connectors]\nsitekind = site_conn\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    connectors._entry_points.cache_clear()
    yield
    connectors._entry_points.cache_clear()
    sys.modules.pop("site_conn", None)


def _shipped_kinds() -> set[str]:
    """Modules and packages of connectors/ that define a connector (ALLOCATIONS or TELEMETRY at top level),
    read from the source, not from the registry under test."""
    found = set()
    for p in (ROOT / "connectors").iterdir():
        src = p / "__init__.py" if p.is_dir() else p
        if src.suffix == ".py" and src.is_file() and re.search(r"^(ALLOCATIONS|TELEMETRY) = ", src.read_text(), re.M):
            found.add(p.stem if p.is_file() else p.name)
    return found


def test_pyproject_registers_every_builtin_kind() -> None:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    registered = data["project"]["entry-points"]["gpu_audit.connectors"]
    assert set(registered) == _shipped_kinds(), "register every connector module of connectors/ in pyproject.toml"
    assert set(connectors.builtin_kinds()) == set(registered), (
        "reinstall (pip install -e .) to register the entry points; a stale gpu_audit.egg-info/ in the checkout "
        "(from an old build) hides them: remove it")
    assert set(registered) <= set(connectors.kinds())


@pytest.mark.parametrize("kind", sorted(_shipped_kinds()))
def test_builtin_connectors_satisfy_their_protocols(kind: str) -> None:
    for role, protocol in (("allocations", AllocationSource), ("telemetry", TelemetrySource)):
        try:
            cls = connectors.connector_class(kind, role)
        except KeyError:
            continue
        # (``name`` may be set per instance; build() checks the whole protocol on the instance)
        for member in ("Options", "collect"):
            assert hasattr(cls, member), f"{kind} {role}: no {member} ({protocol.__name__})"
        assert callable(cls.collect)


def test_a_site_package_adds_a_kind(site_plugin: None, tmp_path: Path) -> None:
    assert "sitekind" in connectors.kinds()
    inst = connectors.build("sitekind", "telemetry", {"url": "http://x"}, Context("c1", tmp_path))
    assert isinstance(inst, TelemetrySource) and inst.options.url == "http://x"
    assert not isinstance(connectors.build("sitekind", "allocations", {"url": "http://x"}, Context("c1", tmp_path)),
                          AllocationSource)  # the protocol tells a class without collect() apart
    # the config validates the plug-in's own options, like a built-in kind's
    cluster = {"name": "c1", "telemetry": [{"kind": "sitekind", "url": "http://x"}]}
    connectors.validate_sources(config_mod.parse({"clusters": [cluster]}))
    cluster["telemetry"][0]["bogus"] = 1
    with pytest.raises(ConfigError, match="bogus"):
        connectors.validate_sources(config_mod.parse({"clusters": [cluster]}))


def test_unknown_kind_is_a_clear_error() -> None:
    with pytest.raises(ConfigError, match="unknown connector kind 'nosuch'"):
        connectors.validate_sources(config_mod.parse({"clusters": [{"name": "c1", "telemetry": [{"kind": "nosuch"}]}]}))
