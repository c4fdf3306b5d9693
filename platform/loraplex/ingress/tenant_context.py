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
from loraplex.db.health import StoreHealth
from loraplex.db.unavailable import StoreBusy, StoreUnavailable, is_pool_exhausted, is_unavailable
from loraplex.errors import StatusError
from loraplex.ingress.errors import APIError
from loraplex.ingress.last_known import LastKnown
from loraplex.registry.catalog import group_by_name


class TenantContext:
    """`outage_ttl_s` / `outage_entries`: how long and how many adapter resolutions and adapter
    lists are remembered for a database outage (the key cache's ttl_s and max_entries).

    A slow database (up, every reply late): each adapter request still asks the catalog, so a
    DELETE or a new version made on any replica holds here as soon as the database answers, but
    it waits at most `resolve_wait_s` for the answer when the same (tenant, model) was resolved
    here within outage_ttl_s; then it runs with that last resolution while the query lands in the
    background. One query per (tenant, model) at a time: a request arriving while one is in
    flight joins it, so a slow database sees one query per adapter per round trip, not one per
    request, and the pool is not drained by queued lookups."""

    def __init__(self, authenticator, registry, base_model: str, cache_salt_per_tenant: bool = True,
                 plan_weight=lambda plan: 1.0, health: StoreHealth | None = None,
                 outage_ttl_s: float = 900.0, outage_entries: int = 100_000, bases: list[str] | None = None,
                 resolve_wait_s: float = 0.1, slo_targets=None):
        self.authenticator = authenticator  # async (request) -> principal with .tenant_id
        self.registry = registry
        self.base_model = base_model  # the first (default) base
        self.bases = list(bases) if bases else [base_model]  # every base model's name, the default first
        self.cache_salt_per_tenant = cache_salt_per_tenant
        self.health = health or StoreHealth()
        # Read only while the database cannot be reached: while it is up, a request always sees
        # the catalog as it is (a DELETE 404s at once); during an outage nothing can be deleted.
        self.resolved = LastKnown(outage_ttl_s, outage_entries)  # (tenant, model) -> AdapterVersion
        self.listed = LastKnown(outage_ttl_s, outage_entries)  # tenant -> its live AdapterVersions
        self.plan_weight = plan_weight  # (plan name) -> its fair-queue weight (TenancyConfig.plan_weight)
        self.slo_targets = slo_targets  # (class name or None) -> SloTargets (SloConfig.targets); None: no classes
        self.resolve_wait_s = resolve_wait_s
        self._resolving: dict[tuple[str, str], asyncio.Future] = {}  # (tenant, model) -> its query in flight
        self.served_while_slow = 0  # resolutions answered from memory because the query took over resolve_wait_s

    def weight(self, principal) -> float:
        return self.plan_weight(principal.plan)

    def slo(self, principal):
        """The SloTargets of the principal's class: its own `slo_class` limit, else its plan's (merged
        into its limits), else the default class."""
        if self.slo_targets is None:
            return None
        return self.slo_targets(getattr(principal.limits, "slo_class", None))

    async def authenticate(self, request: Request):
        return await self.authenticator(request)

    async def resolve_model(self, principal, model: str | None,
                            cross_base: bool = False) -> tuple[str, AdapterTarget | None]:
        """(base, adapter) that `model` names: a base model's name; an adapter's `name` or
        `name@version`, which runs on the base it is bound to; or `<base>:<adapter>` to say both,
        refused with the adapter's own base when they differ, unless `cross_base` (a quality run's
        candidate: the adapter tried on another base, quality/gate.py)."""
        if model in self.bases:
            return model, None
        valid = ", ".join(self.bases)
        if not model:  # vLLM's request models let it be omitted; a tenant must say which model
            raise APIError(400, f"Missing `model`: name a base model ({valid}) or one of your "
                                "adapters (GET /v1/models lists them).", param="model")
        asked_base, ref = None, model
        base_part, sep, adapter_part = model.rpartition(":")
        if sep and base_part in self.bases:
            asked_base, ref = base_part, adapter_part
        if self.registry is None:
            raise APIError(404, f"The model `{model}` does not exist. Valid: {valid}.", param="model")
        key = (principal.tenant_id, ref)
        try:
            v = await self._resolve(key)
        except StatusError as exc:
            raise exc.with_param("model")
        except Exception as exc:
            v = self._last_known(exc, self.resolved, key, f"the model `{model}` cannot be looked up")
        base = self.base_of(v)
        if asked_base is not None and asked_base != base and cross_base:
            base = asked_base
        elif asked_base is not None and asked_base != base:
            raise APIError(400, f"The adapter `{ref}` was trained on the base model {base}, so it cannot run on "
                                f"{asked_base}: send `model` as `{ref}` (or `{base}:{ref}`).", param="model",
                           code="adapter_base_mismatch")
        return base, AdapterTarget(
            lora_name=v.lora_name, lora_int_id=v.id, tenant=v.tenant, name=v.name,
            sha256=v.sha256, requested_as=model, version=v.version,
        )

    async def _resolve(self, key: tuple[str, str]):
        """The catalog's answer for (tenant, ref), or the last one if the query takes longer than
        resolve_wait_s (see the class doc); raises what the query raises."""
        query = self._resolving.get(key)
        if query is None:
            query = self._resolving[key] = asyncio.ensure_future(asyncio.to_thread(self.registry.resolve, *key))
            query.add_done_callback(lambda done: self._landed(key, done))
        last = self.resolved.recall(key)
        if last is None:
            return await asyncio.shield(query)  # nothing to go by: wait for the database
        done, _ = await asyncio.wait({query}, timeout=self.resolve_wait_s)
        if not done:
            self.served_while_slow += 1
            return last
        return query.result()

    def _landed(self, key: tuple[str, str], query: asyncio.Future) -> None:
        """Every query's answer updates the memory, whether or not a request still waits for it."""
        exc = None if query.cancelled() else query.exception()  # retrieved, even if no request waits
        if self._resolving.get(key) is not query:
            return  # forgotten meanwhile (this replica changed the tenant's adapters): stale
        del self._resolving[key]
        if query.cancelled():
            return
        if exc is None:
            self.resolved.remember(key, query.result())
        elif isinstance(exc, StatusError):  # deleted (404): never served from memory again
            self.resolved.forget(lambda k: k == key)

    def base_of(self, version) -> str:
        """The base a version is bound to; a version from before bases were recorded (or of a base
        no longer served) is the default's, as it was served then."""
        return version.base_model if version.base_model in self.bases else self.base_model

    def cache_salt(self, principal) -> str | None:
        # vLLM mixes the salt into every KV block hash: equal prompts of two tenants never
        # share blocks, so one tenant cannot time another's cache hits.
        return f"tenant:{principal.tenant_id}" if self.cache_salt_per_tenant else None

    async def adapters(self, tenant_id: str) -> list:
        """The tenant's live adapter versions (the last known list during an outage)."""
        try:
            versions = await asyncio.to_thread(self.registry.list, tenant_id)
        except Exception as exc:
            return self._last_known(exc, self.listed, tenant_id, "your adapters cannot be listed")
        self.listed.remember(tenant_id, versions)
        return versions

    def forget_adapters(self, tenant_id: str) -> None:
        """After this replica changed a tenant's adapters: nothing older is recalled."""
        self.resolved.forget(lambda key: key[0] == tenant_id)
        for key in [k for k in self._resolving if k[0] == tenant_id]:
            # Its answer may predate the change: not remembered (the callback checks), not joined.
            del self._resolving[key]
        self.listed.forget(lambda key: key == tenant_id)

    def _last_known(self, exc: Exception, memory: LastKnown, key, what: str):
        if not is_unavailable(exc):
            raise exc
        busy = is_pool_exhausted(exc)
        if not busy:  # a busy pool is not an outage: readiness stays as it is
            self.health.failed(exc)
        value = memory.recall(key)
        if value is None:
            raise (StoreBusy(what) if busy else StoreUnavailable(what, exc)) from exc
        return value

    async def adapter_models(self, principal) -> list[dict[str, Any]]:
        if self.registry is None:
            return []
        by_name = group_by_name(await self.adapters(principal.tenant_id))
        return [
            {"id": name, "object": "model", "owned_by": principal.tenant_id, "parent": self.base_of(versions[-1]),
             "version": versions[-1].version, "sha256": versions[-1].sha256}
            for name, versions in by_name.items()  # versions oldest first: the last is `name`
        ]
