"""/v1/files (purpose=batch): a tenant's batch input files and its batches' output / error files,
OpenAI's shapes. Bytes live in the adapter store beside the tenant's adapters (batches/files.py),
rows in the database; another tenant's file is exactly a missing one (404)."""

from __future__ import annotations

import asyncio

from starlette.datastructures import UploadFile
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from loraplex.batches.config import BatchConfig
from loraplex.batches.files import BatchFileStore
from loraplex.batches.jsonl import InvalidBatchFile, parse_batch_file
from loraplex.batches.repository import INPUT_PURPOSE, BatchRepository, new_file_id
from loraplex.batches.state import file_object
from loraplex.errors import StatusError
from loraplex.ingress.body_limit import limited
from loraplex.ingress.errors import APIError
from loraplex.ingress.tenant_context import TenantContext

FORM_SLACK = 64 * 1024  # the multipart boundaries and the `purpose` field beside the file


class FileRoutes:
    def __init__(self, tenants: TenantContext, repo: BatchRepository, files: BatchFileStore, config: BatchConfig):
        self.tenants, self.repo, self.files, self.config = tenants, repo, files, config

    def routes(self) -> list[Route]:
        return [
            Route("/v1/files", self.upload, methods=["POST"]),
            Route("/v1/files", self.list, methods=["GET"]),
            Route("/v1/files/{file_id}", self.retrieve, methods=["GET"]),
            Route("/v1/files/{file_id}", self.delete, methods=["DELETE"]),
            Route("/v1/files/{file_id}/content", self.content, methods=["GET"]),
        ]

    async def upload(self, request: Request) -> Response:
        principal = await self.tenants.authenticate(request)
        if not request.headers.get("content-type", "").startswith("multipart/form-data"):
            raise APIError(400, "Send multipart/form-data with a `file` (JSONL) and `purpose` = batch.")
        data, filename, purpose = await self._read_form(request)
        if purpose != INPUT_PURPOSE:
            raise APIError(400, f"`purpose` must be {INPUT_PURPOSE!r} (the files this server keeps are batch "
                                f"inputs), got {purpose!r}.", param="purpose")
        try:
            lines = parse_batch_file(data, self.config.max_lines, self.config.max_line_bytes)
        except InvalidBatchFile as exc:
            raise APIError(400, str(exc), param="file")
        tenant, limits = principal.tenant_id, principal.limits
        count, size = await asyncio.to_thread(self.repo.file_usage, tenant)
        if limits.max_batch_files is not None and count + 1 > limits.max_batch_files:
            raise APIError(409, f"You hold {count} batch files and your quota (max_batch_files) is "
                                f"{limits.max_batch_files}: delete files (DELETE /v1/files/{{id}}) first.", param="file")
        if limits.max_batch_file_bytes is not None and size + len(data) > limits.max_batch_file_bytes:
            raise APIError(413, f"Your batch files would hold {size + len(data)} bytes and your quota "
                                f"(max_batch_file_bytes) is {limits.max_batch_file_bytes}: delete files first.",
                           param="file")
        file_id = new_file_id()
        # Bytes first, the row last: a file is listed only once its bytes are all stored.
        await asyncio.to_thread(self.files.put, tenant, file_id, data)
        row = await asyncio.to_thread(self.repo.create_file, tenant, INPUT_PURPOSE, filename, len(data), file_id)
        return JSONResponse({**file_object(row), "lines": len(lines)}, status_code=200)

    async def _read_form(self, request: Request) -> tuple[bytes, str, str]:
        limit = self.config.max_file_bytes
        request = limited(request, limit + FORM_SLACK, self._too_large)
        try:
            form = await request.form(max_files=1, max_fields=4)
        except StatusError:
            raise
        except Exception as exc:
            raise APIError(400, f"Could not read the multipart form ({exc}); send `file` and `purpose`.")
        try:
            upload, purpose = form.get("file"), form.get("purpose")
            if not isinstance(upload, UploadFile):
                raise APIError(400, "Missing `file`: attach the JSONL as the form field `file`.", param="file")
            data = await upload.read()
            if len(data) > limit:
                raise self._too_large()
            return data, upload.filename or "batch.jsonl", purpose if isinstance(purpose, str) else ""
        finally:
            await form.close()

    def _too_large(self) -> APIError:
        return APIError(413, f"The file is over {self.config.max_file_bytes} bytes (batches.max_file_bytes): "
                             "split it into several batches.", param="file")

    async def _owned(self, request: Request) -> tuple[str, dict]:
        principal = await self.tenants.authenticate(request)
        file_id = request.path_params["file_id"]
        row = await asyncio.to_thread(self.repo.get_file, principal.tenant_id, file_id)
        if row is None:
            raise APIError(404, f"No such file: {file_id!r} (GET /v1/files lists yours).", param="file_id")
        return principal.tenant_id, row

    async def list(self, request: Request) -> Response:
        principal = await self.tenants.authenticate(request)
        purpose = request.query_params.get("purpose")
        rows = await asyncio.to_thread(self.repo.list_files, principal.tenant_id, purpose, 10_000)
        return JSONResponse({"object": "list", "data": [file_object(r) for r in rows], "has_more": False})

    async def retrieve(self, request: Request) -> Response:
        _, row = await self._owned(request)
        return JSONResponse(file_object(row))

    async def content(self, request: Request) -> Response:
        tenant, row = await self._owned(request)
        data = await asyncio.to_thread(self.files.get, tenant, row["id"])
        return Response(data, media_type="application/jsonl")

    async def delete(self, request: Request) -> Response:
        tenant, row = await self._owned(request)
        user = await asyncio.to_thread(self.repo.file_in_use, tenant, row["id"])
        if user is not None:
            raise APIError(409, f"The file is the input of batch {user}, which has not ended; cancel it "
                                f"(POST /v1/batches/{user}/cancel) or wait for it to end first.", param="file_id")
        await asyncio.to_thread(self.repo.delete_file, tenant, row["id"])
        await asyncio.to_thread(self.files.delete, tenant, row["id"])
        return JSONResponse({"id": row["id"], "object": "file", "deleted": True})
