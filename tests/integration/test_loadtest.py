"""python -m bench loadtest against the real platform: a tiny sweep (issue 13). It creates its tenants and
uploads an adapter through the admin API, streams real ShareGPT prompts, and its per-request
token counts match what the platform billed; then the usage ledger exported as a trace drives an
open-loop (Poisson) run. Sizes are tiny: this checks the tool, it measures nothing."""

import json
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import select

from bench.loadtest import trace_export
from bench.loadtest.cli import main
from loraplex.accounting.cost_model import per_million
from loraplex.accounting.tables import usage_records

sys.path.insert(0, str(Path(__file__).resolve().parent))
from demo_adapters import ROOT, trained_adapter  # noqa: E402
from tenant_keys import ADMIN_TOKEN  # noqa: E402

pytestmark = pytest.mark.integration


def ledger_rows(usage_db, request_ids, timeout_s=20.0) -> dict[str, dict]:
    deadline = time.time() + timeout_s
    while True:
        with usage_db.connect() as conn:
            rows = {r.request_id: r._asdict() for r in conn.execute(
                select(usage_records).where(usage_records.c.request_id.in_(list(request_ids))))}
        if len(rows) == len(set(request_ids)) or time.time() > deadline:
            return rows
        time.sleep(0.2)


COMMON = ["--admin-token", ADMIN_TOKEN, "--config", str(ROOT / "serve_config.yaml"), "--num-requests", "3",
          "--max-output-tokens", "6", "--max-prompt-tokens", "128", "--system-chars", "200", "--warmup", "1",
          "--no-progress"]


def test_tiny_sweep_against_the_platform(base_url, usage_db, model_name, tmp_path, capsys):
    pirate = trained_adapter("pirate")
    out = tmp_path / "sweep"
    # SLO loose enough for a shared 2-core CPU: the capacity / replicas / cost path must run.
    assert main(["--url", base_url, *COMMON, "--sweep", "1,2", "--tenants", "2", "--adapter-share", "0.5",
                 "--adapter-archive", str(pirate), "--slo-ttft-p95", "600", "--slo-tpot-p95", "60",
                 "--peak-concurrency", "5", "--gpu-hour-price", "3.60", "--out", str(out)]) == 0
    res = json.loads((out / "results.json").read_text())
    levels = res["targets"]["loraplex"]["mix"]["levels"]
    assert [s["level"] for s in levels] == [1, 2]
    assert all(s["requests"] == 3 and s["ok"] == 3 and s["output_tokens_per_s"] > 0 for s in levels)
    assert all(s["ttft_p50"] <= s["ttft_p95"] and s["tpot_p50"] is not None for s in levels)
    assert res["workload"]["mix"]["exact_token_lengths"] is True
    assert res["workload"]["mix"]["adapters"] == 2  # one per tenant, uploaded with the tenant's key

    plan = res["plan"]["loraplex"]
    assert plan["capacity"] == 2 and plan["max_num_seqs"] == 2 and plan["all_levels_met"]
    cost = plan["cost"]
    assert cost["replicas"] == 3  # ceil(5 / 2)
    at = levels[1]
    from decimal import Decimal

    assert cost["capacity_cost_per_1m"] == str(per_million(Decimal("3.60"), 1, at["peak_tokens_per_s"], 1.0))
    assert cost["measured_cost_per_1m"] == str(per_million(Decimal("3.60"), 1, at["peak_tokens_per_s"],
                                                           at["utilization"]))

    # What the client measured is what the platform billed.
    reqs = json.loads((out / "requests.json").read_text())["loraplex"]["mix"]
    sent = [r for lv in reqs for r in lv["results"]]
    assert len(sent) == 6 and all(r["status"] == "ok" and r["request_id"] for r in sent)
    rows = ledger_rows(usage_db, [r["request_id"] for r in sent])
    assert len(rows) == 6
    for r in sent:
        row = rows[r["request_id"]]
        assert (row["prompt_tokens"], row["completion_tokens"]) == (r["prompt_tokens"], r["completion_tokens"])
        assert 1 <= r["completion_tokens"] <= 6
        assert (row["adapter"] is not None) == (r["adapter"] is not None)
    # each workload tenant is one platform tenant
    assert len({rows[r["request_id"]]["tenant_id"] for r in sent}) == len({r["tenant"] for r in sent})

    summary = (out / "summary.md").read_text()
    assert "| concurrency | requests | failed | requests/s | output tok/s | TTFT P50 s" in summary
    assert "capacity (highest concurrency meeting the SLO" in summary and "**2**" in summary
    assert (out / "curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # The ledger as a trace (real lengths per tenant), replayed open loop at 2 requests/s.
    trace = tmp_path / "trace.jsonl"
    with trace.open("w") as f:
        for rec in trace_export.export_trace(usage_db):
            if rec["tenant"] in {row["tenant_id"] for row in rows.values()}:
                f.write(json.dumps(rec) + "\n")
    out2 = tmp_path / "trace-run"
    assert main(["--url", base_url, *COMMON, "--trace", str(trace), "--rate", "2", "--burstiness", "1",
                 "--adapter-archive", str(pirate), "--out", str(out2)]) == 0
    res2 = json.loads((out2 / "results.json").read_text())
    (lv,) = res2["targets"]["loraplex"]["mix"]["levels"]
    assert res2["mode"] == "open" and lv["level"] == 2.0 and lv["ok"] == 3
    assert res2["workload"]["mix"]["source"].startswith("trace")
    assert "TTFT" in capsys.readouterr().out
