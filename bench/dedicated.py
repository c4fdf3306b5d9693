"""A `serve run` config with a dedicated adapter version, for python -m bench merged and
tests/e2e/test_dedicated_merged.py: the database and adapter store are seeded the way the routes
seed them (tenants, keys, validated uploads) before `serve run`, so the config can name the
version (`<tenant id>/<name>@<version>`) and the app is built with its Merged-<id> deployment."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import yaml

from bench.demo_adapters import trained_adapter
from bench.processes import ROOT
from bench.state import with_fresh_state


@dataclass
class Seeded:
    config: Path  # the serve config to run
    database_url: str
    owner: str  # the tenant id owning every upload
    keys: dict[str, str] = field(default_factory=dict)  # tenant name -> API key (the owner's is keys[owner_name])
    tenant_ids: dict[str, str] = field(default_factory=dict)
    versions: dict = field(default_factory=dict)  # adapter name -> AdapterVersion


def seeded_config(state: Path, *, uploads: dict[str, str], dedicated: list[str], tenants=("owner",),
                  engine_cpus: float = 1.0, dedicated_cpus: float = 0.5, ingress_cpus: float = 0.5,
                  accounting: dict | None = None, engine_kwargs: dict | None = None) -> Seeded:
    """The shipped serve_config.yaml with its state in `state`. `tenants[0]` owns `uploads` (adapter
    name -> adapters/recipes recipe); the names in `dedicated` are marked dedicated in the config,
    each on a replica of `dedicated_cpus`; `engine_kwargs` are added to the engine's (the merged
    replicas' too)."""
    from loraplex.config import PlatformConfig
    from loraplex.db.engine import make_engine
    from loraplex.registry.registry import build_registry
    from loraplex.tenancy.service import TenantService

    doc = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
    args = doc["applications"][0]["args"]
    with_fresh_state(args, state, flush_interval_s=0.5, **(accounting or {}))
    args["registry"]["deletion_poll_s"] = 1
    args["engine"]["model"] = str(ROOT / args["engine"]["model"])
    args["engine_deployment"]["num_cpus"] = engine_cpus
    args["engine"]["engine_kwargs"] = {**args["engine"].get("engine_kwargs", {}), **(engine_kwargs or {})}
    args["ingress"]["num_cpus"] = ingress_cpus
    db = make_engine(args["database_url"])
    service = TenantService(db)
    seeded = Seeded(state / "serve_config.yaml", args["database_url"], owner="")
    for name in tenants:
        tenant = service.create_tenant(name)
        seeded.tenant_ids[name], seeded.keys[name] = tenant.id, service.issue_key(tenant.id)[1]
    seeded.owner = seeded.tenant_ids[tenants[0]]
    registry = build_registry(PlatformConfig.from_args(args), db)
    seeded.versions = {name: registry.upload(seeded.owner, name, trained_adapter(recipe))
                       for name, recipe in uploads.items()}
    args["dedicated"] = {"adapters": [{"adapter": f"{seeded.owner}/{n}@{seeded.versions[n].version}",
                                       "num_cpus": dedicated_cpus} for n in dedicated]}
    db.dispose()
    seeded.config.write_text(yaml.safe_dump(doc))
    return seeded
