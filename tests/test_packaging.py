"""Packaging that fits PyPI: the version in one place, the wheel and the sdist complete, the extras the docs
name real.

- The version lives only in ``auditor/__init__.py`` (pyproject.toml reads it: ``dynamic = ["version"]``); the
  wheel's name, its metadata and ``gpu-audit --version`` of the installed wheel all say it.
- The wheel carries templates, migrations and the deploy files: installed into a fresh virtualenv it runs the
  demo from another directory.
- The sdist carries what a distribution packager runs the tests with (tests, docs, scripts, bench), and a wheel
  built from the sdist holds the same files as one built from the checkout.
- Every extra the README and docs name in a ``pip install`` line is one of pyproject's optional-dependencies,
  and installing the wheel with the extras resolves (offline, from this interpreter's packages; and, marked
  ``service``, from the package index into an empty virtualenv).
"""

from __future__ import annotations

import email.parser
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from pathlib import Path

import pytest

import auditor
from tests.conftest import need

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
#: extras a site installs (test and bench are the project's own)
SITE_EXTRAS = ("postgres", "parquet", "jobstats-db")
#: `gpu-audit[x,y]`, `'.[x]'`, `gpu_audit-0.1.0-py3-none-any.whl[x]` (not PromQL's `...)[300s]`)
PIP_EXTRAS = r"(?:\bgpu-audit|(?<=['\"\s])\.|gpu_audit-\S*?\.whl)\[([a-z][a-z0-9\-]*(?:, ?[a-z][a-z0-9\-]*)*)\]"


def _build(cmd: list[str], out: Path) -> None:
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=out)
    assert res.returncode == 0, f"{' '.join(cmd)}:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"


def _checkout_files() -> list[str]:
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True, text=True,
                            check=True).stdout.split("\n")
    return [n for n in listed if n and (ROOT / n).is_file()]


@pytest.fixture(scope="module")
def dists(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The sdist, built from the checkout, and the wheel built from that sdist (as `python -m build` does), plus a
    wheel built straight from the checkout to compare with."""
    out = tmp_path_factory.mktemp("dist")
    # From a clean copy of the checkout's files (tracked and new, not ignored): setuptools adds the files listed in
    # a *.egg-info/SOURCES.txt left by an earlier build, so building in the checkout could hide a MANIFEST gap.
    src = tmp_path_factory.mktemp("src") / "gpu-audit"
    for name in _checkout_files():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, src / name)
    _build([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(src)], out)
    direct = out / "direct"
    direct.mkdir()
    _build([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(direct),
            str(src)], direct)
    return {"sdist": next(out.glob("gpu_audit-*.tar.gz")), "wheel": next(out.glob("gpu_audit-*.whl")),
            "direct": next(direct.glob("gpu_audit-*.whl"))}


def test_version_is_defined_in_one_place() -> None:
    project = PYPROJECT["project"]
    assert "version" not in project and "version" in project["dynamic"], "pyproject.toml names a version of its own"
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "auditor.__version__"}
    assert re.fullmatch(r"\d+\.\d+\.\d+((a|b|rc)\d+)?(\.post\d+)?(\.dev\d+)?", auditor.__version__)
    literal = re.compile(r"""(?m)^\s*(__version__|version)\s*=\s*["']\d""")
    holders = [p.relative_to(ROOT).as_posix() for p in [*ROOT.glob("auditor/**/*.py"), *ROOT.glob("connectors/**/*.py"),
                                                        ROOT / "pyproject.toml"] if literal.search(p.read_text())]
    assert holders == ["auditor/__init__.py"], holders


def test_extras_named_in_the_docs_exist() -> None:
    """`pip install '.[x]'` / `gpu-audit[x]` anywhere in the README or docs names an extra pyproject defines."""
    extras = set(PYPROJECT["project"]["optional-dependencies"])
    named: dict[str, set[str]] = {}
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / "deploy").rglob("*.md"))]:
        for m in re.finditer(PIP_EXTRAS, doc.read_text()):
            for extra in m.group(1).split(","):
                named.setdefault(extra.strip(), set()).add(doc.relative_to(ROOT).as_posix())
    assert {"postgres", "parquet", "jobstats-db"} <= set(named), named  # the pattern still finds them
    unknown = {k: sorted(v) for k, v in named.items() if k not in extras}
    assert not unknown, f"extras named in the docs but not in pyproject.toml: {unknown}"


@pytest.mark.slow
def test_sdist_carries_the_tests_and_rebuilds_the_same_wheel(dists: dict[str, Path]) -> None:
    assert dists["sdist"].name == f"gpu_audit-{auditor.__version__}.tar.gz"
    top = f"gpu_audit-{auditor.__version__}/"
    with tarfile.open(dists["sdist"]) as tar:
        names = {n.removeprefix(top) for n in tar.getnames()}
    tracked = set(_checkout_files())
    for folder in ("tests/", "docs/", "scripts/", "bench/", "deploy/", "templates/", "migrations/", "auditor/",
                   "connectors/"):
        missing = sorted(n for n in tracked if n.startswith(folder) and n not in names)
        assert not missing, f"tracked files left out of the sdist: {missing[:10]} ({len(missing)})"
    assert {"README.md", "pyproject.toml", "MANIFEST.in", ".ci/run", "PKG-INFO"} <= names
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]

    def files(wheel: Path) -> set[str]:
        return {n for n in zipfile.ZipFile(wheel).namelist() if ".dist-info/" not in n}

    assert files(dists["wheel"]) == files(dists["direct"]), "the wheel from the sdist differs from the checkout's"


@pytest.mark.slow
def test_wheel_installs_and_runs_the_demo(tmp_path: Path, dists: dict[str, Path]) -> None:
    wheel = dists["wheel"]
    assert wheel.name == f"gpu_audit-{auditor.__version__}-py3-none-any.whl"
    zf = zipfile.ZipFile(wheel)
    names = zf.namelist()
    assert "auditor/migrations/env.py" in names
    assert "connectors/actions/kubernetes.py" in names and "connectors/actions/slurm.py" in names
    assert any(n.startswith("auditor/migrations/versions/0001") for n in names)
    assert any(n.startswith("auditor/templates/") for n in names) or not list((ROOT / "templates").iterdir())
    assert "auditor/deploy/grafana/gpu-audit.json" in names and "auditor/deploy/dcgm-counters.csv" in names
    meta = email.parser.Parser().parsestr(zf.read(next(n for n in names if n.endswith(".dist-info/METADATA")))
                                          .decode())
    assert meta["Version"] == auditor.__version__
    assert set(meta.get_all("Provides-Extra")) == set(PYPROJECT["project"]["optional-dependencies"])
    venv = tmp_path / "venv"
    # Dependencies come from this interpreter's site-packages, the package itself only from the wheel.
    # `venv --system-site-packages` would see the *base* interpreter's packages, not those of a virtualenv this
    # test may run in; a .pth file naming this interpreter's site directories works in both cases. Plain paths in
    # a .pth are appended after the new venv's own site-packages, and .pth files inside them (an editable install
    # of this checkout) are not processed, so the wheel's copy is the one imported.
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    new_site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                              capture_output=True, text=True, check=True).stdout.strip()
    outer = [p for p in sys.path if p.endswith("-packages") and Path(p).is_dir()]
    Path(new_site, "outer-deps.pth").write_text("\n".join(outer) + "\n")
    pip = [sys.executable, "-m", "pip", "--python", str(py), "install", "--no-index", "-q"]
    subprocess.run([*pip, "--force-reinstall", "--no-deps", str(wheel)], check=True, capture_output=True, timeout=300)
    # then its extras: with --no-index they resolve from what is installed here, or pip refuses (the test above
    # checks their names: a misspelt extra only warns)
    res = subprocess.run([*pip, f"{wheel}[{','.join(SITE_EXTRAS)}]"], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    res = subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "check"], capture_output=True, text=True,
                         timeout=120)
    broken = [line for line in res.stdout.splitlines() if line.startswith("gpu-audit ")]
    assert not broken, broken  # gpu-audit's own requirements (and its extras') are met
    work = tmp_path / "elsewhere"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # a checkout on PYTHONPATH would win
    where = subprocess.run([str(py), "-c", "import auditor; print(auditor.__file__)"], cwd=work,
                           capture_output=True, text=True, check=True, env=env)
    assert str(venv) in where.stdout, f"imported from the source tree, not the wheel: {where.stdout}"
    exe = str(venv / "bin" / "gpu-audit")
    res = subprocess.run([exe, "--version"], cwd=work, capture_output=True, text=True, timeout=120, env=env)
    assert res.returncode == 0 and res.stdout.split()[-1] == auditor.__version__, (res.stdout, res.stderr)
    res = subprocess.run([exe, "demo", "--out", str(work / "demo"), "--now", "2026-11-29T00:00"], cwd=work,
                         capture_output=True, text=True, timeout=300, env=env)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "Reserved GPU-hours" in res.stdout and "util_mirage 1" in res.stdout
    assert (work / "demo" / "demo.toml").is_file() and list((work / "demo").glob("**/report-*.html"))
    res = subprocess.run([exe, "deploy", "dcgm-counters"], cwd=work, capture_output=True,
                         text=True, timeout=120, env=env)  # the counters file for a pip install, from the wheel
    assert res.returncode == 0 and res.stdout == (ROOT / "deploy" / "dcgm-counters.csv").read_text(), res.stderr


def _index_reachable(tmp: Path) -> str | None:
    res = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "-q", "-d",
                          str(tmp), "tenacity"], capture_output=True, text=True, timeout=120)
    if res.returncode:
        return f"the package index pip is configured with does not answer: {res.stderr.strip()[-300:]}"
    return None


@pytest.mark.slow
@pytest.mark.service
def test_wheel_installs_with_its_extras_into_an_empty_venv(tmp_path: Path, dists: dict[str, Path]) -> None:
    """`pip install gpu-audit[postgres,parquet,jobstats-db]` as a site does it: an empty virtualenv, every
    dependency from the package index pip is configured with (PyPI), the package from the built wheel."""
    reason = _index_reachable(tmp_path / "probe")
    need(reason is None, reason or "")
    venv = tmp_path / "fresh"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    py = str(venv / "bin" / "python")
    res = subprocess.run([py, "-m", "pip", "install", "-q", f"{dists['wheel']}[{','.join(SITE_EXTRAS)}]"],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    res = subprocess.run([py, "-m", "pip", "check"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    res = subprocess.run([py, "-c", "import psycopg, pyarrow, pymysql, auditor; print(auditor.__file__)"],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)
    assert res.returncode == 0 and str(venv) in res.stdout, res.stderr[-2000:]
    res = subprocess.run([str(venv / "bin" / "gpu-audit"), "--version"], capture_output=True, text=True,
                         timeout=120, cwd=tmp_path, env=env)
    assert res.stdout.split()[-1] == auditor.__version__, (res.stdout, res.stderr)
    res = subprocess.run([str(venv / "bin" / "gpu-audit"), "demo", "--out", str(tmp_path / "demo")],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert res.returncode == 0 and "Reserved GPU-hours" in res.stdout, res.stderr[-2000:]
