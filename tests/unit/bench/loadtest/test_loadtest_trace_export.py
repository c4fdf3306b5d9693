"""The usage ledger exported as a load-test trace: real lengths per tenant, arrival offsets."""
import json
import random
import sys
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "accounting"))  # usage_builders
from usage_builders import T0, make_record  # noqa: E402

from bench.loadtest import trace_export  # noqa: E402
from bench.loadtest import workload as wl  # noqa: E402
from loraplex.accounting.ledger import UsageLedger  # noqa: E402


def test_export_reads_usage_records_through_the_db_helpers(tmp_path):
    db_url = f"sqlite:///{tmp_path}/loraplex.db"
    with UsageLedger(db_url, tmp_path / "spool") as ledger:
        ledger.append(make_record(1, "ten_a", at=T0, prompt_tokens=120, cached_prompt_tokens=0, completion_tokens=30))
        ledger.append(make_record(2, "ten_b", at=T0 + timedelta(seconds=2), adapter="style@3", prompt_tokens=50,
                                  cached_prompt_tokens=10, completion_tokens=9, status="length"))
        ledger.append(make_record(3, "ten_a", at=T0 + timedelta(seconds=3), status="aborted"))
        ledger.append(make_record(4, "ten_a", at=T0 + timedelta(seconds=4), completion_tokens=0, status="error"))
        ledger.flush()
        rows = list(trace_export.export_trace(ledger.engine))
        assert [r["tenant"] for r in rows] == ["ten_a", "ten_b"]  # aborted / failed requests left out
        assert rows[0] == {"tenant": "ten_a", "adapter": None, "prompt_tokens": 120, "cached_prompt_tokens": 0,
                           "completion_tokens": 30, "arrival_s": 0.0, "status": "finished"}
        assert rows[1]["adapter"] == "style" and rows[1]["arrival_s"] == 2.0 and rows[1]["prompt_tokens"] == 50
        assert len(list(trace_export.export_trace(ledger.engine, all_statuses=True))) == 3  # not the 0-token one
        assert [r["tenant"] for r in trace_export.export_trace(ledger.engine, tenant="ten_b")] == ["ten_b"]
        assert list(trace_export.export_trace(ledger.engine, start=T0 + timedelta(seconds=1),
                                              end=T0 + timedelta(seconds=3)))[0]["tenant"] == "ten_b"

    out = tmp_path / "trace.jsonl"
    assert trace_export.main(["--database-url", db_url, "--out", str(out)]) == 0
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(lines) == 2
    # ... and the load test reads it back: the same lengths, tenants and adapter per tenant.
    ps = wl.trace_prompts(out, wl.Lengths(None), None, "text " * 1000, random.Random(0), 2048)
    assert [(p.tenant, p.adapter, p.max_tokens) for p in ps] == [("ten_a", None, 30), ("ten_b", "style", 9)]
