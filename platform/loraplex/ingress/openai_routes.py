"""POST /v1/chat/completions, POST /v1/completions, GET /v1/models.

Requests are parsed and validated with vLLM's own OpenAI protocol models; the Engine replica runs
vLLM's serving layer and streams back SSE strings exactly as vLLM's server would send them.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from typing import Any, AsyncIterator

from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.entrypoints.openai.completion.protocol import CompletionRequest

from loraplex.engine.protocol import AdapterTarget, EngineError, RequestMeta, RequestUsage
from loraplex.ingress.errors import APIError
from loraplex.ingress.tenant_context import TenantContext

logger = logging.getLogger(__name__)

# The ledger's id of a request (also in the reply's `id`). Not X-Request-Id: Ray Serve's proxy
# sets that one to its own id, which a client may choose.
REQUEST_ID_HEADER = "X-LoRAPlex-Request-Id"


async def read_json(request: Request, max_bytes: int) -> dict[str, Any]:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise APIError(413, f"Request body is over {max_bytes} bytes; send a shorter prompt.")
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > max_bytes:
            raise APIError(413, f"Request body is over {max_bytes} bytes; send a shorter prompt.")
    try:
        data = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise APIError(400, f"Request body is not valid JSON ({exc}); send a JSON object.")
    if not isinstance(data, dict):
        raise APIError(400, "Request body must be a JSON object.")
    return data


def parse(model: type[BaseModel], data: dict[str, Any]) -> BaseModel:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = ".".join(str(p) for p in first.get("loc", ())) or None
        message = first.get("msg", str(exc))
        raise APIError(400, f"{param}: {message}" if param else message, param=param)


class OpenAIRoutes:
    def __init__(self, engine, max_body_bytes: int, tenants: TenantContext | None = None, ledger=None):
        self.engine = engine
        self.max_body_bytes = max_body_bytes
        # None: an open single-tenant deployment (no keys, base model only, nothing metered).
        self.tenants = tenants
        # The UsageLedger that counts requests refused before the engine (never billed). The
        # billable record is written by the Engine replica, which sees every token.
        self.ledger = ledger

    def routes(self) -> list[Route]:
        return [
            Route("/v1/chat/completions", self.chat_completions, methods=["POST"]),
            Route("/v1/completions", self.completions, methods=["POST"]),
            Route("/v1/models", self.models, methods=["GET"]),
        ]

    async def chat_completions(self, request: Request) -> Response:
        return await self._generate(request, "chat", ChatCompletionRequest)

    async def completions(self, request: Request) -> Response:
        return await self._generate(request, "completions", CompletionRequest)

    async def models(self, request: Request) -> Response:
        if self.tenants is None:
            return JSONResponse(await self.engine.call("list_models"))
        # Authenticate first: a caller without a key costs no engine round trip.
        principal = await self.tenants.authenticate(request)
        models = await self.engine.call("list_models")
        # Never the engine's own LoRA list: it holds every tenant's loaded adapters.
        base = [m for m in models["data"] if m.get("parent") is None]
        return JSONResponse({"object": "list", "data": base + await self.tenants.adapter_models(principal)})

    async def _generate(self, request: Request, method: str, model: type[BaseModel]) -> Response:
        arrival = time.time()
        principal = None
        try:
            if self.tenants is not None:
                principal = await self.tenants.authenticate(request)
            oai_request = parse(model, await read_json(request, self.max_body_bytes))
            adapter, cache_salt, meta = None, None, None
            # Ours, never the client's: it is the ledger's idempotency key and vLLM's request id,
            # so a client-chosen value could collide with another request.
            oai_request.request_id = uuid.uuid4().hex
            if principal is not None:
                adapter = await self.tenants.resolve_adapter(principal, oai_request.model)
                cache_salt = self.tenants.cache_salt(principal)
                meta = RequestMeta(
                    request_id=oai_request.request_id, tenant_id=principal.tenant_id, api_key_id=principal.key_id,
                    adapter=adapter.label if adapter else None, arrival_time=arrival,
                )
            response = await self.generate(method, oai_request, adapter, cache_salt, meta)
        except APIError as exc:
            if self.ledger is not None:
                self.ledger.reject(principal.tenant_id if principal else None, str(exc.status))
            raise
        response.headers[REQUEST_ID_HEADER] = oai_request.request_id
        return response

    async def generate(
        self, method: str, oai_request, adapter: AdapterTarget | None = None, cache_salt=None, meta=None
    ) -> Response:
        items = self.engine.stream(method, oai_request, adapter, cache_salt, meta)
        try:
            first = await anext(items)
        except StopAsyncIteration:
            raise APIError(503, "The engine ended the request without a reply; retry it.")
        if isinstance(first, EngineError):
            await items.aclose()
            raise APIError(first.status, first.message, param=first.param)
        if oai_request.stream:
            return StreamingResponse(
                self._sse(first, items),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
            )
        # Drain the stream to its end (only the RequestUsage follows): the Engine replica has
        # already metered the request, and an early close would read as a disconnect.
        async for _ in items:
            pass
        return JSONResponse(first)

    async def _sse(self, first: str, items: AsyncIterator) -> AsyncIterator[str]:
        try:
            yield first
            async for item in items:
                if not isinstance(item, RequestUsage):  # metered by the Engine replica already
                    yield item
        finally:
            # On client disconnect Starlette cancels us here; closing the engine stream
            # cancels the engine request.
            await items.aclose()
