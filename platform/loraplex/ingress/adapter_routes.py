"""POST/GET/DELETE /v1/adapters: a tenant uploads, lists and deletes its own LoRA adapters."""

from __future__ import annotations

import functools
from typing import Callable

from starlette.datastructures import UploadFile
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from loraplex.disk_full import upload_temp_full
from loraplex.errors import StatusError
from loraplex.ingress.body_limit import limited
from loraplex.ingress.errors import APIError
from loraplex.ingress.tenant_context import TenantContext
from loraplex.ingress.upload_pool import UploadPool
from loraplex.registry.catalog import group_by_name
from loraplex.registry.quota import AdapterQuota


class AdapterRoutes:
    def __init__(self, tenants: TenantContext, max_upload_bytes: int, uploads: UploadPool | None = None,
                 on_refused: Callable[[str | None, str], None] | None = None):
        self.tenants = tenants
        self.registry = tenants.registry
        self.max_upload_bytes = max_upload_bytes
        self.uploads = uploads or UploadPool(workers=2, per_tenant=1)  # RegistryConfig's defaults
        # Counts an upload the platform itself could not take (OpenAIRoutes.refused: the ledger's
        # refusals and the metrics', which the availability objective reads).
        self.on_refused = on_refused or (lambda tenant_id, reason: None)

    def routes(self) -> list[Route]:
        return [
            Route("/v1/adapters", self.upload, methods=["POST"]),
            Route("/v1/adapters", self.list, methods=["GET"]),
            Route("/v1/adapters/{ref}", self.show, methods=["GET"]),
            Route("/v1/adapters/{ref}", self.delete, methods=["DELETE"]),
        ]

    async def upload(self, request: Request) -> Response:
        principal = await self.tenants.authenticate(request)
        if not request.headers.get("content-type", "").startswith("multipart/form-data"):
            raise APIError(400, "Send multipart/form-data with a `file` (.tar.gz/.tgz/.zip) and a `name`.")
        try:
            # The tenant's upload slot before its body is read: one over uploads_per_tenant costs no spooling.
            async with self.uploads.slot(principal.tenant_id):
                entry = await self._upload(request, principal.tenant_id, AdapterQuota.of(principal.limits))
        except StatusError as exc:
            # A 503 is the platform's own store or disk failing (upload_temp_full, adapter store, database):
            # our unavailability, counted as a chat request's 503 is; a 4xx is the tenant's (archive, quota, 429).
            if exc.status == 503:
                self.on_refused(principal.tenant_id, exc.refusal_reason)
            raise
        self.tenants.forget_adapters(principal.tenant_id)
        return JSONResponse(entry.to_response(), status_code=201)

    async def _upload(self, request: Request, tenant: str, quota: AdapterQuota):
        # The whole multipart body (archive, `name`, boundaries) counts against the bound, as it
        # streams in (a chunked upload declares no length): once past it the request is refused
        # before the form parser spools another byte, so no more than the bound is ever spooled.
        request = limited(request, self.max_upload_bytes, self._too_large)
        try:
            form = await request.form(max_files=1, max_fields=5)
        except StatusError:
            raise
        except OSError as exc:  # the form parser spools the archive into the temp dir (its files closed)
            if (full := upload_temp_full(exc)) is not None:
                raise full from exc
            raise
        except Exception as exc:  # malformed multipart bodies
            raise APIError(400, f"Could not read the multipart form ({exc}); send `file` and `name`.")
        try:
            upload, name = form.get("file"), form.get("name")
            if not isinstance(upload, UploadFile):
                raise APIError(400, "Missing `file`: attach the adapter archive as the form field `file`.", param="file")
            if not isinstance(name, str) or not name:
                raise APIError(400, "Missing `name`: say what to call the adapter.", param="name")
            base_model = form.get("base_model")  # optional: else the archive's claim, the name's base, the only base
            if base_model is not None and not isinstance(base_model, str):
                raise APIError(400, "`base_model` must be a text field naming a base model.", param="base_model")
            return await self.uploads.run(functools.partial(self.registry.upload, quota=quota, base_model=base_model),
                                          tenant, name, upload.file, cancellable=True)
        finally:
            await form.close()  # the spooled upload file (after the upload thread has stopped with it)

    def _too_large(self) -> APIError:
        return APIError(413, f"The upload is over {self.max_upload_bytes} bytes (registry.max_upload_bytes): "
                             "upload only adapter_config.json and adapter_model.safetensors, lower the "
                             "adapter rank, or raise registry.max_upload_bytes in the config.",
                        param="file")

    async def list(self, request: Request) -> Response:
        principal = await self.tenants.authenticate(request)
        by_name = group_by_name(await self.tenants.adapters(principal.tenant_id))
        data = [{"name": name, "versions": [e.to_response() for e in entries]} for name, entries in by_name.items()]
        return JSONResponse({"object": "list", "data": data})

    async def show(self, request: Request) -> Response:
        principal = await self.tenants.authenticate(request)
        ref = request.path_params["ref"]
        entries = group_by_name(await self.tenants.adapters(principal.tenant_id)).get(ref)
        if not entries:
            raise APIError(404, f"The adapter `{ref}` does not exist.", param="name")
        return JSONResponse({"name": ref, "versions": [e.to_response() for e in entries]})

    async def delete(self, request: Request) -> Response:
        principal = await self.tenants.authenticate(request)
        ref = request.path_params["ref"]
        async with self.uploads.slot(principal.tenant_id):
            entries = await self.uploads.run(self.registry.delete, principal.tenant_id, ref)
        self.tenants.forget_adapters(principal.tenant_id)
        return JSONResponse({"deleted": [e.to_response() for e in entries]})
