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


def test_shared_connection_options_are_one_definition_documented_once() -> None:
    """node_exporter and inference read their API through the prometheus connector: its connection options are
    theirs (one class, so one default and one check), listed once under prometheus, and their pages name each."""
    from connectors.inference import InferenceTelemetry
    from connectors.node_exporter import NodeTelemetry
    from connectors.prometheus import ApiOptions, PrometheusTelemetry

    keys = {k for k, _ in connector_keys()}
    shared = list(ApiOptions.model_fields)
    assert len(shared) == 10 and {f"prometheus.{n}" for n in shared} <= keys
    for cls, kind, page in ((NodeTelemetry, "node_exporter", "node-telemetry.md"),
                            (InferenceTelemetry, "inference", "inference.md")):
        assert issubclass(cls.Options, ApiOptions) and issubclass(PrometheusTelemetry.Options, ApiOptions)
        assert not [n for n in shared if f"{kind}.{n}" in keys]
        text = (ROOT / "docs" / page).read_text()
        assert not [n for n in shared if f"`{n}`" not in text], page
        with pytest.raises(ValueError, match="without braces"):  # the prometheus connector's check, here too
            cls.Options(url="http://p:9090", matchers='{cluster="a"}')


def test_every_setting_has_a_description() -> None:
    assert [p for p, info in walk() if not info.description] == []
    assert [k for k, info in connector_keys() if not info.description] == []


# -- retired settings (issue 45): rule constants a site's old config may still set -----------------------------


def test_every_retired_key_names_a_constant_and_is_no_setting_any_more() -> None:
    from auditor.config.retired import RETIRED, constant

    settings = {p for p, _ in walk()} | {k for k, _ in connector_keys()}
    assert RETIRED and not [k for k in RETIRED if k in settings]
    for key in RETIRED:
        name, value = constant(key)  # imports the module: an AttributeError names a constant that went away
        assert name.rsplit(".", 1)[1].isupper() and value is not None, key
    docs = (ROOT / "docs" / "configuration.md").read_text()
    assert not [k for k in RETIRED if f"| {k} | `{constant(k)[0]}` |" not in docs], "regenerate the retired table"


def test_a_retired_key_of_another_value_is_an_error_naming_the_constant(tmp_path: Path) -> None:
    """A site that set lemon_min_faults = 5 meant 5: loading must not silently judge with 3."""
    from auditor.audit.infra import LEMON_MIN_FAULTS

    assert LEMON_MIN_FAULTS == 3
    p = write(tmp_path, "[thresholds]\nidle_sm = 0.1\nlemon_min_faults = 5\nhint_dram_high = 0.4\n")
    with pytest.raises(ConfigError) as exc:
        config_mod.load(p)
    assert str(exc.value) == (f"{p}: thresholds.lemon_min_faults: no longer a setting: it is the constant "
                              "auditor.audit.infra.LEMON_MIN_FAULTS = 3 (the value given, 5, is not used any more): "
                              "remove the key")
    from auditor.configdoc import check

    got = check(p)
    assert got.config is None and len(got.errors) == 1 and "thresholds.lemon_min_faults" in got.errors[0]
    assert [w.split(": ", 2)[1] for w in got.warnings] == ["thresholds.hint_dram_high"]


def test_a_retired_key_of_the_same_value_is_a_warning_and_changes_nothing(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    p = write(tmp_path, "[thresholds]\nidle_sm = 0.1\nhint_dram_high = 0.4\ngoodput_infra_events = ['xid', 'ecc_dbe', "
                        "'row_remap', 'down', 'not_ready']\n")
    with caplog.at_level("WARNING", logger="gpu_audit.config"):
        cfg = config_mod.load(p)
    assert cfg.thresholds == config_mod.Thresholds(idle_sm=0.1)
    said = [r.getMessage() for r in caplog.records if r.name == "gpu_audit.config"]
    assert said == [f"{p}: thresholds.hint_dram_high: no longer a setting: it is the constant "
                    "auditor.audit.efficiency.HINT_DRAM_HIGH = 0.4; the value given is the same, remove the key",
                    f"{p}: thresholds.goodput_infra_events: no longer a setting: it is the constant "
                    "auditor.audit.goodput.GOODPUT_INFRA_EVENTS = ('xid', 'ecc_dbe', 'row_remap', 'down', "
                    "'not_ready'); the value given is the same, remove the key"]


def test_a_run_recorded_before_the_constants_reads_back() -> None:
    """audit_runs.thresholds of an earlier run still holds the retired keys: they are left out, the rest kept."""
    old = {**config_mod.Thresholds().model_dump(), "idle_sm": 0.1, "hint_dram_high": 0.4, "lemon_min_faults": 3}
    assert config_mod.Thresholds.of_run(old) == config_mod.Thresholds(idle_sm=0.1)
    assert config_mod.Thresholds.of_run(None) == config_mod.Thresholds()


def test_retired_keys_in_a_list_of_tables_and_in_a_source_name_their_place(tmp_path: Path) -> None:
    """clusters[].overlap_minutes (a list of tables) and a kubernetes source's watch_s (a connector's option)."""
    from auditor.configdoc import check

    p = write(tmp_path, '[[clusters]]\nname = "k"\noverlap_minutes = 30\n[[clusters.allocations]]\n'
                        'kind = "kubernetes"\nin_cluster = true\nwatch_s = 9\n')
    got = check(p)
    assert got.errors == [f"{p}: clusters[0].allocations[0].watch_s: no longer a setting: it is the constant "
                          "connectors.kubernetes.WATCH_S = 5 (the value given, 9, is not used any more): "
                          "remove the key"]
    assert got.warnings == [f"{p}: clusters[0].overlap_minutes: no longer a setting: it is the constant "
                            "auditor.collect.OVERLAP_MINUTES = 30; the value given is the same, remove the key"]
    with pytest.raises(ConfigError, match=r"clusters\[0\]\.allocations\[0\]\.watch_s: no longer a setting"):
        config_mod.load(p)
