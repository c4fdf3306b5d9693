"""/v1/usage and the /admin usage, billing export, statement and cost-model routes, against a real
ledger (spool -> DB) on SQLite and PostgreSQL, tenancy and prices, with a fake engine."""

import csv
import io
import json
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from decimal import Decimal

import pytest
from starlette.testclient import TestClient

from fake_engine import FakeEngineClient
from loraplex.accounting.accounting import Accounting
from loraplex.accounting.config import CPU_PROFILE_HARDWARE, CPU_PROFILE_HOUR_PRICE, AccountingConfig
from loraplex.accounting.record import UsageRecord
from loraplex.accounting.billing_export import EVENT_TYPE, METERS, event_id
from loraplex.config import PlatformConfig
from loraplex.db.engine import make_engine
from loraplex.ingress import usage_routes
from loraplex.ingress.app import build_ingress_app
from loraplex.tenancy.service import TenantService
from loraplex.tenancy.tenancy import Tenancy

ADMIN = "usage-admin-token"
AUTH = {"Authorization": f"Bearer {ADMIN}"}
OCT = {"start": "2026-10-01", "end": "2026-11-01"}
UTC = timezone.utc
COLUMNS = ["prompt_tokens", "cached_prompt_tokens", "completion_tokens", "requests", "cost"]
# Per 1M tokens: (input, cached_input, output)
PRICES = {"default": ("0.50", "0.05", "1.50"), "pro": ("0.40", "0.04", "1.20"), "globex": ("2", "0.2", "6")}
# The pro plan prices the base model "other" apart: output dearer, its input and cached input the plan's.
PRO_OTHER = ("0.40", "0.04", "9")


def cost(price: tuple[str, str, str], prompt: int, cached: int, completion: int) -> Decimal:
    i, c, o = map(Decimal, price)
    return ((prompt - cached) * i + cached * c + completion * o) / Decimal(1_000_000)


@dataclass
class Env:
    client: TestClient
    acc: Accounting
    ids: dict[str, str]       # tenant name -> id
    keys: dict[str, dict]     # tenant name -> Authorization header
    records: dict[str, list[UsageRecord]]  # tenant name -> its October records


def rec(n: int, tenant_id: str, finish: datetime, prompt: int, cached: int, completion: int,
        model: str = "base-model", adapter: str | None = None, status: str = "finished") -> UsageRecord:
    return UsageRecord(request_id=f"{tenant_id}-{n}", tenant_id=tenant_id, base_model=model, adapter=adapter,
                       prompt_tokens=prompt, cached_prompt_tokens=cached, completion_tokens=completion,
                       status=status, arrival_time=finish - timedelta(seconds=2),
                       first_token_time=finish - timedelta(seconds=1), finish_time=finish, api_key_id="key",
                       replica_id="r0")


@pytest.fixture
def env(db_url, tmp_path):
    db = make_engine(db_url)
    service = TenantService(db)
    tenancy = Tenancy(service, admin_token=ADMIN)
    ids, keys = {}, {}
    for name, plan in (("acme", "pro"), ("globex", "default"), ("initech", "default")):
        ids[name] = service.create_tenant(name, plan=plan).id
        keys[name] = {"Authorization": f"Bearer {service.issue_key(ids[name])[1]}"}
    as_price = lambda p: dict(zip(("input", "cached_input", "output"), p))  # noqa: E731
    cfg = AccountingConfig(
        spool_dir=str(tmp_path / "spool"), billing_source="loraplex-test", billing_grace_s=3600,
        cost_model={"models": {"other": {"gpus": 2, "gpu_hour_price": "1.5", "hardware": "L4"}}},
        pricing={"currency": "EUR", "plans": {"default": as_price(PRICES["default"]),
                                              "pro": {**as_price(PRICES["pro"]), "models": {"other": {"output": "9"}}}},
                 "tenant_overrides": {ids["globex"]: as_price(PRICES["globex"])}})
    acc = Accounting.start(cfg, db, "ingress#1", plan_of=service.plan_of)
    a, g = ids["acme"], ids["globex"]
    records = {
        "acme": [rec(1, a, datetime(2026, 10, 5, 10, 5, tzinfo=UTC), 100, 40, 20),
                 rec(2, a, datetime(2026, 10, 5, 11, 0, tzinfo=UTC), 1000, 0, 300, adapter="bot@abc"),
                 rec(3, a, datetime(2026, 10, 6, 9, 59, tzinfo=UTC), 7, 7, 1, model="other", adapter="bot@abc",
                     status="client_disconnect")],
        "globex": [rec(1, g, datetime(2026, 10, 5, 10, 30, tzinfo=UTC), 50, 10, 5, model="globex-model",
                       adapter="secret@9"),
                   rec(2, g, datetime(2026, 10, 31, 23, 59, 59, tzinfo=UTC), 1, 0, 1000, model="globex-model")],
    }
    for r in [*records["acme"], *records["globex"],
              rec(99, a, datetime(2026, 11, 2, tzinfo=UTC), 5, 0, 5),      # November: outside October
              rec(98, a, datetime(2026, 9, 30, 23, 59, tzinfo=UTC), 5, 0, 5)]:  # September
        acc.ledger.append(r)
    acc.ledger.rejections.add(a, "rate_limited", at=datetime(2026, 10, 5, 10, 15, tzinfo=UTC), n=3)
    acc.ledger.rejections.add(None, "invalid_api_key", at=datetime(2026, 10, 6, 1, 0, tzinfo=UTC))
    acc.ledger.flush()
    engine = FakeEngineClient(lambda method, request, *context: iter(()))
    app = build_ingress_app(engine, PlatformConfig.from_args(None), tenancy=tenancy, accounting=acc)
    yield Env(TestClient(app, raise_server_exceptions=False), acc, ids, keys, records)
    acc.close()
    db.dispose()


def sums(records: list[UsageRecord]) -> dict:
    return {"prompt_tokens": sum(r.prompt_tokens for r in records),
            "cached_prompt_tokens": sum(r.cached_prompt_tokens for r in records),
            "completion_tokens": sum(r.completion_tokens for r in records), "requests": len(records)}


def price_of(name: str, model: str) -> tuple[str, str, str]:
    if name == "acme":
        return PRO_OTHER if model == "other" else PRICES["pro"]
    return PRICES[name if name == "globex" else "default"]


def expected_cost(env: Env, name: str, model: str | None = None) -> Decimal:
    """What tenant `name`'s October records cost (those on base `model` only, if given)."""
    return sum((cost(price_of(name, r.base_model), r.prompt_tokens, r.cached_prompt_tokens, r.completion_tokens)
                for r in env.records.get(name, []) if model in (None, r.base_model)), Decimal(0))


def ok(response, content_type="application/json"):
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith(content_type)
    return response


def error_of(response, status, param=None):
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == status and error["message"]
    if param is not None:
        assert error["param"] == param, error
    return error


def test_tenant_usage_totals_and_exact_cost(env):
    for name in ("acme", "globex"):
        body = ok(env.client.get("/v1/usage", params=OCT, headers=env.keys[name])).json()
        assert body["tenant"] == env.ids[name] and body["group_by"] == "day" and body["currency"] == "EUR"
        assert body["start"] == "2026-10-01T00:00:00+00:00" and body["end"] == "2026-11-01T00:00:00+00:00"
        total = body["total"]
        assert {k: total[k] for k in COLUMNS[:-1]} == sums(env.records[name])
        assert isinstance(total["cost"], str) and Decimal(total["cost"]) == expected_cost(env, name)
        for col in COLUMNS:
            assert sum(Decimal(str(r[col])) for r in body["rows"]) == Decimal(str(total[col]))
    acme = env.client.get("/v1/usage", params=OCT, headers=env.keys["acme"]).json()
    assert [(r["day"], r["requests"]) for r in acme["rows"]] == [("2026-10-05", 2), ("2026-10-06", 1)]
    # globex pays its negotiated price, not its plan's.
    globex = env.client.get("/v1/usage", params=OCT, headers=env.keys["globex"]).json()
    assert Decimal(globex["total"]["cost"]) == Decimal("0.006114")  # (41*2 + 10*0.2 + 1005*6) / 1e6


def test_tenant_never_sees_another_tenants_usage(env):
    for group_by in ("day", "hour", "adapter", "model"):
        for fmt in ("json", "csv"):
            response = env.client.get("/v1/usage", params={**OCT, "group_by": group_by, "format": fmt},
                                      headers=env.keys["acme"])
            text = ok(response, "application/json" if fmt == "json" else "text/csv").text
            assert "globex-model" not in text and "secret@9" not in text and env.ids["globex"] not in text
    empty = ok(env.client.get("/v1/usage", params=OCT, headers=env.keys["initech"])).json()
    assert empty["rows"] == [] and empty["total"] == {"prompt_tokens": 0, "cached_prompt_tokens": 0,
                                                      "completion_tokens": 0, "requests": 0, "cost": "0"}
    # A tenant cannot ask for someone else's: the tenant parameter does not exist on /v1/usage.
    error_of(env.client.get("/v1/usage", params={**OCT, "tenant": env.ids["globex"]}, headers=env.keys["acme"]),
             400, "tenant")


def test_group_by_hour_adapter_model(env):
    def keys(group_by):
        body = ok(env.client.get("/v1/usage", params={**OCT, "group_by": group_by}, headers=env.keys["acme"])).json()
        assert body["group_by"] == group_by and Decimal(body["total"]["cost"]) == expected_cost(env, "acme")
        return [(r[group_by], r["requests"]) for r in body["rows"]]

    assert keys("hour") == [("2026-10-05T10:00:00Z", 1), ("2026-10-05T11:00:00Z", 1), ("2026-10-06T09:00:00Z", 1)]
    assert keys("adapter") == [("(base)", 1), ("bot@abc", 2)]  # the base model's row is named
    assert keys("model") == [("base-model", 2), ("other", 1)]


def test_group_by_model_prices_each_row_at_its_base_s_price(env):
    body = ok(env.client.get("/v1/usage", params={**OCT, "group_by": "model"}, headers=env.keys["acme"])).json()
    costs = {r["model"]: Decimal(r["cost"]) for r in body["rows"]}
    assert costs == {m: expected_cost(env, "acme", m) for m in ("base-model", "other")}
    # "other": 1 completion token at its own output price, 9 (not the plan's 1.20); 7 cached at the plan's 0.04.
    assert costs["other"] == Decimal("0.00000928")  # (7*0.04 + 1*9) / 1e6
    # Grouped by day, the two bases share a day's row only where both ran that day: each record at its base's price.
    days = ok(env.client.get("/v1/usage", params=OCT, headers=env.keys["acme"])).json()
    assert Decimal(days["rows"][1]["cost"]) == costs["other"]


def test_csv(env):
    response = ok(env.client.get("/v1/usage", params={**OCT, "format": "csv", "group_by": "adapter"},
                                 headers=env.keys["acme"]), "text/csv")
    lines = response.text.splitlines()
    assert lines[0] == "adapter,prompt_tokens,cached_prompt_tokens,completion_tokens,requests,cost"
    rows = list(csv.DictReader(io.StringIO(response.text)))
    assert [r["adapter"] for r in rows] == ["(base)", "bot@abc"]
    assert sum(Decimal(r["cost"]) for r in rows) == expected_cost(env, "acme")
    assert sum(int(r["requests"]) for r in rows) == 3
    assert ok(env.client.get("/v1/usage", params={**OCT, "format": "csv"}, headers=env.keys["acme"]),
              "text/csv").text.startswith("day,prompt_tokens,cached_prompt_tokens,completion_tokens,requests,cost\n")


def test_default_range_is_the_current_month_so_far(env, monkeypatch):
    now = datetime(2026, 10, 20, 12, 30, tzinfo=UTC)
    monkeypatch.setattr(usage_routes, "_now", lambda: now)
    body = ok(env.client.get("/v1/usage", headers=env.keys["acme"])).json()
    assert (body["start"], body["end"], body["group_by"]) == ("2026-10-01T00:00:00+00:00", now.isoformat(), "day")
    assert body["total"]["requests"] == 3
    # end alone: the month end falls in; end on a month boundary is exclusive, so it means the month before.
    body = ok(env.client.get("/v1/usage", params={"end": "2026-11-01"}, headers=env.keys["acme"])).json()
    assert body["start"] == "2026-10-01T00:00:00+00:00" and body["total"]["requests"] == 3
    body = ok(env.client.get("/v1/usage", params={"start": "2026-09-01T00:00:00Z"}, headers=env.keys["acme"])).json()
    assert body["end"] == now.isoformat() and body["total"]["requests"] == 4  # September's one too
    # Offsets are honoured and reported in UTC ('+' in a query string arrives as a space).
    body = ok(env.client.get("/v1/usage?start=2026-10-05T12:00:00+02:00&end=2026-10-05T13:00:00%2B02:00",
                             headers=env.keys["acme"])).json()
    assert body["start"] == "2026-10-05T10:00:00+00:00" and body["total"]["requests"] == 1


def test_admin_usage_all_tenants_one_tenant_and_rejections(env):
    body = ok(env.client.get("/admin/usage", params={**OCT, "group_by": "tenant"}, headers=AUTH)).json()
    assert body["tenant"] is None
    everyone = env.records["acme"] + env.records["globex"]
    assert {k: body["total"][k] for k in COLUMNS[:-1]} == sums(everyone)
    assert Decimal(body["total"]["cost"]) == expected_cost(env, "acme") + expected_cost(env, "globex")
    by_tenant = {r["tenant"]: r for r in body["rows"]}
    assert set(by_tenant) == {env.ids["acme"], env.ids["globex"]}
    # Tenants by name next to their id.
    assert {r["tenant_name"] for r in body["rows"]} == {"acme", "globex"}
    assert all(env.ids[r["tenant_name"]] == r["tenant"] for r in body["rows"])
    assert Decimal(by_tenant[env.ids["globex"]]["cost"]) == expected_cost(env, "globex")
    assert sorted(body["rejections"], key=lambda r: r["tenant"]) == sorted(
        [{"tenant": env.ids["acme"], "tenant_name": "acme", "reason": "rate_limited", "count": 3},
         {"tenant": "-", "tenant_name": None, "reason": "invalid_api_key", "count": 1}], key=lambda r: r["tenant"])

    one = ok(env.client.get("/admin/usage", params={**OCT, "tenant": env.ids["acme"]}, headers=AUTH)).json()
    tenant_view = env.client.get("/v1/usage", params=OCT, headers=env.keys["acme"]).json()
    assert one["tenant"] == env.ids["acme"] and one["rows"] == tenant_view["rows"]
    assert one["total"] == tenant_view["total"]
    assert one["rejections"] == [{"tenant": env.ids["acme"], "tenant_name": "acme", "reason": "rate_limited",
                                  "count": 3}]

    text = ok(env.client.get("/admin/usage", params={**OCT, "group_by": "tenant", "format": "csv"}, headers=AUTH),
              "text/csv").text
    assert text.splitlines()[0] == "tenant,tenant_name,prompt_tokens,cached_prompt_tokens,completion_tokens,requests,cost"
    assert {r["tenant_name"]: r["tenant"] for r in csv.DictReader(io.StringIO(text))} == {
        "acme": env.ids["acme"], "globex": env.ids["globex"]}
    error_of(env.client.get("/admin/usage", params={"tenant": "ten_nobody"}, headers=AUTH), 404)


def test_billing_export_is_stable_cloudevents(env, monkeypatch):
    monkeypatch.setattr(usage_routes, "_now", lambda: datetime(2026, 11, 5, tzinfo=UTC))
    first = ok(env.client.get("/admin/billing/export", params={"period": "2026-10"}, headers=AUTH),
               "application/x-ndjson")
    second = env.client.get("/admin/billing/export", params={"period": "2026-10", "format": "jsonl"}, headers=AUTH)
    assert first.text == second.text and first.text.endswith("\n")
    assert first.headers["x-loraplex-export-complete"] == "true"
    assert first.headers["x-loraplex-export-through"] == "2026-10-31"
    events = [json.loads(line) for line in first.text.splitlines()]
    assert first.headers["x-loraplex-export-events"] == str(len(events))
    assert len({e["id"] for e in events}) == len(events) > 0
    for e in events:
        assert e["specversion"] == "1.0" and e["type"] == EVENT_TYPE and e["source"] == "loraplex-test"
        assert e["subject"] in (env.ids["acme"], env.ids["globex"]) and e["time"].endswith("T00:00:00Z")
        assert e["data"]["meter"] in METERS and isinstance(e["data"]["quantity"], int) and e["data"]["quantity"] > 0
        assert e["id"] == event_id(e["subject"], e["data"]["meter"], "2026-10", e["data"]["day"])
        datetime.fromisoformat(e["time"].replace("Z", "+00:00"))
    for name in ("acme", "globex"):
        mine = [e for e in events if e["subject"] == env.ids[name]]
        s = sums(env.records[name])
        assert sum(e["data"]["quantity"] for e in mine if e["data"]["meter"] == "output_tokens") \
            == s["completion_tokens"]
        assert sum(e["data"]["quantity"] for e in mine if e["data"]["meter"] == "input_tokens") \
            == s["prompt_tokens"] - s["cached_prompt_tokens"]

    as_csv = ok(env.client.get("/admin/billing/export", params={"period": "2026-10", "format": "csv"}, headers=AUTH),
                "text/csv")
    rows = list(csv.DictReader(io.StringIO(as_csv.text)))
    assert [r["id"] for r in rows] == [e["id"] for e in events] and rows[0]["period"] == "2026-10"
    only = ok(env.client.get("/admin/billing/export", params={"period": "2026-10", "tenant": env.ids["globex"]},
                             headers=AUTH), "application/x-ndjson")
    assert only.text == "".join(line + "\n" for line in first.text.splitlines()
                                if json.loads(line)["subject"] == env.ids["globex"])


def test_billing_export_waits_for_the_grace_period(env, monkeypatch):
    # 2026-10-06 00:30: October 5th ended 30 minutes ago, inside the 1 h grace: not final yet.
    monkeypatch.setattr(usage_routes, "_now", lambda: datetime(2026, 10, 6, 0, 30, tzinfo=UTC))
    early = ok(env.client.get("/admin/billing/export", params={"period": "2026-10"}, headers=AUTH),
               "application/x-ndjson")
    assert early.text == "" and early.headers["x-loraplex-export-complete"] == "false"
    assert early.headers["x-loraplex-export-through"] == "2026-10-04"
    monkeypatch.setattr(usage_routes, "_now", lambda: datetime(2026, 10, 6, 1, 30, tzinfo=UTC))
    later = env.client.get("/admin/billing/export", params={"period": "2026-10"}, headers=AUTH)
    assert later.headers["x-loraplex-export-through"] == "2026-10-05"
    assert {json.loads(line)["data"]["day"] for line in later.text.splitlines()} == {"2026-10-05"}
    # Nothing of a month that has not begun: no through header at all.
    future = env.client.get("/admin/billing/export", params={"period": "2026-12"}, headers=AUTH)
    assert future.text == "" and "x-loraplex-export-through" not in future.headers


def test_statement(env):
    body = ok(env.client.get(f"/admin/tenants/{env.ids['acme']}/statement", params={"period": "2026-10"},
                             headers=AUTH)).json()
    assert body["tenant"] == env.ids["acme"] and body["plan"] == "pro" and body["currency"] == "EUR"
    assert body["requests"] == 3
    # A line per base model and meter, each base at its own price.
    lines = []
    for model in ("base-model", "other"):
        s = sums([r for r in env.records["acme"] if r.base_model == model])
        i, c, o = price_of("acme", model)
        lines += [(model, "input_tokens", s["prompt_tokens"] - s["cached_prompt_tokens"], i),
                  (model, "cached_input_tokens", s["cached_prompt_tokens"], c),
                  (model, "output_tokens", s["completion_tokens"], o)]
    assert [(ln["model"], ln["meter"], ln["quantity"], ln["unit_price_per_1m"]) for ln in body["lines"]] == lines
    assert Decimal(body["subtotal"]) == expected_cost(env, "acme") and body["total_due"] == "0.00"
    globex = env.client.get(f"/admin/tenants/{env.ids['globex']}/statement", params={"period": "2026-10"},
                            headers=AUTH).json()
    assert globex["plan"] == "override" and Decimal(globex["subtotal"]) == expected_cost(env, "globex")
    text = ok(env.client.get(f"/admin/tenants/{env.ids['acme']}/statement",
                             params={"period": "2026-10", "format": "csv"}, headers=AUTH), "text/csv").text
    rows = list(csv.DictReader(io.StringIO(text)))
    assert [(r["model"], r["meter"]) for r in rows] == [(ln[0], ln[1]) for ln in lines] + [("", "total_due")]
    assert sum(Decimal(r["amount"]) for r in rows[:-1]) == expected_cost(env, "acme")
    error_of(env.client.get("/admin/tenants/ten_nobody/statement", params={"period": "2026-10"}, headers=AUTH), 404)
    error_of(env.client.get(f"/admin/tenants/{env.ids['acme']}/statement", headers=AUTH), 400, "period")


def test_cost_model(env):
    body = ok(env.client.get("/admin/cost-model", params=OCT, headers=AUTH)).json()
    assert body["requests"] == 5 and body["currency"] == "EUR"
    assert body["tokens"] == sum(r.prompt_tokens + r.completion_tokens
                                 for r in env.records["acme"] + env.records["globex"])
    revenue = expected_cost(env, "acme") + expected_cost(env, "globex")
    assert Decimal(body["revenue"]) == revenue
    # Defaults: the CPU profile's hardware (PlatformConfig gives GPU replicas a GPU's hour), named.
    assert body["hardware"] == CPU_PROFILE_HARDWARE and Decimal(body["gpu_hour_price"]) == CPU_PROFILE_HOUR_PRICE
    assert Decimal(body["gpu_cost"]) == (CPU_PROFILE_HOUR_PRICE * 31 * 24).quantize(Decimal("0.000001"))
    assert Decimal(body["margin"]) == revenue - Decimal(body["gpu_cost"])
    assert body["peak_tokens_per_s"] > 0 and 0 <= body["utilization"] <= 1 and body["real_cost_per_1m"]


def test_cost_model_of_one_base_prices_its_records_on_its_pools_hardware(env):
    body = ok(env.client.get("/admin/cost-model", params={**OCT, "model": "other"}, headers=AUTH)).json()
    other = [r for r in env.records["acme"] if r.base_model == "other"]
    assert body["model"] == "other" and body["requests"] == len(other) == 1
    assert body["tokens"] == sum(r.prompt_tokens + r.completion_tokens for r in other)
    assert (body["gpus"], body["hardware"], Decimal(body["gpu_hour_price"])) == (2, "L4", Decimal("1.5"))
    assert Decimal(body["gpu_cost"]) == Decimal("1.5") * 2 * 31 * 24
    price = env.acc.prices.price_for(env.ids["acme"], "other")
    assert Decimal(body["revenue"]) == sum(price.cost(r.prompt_tokens, r.cached_prompt_tokens, r.completion_tokens)
                                           for r in other)
    # A base whose pool's hardware is not configured: 400 with the setting to add, not the deployment's figures.
    error_of(env.client.get("/admin/cost-model", params={**OCT, "model": "globex-model"}, headers=AUTH), 400,
             "model")


BAD_PARAMETERS = [
    ("/v1/usage", {"start": "yesterday"}, "start"),
    ("/v1/usage", {"end": "2026-10-32"}, "end"),
    ("/v1/usage", {"start": "2026-11-01", "end": "2026-10-01"}, "start"),
    ("/v1/usage", {"start": "2026-10-01", "end": "2026-10-01"}, "start"),
    ("/v1/usage", {"group_by": "week"}, "group_by"),
    ("/v1/usage", {"group_by": "tenant"}, "group_by"),
    ("/v1/usage", {"format": "xml"}, "format"),
    ("/v1/usage", {"groupby": "day"}, "groupby"),
    ("/admin/usage", {"group_by": "week"}, "group_by"),
    ("/admin/usage", {"start": "2026-10-01T25:00"}, "start"),
    ("/admin/usage", {"tenant": ""}, "tenant"),
    ("/admin/billing/export", {}, "period"),
    ("/admin/billing/export", {"period": "2026-13"}, "period"),
    ("/admin/billing/export", {"period": "2026-1"}, "period"),
    ("/admin/billing/export", {"period": "2026-10", "format": "json"}, "format"),
    ("/admin/tenants/{acme}/statement", {"period": "October"}, "period"),
    ("/admin/tenants/{acme}/statement", {"period": "2026-10", "format": "pdf"}, "format"),
    ("/admin/cost-model", {"start": "2026-10-01", "end": "2026-09-01"}, "start"),
    ("/admin/cost-model", {"end": "soon"}, "end"),
]


def test_bad_parameters_are_400_naming_the_parameter(env):
    for path, params, param in BAD_PARAMETERS:
        headers = env.keys["acme"] if path.startswith("/v1") else AUTH
        response = env.client.get(path.format(acme=env.ids["acme"]), params=params, headers=headers)
        error = error_of(response, 400, param)
        assert f"`{param}`" in error["message"] and error["type"] == "invalid_request_error", (path, params)
        ok(env.client.get("/v1/usage", params=OCT, headers=env.keys["acme"]))  # still serving


def test_auth(env):
    admin_paths = ["/admin/usage", "/admin/billing/export?period=2026-10",
                   f"/admin/tenants/{env.ids['acme']}/statement?period=2026-10", "/admin/cost-model"]
    for headers in ({}, {"Authorization": "Bearer lpx-wrong"}, AUTH):  # the admin token is not a tenant key
        response = env.client.get("/v1/usage", headers=headers)
        error_of(response, 401)
        assert response.headers["www-authenticate"] == "Bearer"
    for path in admin_paths:
        for headers in ({}, env.keys["acme"], {"Authorization": "Bearer wrong"}):
            assert "admin token" in error_of(env.client.get(path, headers=headers), 401)["message"]
    ok(env.client.get("/v1/usage", params=OCT, headers=env.keys["acme"]))
    for path in admin_paths:
        ok(env.client.get(path, headers=AUTH), "")


def test_without_accounting_there_are_no_usage_routes(tmp_path):
    db = make_engine(f"sqlite:///{tmp_path}/t.db")
    service = TenantService(db)
    key = service.issue_key(service.create_tenant("acme").id)[1]
    app = build_ingress_app(FakeEngineClient(lambda *a: iter(())), PlatformConfig.from_args(None),
                            tenancy=Tenancy(service, ADMIN))
    client = TestClient(app, raise_server_exceptions=False)
    assert client.get("/v1/usage", headers={"Authorization": f"Bearer {key}"}).status_code == 404
    assert client.get("/admin/usage", headers=AUTH).status_code == 404
    db.dispose()
