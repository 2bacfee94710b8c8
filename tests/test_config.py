"""Config: validation errors are one line with the key path; secrets come from env/files; every key is documented."""

from __future__ import annotations

import os
import re
import warnings
from pathlib import Path

import pytest

import connectors
from auditor import config as config_mod
from auditor.configdoc import connector_keys, walk
from auditor.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "c.toml"
    p.write_text(text)
    return p


def test_valid_config_loads(tmp_path: Path) -> None:
    p = write(tmp_path, """
[store]
url = "sqlite:///x.db"
[[clusters]]
name = "hpc"
[[clusters.allocations]]
kind = "file"
paths = ["a.csv"]
[thresholds]
idle_sm = 0.1
[[teams]]
name = "ml"
accounts = ["team-a"]
""")
    cfg = config_mod.load(p)
    assert cfg.clusters[0].name == "hpc"
    assert cfg.thresholds.idle_sm == 0.1
    assert cfg.teams[0].accounts == ["team-a"]


@pytest.mark.parametrize("text, path_re", [
    ("[store]\nbucket_seconds = 5\n", r"store\.bucket_seconds: .*greater than or equal to 60"),
    ("[thresholds]\nidle_sm = 'x'\n", r"thresholds\.idle_sm: "),
    ("[thresholds]\nidel_sm = 0.1\n", r"thresholds\.idel_sm: unknown key"),
    ("[[clusters]]\nname='a'\n[[clusters.telemetry]]\nkind='file'\n", r"clusters\[0\]\.telemetry\[0\]\.paths: "),
    ("[[clusters]]\nname='a'\n[[clusters.telemetry]]\nkind='nosuch'\n", r"clusters\[0\]\.telemetry\[0\]\.kind: "
     r"unknown connector kind 'nosuch'"),
    ("[[clusters]]\nname='a'\n[[clusters]]\nname='a'\n", r"clusters: .*duplicate cluster name 'a'"),
    ("[[clusters]]\nname='a b'\n", r"clusters\[0\]\.name: "),
    ("not toml = = 1", r"not valid TOML"),
    ("[store]\njudge_connections = 3\n", r"store: .*store\.judge_connections was removed: .*store\.audit_processes"),
])
def test_errors_are_one_line_with_key_path(tmp_path: Path, text: str, path_re: str) -> None:
    with pytest.raises(ConfigError) as err:
        connectors.load_config(write(tmp_path, text))
    msg = str(err.value)
    assert "\n" not in msg
    assert re.search(path_re, msg), msg


def test_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such config file"):
        config_mod.load(tmp_path / "nope.toml")


def test_env_var_names_the_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p = write(tmp_path, "[report]\ntop_n = 3\n")
    monkeypatch.setenv("GPU_AUDIT_CONFIG", str(p))
    assert config_mod.load().report.top_n == 3


def test_secret_from_env_and_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SMTP_PW", "s3cret-env")
    ref = config_mod.SecretRef(env="SMTP_PW")
    assert ref.resolve("email.password") == "s3cret-env"
    assert "s3cret" not in repr(ref)
    f = tmp_path / "pw"
    f.write_text("s3cret-file\n")
    os.chmod(f, 0o600)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert config_mod.SecretRef(file=f).resolve("email.password") == "s3cret-file"
    os.chmod(f, 0o644)
    with pytest.warns(UserWarning, match="readable by group/others") as rec:
        config_mod.SecretRef(file=f).resolve("email.password")
    assert "s3cret" not in str(rec[0].message)


def test_missing_secret_env_names_the_variable_not_a_value(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOPE_PW", raising=False)
    with pytest.raises(ConfigError, match="NOPE_PW is not set"):
        config_mod.SecretRef(env="NOPE_PW").resolve("email.password")


def _docs_text() -> str:
    return "\n".join(p.read_text() for p in (ROOT / "docs").glob("*.md")) + (ROOT / "README.md").read_text()


def test_every_config_key_is_documented() -> None:
    docs = (ROOT / "docs" / "configuration.md").read_text()
    missing = [path for path, _ in walk() if f"`{path}`" not in docs]
    assert not missing, f"undocumented config keys (regenerate with python -m auditor.configdoc): {missing}"


def test_every_connector_option_is_documented() -> None:
    docs = _docs_text()
    missing = [key for key, _ in connector_keys() if f"`{key}`" not in docs]
    assert not missing, f"undocumented connector options: {missing}"


def test_every_setting_has_a_description() -> None:
    assert [p for p, info in walk() if not info.description] == []
    assert [k for k, info in connector_keys() if not info.description] == []
