"""One request's usage record, from what the ingress knew (RequestMeta) and the engine counted."""

from __future__ import annotations

from loraplex.accounting.record import UsageRecord
from loraplex.engine.protocol import RequestMeta, RequestUsage


def usage_record(meta: RequestMeta, usage: RequestUsage, base_model: str) -> UsageRecord:
    return UsageRecord(
        request_id=meta.request_id,
        tenant_id=meta.tenant_id,
        api_key_id=meta.api_key_id,
        base_model=base_model,
        adapter=meta.adapter,
        prompt_tokens=usage.prompt_tokens,
        cached_prompt_tokens=usage.cached_prompt_tokens,
        completion_tokens=usage.completion_tokens,
        status=usage.status or "error",
        arrival_time=meta.arrival_time or usage.finish_time,
        first_token_time=usage.first_token_time,
        finish_time=usage.finish_time,
        replica_id=usage.replica_id or None,
    )
