"""POST /v1/chat/completions, POST /v1/completions, GET /v1/models.

Requests are parsed and validated with vLLM's own OpenAI protocol models; the Engine replica runs
vLLM's serving layer and streams back SSE strings exactly as vLLM's server would send them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
import uuid
from dataclasses import dataclass
from typing import Any, AsyncIterator

from pydantic import BaseModel, ValidationError
from ray.serve.exceptions import BackPressureError
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.entrypoints.openai.completion.protocol import CompletionRequest
from vllm.exceptions import VLLMValidationError

from loraplex.admission.limiter import Limiter, LocalBackend
from loraplex.engine.metering import Meter
from loraplex.contract import (SSE_DONE, EngineCall, EngineChunk, EngineError, EngineLost, RequestUsage, Resumed,
                                      affinity_key, sse_error)
from loraplex.errors import StatusError
from loraplex.ingress.body_reads import BodyReads
from loraplex.ingress.errors import APIError
from loraplex.ingress.idempotency import HEADER as IDEMPOTENCY_HEADER, MAX_KEY_CHARS, body_hash, check_key
from loraplex.ingress.migration import MigratingEngine
from loraplex.ingress.request_size import (RequestSize, apply_max_tokens_cap, check_bound, check_caps,
                                          effective_max_tokens, request_size)
from loraplex.ingress.tenant_context import TenantContext
from loraplex.metrics.request_metrics import NoRequestMetrics

logger = logging.getLogger(__name__)

# The ledger's id of a request (also in the reply's `id`). Not X-Request-Id: Ray Serve's proxy
# sets that one to its own id, which a client may choose.
REQUEST_ID_HEADER = "X-LoRAPlex-Request-Id"
RETRY_AFTER = {"Retry-After": "1"}
TIMEOUT_HEADER = "X-LoRAPlex-Timeout"


BODY_TIMEOUT_REASON = "408:body_timeout"
BODY_INCOMPLETE_REASON = "400:body_incomplete"


async def read_body(request: Request, max_bytes: int, timeout_s: float | None = None) -> bytearray:
    """The whole body, at most `max_bytes` (413), within `timeout_s` of the first read (408):
    a client trickling a byte now and then must not hold an ingress slot for free."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise APIError(413, f"Request body is over {max_bytes} bytes; send a shorter prompt.")
    body = bytearray()  # not bytes +=: a body in many tiny chunks would cost quadratic time
    try:
        async with asyncio.timeout(timeout_s):
            async for chunk in request.stream():
                body += chunk
                if len(body) > max_bytes:
                    raise APIError(413, f"Request body is over {max_bytes} bytes; send a shorter prompt.")
    except ClientDisconnect:  # gone mid-body: nobody to answer; a refusal, not an internal error
        raise APIError(400, "The client disconnected before its request body arrived.",
                       reject_reason=BODY_INCOMPLETE_REASON) from None
    except TimeoutError:
        raise APIError(408, f"The request body did not arrive within {timeout_s:g} s (ingress.body_timeout_s; "
                            f"{len(body)} bytes came); send the whole body at once.",
                       reject_reason=BODY_TIMEOUT_REASON) from None
    return body


async def read_json(request: Request, max_bytes: int, timeout_s: float | None = None) -> dict[str, Any]:
    body = await read_body(request, max_bytes, timeout_s)
    try:
        data = json.loads(body)
        if not isinstance(data, dict):
            raise APIError(400, "Request body must be a JSON object.")
        # A lone surrogate escape ("\ud800") is valid JSON but no text: nothing can store or
        # tokenize it. Only an escape can make one, so most bodies skip the re-encoding.
        if b"\\ud" in body.lower():
            json.dumps(data, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as exc:
        raise APIError(400, f"Request body has a lone UTF-16 surrogate ({exc.object[exc.start:exc.end]!r}) in a "
                            "string; send valid Unicode (pair every \\ud800-\\udbff escape with a low one).")
    except ValueError as exc:  # not JSON, not UTF-8, or an integer literal over 4300 digits
        raise APIError(400, f"Request body is not valid JSON ({exc}); send a JSON object.")
    except RecursionError:
        raise APIError(400, "Request body nests too deeply to parse; send a flatter JSON object.")
    return data


@dataclass(frozen=True)
class Kept:
    """A request run under an Idempotency-Key: its reply is kept for retries (ingress/idempotency.py)."""

    tenant: str
    key: str
    request_id: str
    again: bool  # a re-run of one whose Ingress replica died


class EngineFailed(APIError):
    """The engine failed after taking the request: it is billed (`engine_error`), not a refusal."""


def refusal(status: int, message: str, reason: str, **kw) -> APIError:
    """An APIError counted as a refusal under `reason` (the ledger's and the metrics' word for it)."""
    return APIError(status, message, reject_reason=reason, **kw)


def parse(model: type[BaseModel], data: dict[str, Any]) -> BaseModel:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = ".".join(str(p) for p in first.get("loc", ())) or None
        message = first.get("msg", str(exc))
        raise APIError(400, f"{param}: {message}" if param else message, param=param)
    except VLLMValidationError as exc:  # vLLM's model validators raise it past pydantic
        raise APIError(400, exc.args[0] if exc.args else str(exc), param=exc.parameter)
    except Exception as exc:  # and TypeError & co. on wrong types (`"messages": null`)
        raise APIError(400, f"The request does not fit the API's schema ({type(exc).__name__}: {exc}); check "
                            "each field's type against the OpenAI API reference.")


class OpenAIRoutes:
    def __init__(self, engine, max_body_bytes: int, tenants: TenantContext | None = None, ledger=None,
                 base_model: str = "", request_timeout_s: float = 300.0, limits: Limiter | None = None,
                 metrics=None, body_timeout_s: float | None = 10.0, max_model_len: int | None = None,
                 max_body_reads_per_tenant: int | None = None, max_sequences: dict[str, int] | None = None,
                 max_migrations: int = 0, replica_metrics=None, idempotency=None, owner: str = "local"):
        self.engine = engine
        # The server's bound per base model (request_size.server_bound): no request carries more
        # sequences than its pool batches, whatever its plan says.
        self.max_sequences = max_sequences or {}
        # Idempotency-Key records (ingress/idempotency.py); None: the header is ignored.
        self.idempotency = idempotency
        self.owner = owner  # this Ingress replica's name in those records
        self._kept: set[asyncio.Task] = set()  # replies of idempotent streams running on without a client
        # Generation calls go through it: a request whose replica is lost moves to another one.
        self.migrating = MigratingEngine(engine, max_migrations, replica_metrics)
        self.body_reads = BodyReads(max_body_reads_per_tenant)
        self.body_timeout_s = body_timeout_s  # None: no deadline on reading a body
        self.max_model_len = max_model_len  # vLLM's default max_tokens of a chat request is the rest of it
        # Tenant limits (loraplex.admission): in-process unless the deployment shares them.
        self.limits = limits if limits is not None else Limiter(LocalBackend())
        self.request_timeout_s = request_timeout_s
        self.base_model = base_model
        self.max_body_bytes = max_body_bytes
        # None: an open single-tenant deployment (no keys, base model only, nothing metered).
        self.tenants = tenants
        # The UsageLedger that counts requests refused before the engine (never billed). The
        # billable record is written by the Engine replica, which sees every token; the
        # ingress writes one only when that replica is lost mid-request.
        self.ledger = ledger
        # RequestMetrics: refusals counted here, and the usage of a request whose replica was lost.
        self.metrics = metrics if metrics is not None else NoRequestMetrics()
        self.meter = Meter(ledger, self.metrics, base_model)

    CHAT_PATH, COMPLETIONS_PATH = "/v1/chat/completions", "/v1/completions"
    GENERATION_PATHS = frozenset({CHAT_PATH, COMPLETIONS_PATH})  # what ingress/overload.py bounds

    def routes(self) -> list[Route]:
        return [
            Route(self.CHAT_PATH, self.chat_completions, methods=["POST"]),
            Route(self.COMPLETIONS_PATH, self.completions, methods=["POST"]),
            Route("/v1/models", self.models, methods=["GET"]),
        ]

    async def chat_completions(self, request: Request) -> Response:
        return await self._generate(request, ChatCompletionRequest)

    async def completions(self, request: Request) -> Response:
        return await self._generate(request, CompletionRequest)

    async def models(self, request: Request) -> Response:
        if self.tenants is None:
            return JSONResponse(await self.engine.base_models())
        # Authenticate first: a caller without a key costs no engine round trip.
        principal = await self.tenants.authenticate(request)
        base = (await self.engine.base_models())["data"]
        return JSONResponse({"object": "list", "data": base + await self.tenants.adapter_models(principal)})

    async def _generate(self, request: Request, model: type[BaseModel]) -> Response:
        arrival = time.time()
        principal = call = None
        try:
            if self.tenants is not None:
                principal = await self.tenants.authenticate(request)
            deadline = arrival + self._timeout_s(request)
            # The tenant's concurrency slot before its body is read (LimitExceeded: 429): its open
            # connections are its own max_concurrent_requests', and the body has a deadline.
            held = await self.limits.hold(principal)
            try:
                with self.body_reads.reading_for(principal.tenant_id if principal else "-"):  # 429 past the bound
                    data = await read_json(request, self.max_body_bytes, self.body_timeout_s)
                # Before vLLM's parser: its refusal of a long prompt list gives server-side advice.
                self._check_size(principal, request_size(data))
                oai_request = parse(model, data)
                kept = None
                if self.idempotency is not None and principal is not None and IDEMPOTENCY_HEADER in request.headers:
                    kept = await self._claim(principal.tenant_id, request.headers[IDEMPOTENCY_HEADER], data, deadline)
                    if isinstance(kept, Response):  # replayed: nothing runs, nothing is billed again
                        held.release()
                        return kept
                call = await self._call(principal, oai_request, arrival, deadline,
                                        request_id=kept.request_id if kept is not None else None)
                if kept is not None and kept.again:  # its record supersedes the aborted run's (ledger)
                    call = dataclasses.replace(call, resumed=Resumed(migrations=1))
                admission = await self.limits.admit(principal, call, held)  # LimitExceeded: 429
            except BaseException:
                held.release()  # idempotent; admit took it over if it got that far
                raise
            try:
                response = await self.generate(call, oai_request, admission.track, kept)
            except BaseException:
                admission.release()  # idempotent; otherwise the engine stream's end releases it
                if kept is not None:
                    await self.idempotency.finish(kept.tenant, kept.key, call.request_id, None)
                raise
        except StatusError as exc:  # auth, adapter and request errors alike: a refusal
            if not isinstance(exc, EngineFailed):
                self.refused(principal.tenant_id if principal else None, exc.refusal_reason, call)
            if call is not None:  # the id a billed failure (504, 503 engine lost) is in the ledger under
                exc.headers[REQUEST_ID_HEADER] = call.request_id
            raise
        response.headers[REQUEST_ID_HEADER] = call.request_id
        return response

    async def _claim(self, tenant: str, key: str, data: dict, deadline: float):
        """A request with an Idempotency-Key: a Kept to run it under, or the reply to send now."""
        if check_key(key) is None:
            raise APIError(400, f"{IDEMPOTENCY_HEADER} must be 1 to {MAX_KEY_CHARS} printable characters.",
                           param=IDEMPOTENCY_HEADER)
        claim = await self.idempotency.claim(tenant, key, body_hash(data), self.owner, uuid.uuid4().hex)
        if claim.outcome == "conflict":
            raise APIError(422, f"This {IDEMPOTENCY_HEADER} was used with another request body; use a new key "
                                "for a new request.", param=IDEMPOTENCY_HEADER)
        reply = claim.reply
        if claim.outcome == "wait":
            reply = await self.idempotency.wait(tenant, key, deadline - time.time())
            if reply is None:
                raise APIError(409, f"The request with this {IDEMPOTENCY_HEADER} is still running; retry later.",
                               param=IDEMPOTENCY_HEADER, headers=RETRY_AFTER)
        if reply is not None:
            status, media_type, body = reply
            return Response(body, status_code=status, media_type=media_type,
                            headers={REQUEST_ID_HEADER: claim.request_id, "Idempotent-Replayed": "true"})
        return Kept(tenant, key, claim.request_id, claim.again)

    def refused(self, tenant_id: str | None, reason: str, call: EngineCall | None = None) -> None:
        """Count a request refused before the engine: the ledger's refusals and the metrics'."""
        if self.ledger is not None:
            self.ledger.reject(tenant_id, reason)
        self.metrics.refused(tenant_id, reason, call)

    def _timeout_s(self, request: Request) -> float:
        """The server's deadline, or less if the client asks for less (never more)."""
        asked = request.headers.get(TIMEOUT_HEADER)
        if asked is None:
            return self.request_timeout_s
        try:
            seconds = float(asked)
        except ValueError:
            seconds = float("nan")
        if not 0 < seconds < float("inf"):
            raise APIError(400, f"{TIMEOUT_HEADER} must be a positive number of seconds, got {asked[:40]!r}.",
                           param=TIMEOUT_HEADER)
        return min(seconds, self.request_timeout_s)

    async def _call(self, principal, oai_request, arrival: float, deadline: float, request_id: str | None = None,
                    batch: bool = False, cross_base: bool = False) -> EngineCall:
        # Ours, never the client's: it is the ledger's idempotency key and vLLM's request id,
        # so a client-chosen value could collide with another request. A batch line's is its
        # batch's id and line number (the same on every run of it: billed once).
        request_id = request_id or uuid.uuid4().hex
        oai_request.request_id = request_id
        size = request_size(oai_request)
        self._check_size(principal, size)
        if principal is not None:
            apply_max_tokens_cap(oai_request, size, principal.limits)
        prompt_tokens = prompt_tokens_estimate(oai_request)
        max_tokens = effective_max_tokens(oai_request, prompt_tokens // size.prompts, self.max_model_len,
                                          self.limits.config.default_max_tokens)
        common = dict(request_id=request_id, arrival_time=arrival, deadline=deadline, stream=bool(oai_request.stream),
                      prompt_tokens=prompt_tokens, max_tokens=max_tokens, sequences=size.sequences)
        if principal is None:
            return EngineCall(**common)
        base_model, adapter = await self.tenants.resolve_model(principal, oai_request.model, cross_base)
        if base_model in self.max_sequences:  # its own pool's bound, now that the base is known
            check_bound(size, self.max_sequences[base_model])
        return EngineCall(base_model=base_model,
            **common, tenant_id=principal.tenant_id, api_key_id=principal.key_id, adapter=adapter,
            cache_salt=self.tenants.cache_salt(principal), priority=0 if batch else principal.limits.priority,
            weight=self.tenants.weight(principal), slo=None if batch else self.tenants.slo(principal),
            routing_key=affinity_key(principal.tenant_id, adapter.name if adapter else None), batch=batch,
        )

    def _check_size(self, principal, size: RequestSize) -> None:
        """400 over the principal's per-request caps or the server's bound (before the request's
        base is known, the largest pool's)."""
        if principal is not None:
            check_caps(size, principal.limits)
        if self.max_sequences:
            check_bound(size, max(self.max_sequences.values()))

    async def generate(self, call: EngineCall, oai_request, track=None, kept: "Kept | None" = None) -> Response:
        items = self.migrating.generate(call, oai_request)
        if track is not None:  # the admission sees the stream end and its token counts
            items = track(items)
        try:
            first = await anext(items)
        except StopAsyncIteration:
            raise APIError(503, "The engine ended the request without a reply; retry it.",
                           headers=RETRY_AFTER)
        except BackPressureError:  # every replica is full and the queue to them too: a refusal
            raise refusal(503, "The server is overloaded (every engine replica's queue is full); retry in a moment.",
                          "503:queue_full", headers=RETRY_AFTER)
        except Exception as exc:  # the replica died or could not be reached: nothing was sent
            self._bill_engine_lost(call, None, exc)
            raise EngineFailed(503, f"The engine replica was lost ({type(exc).__name__}); retry the request.",
                               headers=RETRY_AFTER)
        if isinstance(first, EngineError):
            await items.aclose()
            error = EngineFailed if first.billed else APIError
            retry = {"Retry-After": str(first.retry_after)} if first.retry_after else (
                RETRY_AFTER if first.status == 503 else None)
            # The replica may say why (503 shed): the refusal is counted under that reason.
            reason = f"{first.status}:{first.reason}" if first.reason is not None else None
            raise error(first.status, first.message, param=first.param, headers=retry, reject_reason=reason,
                        code=first.code)
        if call.stream:
            stream = self._sse(call, first, items)
            if kept is not None:
                stream = self._kept_stream(kept, call, stream)
            return StreamingResponse(
                stream,
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
            )
        # A non-stream reply is one chunk; drain to the end so the close is not a disconnect.
        try:
            async for _ in items:
                pass
        except Exception as exc:  # the replica died after the whole reply: the client gets it
            self._bill_engine_lost(call, first, exc)
        if kept is not None:
            await self.idempotency.finish(kept.tenant, kept.key, call.request_id, (200, "application/json", first.data))
        return Response(first.data, media_type="application/json")

    def _kept_stream(self, kept: "Kept", call: EngineCall, stream: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        """An idempotent stream runs to its end whether or not its client stays (a retry collects
        the reply): a task reads it into the records, the client is sent what it reads."""
        queue: asyncio.Queue = asyncio.Queue()

        async def keep() -> None:
            sent: list[bytes] = []
            try:
                async for data in stream:
                    sent.append(data)
                    queue.put_nowait(data)
            finally:
                queue.put_nowait(None)
                await self.idempotency.finish(kept.tenant, kept.key, call.request_id,
                                              (200, "text/event-stream", b"".join(sent)))

        task = asyncio.get_running_loop().create_task(keep())
        self._kept.add(task)
        task.add_done_callback(self._kept.discard)

        async def to_client() -> AsyncIterator[bytes]:
            while (data := await queue.get()) is not None:
                yield data
        return to_client()

    async def _sse(self, call: EngineCall, first: EngineChunk, items: AsyncIterator) -> AsyncIterator[bytes]:
        """Pass the Engine's coalesced SSE bytes through, one body message per chunk."""
        received = first
        try:
            yield first.data
            async for received in items:
                yield received.data
        except Exception as exc:  # the replica died mid-stream: say so, then end the stream
            self._bill_engine_lost(call, received, exc)
            yield sse_error(503, f"The engine replica was lost mid-stream ({type(exc).__name__}); "
                                 "the reply is incomplete. Retry the request.")
            yield SSE_DONE.encode()
        finally:
            # On client disconnect Starlette cancels us here; closing the engine stream
            # cancels the engine request.
            await items.aclose()

    def _bill_engine_lost(self, call: EngineCall, received: EngineChunk | None, exc: Exception) -> None:
        """The replica that would have metered this request is gone: bill what the client got.
        Idempotent on the request id, so if the replica's own record also lands, one wins."""
        logger.warning("engine lost on request %s: %r", call.request_id, exc)
        migrated = 0
        if isinstance(exc, EngineLost):  # the client sent another call than ours (its path), or it moved
            call, migrated = exc.call, exc.migrated_prompt_tokens
        if call.tenant_id is None:
            return
        usage = RequestUsage(status="engine_error", finish_time=time.time(), migrated_prompt_tokens=migrated)
        if received is not None:
            usage.prompt_tokens, usage.cached_prompt_tokens = received.prompt_tokens, received.cached_prompt_tokens
            usage.completion_tokens, usage.first_token_time = received.completion_tokens, received.first_token_time
        self.meter(call, usage)


def prompt_tokens_estimate(oai_request) -> int:
    """Prompt tokens at ~4 characters a token, for routing and admission (no tokenizer here)."""
    messages = getattr(oai_request, "messages", None)
    if messages is not None:
        chars = 0
        for message in messages:
            content = message.get("content") if isinstance(message, dict) else None
            if isinstance(content, str):
                chars += len(content)
            elif isinstance(content, list):
                chars += sum(len(p.get("text") or "") for p in content if isinstance(p, dict))
        return chars // 4
    prompt = getattr(oai_request, "prompt", None)
    if isinstance(prompt, str):
        return len(prompt) // 4
    if isinstance(prompt, list) and prompt:
        first = prompt[0]
        if isinstance(first, int):
            return len(prompt)  # token ids
        if isinstance(first, str):
            return sum(len(p) for p in prompt if isinstance(p, str)) // 4
        if isinstance(first, list):
            return sum(len(p) for p in prompt)  # a batch of token-id prompts
    return 0
