"""One request's usage record, from what the ingress knew (EngineCall) and the engine counted."""

from __future__ import annotations

from loraplex.accounting.record import UsageRecord
from loraplex.engine.protocol import EngineCall, RequestUsage


def usage_record(call: EngineCall, usage: RequestUsage, base_model: str) -> UsageRecord:
    return UsageRecord(
        request_id=call.request_id,
        tenant_id=call.tenant_id,
        api_key_id=call.api_key_id,
        base_model=base_model,
        adapter=call.adapter_label,
        prompt_tokens=usage.prompt_tokens,
        cached_prompt_tokens=usage.cached_prompt_tokens,
        completion_tokens=usage.completion_tokens,
        status=usage.status or "error",
        arrival_time=call.arrival_time or usage.finish_time,
        first_token_time=usage.first_token_time,
        finish_time=usage.finish_time,
        replica_id=usage.replica_id or None,
    )
