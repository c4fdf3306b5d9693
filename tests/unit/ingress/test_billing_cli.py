"""`loraplex usage` and `loraplex billing ...` against the real usage routes on a uvicorn server
(SQLite ledger with records, tenancy, prices; a fake engine)."""

import csv
import io
import json
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from decimal import Decimal

import pytest

from fake_engine import FakeEngineClient
from live_server import serving
from loraplex.accounting.accounting import Accounting
from loraplex.accounting.config import AccountingConfig
from loraplex.accounting.record import UsageRecord
from loraplex.cli import main
from loraplex.config import PlatformConfig
from loraplex.db.engine import make_engine
from loraplex.ingress import usage_routes
from loraplex.ingress.app import build_ingress_app
from loraplex.tenancy.service import TenantService
from loraplex.tenancy.tenancy import Tenancy

ADMIN = "billing-cli-admin"
UTC = timezone.utc
PRO = {"input": "0.40", "cached_input": "0.04", "output": "1.20"}


@dataclass
class Server:
    url: str
    acme: str   # tenant id
    key: str    # acme's API key


def record(n: int, tenant_id: str, finish: datetime, adapter: str | None = None) -> UsageRecord:
    return UsageRecord(request_id=f"{tenant_id}-{n}", tenant_id=tenant_id, base_model="base", adapter=adapter,
                       prompt_tokens=1_000_000, cached_prompt_tokens=250_000, completion_tokens=500_000,
                       status="finished", arrival_time=finish - timedelta(seconds=3), finish_time=finish)


@pytest.fixture
def server(tmp_path, monkeypatch):
    for name in ("LORAPLEX_URL", "LORAPLEX_ADMIN_TOKEN", "LORAPLEX_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(usage_routes, "_now", lambda: datetime(2026, 11, 10, tzinfo=UTC))
    db = make_engine(f"sqlite:///{tmp_path}/cli.db")
    service = TenantService(db)
    acme = service.create_tenant("acme", plan="pro").id
    globex = service.create_tenant("globex").id
    key = service.issue_key(acme)[1]
    cfg = AccountingConfig(spool_dir=str(tmp_path / "spool"), pricing={"plans": {
        "default": {"input": "0.50", "cached_input": "0.05", "output": "1.50"}, "pro": PRO}})
    acc = Accounting.start(cfg, db, "cli", plan_of=service.plan_of)
    for r in (record(1, acme, datetime(2026, 10, 5, 10, tzinfo=UTC)),
              record(2, acme, datetime(2026, 10, 6, 10, tzinfo=UTC), adapter="bot@1"),
              record(1, globex, datetime(2026, 10, 5, 12, tzinfo=UTC))):
        acc.ledger.append(r)
    acc.ledger.rejections.add(acme, "rate_limited", at=datetime(2026, 10, 5, 9, tzinfo=UTC), n=2)
    acc.ledger.flush()
    app = build_ingress_app(FakeEngineClient(lambda *a: iter(())), PlatformConfig.from_args(None),
                            tenancy=Tenancy(service, ADMIN), accounting=acc)
    with serving(app) as url:
        yield Server(url, acme, key)
    acc.close()
    db.dispose()


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# One acme request: 750k input x 0.40 + 250k cached x 0.04 + 500k output x 1.20 per 1M = 0.91
ACME_OCTOBER = Decimal("1.82")


def test_usage_table_has_a_total_row_and_csv_is_the_servers(server, capsys):
    tenant = ["--url", server.url, "--api-key", server.key]
    code, out, _ = run(capsys, *tenant, "usage", "--start", "2026-10-01", "--end", "2026-11-01")
    assert code == 0, out
    lines = out.splitlines()
    assert lines[0].split() == ["DAY", "PROMPT_TOKENS", "CACHED_PROMPT_TOKENS", "COMPLETION_TOKENS", "REQUESTS", "COST"]
    assert [ln.split()[0] for ln in lines[1:4]] == ["2026-10-05", "2026-10-06", "TOTAL"]
    total = lines[3].split()
    assert total[1:5] == ["2000000", "500000", "1000000", "2"] and Decimal(total[5]) == ACME_OCTOBER
    assert "cost in USD" in out

    code, out, _ = run(capsys, *tenant, "usage", "--start", "2026-10-01", "--end", "2026-11-01",
                       "--group-by", "adapter", "--format", "csv")
    rows = list(csv.DictReader(io.StringIO(out)))
    assert code == 0 and [r["adapter"] for r in rows] == ["(base)", "bot@1"]
    assert sum(Decimal(r["cost"]) for r in rows) == ACME_OCTOBER
    # The table names the base model's row too (it was an empty cell).
    code, out, _ = run(capsys, *tenant, "usage", "--start", "2026-10-01", "--end", "2026-11-01", "--group-by", "adapter")
    assert code == 0 and [ln.split()[:2] for ln in out.splitlines()[1:4]] == [
        ["(base)", "1000000"], ["bot@1", "1000000"], ["TOTAL", "2000000"]]

    code, out, _ = run(capsys, *tenant, "--json", "usage", "--start", "2026-10-01", "--end", "2026-11-01")
    assert code == 0 and Decimal(json.loads(out)["total"]["cost"]) == ACME_OCTOBER

    code, out, _ = run(capsys, "--url", server.url, "--admin-token", ADMIN, "usage", "--admin", "--group-by",
                       "tenant", "--start", "2026-10-01", "--end", "2026-11-01")
    assert code == 0 and "TOTAL" in out
    lines = out.splitlines()
    assert lines[0].split()[:2] == ["TENANT", "TENANT_NAME"]
    # Each tenant's name next to its id, in the usage rows and in the refusals.
    assert [server.acme, "acme"] in [ln.split()[:2] for ln in lines]
    assert "refused before the engine" in out and [server.acme, "acme", "rate_limited", "2"] in [
        ln.split() for ln in lines]

    code, _, err = run(capsys, *tenant, "usage", "--start", "yesterday")
    assert code == 1 and "400" in err and "`start`" in err


def test_billing_export(server, capsys, tmp_path):
    admin = ["--url", server.url, "--admin-token", ADMIN]
    code, out, err = run(capsys, *admin, "billing", "export", "--period", "2026-10")
    assert code == 0 and "complete (through 2026-10-31)" in err
    events = [json.loads(line) for line in out.splitlines()]
    assert len(events) == 9 and len({e["subject"] for e in events}) == 2
    assert all(e["specversion"] == "1.0" and e["data"]["quantity"] > 0 for e in events)
    assert run(capsys, *admin, "billing", "export", "--period", "2026-10")[1] == out  # same ids, same bytes

    code, out, _ = run(capsys, *admin, "billing", "export", "--period", "2026-10", "--format", "csv",
                       "--tenant", server.acme)
    rows = list(csv.DictReader(io.StringIO(out)))
    assert code == 0 and len(rows) == 6 and {r["tenant"] for r in rows} == {server.acme}
    assert {r["id"] for r in rows} < {e["id"] for e in events}

    target = tmp_path / "nov.jsonl"
    code, out, err = run(capsys, *admin, "billing", "export", "--period", "2026-11", "-o", str(target))
    assert code == 0 and out == "" and target.read_text() == "" and "NOT complete" in err

    code, _, err = run(capsys, *admin, "billing", "export", "--period", "2026-13")
    assert code == 1 and "400" in err and "YYYY-MM" in err
    with pytest.raises(SystemExit) as e:
        main(["--url", server.url, "billing", "export"])  # --period is required
    assert e.value.code == 2
    code, _, err = run(capsys, "--url", server.url, "billing", "export", "--period", "2026-10")
    assert code == 2 and "LORAPLEX_ADMIN_TOKEN" in err


def test_billing_statement_and_cost_model(server, capsys):
    admin = ["--url", server.url, "--admin-token", ADMIN]
    code, out, _ = run(capsys, *admin, "billing", "statement", server.acme, "--period", "2026-10")
    assert code == 0 and "plan pro" in out and "2 requests" in out
    assert "input_tokens" in out and "output_tokens" in out
    assert "TOTAL DUE  1.82 USD" in out

    code, out, _ = run(capsys, *admin, "--json", "billing", "statement", server.acme, "--period", "2026-10")
    assert code == 0 and json.loads(out)["total_due"] == "1.82"
    code, out, _ = run(capsys, *admin, "billing", "statement", server.acme, "--period", "2026-10", "--format", "csv")
    assert code == 0 and out.startswith("tenant,period,plan,currency,model,meter,quantity,unit_price_per_1m,amount\n")
    code, _, err = run(capsys, *admin, "billing", "statement", "ten_nobody", "--period", "2026-10")
    assert code == 1 and "404" in err

    code, out, _ = run(capsys, *admin, "billing", "cost-model", "--start", "2026-10-01", "--end", "2026-11-01")
    assert code == 0 and out.splitlines()[0].split() == ["METRIC", "VALUE"]
    table, note = out.split("\n\n")
    values = dict(line.split(None, 1) for line in table.splitlines()[1:])
    assert values["requests"] == "3" and Decimal(values["revenue"]) == ACME_OCTOBER + Decimal("1.1375")
    # It says plainly what hardware the figures price (a CPU install is not priced as a GPU).
    assert values["hardware"] == "2-vCPU VM"
    # Its rows are named for any hardware, not GPUs (issue 46); the API's JSON keeps its fields.
    assert values["units"] == "1" and "hardware_cost" in values and "unit_hour_price" in values
    assert not any(name.startswith("gpu") for name in values), values
    assert note.strip() == ("priced as 1 x 2-vCPU VM at 0.1008 USD/h each (accounting.cost_model in the serve "
                            "config)")
    code, out, _ = run(capsys, *admin, "--json", "billing", "cost-model")  # defaults: this month so far
    body = json.loads(out)
    assert code == 0 and body["start"] == "2026-11-01T00:00:00+00:00" and body["requests"] == 0

