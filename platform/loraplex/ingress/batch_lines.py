"""BatchLines: runs one batch line through the online path (the same EngineCall, the same Engine
replica metering into the same ledger), marked batch and with the line's own request id.

What the line gets is what an online request would: its 2xx reply (the output file), or its 4xx
(another tenant's adapter: 404, like online) in the error file. Refusals before the engine ran
it (503 overload, shed, queue full; an Engine replica lost before its reply) are retried by the
runner, never written: nothing of them was billed, or the ledger keeps the one record a request
id may have.

Of the tenant's limits a line meets `monthly_token_budget` (BATCH_LIMITS): it is a cap on the
bill, and a batch is billed like online traffic. The per-minute rates and
`max_concurrent_requests` are the online traffic's; a batch's own bounds are
`max_batches_in_flight`, `batches.lines_in_flight` and `batch_tokens_per_day` (batches/day_tokens.py:
a line past it parks its batch until the next UTC day). A budget refusal that lifts within
MAX_RETRY_WAIT_S (the requests in flight would exceed it) is waited out; an exhausted budget (it
refills next month) ends the line in the error file with the 429 an online request gets.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time

from ray.serve.exceptions import BackPressureError
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.entrypoints.openai.completion.protocol import CompletionRequest

from loraplex.batches.jsonl import BatchLine
from loraplex.batches.day_tokens import BatchDayTokens
from loraplex.batches.results import MAX_RETRY_WAIT_S, LineResult
from loraplex.contract import EngineError
from loraplex.errors import StatusError
from loraplex.ingress.openai_routes import OpenAIRoutes, parse
from loraplex.tenancy.models import Principal

logger = logging.getLogger(__name__)
MODELS = {"/v1/chat/completions": ChatCompletionRequest, "/v1/completions": CompletionRequest}
RETRYABLE = (429, 503)
BATCH_LIMITS = ("budget",)
QUALITY_RUN = "loraplex_quality_run"  # quality/runner.py's RUN_KEY; batch_routes.py refuses loraplex_* from tenants
PRINCIPAL_TTL_S = 30.0  # a suspension or a limit change reaches a running batch within this


class BatchLines:
    def __init__(self, openai: OpenAIRoutes, service, line_timeout_s: float, day_tokens: BatchDayTokens | None = None):
        self.openai, self.service, self.line_timeout_s = openai, service, line_timeout_s
        self.day_tokens = day_tokens  # batch_tokens_per_day (None: not enforced, e.g. no ledger)
        self._principals: dict[str, tuple[float, Principal | StatusError]] = {}

    async def __call__(self, batch: dict, line: BatchLine, request_id: str) -> LineResult:
        try:
            principal = await self._principal(batch)
            oai_request = parse(MODELS[line.url], {**line.body, "stream": False})
            arrival = time.time()
            call = await self.openai._call(principal, oai_request, arrival, arrival + self.line_timeout_s,
                                           request_id=request_id, batch=True,
                                           # a quality run's batch may try an adapter on another base
                                           cross_base=QUALITY_RUN in (batch.get("metadata") or {}))
            day_limit = principal.limits.batch_tokens_per_day if self.day_tokens is not None else None
            charge = self.openai.limits.charge(call)  # what the admission holds for it: the day's estimate too
            refused = await self.day_tokens.take(principal.tenant_id, day_limit, request_id, charge) \
                if day_limit is not None else None
            if refused is not None:
                return refused
            try:
                admission = await self.openai.limits.admit(principal, call, resources=BATCH_LIMITS)
            except StatusError:
                self._settle(principal, request_id, day_limit, None)
                raise
        except StatusError as exc:
            wait = float(exc.headers.get("Retry-After", 0) or 0)
            return LineResult(exc.status, exc.body(), retry=exc.status in RETRYABLE and wait <= MAX_RETRY_WAIT_S,
                              retry_after_s=wait or None)
        result = None
        try:
            result = await self._run(call, oai_request, admission)
            return result
        finally:
            admission.release()  # idempotent: the stream's end released it, unless it never started
            self._settle(principal, request_id, day_limit, _used(result, charge))

    def _settle(self, principal: Principal, request_id: str, day_limit, used) -> None:
        if day_limit is not None:
            self.day_tokens.settle(principal.tenant_id, request_id, used)

    async def _run(self, call, oai_request, admission) -> LineResult:
        items = admission.track(self.openai.engine.generate(call, oai_request))
        try:
            first = await anext(items)
            if isinstance(first, EngineError):
                return LineResult(first.status, first.body(), retry=first.status in RETRYABLE and not first.billed,
                                  retry_after_s=first.retry_after, billed=first.billed)
            async for _ in items:  # a non-stream reply is one chunk: drain to its end
                pass
        except (StopAsyncIteration, BackPressureError):
            return LineResult(503, None, retry=True)
        except Exception as exc:  # the replica was lost: the line runs again under the same id
            logger.warning("batch line %s: engine lost (%r); it runs again", call.request_id, exc)
            return LineResult(503, None, retry=True)
        finally:
            await items.aclose()
        return LineResult(200, json.loads(first.data))

    async def _principal(self, batch: dict) -> Principal:
        """The batch's tenant as it is now (suspended: its lines get 403), cached PRINCIPAL_TTL_S."""
        tenant_id = batch["tenant_id"]
        cached = self._principals.get(tenant_id)
        if cached is None or time.monotonic() - cached[0] > PRINCIPAL_TTL_S:
            cached = (time.monotonic(), await asyncio.to_thread(self._load, tenant_id, batch.get("api_key_id")))
            self._principals[tenant_id] = cached
        if isinstance(cached[1], StatusError):
            raise cached[1]
        return cached[1]

    def _load(self, tenant_id: str, key_id: str | None) -> Principal | StatusError:
        try:
            tenant = self.service.get_tenant(tenant_id)
        except StatusError as exc:
            return exc
        if tenant.status != "active":
            return StatusError(f"Tenant {tenant.name!r} is suspended; its batch lines are refused.", status=403)
        return Principal(tenant_id=tenant.id, tenant_name=tenant.name, plan=tenant.plan,
                         limits=self.service.effective_limits(tenant.plan, tenant.limits), key_id=key_id or "")


def _used(result: LineResult | None, charge: float) -> float | None:
    """Tokens a line used, for batch_tokens_per_day: its reply's usage; a billed error its charge
    (kept until the ledger has its record); None when nothing was billed (refused, never ran)."""
    if result is not None and (result.retry or result.billed is False):
        return None
    if result is not None and result.ok:
        usage = (result.body or {}).get("usage") or {}
        return float(usage.get("prompt_tokens", 0) + usage.get("completion_tokens", 0)) or charge
    return charge
