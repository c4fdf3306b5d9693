"""One request's usage record, from what the ingress knew (EngineCall) and the engine counted,
and the Meter that writes it: to the ledger (the bill) and, from the same record, to the
per-tenant metrics, so the two never count apart."""

from __future__ import annotations

import logging

from loraplex.accounting.record import UsageRecord
from loraplex.contract import EngineCall, RequestUsage

logger = logging.getLogger(__name__)


def usage_record(call: EngineCall, usage: RequestUsage, base_model: str) -> UsageRecord:
    return UsageRecord(
        request_id=call.request_id,
        tenant_id=call.tenant_id,
        api_key_id=call.api_key_id,
        base_model=call.base_model or base_model,
        adapter=call.adapter_label,
        prompt_tokens=usage.prompt_tokens,
        cached_prompt_tokens=usage.cached_prompt_tokens,
        completion_tokens=usage.completion_tokens,
        status=usage.status or "error",
        arrival_time=call.arrival_time or usage.finish_time,
        first_token_time=usage.first_token_time,
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
            self.metrics.finished(record, usage, call.arrival_time or usage.finish_time)
        except Exception:  # a metric never fails a request, nor its bill
            logger.exception("recording the metrics of request %s failed", call.request_id)
        return record
