"""One request's usage record, from what the ingress knew (EngineCall) and the engine counted,
and the Meter that writes it: to the ledger (the bill) and, from the same record, to the
per-tenant metrics, so the two never count apart."""

from __future__ import annotations

import logging

from loraplex.accounting.record import UsageRecord
from loraplex.contract import EngineCall, RequestUsage

logger = logging.getLogger(__name__)


def usage_record(call: EngineCall, usage: RequestUsage, base_model: str) -> UsageRecord:
    prompt, cached, completion = usage.prompt_tokens, usage.cached_prompt_tokens, usage.completion_tokens
    first_token_time, migrated = usage.first_token_time, usage.migrated_prompt_tokens
    if (resumed := call.resumed) is not None:
        # A request moved off a lost replica: one record for all its replicas. The client's prompt
        # once (as the first replica counted it, if it did), every token the client received; what
        # this replica prefilled is the move's cost, kept apart.
        migrated += resumed.migrated_prompt_tokens + prompt
        if resumed.prompt_tokens:
            prompt, cached = resumed.prompt_tokens, resumed.cached_prompt_tokens
        completion += resumed.completion_tokens
        first_token_time = resumed.first_token_time or first_token_time
    return UsageRecord(
        request_id=call.request_id,
        tenant_id=call.tenant_id,
        api_key_id=call.api_key_id,
        base_model=call.base_model or base_model,
        adapter=call.adapter_label,
        prompt_tokens=prompt,
        cached_prompt_tokens=cached,
        completion_tokens=completion,
        migrated_prompt_tokens=migrated,
        status=usage.status or "error",
        arrival_time=call.arrival_time or usage.finish_time,
        first_token_time=first_token_time,
        finish_time=usage.finish_time,
        replica_id=usage.replica_id or None,
        path=call.path if call.adapter is not None else None,
        batch=call.batch,
    )


class Meter:
    """ledger: the replica's UsageLedger (None: metrics only); metrics: its RequestMetrics;
    base_model: the base of calls that name none (EngineCall.base_model None)."""

    def __init__(self, ledger, metrics, base_model: str):
        self.ledger = ledger
        self.metrics = metrics
        self.base_model = base_model

    def __call__(self, call: EngineCall, usage: RequestUsage) -> UsageRecord:
        record = usage_record(call, usage, call.base_model or self.base_model)
        if self.ledger is not None:
            # Never raises: a record that cannot be spooled now is kept and retried by the ledger.
            self.ledger.append(record)
        try:
            self.metrics.finished(record, usage, call.arrival_time or usage.finish_time, call.slo)
        except Exception:  # a metric never fails a request, nor its bill
            logger.exception("recording the metrics of request %s failed", call.request_id)
        return record
