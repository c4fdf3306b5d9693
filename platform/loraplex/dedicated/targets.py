"""Which adapter versions get a dedicated Engine deployment: the config's `dedicated.adapters`
and (with `dedicated.admin_marks`) the versions marked through the admin route, resolved against
the catalog when the app is built. A version that does not exist or was deleted is skipped (with
a warning): a stale config entry never fails a deploy, and a deleted adapter gets no replica."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from loraplex.dedicated.config import DedicatedConfig
from loraplex.contract import EngineCall
from loraplex.registry.catalog import AdapterCatalog, AdapterVersion
from loraplex.registry.store import AdapterNotFound

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class DedicatedTarget:
    """One dedicated adapter version, as the ingress routes to it and its replica serves it."""

    adapter_id: int  # the catalog row: the call's adapter.lora_int_id
    tenant: str
    name: str
    version: int
    sha256: str
    source: str  # "config" or "admin": where it was marked
    num_cpus: float = 1.0
    num_gpus: float = 0.0
    base_model: str | None = None  # the base the version is bound to: its weights are merged into that base's

    @property
    def deployment_name(self) -> str:
        return f"Merged-{self.adapter_id}"

    @property
    def label(self) -> str:
        return f"{self.tenant}/{self.name}@{self.version}"

    def serves(self, call: EngineCall) -> bool:
        """The call is for exactly this version, sent down the merged path."""
        a = call.adapter
        return (call.path == "merged" and a is not None and a.lora_int_id == self.adapter_id
                and a.sha256 == self.sha256 and a.tenant == self.tenant)

    def to_response(self) -> dict:
        return {"adapter": self.label, "adapter_id": self.adapter_id, "sha256": self.sha256, "source": self.source,
                "deployment": self.deployment_name}


def _target(v: AdapterVersion, source: str, num_cpus: float, num_gpus: float) -> DedicatedTarget:
    return DedicatedTarget(v.id, v.tenant, v.name, v.version, v.sha256, source, num_cpus, num_gpus, v.base_model)


def resolve_targets(config: DedicatedConfig, catalog: AdapterCatalog, marked: list[AdapterVersion]) -> list[DedicatedTarget]:
    """The config's versions (first: they win a duplicate), then the admin-marked ones."""
    targets: dict[int, DedicatedTarget] = {}
    for entry in config.adapters:
        try:
            v = catalog.resolve(entry.tenant, entry.ref)
        except AdapterNotFound:
            logger.warning("dedicated.adapters: %s does not exist (or was deleted); no dedicated replica for it",
                           entry.adapter)
            continue
        targets.setdefault(v.id, _target(v, "config", entry.num_cpus, entry.num_gpus))
    if config.admin_marks:
        for v in marked:
            targets.setdefault(v.id, _target(v, "admin", config.num_cpus, config.num_gpus))
    return list(targets.values())
