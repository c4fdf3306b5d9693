"""RequestMetrics: the per-request, per-tenant metrics, recorded where the usage record is built.

`finished(record, usage, arrival_time)` is called by engine.metering.Meter with the very
UsageRecord it appends to the ledger, so the token counters are the ledger's numbers, not a
second count. `refused(tenant_id, reason, call)` is called where the ingress counts a refusal
in the ledger, with the ledger's reason. Labels: `tenant` is the tenant id (`ten_...`) and
`adapter` the record's `name@version` (`base` for the base model), both bounded by a LabelGuard;
`model` is the record's base model (the call's, for a refusal), unguarded: its values are the
deployment's configured bases, never more.

Per request: the guards' dict look-ups, the counters added up in memory (Counts, handed to Ray
by the publisher's `flush`), one Ray record per histogram. Nothing per token.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from loraplex.metrics import catalog as c
from loraplex.metrics.config import MetricsConfig
from loraplex.metrics.counts import Counts
from loraplex.metrics.label_guard import LabelGuard


# How a request ended, in the metrics' few words: the ledger's status mapped to `status`.
#
# The usage ledger keeps vLLM's finish reasons and our endings (accounting.record.STATUSES); the
# `loraplex_requests_total{status}` label folds them into what an operator alerts on:
#
#     stop, finished      -> ok                 (ended on its own: a stop token or string)
#     length              -> length             (cut at max_tokens / the context length)
#     client_disconnect   -> client_disconnect  (the client went away; tokens made so far are billed)
#     timeout             -> timeout            (the request's deadline passed: 504 / error event)
#     error, engine_error -> error              (the engine failed, or the replica was lost)
#     aborted             -> error              (vLLM aborted it without the client asking)
#
# Any status this table does not know counts as `error`: a new ending is seen, not hidden.
OUTCOMES = ("ok", "length", "client_disconnect", "timeout", "error")

STATUS_OF = {
    "stop": "ok",
    "finished": "ok",
    "length": "length",
    "client_disconnect": "client_disconnect",
    "timeout": "timeout",
    "error": "error",
    "engine_error": "error",
    "aborted": "error",
}


def outcome(ledger_status: str | None) -> str:
    return STATUS_OF.get(ledger_status, "error")


if TYPE_CHECKING:
    from loraplex.accounting.record import UsageRecord
    from loraplex.contract import EngineCall, RequestUsage


class RequestMetrics:
    def __init__(self, config: MetricsConfig, sink, base_model: Optional[str] = None):
        """base_model: the base of refused calls that name none (EngineCall.base_model None)."""
        self.base_model = base_model or c.UNKNOWN
        self.tenants = LabelGuard(config.max_tenant_labels, config.label_window_s)
        self.adapters = LabelGuard(config.max_adapter_labels, config.label_window_s)
        self.ttft, self.tpot, self.e2e, self.queue = (sink.make(s) for s in (c.TTFT, c.TPOT, c.E2E, c.QUEUE))
        self.prompt, self.cached, self.completion, self.requests, self.refusals = (
            Counts(sink.make(spec), spec.labels)
            for spec in (c.PROMPT_TOKENS, c.CACHED_PROMPT_TOKENS, c.COMPLETION_TOKENS, c.REQUESTS, c.REFUSALS))
        self.slo_requests, self.goodput = (Counts(sink.make(spec), spec.labels)
                                           for spec in (c.SLO_REQUESTS, c.GOODPUT_TOKENS))
        self._tags: dict[tuple[str, str, str], dict[str, str]] = {}  # (tenant, adapter, model) -> histograms' tags

    def labels(self, tenant_id: str, adapter: Optional[str], tokens: int) -> tuple[str, str]:
        """The (tenant, adapter) label values of a request, through the cardinality guards."""
        tenant = tenant_id if self.tenants.keep(tenant_id, tokens) else c.OTHER
        if adapter is None:
            return tenant, c.BASE
        if tenant == c.OTHER:
            return tenant, c.OTHER
        return tenant, adapter if self.adapters.keep(f"{tenant_id}/{adapter}", tokens) else c.OTHER

    def tenant_label(self, tenant_id: str) -> str:
        """The tenant's label value as the guard has it now, without counting (safe off the loop)."""
        guard = self.tenants
        return tenant_id if tenant_id in guard.kept or len(guard.kept) < guard.limit else c.OTHER

    def finished(self, record: UsageRecord, usage: RequestUsage, arrival_time: float, slo=None) -> None:
        """One metered request: its record (as the ledger got it), the engine's timings and its SLO
        class's targets (contract.SloTargets; None: no class, no attainment counted)."""
        prompt, completion = record.prompt_tokens, record.completion_tokens
        key = self.labels(record.tenant_id, record.adapter, prompt + completion) + (record.base_model,)
        if prompt > 0:
            self.prompt.add(key, prompt)
        if record.cached_prompt_tokens > 0:
            self.cached.add(key, record.cached_prompt_tokens)
        if completion > 0:
            self.completion.add(key, completion)
        self.requests.add(key + (outcome(record.status),))
        tags = self._tags.get(key)
        if tags is None:
            tags = self._tags[key] = dict(zip(c.REQUEST_LABELS, key))
        if record.ttft is not None:
            self.ttft.observe(max(record.ttft, 0.0), tags)
        finish, tpot = usage.finish_time, None
        if finish is not None:
            self.e2e.observe(max(finish - arrival_time, 0.0), tags)
            longest = usage.longest_output()
            if usage.first_token_time is not None and longest > 1:
                tpot = max(finish - usage.first_token_time, 0.0) / (longest - 1)
                self.tpot.observe(tpot, tags)
        if usage.scheduled_time is not None:
            self.queue.observe(max(usage.scheduled_time - arrival_time, 0.0), tags)
        if slo is not None:
            met = outcome(record.status) in ("ok", "length") and slo.met(record.ttft, tpot)
            self.slo_requests.add((key[0], slo.name, "true" if met else "false"))
            if met and completion > 0:
                self.goodput.add((key[0], slo.name), completion)

    def refused(self, tenant_id: Optional[str], reason: str, call: Optional[EngineCall] = None) -> None:
        """A request refused before generating, under the ledger's reason (`401`, `429:<code>`, ...)."""
        if tenant_id is None:
            tenant, adapter = c.UNKNOWN, c.UNKNOWN
        else:
            tenant, adapter = self.labels(tenant_id, None if call is None else call.adapter_label, 0)
            if call is None:  # refused before its model was resolved
                adapter = c.UNKNOWN
        model = c.UNKNOWN if call is None else call.base_model or self.base_model
        self.refusals.add((tenant, adapter, model, reason))

    def flush(self) -> None:
        """Hand the counters' growth to Ray (the publisher's thread)."""
        for counts in (self.prompt, self.cached, self.completion, self.requests, self.refusals, self.slo_requests,
                       self.goodput):
            counts.flush()


class NoRequestMetrics:
    """metrics.enabled: false: nothing recorded, nothing computed."""

    def tenant_label(self, tenant_id: str) -> str:
        return tenant_id

    def finished(self, record, usage, arrival_time, slo=None) -> None:
        pass

    def refused(self, tenant_id, reason, call=None) -> None:
        pass

    def flush(self) -> None:
        pass
