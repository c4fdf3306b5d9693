"""/v1/batches: create, retrieve, list, cancel, in OpenAI's shapes (the `openai` SDK's
client.batches.* work unchanged). A batch is a row; the runner (batches/runner.py) works it."""

from __future__ import annotations

import asyncio

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from loraplex.batches.config import BatchConfig
from loraplex.batches.files import BatchFileStore
from loraplex.batches.jsonl import ENDPOINTS, InvalidBatchFile, parse_batch_file
from loraplex.batches.repository import INPUT_PURPOSE, BatchRepository
from loraplex.batches.state import COMPLETION_WINDOW, batch_object
from loraplex.ingress.errors import APIError
from loraplex.ingress.openai_routes import read_json
from loraplex.ingress.tenant_context import TenantContext

MAX_METADATA_KEYS = 16
MAX_BODY_BYTES = 64 * 1024
IN_FLIGHT_RETRY_S = 60


class BatchRoutes:
    def __init__(self, tenants: TenantContext, repo: BatchRepository, files: BatchFileStore, config: BatchConfig):
        self.tenants, self.repo, self.files, self.config = tenants, repo, files, config

    def routes(self) -> list[Route]:
        return [
            Route("/v1/batches", self.create, methods=["POST"]),
            Route("/v1/batches", self.list, methods=["GET"]),
            Route("/v1/batches/{batch_id}", self.retrieve, methods=["GET"]),
            Route("/v1/batches/{batch_id}/cancel", self.cancel, methods=["POST"]),
        ]

    async def create(self, request: Request) -> Response:
        principal = await self.tenants.authenticate(request)
        body = await read_json(request, MAX_BODY_BYTES, 10.0)
        file_id, endpoint = body.get("input_file_id"), body.get("endpoint")
        window, metadata = body.get("completion_window", COMPLETION_WINDOW), body.get("metadata")
        if endpoint not in ENDPOINTS:
            raise APIError(400, f"`endpoint` must be one of {', '.join(ENDPOINTS)}, got {endpoint!r}.", param="endpoint")
        if window != COMPLETION_WINDOW:
            raise APIError(400, f"`completion_window` must be {COMPLETION_WINDOW!r} (the server's window is "
                                f"batches.completion_window_s), got {window!r}.", param="completion_window")
        if metadata is not None and not (isinstance(metadata, dict) and len(metadata) <= MAX_METADATA_KEYS and all(
                isinstance(k, str) and isinstance(v, str) for k, v in metadata.items())):
            raise APIError(400, f"`metadata` must map at most {MAX_METADATA_KEYS} strings to strings.", param="metadata")
        if metadata and any(k.startswith("loraplex_") for k in metadata):  # the platform's own batches' keys
            raise APIError(400, "`metadata` keys starting with `loraplex_` are reserved.", param="metadata")
        tenant = principal.tenant_id
        row = await asyncio.to_thread(self.repo.get_file, tenant, file_id) if isinstance(file_id, str) else None
        if row is None:
            raise APIError(404, f"No such file: {file_id!r}; upload the JSONL with POST /v1/files first.",
                           param="input_file_id")
        if row["purpose"] != INPUT_PURPOSE:
            raise APIError(400, f"The file {file_id} is a batch's {row['purpose']} file, not an input (purpose "
                                f"{INPUT_PURPOSE!r}).", param="input_file_id")
        try:
            lines = parse_batch_file(await asyncio.to_thread(self.files.get, tenant, file_id),
                                     self.config.max_lines, self.config.max_line_bytes)
        except InvalidBatchFile as exc:
            raise APIError(400, str(exc), param="input_file_id")
        other = next((x for x in lines if x.url != endpoint), None)
        if other is not None:
            raise APIError(400, f"Request {other.index + 1} (custom_id {other.custom_id!r}) is for {other.url}, "
                                f"the batch for {endpoint}: one endpoint per batch.", param="endpoint")
        cap = principal.limits.max_batches_in_flight
        if cap is not None and await asyncio.to_thread(self.repo.in_flight, tenant) >= cap:
            raise APIError(429, f"You have {cap} batches not yet ended and your quota (max_batches_in_flight) is "
                                f"{cap}: wait for one to end or cancel one.",
                           headers={"Retry-After": str(IN_FLIGHT_RETRY_S)}, reject_reason="429:batches_in_flight")
        batch = await asyncio.to_thread(self.repo.create_batch, tenant, principal.key_id, endpoint, file_id,
                                        metadata, self.config.completion_window_s)
        return JSONResponse(batch_object(batch))

    async def _owned(self, request: Request) -> tuple[str, str]:
        principal = await self.tenants.authenticate(request)
        return principal.tenant_id, request.path_params["batch_id"]

    def _missing(self, batch_id: str) -> APIError:
        return APIError(404, f"No such batch: {batch_id!r} (GET /v1/batches lists yours).", param="batch_id")

    async def retrieve(self, request: Request) -> Response:
        tenant, batch_id = await self._owned(request)
        row = await asyncio.to_thread(self.repo.get_batch, tenant, batch_id)
        if row is None:
            raise self._missing(batch_id)
        return JSONResponse(batch_object(row))

    async def cancel(self, request: Request) -> Response:
        tenant, batch_id = await self._owned(request)
        row = await asyncio.to_thread(self.repo.cancel, tenant, batch_id)
        if row is None:
            raise self._missing(batch_id)
        if row["status"] not in ("cancelling", "cancelled"):
            raise APIError(409, f"The batch is {row['status']}: only a batch that has not ended can be cancelled.",
                           param="batch_id")
        return JSONResponse(batch_object(row))

    async def list(self, request: Request) -> Response:
        principal = await self.tenants.authenticate(request)
        raw = request.query_params.get("limit", "20")
        if not raw.isdigit() or not 1 <= int(raw) <= 100:
            raise APIError(400, f"`limit` must be 1 to 100, got {raw!r}.", param="limit")
        limit = int(raw)
        rows = await asyncio.to_thread(self.repo.list_batches, principal.tenant_id, limit + 1,
                                       request.query_params.get("after"))
        data = [batch_object(r) for r in rows[:limit]]
        return JSONResponse({"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
                             "last_id": data[-1]["id"] if data else None, "has_more": len(rows) > limit})
