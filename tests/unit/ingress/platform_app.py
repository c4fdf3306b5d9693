"""The real ingress app (tenancy, registry, accounting on SQLite in a tmp dir) over a fake engine,
for tests that exercise every route: uploads, limits, the fuzz."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from starlette.applications import Starlette

from fake_engine import FakeEngineClient
from loraplex.accounting.accounting import Accounting
from loraplex.config import PlatformConfig
from loraplex.db.engine import make_engine
from loraplex.ingress.app import build_ingress_app
from loraplex.registry.model_spec import BaseModelSpec
from loraplex.registry.registry import build_registry
from loraplex.tenancy.service import TenantService
from loraplex.tenancy.tenancy import Tenancy

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "registry"))
from registry_builders import SMOLLM2_CONFIG, lora_config, lora_tensors, tar_dir, write_adapter  # noqa: E402

BASE = "SmolLM2-135M-Instruct"
ADMIN_TOKEN = "admin-token"


@dataclass
class PlatformApp:
    app: Starlette
    engine: FakeEngineClient
    service: TenantService
    accounting: Accounting
    config: PlatformConfig
    tmp: Path
    keys: dict[str, str] = field(default_factory=dict)  # tenant name -> Authorization header value
    tenant_ids: dict[str, str] = field(default_factory=dict)
    key_ids: dict[str, str] = field(default_factory=dict)
    tenancy: Tenancy | None = None

    def add_tenant(self, name: str) -> None:
        tenant = self.service.create_tenant(name)
        record, key = self.service.issue_key(tenant.id)
        self.keys[name], self.tenant_ids[name], self.key_ids[name] = f"Bearer {key}", tenant.id, record.id

    def adapter_archive(self, r: int = 4) -> bytes:
        spec = BaseModelSpec.from_config(SMOLLM2_CONFIG, BASE)
        src = write_adapter(self.tmp / f"adapter-r{r}", lora_config(r=r), lora_tensors(spec, r=r, fill=0.01 * r))
        return tar_dir(src, self.tmp / f"adapter-r{r}.tar.gz").read_bytes()

    def close(self) -> None:
        self.accounting.close()


def build_platform_app(tmp: Path, script: Callable[..., Any], registry: dict | None = None,
                       calls: dict | None = None, engine: dict | None = None) -> PlatformApp:
    model_dir = tmp / BASE
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps(SMOLLM2_CONFIG))
    config = PlatformConfig.from_args({
        "engine": {"model": str(model_dir), **(engine or {})},
        "database_url": f"sqlite:///{tmp}/db.sqlite",
        "registry": {"store_url": str(tmp / "store"), "cache_dir": str(tmp / "cache"), **(registry or {})},
    })
    db = make_engine(config.database_url)
    service = TenantService(db)
    tenancy = Tenancy(service, admin_token=ADMIN_TOKEN)
    engine = FakeEngineClient(script, calls={"base_models": {"object": "list", "data": [{"id": BASE, "parent": None}]},
                                             **(calls or {})})
    accounting = Accounting.start(config.accounting.model_copy(update={"spool_dir": str(tmp / "spool")}),
                                  db, "ingress-test", plan_of=service.plan_of)
    app = build_ingress_app(engine, config, tenancy=tenancy, registry=build_registry(config, db), accounting=accounting)
    return PlatformApp(app, engine, service, accounting, config, tmp, tenancy=tenancy)
