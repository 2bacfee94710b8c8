"""The read-only web UI through Starlette's TestClient on SQLite and PostgreSQL: every page and its JSON,
numbers checked by hand, filters and sorting, CSV = JSON, per-user scope behind an auth proxy header,
state-changing methods refused, hostile names escaped and shortened everywhere, security headers."""

from __future__ import annotations

import csv
import io
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from starlette.routing import Route
from starlette.testclient import TestClient

from auditor.audit.run import run_audit
from auditor.config import Config, WebConfig
from auditor.records import AllocatedGpu, Allocation
from auditor.web.app import create_app

sys.path.insert(0, str(Path(__file__).parent))
from test_jobview import DAY, bk, records  # noqa: E402
from test_report import T0  # noqa: E402

EVIL = "<script>alert(1)</script>\u202e" + "x" * 3000 + "-tail"
PAGES = ("/", "/teams", "/users", "/clusters", "/findings", "/allocation/1", "/chargeback")


def world_records() -> list:
    """test_jobview's dana (8 GPU-h, 6 idle) and erin (2 GPU-h, 2 idle) plus mallory's 1 idle GPU-hour job
    with a hostile 3,000-character name: 11 reserved, 9 idle GPU-hours; at 2.0 per GPU-hour 22.00 and 18.00."""
    recs = records()
    recs.append(Allocation("c1", "slurm", "666", name=EVIL, user="mallory", account="acct-x", start=T0,
                           end=T0 + timedelta(hours=1), gpus=[AllocatedGpu("g3", 0)]))
    recs += bk("g3", 0, T0, 1, sm_active=0.0, gpu_util=0.0)
    return recs


def client(store, web: WebConfig | None = None) -> TestClient:  # noqa: ANN001
    cfg = Config(web=web or WebConfig())
    return TestClient(create_app(store, cfg))


@pytest.fixture
def audited(store):  # noqa: ANN001, ANN201
    store.ingest(world_records())
    run_audit(store, Config(), T0, T0 + DAY)
    return store


def test_pages_and_api_numbers_by_hand(audited) -> None:  # noqa: ANN001
    c = client(audited)
    for p in PAGES:
        r = c.get(p)
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/html"), p
        assert "default-src 'none'" in r.headers["content-security-policy"] and r.headers["x-frame-options"] == "DENY"
        assert "<script" not in r.text.lower(), p
    h = c.get("/api/overview").json()["headline"]
    assert (h["reserved_gpu_hours"], h["idle_gpu_hours"]) == pytest.approx((11.0, 9.0))
    assert (h["reserved_cost"], h["idle_cost"]) == pytest.approx((22.0, 18.0))
    assert ">USD 18.00<" in c.get("/").text
    users = c.get("/api/users").json()
    assert [(r["name"], round(r["idle_cost"], 2)) for r in users["rows"]] == [("dana", 12.0), ("erin", 4.0),
                                                                              ("mallory", 2.0)]
    assert users["totals"]["idle_cost"] == pytest.approx(18.0)
    assert [r["name"] for r in c.get("/api/clusters").json()["rows"]] == ["c1"]
    alloc = c.get("/api/allocation/1").json()
    assert alloc["id"] == "501" and alloc["idle_cost"] == pytest.approx(12.0) and len(alloc["gpus"]) == 2
    assert c.get("/allocation/1").text.count("<svg") == 2  # one chart per GPU
    assert c.get("/allocation/999").status_code == 404 and c.get("/api/allocation/999").status_code == 404
    assert c.get("/?run=abc").status_code == 404 and "not a run id" in c.get("/api/overview?run=abc").json()["error"]


def test_findings_filters_and_sorting(audited) -> None:  # noqa: ANN001
    c = client(audited)
    allf = c.get("/api/findings").json()
    costs = [r["cost"] for r in allf["rows"]]
    assert costs == sorted(costs, reverse=True) and allf["total"] == len(allf["rows"])
    asc = c.get("/api/findings?sort=cost&order=asc").json()
    assert [r["cost"] for r in asc["rows"]] == sorted(costs)
    mir = c.get("/api/findings?kind=util_mirage").json()
    assert {r["kind"] for r in mir["rows"]} == {"util_mirage"} and mir["rows"][0]["job_id"] == "501"
    erin = c.get("/api/findings?user=erin").json()
    assert {r["user"] for r in erin["rows"]} == {"erin"} and erin["totals"]["cost"] == pytest.approx(4.0)
    q = c.get("/api/findings?q=NB-").json()  # name contains, case-insensitive
    assert [r["job_name"] for r in q["rows"]] == ["nb-0"]
    assert c.get("/api/findings?q=100%25").json()["total"] == 0  # LIKE wildcards are literal
    assert c.get("/findings?sort=bogus").status_code == 200
    assert c.get("/findings?page=x").status_code == 400  # a page that is no number: one line, not page 1


def test_chargeback_csv_matches_json(audited, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    c = client(audited)
    data = c.get("/api/chargeback?by=user").json()
    assert data["totals"]["reserved_cost"] == pytest.approx(22.0) and len(data["rows"]) == 3
    r = c.get("/chargeback.csv?by=user")
    assert r.headers["content-disposition"].startswith("attachment;")
    assert r.headers["content-type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(r.text)))
    assert [(x["owner"], float(x["idle_cost"])) for x in rows] == [(x["owner"], x["idle_cost"]) for x in data["rows"]]
    assert c.get("/api/chargeback?by=nope").status_code == 404
    from auditor.web import data as web_data

    monkeypatch.setattr(web_data, "PAGE_ROWS", 2)  # a setting until issue 45
    paged = client(audited)
    p2 = paged.get("/api/chargeback?by=user&page=2").json()
    assert (len(p2["rows"]), p2["total"]) == (1, 3) and p2["totals"]["reserved_cost"] == pytest.approx(22.0)
    assert len(list(csv.DictReader(io.StringIO(paged.get("/chargeback.csv?by=user").text)))) == 3
    assert 'id="next"' in paged.get("/chargeback?by=user").text


def test_read_only_every_route_refuses_writes(audited) -> None:  # noqa: ANN001
    c = client(audited)
    paths = [r.path.replace("{aid:int}", "1") for r in c.app.routes if isinstance(r, Route)]
    assert len(paths) >= 16
    for p in paths:
        assert set(next(r for r in c.app.routes if r.path.replace("{aid:int}", "1") == p).methods) <= {"GET", "HEAD"}
        for method in ("POST", "PUT", "PATCH", "DELETE"):
            assert c.request(method, p).status_code == 405, (method, p)


def test_auth_proxy_scopes_users(audited) -> None:  # noqa: ANN001
    web = WebConfig(user_header="X-WEBAUTH-USER", groups_header="X-WEBAUTH-GROUPS", admins=["root"],
                    admin_groups=["ops"])
    c = client(audited, web)
    assert c.get("/").status_code == 401 and c.get("/api/findings").status_code == 401
    erin = {"X-WEBAUTH-USER": "erin"}
    h = c.get("/api/overview", headers=erin).json()["headline"]
    assert h["reserved_gpu_hours"] == pytest.approx(2.0) and h["idle_cost"] == pytest.approx(4.0)
    assert {r["user"] for r in c.get("/api/findings", headers=erin).json()["rows"]} == {"erin"}
    assert [r["name"] for r in c.get("/api/users", headers=erin).json()["rows"]] == ["erin"]
    assert c.get("/api/allocation/1", headers=erin).status_code == 404  # dana's job
    assert c.get("/api/allocation/2", headers=erin).json()["user"] == "erin"
    cb = c.get("/api/chargeback?by=team", headers=erin).json()
    assert cb["by"] == "user" and [r["owner"] for r in cb["rows"]] == ["erin"]
    assert "your allocations only" in c.get("/", headers=erin).text
    for admin in ({"X-WEBAUTH-USER": "root"}, {"X-WEBAUTH-USER": "zed", "X-WEBAUTH-GROUPS": "dev, ops"}):
        assert c.get("/api/overview", headers=admin).json()["headline"]["idle_cost"] == pytest.approx(18.0)
    assert c.get("/api/overview", headers={"X-WEBAUTH-USER": "zed", "X-WEBAUTH-GROUPS": "dev"}).json()[
        "headline"]["reserved_gpu_hours"] == 0


def test_hostile_names_escaped_and_shortened(audited) -> None:  # noqa: ANN001
    c = client(audited)
    mal = next(r for r in c.get("/api/findings?user=mallory").json()["rows"])
    pages = [*PAGES, f"/allocation/{mal['allocation_id']}", "/findings?user=mallory", "/chargeback?by=user"]
    for p in pages:
        body = c.get(p).text
        assert "<script>alert" not in body and "\u202e" not in body, p
        assert "x" * 400 not in body, p  # shortened (title attribute capped too)
    body = c.get("/findings?user=mallory").text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in body and "-tail" in body
    assert c.get(f"/api/allocation/{mal['allocation_id']}").json()["name"] == EVIL  # the API keeps it whole


def test_cli_web_bad_listen_is_one_line(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from auditor.cli import main

    res = CliRunner().invoke(main, ["web", "--listen", "nonsense"])
    assert res.exit_code == 1 and "web listen address" in res.output and len(res.output.strip().splitlines()) == 1
    res = CliRunner().invoke(main, ["web", "--listen", "off"])
    assert res.exit_code == 1 and "'off' is not an address" in res.output
