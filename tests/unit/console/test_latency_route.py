"""GET /admin/latency: TTFT/TPOT P95 against the SLO, from the ledger's timestamps, or from the
Prometheus HTTP API at console.prometheus_url when it is set (and back to the ledger when that
Prometheus does not answer)."""

import json
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path
from urllib.parse import parse_qs

import pytest
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.testclient import TestClient

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ingress"))
from fake_engine import FakeEngineClient  # noqa: E402
from live_server import serving  # noqa: E402

from loraplex.accounting.accounting import Accounting  # noqa: E402
from loraplex.accounting.config import AccountingConfig  # noqa: E402
from loraplex.accounting.record import UsageRecord  # noqa: E402
from loraplex.accounting.latency import ledger_latency  # noqa: E402
from loraplex.config import PlatformConfig  # noqa: E402
from loraplex.db.engine import make_engine  # noqa: E402
from loraplex.ingress.app import build_ingress_app  # noqa: E402
from loraplex.observability.prometheus_latency import latency_queries  # noqa: E402
from loraplex.tenancy.service import TenantService  # noqa: E402
from loraplex.tenancy.tenancy import Tenancy  # noqa: E402

ADMIN = {"Authorization": "Bearer latency-admin"}


def record(n: int, tenant_id: str, ttft: float, tpot: float, tokens: int, finished_ago: float) -> UsageRecord:
    finish = datetime.now(timezone.utc) - timedelta(seconds=finished_ago)
    first = finish - timedelta(seconds=tpot * (tokens - 1))
    return UsageRecord(request_id=f"r{n}", tenant_id=tenant_id, base_model="base", adapter=None, prompt_tokens=5,
                       cached_prompt_tokens=0, completion_tokens=tokens, status="finished",
                       arrival_time=first - timedelta(seconds=ttft), first_token_time=first, finish_time=finish)


def build(tmp_path, args: dict):
    db = make_engine(f"sqlite:///{tmp_path}/lat.db")
    service = TenantService(db)
    tenant = service.create_tenant("acme").id
    key = service.issue_key(tenant)[1]
    acc = Accounting.start(AccountingConfig(spool_dir=str(tmp_path / "spool")), db, "lat", plan_of=service.plan_of)
    # 20 requests in the last hour: TTFT 0.1 .. 2.0 s, TPOT 0.01 .. 0.2 s; one 2 h ago (outside)
    # that would be the worst of all; one with a single token (no TPOT).
    for i in range(1, 21):
        acc.ledger.append(record(i, tenant, ttft=0.1 * i, tpot=0.01 * i, tokens=11, finished_ago=60 + i))
    acc.ledger.append(record(99, tenant, ttft=50, tpot=5, tokens=11, finished_ago=7200))
    acc.ledger.append(record(98, tenant, ttft=0.05, tpot=9, tokens=1, finished_ago=30))
    acc.ledger.flush()
    config = PlatformConfig.from_args({"slo": {"ttft_p95_s": 1.5, "tpot_p95_s": 0.25}, **args})
    app = build_ingress_app(FakeEngineClient(lambda *a: iter(())), config,
                            tenancy=Tenancy(service, "latency-admin"), accounting=acc)
    return TestClient(app, raise_server_exceptions=False), key, acc


def test_the_ledger_percentiles_interpolate_like_the_benchmarks(tmp_path):
    from bench.percentile import percentile as bench_percentile  # the repository root is on pytest's path

    build(tmp_path, {})
    now = datetime.now(timezone.utc)
    lat = ledger_latency(make_engine(f"sqlite:///{tmp_path}/lat.db"), now - timedelta(hours=1), now)
    ttft = [0.1 * i for i in range(1, 21)] + [0.05]  # the single-token record has a TTFT, no TPOT
    tpot = [0.01 * i for i in range(1, 21)]
    assert lat.requests == 21
    assert lat.ttft_p95_s == pytest.approx(bench_percentile(ttft, 95), abs=1e-5)
    assert lat.tpot_p95_s == pytest.approx(bench_percentile(tpot, 95), abs=1e-5)
    empty = ledger_latency(make_engine(f"sqlite:///{tmp_path}/lat.db"), now - timedelta(hours=9), now - timedelta(hours=8))
    assert (empty.requests, empty.ttft_p95_s, empty.tpot_p95_s) == (0, None, None)


def test_from_the_ledger_when_no_prometheus_is_configured(tmp_path):
    client, key, acc = build(tmp_path, {})
    body = client.get("/admin/latency", headers=ADMIN).json()
    assert body["source"] == "ledger" and body["window_s"] == 3600 and body["requests"] == 21
    # 21 TTFTs (0.05, 0.1 .. 2.0): rank 20 * 0.95 = 19 is 1.9; 20 TPOTs (0.01 .. 0.2): rank 18.05, 0.1905.
    assert body["ttft_p95_s"] == pytest.approx(1.9, abs=1e-3)
    assert body["tpot_p95_s"] == pytest.approx(0.1905, abs=1e-3)
    assert body["slo"] == {"ttft_p95_s": 1.5, "tpot_p95_s": 0.25}
    assert body["within_slo"] == {"ttft": False, "tpot": True}
    wider = client.get("/admin/latency", params={"window_s": 3 * 3600}, headers=ADMIN).json()
    assert wider["requests"] == 22 and wider["ttft_p95_s"] == pytest.approx(1.995, abs=1e-3)  # the 50 s one counts
    acc.close()


def test_admin_only_and_bad_windows_are_400(tmp_path):
    client, key, acc = build(tmp_path, {})
    assert client.get("/admin/latency").status_code == 401
    assert client.get("/admin/latency", headers={"Authorization": f"Bearer {key}"}).status_code == 401
    for bad in ("10", "abc", str(8 * 86400)):
        r = client.get("/admin/latency", params={"window_s": bad}, headers=ADMIN)
        assert r.status_code == 400 and r.json()["error"]["param"] == "window_s"
    assert client.get("/admin/latency", params={"windw": 60}, headers=ADMIN).json()["error"]["param"] == "windw"
    acc.close()


def fake_prometheus(answers: dict[str, float | None], asked: list[str]) -> Starlette:
    """A stand-in for Prometheus's /api/v1/query (instant vectors), answering per query text."""
    async def query(request):
        promql = parse_qs(request.url.query)["query"][0]
        asked.append(promql)
        value = answers.get(promql)
        if isinstance(value, list):  # a vector: [(labels, value), ...]
            result = [{"metric": labels, "value": [1796000000.0, str(v)]} for labels, v in value]
        else:
            result = [] if value is None else [{"metric": {}, "value": [1796000000.0, str(value)]}]
        return JSONResponse({"status": "success", "data": {"resultType": "vector", "result": result}})
    return Starlette(routes=[Route("/api/v1/query", query)])


def test_console_prometheus_url_takes_effect(tmp_path):
    queries = latency_queries(1800)
    assert "ray_loraplex_time_to_first_token_seconds_bucket[30m]" in queries["ttft_p95_s"]
    asked: list[str] = []
    with serving(fake_prometheus({queries["ttft_p95_s"]: 0.42, queries["tpot_p95_s"]: None}, asked)) as url:
        client, _, acc = build(tmp_path, {"console": {"prometheus_url": url}})
        body = client.get("/admin/latency", params={"window_s": 1800}, headers=ADMIN).json()
    assert asked[:2] == [queries["ttft_p95_s"], queries["tpot_p95_s"]]
    assert body["source"] == "prometheus" and body["prometheus_error"] is None
    assert body["ttft_p95_s"] == 0.42 and body["tpot_p95_s"] is None  # no requests in Prometheus's window
    assert body["within_slo"] == {"ttft": True, "tpot": None}
    acc.close()


def test_a_prometheus_that_does_not_answer_falls_back_to_the_ledger(tmp_path):
    client, _, acc = build(tmp_path, {"console": {"prometheus_url": "http://127.0.0.1:9", "prometheus_timeout_s": 2}})
    body = client.get("/admin/latency", headers=ADMIN).json()
    assert body["source"] == "ledger" and body["requests"] == 21
    assert "127.0.0.1:9" in body["prometheus_error"]
    acc.close()


def test_loraplex_latency_prints_the_same_figures(tmp_path, capsys, monkeypatch):
    from loraplex.cli import main

    monkeypatch.delenv("LORAPLEX_ADMIN_TOKEN", raising=False)
    client, _, acc = build(tmp_path, {})
    with serving(client.app) as url:
        assert main(["--url", url, "--admin-token", "latency-admin", "latency"]) == 0
        out = capsys.readouterr().out
        assert main(["--url", url, "--admin-token", "latency-admin", "--json", "latency", "--window-s", "600"]) == 0
        body = json.loads(capsys.readouterr().out)
    lines = [ln.split() for ln in out.splitlines()]
    assert lines[0] == ["METRIC", "P95_S", "SLO_P95_S", "WITHIN_SLO"]
    assert lines[1][0] == "TTFT" and float(lines[1][1]) == pytest.approx(1.9, abs=1e-3) and lines[1][3] == "False"
    # Seconds to the millisecond, never a float's 17 digits (issue 46)
    assert all(len(row[1].partition(".")[2]) <= 3 for row in lines[1:3]), out
    assert "from the usage ledger (21 requests)" in out
    assert body["window_s"] == 600 and body["source"] == "ledger"
    acc.close()


def test_per_class_attainment_and_goodput_from_prometheus(tmp_path):
    from loraplex.observability.prometheus_latency import class_queries
    q = class_queries(3600)
    answers = {q["attainment"]: [({"slo_class": "standard"}, 0.97)],
               q["tenants"]: [({"slo_class": "standard", "tenant": "ten_a"}, 1.0),
                              ({"slo_class": "standard", "tenant": "ten_b"}, 0.9)],
               q["goodput_tokens_per_s"]: [({"slo_class": "standard"}, 12.5)]}
    with serving(fake_prometheus(answers, [])) as url:
        client, _, acc = build(tmp_path, {"console": {"prometheus_url": url}})
        body = client.get("/admin/latency", headers=ADMIN).json()
    standard = body["classes"]["standard"]  # the single `slo:` is one class
    assert standard["attainment"] == 0.97 and standard["goodput_tokens_per_s"] == 12.5
    assert standard["tenants"] == {"ten_a": 1.0, "ten_b": 0.9}
    assert standard["ttft_p95_s"] == body["slo"]["ttft_p95_s"] and body["goodput_tokens_per_s"] == 12.5
    acc.close()
