"""What the merged-replica benchmark needs besides the load generator: a database and adapter store
seeded the way the routes seed them (a tenant, a key, validated uploads) before `serve run`, so the
config can name the dedicated version; and a serve config whose replicas fit the machine."""

from __future__ import annotations

from pathlib import Path

import yaml

from bench.demo_adapters import trained_adapter
from bench.processes import ROOT


def seeded_config(state: Path, *, dedicated: list[str], lora: list[str], recipe: str = "pirate",
                  engine_cpus: float = 0.75, ingress_cpus: float = 0.5) -> tuple[Path, dict]:
    """A serve config in `state` (its database, store, spool there) with one tenant owning `recipe`
    uploaded under each name of `dedicated` (marked dedicated in the config: a Merged-<id> replica
    each, of the Engine's size) and of `lora` (the same weights, served by the LoRA pool).
    Returns the config's path and {"key", "tenant", "versions": {name: AdapterVersion}}."""
    from loraplex.config import PlatformConfig
    from loraplex.db.engine import make_engine
    from loraplex.registry.registry import build_registry
    from loraplex.tenancy.service import TenantService

    config = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
    args = config["applications"][0]["args"]
    args["database_url"] = f"sqlite:///{state}/loraplex.db"
    args["registry"] = {"store_url": str(state / "adapters"), "cache_dir": str(state / "cache")}
    args["accounting"] = {"spool_dir": str(state / "spool"), "flush_interval_s": 1}
    args["engine"]["model"] = str(ROOT / args["engine"]["model"])
    args["engine_deployment"]["num_cpus"] = engine_cpus
    args["ingress"]["num_cpus"] = ingress_cpus
    db = make_engine(args["database_url"])
    tenants = TenantService(db)
    tenant = tenants.create_tenant("bench")
    key = tenants.issue_key(tenant.id)[1]
    registry = build_registry(PlatformConfig.from_args(args), db)
    archive = trained_adapter(recipe)
    versions = {name: registry.upload(tenant.id, name, archive) for name in dedicated + lora}
    args["dedicated"] = {"adapters": [{"adapter": f"{tenant.id}/{n}@{versions[n].version}", "num_cpus": engine_cpus}
                                      for n in dedicated]}
    path = state / "serve_config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path, {"key": key, "tenant": tenant.id, "versions": versions, "database_url": args["database_url"]}
