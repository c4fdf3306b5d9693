"""TenantContext: who is calling, and which adapter version their `model` means.

The OpenAI and adapter routes ask it; it joins the tenancy service (API keys) with the adapter
registry, so a tenant can only ever name its own adapters: another tenant's adapter name
resolves exactly like a missing one (404).
"""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.requests import Request

from loraplex.contract import AdapterTarget
from loraplex.errors import StatusError
from loraplex.ingress.errors import APIError
from loraplex.registry import group_by_name


class TenantContext:
    def __init__(self, authenticator, registry, base_model: str, cache_salt_per_tenant: bool = True,
                 plan_weight=lambda plan: 1.0):
        self.authenticator = authenticator  # async (request) -> principal with .tenant_id
        self.registry = registry
        self.base_model = base_model
        self.cache_salt_per_tenant = cache_salt_per_tenant
        self.plan_weight = plan_weight  # (plan name) -> its fair-queue weight (TenancyConfig.plan_weight)

    def weight(self, principal) -> float:
        return self.plan_weight(principal.plan)

    async def authenticate(self, request: Request):
        return await self.authenticator(request)

    async def resolve_adapter(self, principal, model: str | None) -> AdapterTarget | None:
        if model == self.base_model:
            return None
        if not model:  # vLLM's request models let it be omitted; a tenant must say which model
            raise APIError(400, f"Missing `model`: name the base model ({self.base_model}) or one of your "
                                "adapters (GET /v1/models lists them).", param="model")
        if self.registry is None:
            raise APIError(404, f"The model `{model}` does not exist. Valid: {self.base_model}.", param="model")
        try:
            v = await asyncio.to_thread(self.registry.resolve, principal.tenant_id, model)
        except StatusError as exc:
            raise exc.with_param("model")
        return AdapterTarget(
            lora_name=v.lora_name, lora_int_id=v.id, tenant=v.tenant, name=v.name,
            sha256=v.sha256, requested_as=model, version=v.version,
        )

    def cache_salt(self, principal) -> str | None:
        # vLLM mixes the salt into every KV block hash: equal prompts of two tenants never
        # share blocks, so one tenant cannot time another's cache hits.
        return f"tenant:{principal.tenant_id}" if self.cache_salt_per_tenant else None

    async def adapter_models(self, principal) -> list[dict[str, Any]]:
        if self.registry is None:
            return []
        by_name = group_by_name(await asyncio.to_thread(self.registry.list, principal.tenant_id))
        return [
            {"id": name, "object": "model", "owned_by": principal.tenant_id, "parent": self.base_model,
             "version": versions[-1].version, "sha256": versions[-1].sha256}
            for name, versions in by_name.items()  # versions oldest first: the last is `name`
        ]
