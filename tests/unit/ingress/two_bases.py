"""The real ingress app with two base models (issue 35), each on its own fake Engine pool, for the
CLI and console tests: tenancy, registry and accounting on SQLite in a tmp dir, and an adapter
archive per base (each claims base_model_name_or_path="my/run", which names neither base, so an
upload binds to a base only when it says `base_model`)."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

from starlette.applications import Starlette

from fake_engine import FakeEngineClient
from loraplex.accounting.accounting import Accounting
from loraplex.accounting.record import UsageRecord
from loraplex.config import PlatformConfig
from loraplex.db.engine import make_engine
from loraplex.ingress.app import build_ingress_app
from loraplex.ingress.engine_pools import PooledEngineClient
from loraplex.registry.model_spec import BaseModelSpec
from loraplex.registry.registry import build_registry
from loraplex.tenancy.service import TenantService
from loraplex.tenancy.tenancy import Tenancy

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "registry"))
from registry_builders import SMOLLM2_CONFIG, lora_config, lora_tensors, tar_dir, write_adapter  # noqa: E402

SMALL, TINY = "SmolLM2-135M-Instruct", "tiny-llama"  # the default base first
TINY_CONFIG = {**SMOLLM2_CONFIG, "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 4,
               "num_attention_heads": 4, "num_key_value_heads": 2}
CONFIGS = {SMALL: SMOLLM2_CONFIG, TINY: TINY_CONFIG}
ADMIN_TOKEN = "two-bases-admin"


def replies_from(base: str):
    """A pool's engine: a chat stream of two pieces naming its base, then usage and [DONE]."""
    def script(method, call, request):
        for text in (f"{base} ", "says hi"):
            yield "data: " + json.dumps({"object": "chat.completion.chunk", "model": base, "choices": [
                {"index": 0, "delta": {"content": text}, "finish_reason": None}]}) + "\n\n"
        yield "data: " + json.dumps({"object": "chat.completion.chunk", "model": base, "choices": [], "usage": {
            "prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}}) + "\n\n"
        yield "data: [DONE]\n\n"
    return script


@dataclass
class TwoBases:
    app: Starlette
    pools: dict[str, FakeEngineClient]
    service: TenantService
    accounting: Accounting
    archives: dict[str, Path]  # base -> an adapter archive with that base's shapes
    tenant_id: str = ""
    key: str = ""  # the tenant's API key
    records: list[UsageRecord] = field(default_factory=list)

    def add_usage(self, base: str, prompt: int, completion: int, adapter: str | None = None) -> None:
        """One finished request on `base`, just now (so in this UTC month's reports), in the ledger."""
        finish = datetime.now(timezone.utc) - timedelta(seconds=5)
        record = UsageRecord(request_id=f"r{len(self.records)}", tenant_id=self.tenant_id, base_model=base,
                             adapter=adapter, prompt_tokens=prompt, cached_prompt_tokens=0,
                             completion_tokens=completion, status="finished",
                             arrival_time=finish - timedelta(seconds=2), first_token_time=finish - timedelta(seconds=1),
                             finish_time=finish, api_key_id="key", replica_id="r0")
        self.records.append(record)
        self.accounting.ledger.append(record)
        self.accounting.ledger.flush()

    def close(self) -> None:
        self.accounting.close()


def build_two_bases(tmp: Path, script_for=replies_from, **args) -> TwoBases:
    """`script_for(base)`: each pool's fake engine script; `args`: more of the app's args."""
    for name, cfg in CONFIGS.items():
        (tmp / name).mkdir()
        (tmp / name / "config.json").write_text(json.dumps(cfg))
    config = PlatformConfig.from_args({
        "models": [{"engine": {"model": str(tmp / name)}} for name in CONFIGS],
        "database_url": f"sqlite:///{tmp}/db.sqlite",
        "registry": {"store_url": str(tmp / "store"), "cache_dir": str(tmp / "cache")},
        **args,
    })
    db = make_engine(config.database_url)
    service = TenantService(db)
    pools = {base: FakeEngineClient(script_for(base), calls={
        "base_models": {"object": "list", "data": [{"id": base, "object": "model", "parent": None}]},
        "ready": {"replica_id": base},
        "replica_status": {"replica_id": f"{base}#0", "base_model": base, "running": 0, "waiting": 0}})
        for base in CONFIGS}
    accounting = Accounting.start(config.accounting.model_copy(update={"spool_dir": str(tmp / "spool")}),
                                  db, "ingress-test", plan_of=service.plan_of)
    app = build_ingress_app(PooledEngineClient(pools), config, tenancy=Tenancy(service, admin_token=ADMIN_TOKEN),
                            registry=build_registry(config, db), accounting=accounting)
    archives = {}
    for name, cfg in CONFIGS.items():
        spec = BaseModelSpec.from_config(cfg, name)
        src = write_adapter(tmp / f"for-{name}", lora_config(r=4, base_model_name_or_path="my/run"),
                            lora_tensors(spec, r=4, fill=0.01))
        archives[name] = tar_dir(src, tmp / f"for-{name}.tar.gz")
    setup = TwoBases(app, pools, service, accounting, archives)
    tenant = service.create_tenant("acme")
    setup.tenant_id, setup.key = tenant.id, service.issue_key(tenant.id)[1]
    return setup
