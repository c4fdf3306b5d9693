"""Shared builders for accounting tests (a plain module: conftest.py is not importable by name)."""
from datetime import datetime, timedelta, timezone

from loraplex.accounting.record import UsageRecord

T0 = datetime(2026, 11, 3, 10, 0, tzinfo=timezone.utc)


def make_record(i: int, tenant: str = "t1", at: datetime = T0, **kw) -> UsageRecord:
    fields = dict(request_id=f"req-{tenant}-{i}", tenant_id=tenant, api_key_id="k1", base_model="qwen",
                  adapter=None, prompt_tokens=100, cached_prompt_tokens=40, completion_tokens=20,
                  status="finished", arrival_time=at, first_token_time=at + timedelta(milliseconds=50),
                  finish_time=at + timedelta(seconds=1), replica_id="r0")
    fields.update(kw)
    return UsageRecord(**fields)
