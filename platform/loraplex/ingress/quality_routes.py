"""/v1/quality/runs: a tenant's quality runs (quality/); /admin/quality/overrides: the operator's
overrides of the gate.

The `openai` SDK's evals resources (an eval with graders, then runs of one model over a data
source) do not fit a run that compares two models on the same requests, so this is a small resource
of our own; its run object borrows the eval run's names where they mean the same (`status`,
`result_counts`, `metadata`, `error`)."""

from __future__ import annotations

import asyncio

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from loraplex.batches.files import BatchFileStore
from loraplex.batches.jsonl import InvalidBatchFile
from loraplex.batches.repository import INPUT_PURPOSE, BatchRepository
from loraplex.ingress.auth import check_admin
from loraplex.ingress.errors import APIError
from loraplex.ingress.openai_routes import read_json
from loraplex.ingress.tenant_context import TenantContext
from loraplex.quality.config import QualityConfig
from loraplex.quality.lines import parse_quality_file
from loraplex.quality.repository import QualityRepository, run_object

MAX_BODY_BYTES = 64 * 1024
MAX_METADATA_KEYS = 16


class QualityRoutes:
    def __init__(self, tenants: TenantContext, tenancy, runs: QualityRepository, batches: BatchRepository,
                 files: BatchFileStore, config: QualityConfig, max_line_bytes: int):
        self.tenants, self.tenancy, self.runs, self.batches, self.files = tenants, tenancy, runs, batches, files
        self.config, self.max_line_bytes = config, max_line_bytes

    def routes(self) -> list[Route]:
        return [
            Route("/v1/quality/runs", self.create, methods=["POST"]),
            Route("/v1/quality/runs", self.list, methods=["GET"]),
            Route("/v1/quality/runs/{run_id}", self.retrieve, methods=["GET"]),
            Route("/admin/quality/overrides", self.add_override, methods=["POST"]),
            Route("/admin/quality/overrides", self.list_overrides, methods=["GET"]),
        ]

    async def create(self, request: Request) -> Response:
        principal = await self.tenants.authenticate(request)
        body = await read_json(request, MAX_BODY_BYTES, 10.0)
        file_id, metadata = body.get("input_file_id"), body.get("metadata")
        for field in ("reference", "candidate"):
            if not isinstance(body.get(field), str) or not body[field]:
                raise APIError(400, f"`{field}` must name a model: a base, one of your adapters, or "
                                    "`<base>:<adapter>` (your adapter tried on another base).", param=field)
        if metadata is not None and not (isinstance(metadata, dict) and len(metadata) <= MAX_METADATA_KEYS and all(
                isinstance(k, str) and isinstance(v, str) for k, v in metadata.items())):
            raise APIError(400, f"`metadata` must map at most {MAX_METADATA_KEYS} strings to strings.", param="metadata")
        tenant = principal.tenant_id
        row = await asyncio.to_thread(self.batches.get_file, tenant, file_id) if isinstance(file_id, str) else None
        if row is None or row["purpose"] != INPUT_PURPOSE:
            raise APIError(404, f"No such file: {file_id!r}; upload the JSONL with POST /v1/files "
                                "(purpose \"batch\") first.", param="input_file_id")
        try:
            lines = parse_quality_file(await asyncio.to_thread(self.files.get, tenant, file_id),
                                       self.config.max_lines, self.max_line_bytes)
        except InvalidBatchFile as exc:
            raise APIError(400, str(exc), param="input_file_id")
        resolved = {}
        for field in ("reference", "candidate"):  # an unknown model: 404 naming it, as a request would get
            base, adapter = await self.tenants.resolve_model(principal, body[field], cross_base=True)
            resolved[field] = (body[field], base, adapter.name if adapter else None,
                               adapter.sha256 if adapter else None)
        if resolved["reference"][1:] == resolved["candidate"][1:]:
            raise APIError(400, f"The reference ({body['reference']}) and the candidate ({body['candidate']}) are "
                                "the same model on the same base: compare two different ones.", param="candidate")
        run = await asyncio.to_thread(self.runs.create, tenant, principal.key_id, lines[0].line.url, file_id,
                                      resolved["reference"][:3], resolved["candidate"][:3], metadata)
        return JSONResponse(run_object(run), status_code=201)

    async def list(self, request: Request) -> Response:
        principal = await self.tenants.authenticate(request)
        rows = await asyncio.to_thread(self.runs.list, principal.tenant_id)
        return JSONResponse({"object": "list", "data": [run_object(r) for r in rows], "has_more": False})

    async def retrieve(self, request: Request) -> Response:
        principal = await self.tenants.authenticate(request)
        run_id = request.path_params["run_id"]
        row = await asyncio.to_thread(self.runs.get, principal.tenant_id, run_id)
        if row is None:
            raise APIError(404, f"No such quality run: {run_id!r}.", param="run_id")
        return JSONResponse(run_object(row))

    async def add_override(self, request: Request) -> Response:
        check_admin(request, self.tenancy)
        body = await read_json(request, MAX_BODY_BYTES, 10.0)
        tenant, adapter, to_base, reason = (body.get(k) for k in ("tenant_id", "adapter", "to_base", "reason"))
        if not isinstance(tenant, str) or not tenant:
            raise APIError(400, "`tenant_id` must name the tenant.", param="tenant_id")
        await asyncio.to_thread(self.tenancy.service.get_tenant, tenant)  # unknown: 404
        if to_base not in self.tenants.bases:
            raise APIError(400, f"`to_base` must be one of {', '.join(self.tenants.bases)}.", param="to_base")
        if adapter is not None and not isinstance(adapter, str):
            raise APIError(400, "`adapter` must be the adapter's name, or null for the tenant's base traffic.",
                           param="adapter")
        if not isinstance(reason, str) or not reason.strip():
            raise APIError(400, "`reason` must say why the move goes ahead without a passing run (it is kept).",
                           param="reason")
        row = await asyncio.to_thread(self.runs.add_override, tenant, adapter, to_base, reason.strip())
        return JSONResponse(_override(row), status_code=201)

    async def list_overrides(self, request: Request) -> Response:
        check_admin(request, self.tenancy)
        tenant = request.query_params.get("tenant_id")
        if not tenant:
            raise APIError(400, "Pass ?tenant_id=<tenant>.", param="tenant_id")
        rows = await asyncio.to_thread(self.runs.overrides, tenant)
        return JSONResponse({"object": "list", "data": [_override(r) for r in rows]})


def _override(row: dict) -> dict:
    return {"id": row["id"], "object": "quality.override", "tenant_id": row["tenant_id"], "adapter": row["adapter"],
            "to_base": row["to_base"], "reason": row["reason"], "created_at": int(row["created_at"].timestamp())}
