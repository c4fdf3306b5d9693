"""Which versions get a dedicated replica: the admin marks (database), the config's list, both
resolved when the app is built (app.dedicated_targets); the admin routes that set the marks."""

from starlette.testclient import TestClient

from loraplex.app import dedicated_targets
from loraplex.config import PlatformConfig
from loraplex.dedicated.config import DedicatedConfig
from loraplex.db.engine import make_engine
from loraplex.dedicated.marks import DedicatedMarks
from loraplex.dedicated.path_choice import DedicatedPaths
from loraplex.dedicated.targets import resolve_targets
from loraplex.ingress.app import build_ingress_app
from loraplex.registry.catalog import AdapterCatalog

from platform_app import ADMIN_TOKEN, build_platform_app

FACTS = dict(rank=4, target_modules=["q_proj"], base_model="base", size_bytes=10)


def catalog_with_versions(tmp_path):
    db = make_engine(f"sqlite:///{tmp_path}/db.sqlite")
    catalog = AdapterCatalog(db)
    pirate = catalog.add("ten_a", "pirate", "a" * 64, **FACTS)
    pirate2 = catalog.add("ten_a", "pirate", "b" * 64, **FACTS)
    banana = catalog.add("ten_a", "banana", "c" * 64, **FACTS)
    return db, catalog, pirate, pirate2, banana


def test_a_mark_is_live_until_unmarked_or_its_version_deleted(tmp_path):
    db, catalog, pirate, pirate2, banana = catalog_with_versions(tmp_path)
    marks = DedicatedMarks(db)
    assert marks.put(pirate) and not marks.put(pirate) and marks.put(banana)
    assert marks.live_ids() == {pirate.id, banana.id}
    assert marks.delete(banana.id) and not marks.delete(banana.id)
    catalog.delete("ten_a", "pirate@1")
    assert marks.live_ids() == set()  # a deleted version's mark is retired with it


def test_config_versions_first_then_admin_marks_missing_ones_skipped(tmp_path):
    db, catalog, pirate, pirate2, banana = catalog_with_versions(tmp_path)
    config = DedicatedConfig(adapters=[{"adapter": "ten_a/pirate@2", "num_cpus": 2},
                                       {"adapter": "ten_a/pirate@9"}, {"adapter": "ten_b/pirate@1"}],
                             num_cpus=0.5)
    targets = resolve_targets(config, catalog, marked=[pirate2, banana])
    assert [(t.adapter_id, t.version, t.sha256, t.source, t.num_cpus) for t in targets] == [
        (pirate2.id, 2, "b" * 64, "config", 2), (banana.id, 1, "c" * 64, "admin", 0.5)]
    assert targets[0].deployment_name == f"Merged-{pirate2.id}"
    off = config.model_copy(update={"admin_marks": False})
    assert [t.adapter_id for t in resolve_targets(off, catalog, marked=[banana])] == [pirate2.id]


def test_the_build_reads_the_admin_marks_from_the_database(tmp_path):
    db, catalog, pirate, pirate2, banana = catalog_with_versions(tmp_path)
    args = {"database_url": f"sqlite:///{tmp_path}/db.sqlite"}
    assert dedicated_targets(PlatformConfig.from_args(args)) == []
    DedicatedMarks(db).put(banana)
    [target] = dedicated_targets(PlatformConfig.from_args(args))
    assert (target.adapter_id, target.source) == (banana.id, "admin")
    assert dedicated_targets(PlatformConfig.from_args({**args, "dedicated": {"admin_marks": False}})) == []


def test_a_first_start_opens_no_database(tmp_path):
    url = f"sqlite:///{tmp_path}/none.sqlite"
    assert dedicated_targets(PlatformConfig.from_args({"database_url": url})) == []
    assert not (tmp_path / "none.sqlite").exists()


def test_the_build_gives_each_dedicated_version_an_engine_deployment(tmp_path):
    from loraplex.app import build_platform

    db, catalog, pirate, pirate2, banana = catalog_with_versions(tmp_path)
    DedicatedMarks(db).put(banana)
    app = build_platform({"database_url": f"sqlite:///{tmp_path}/db.sqlite",
                          "dedicated": {"adapters": [{"adapter": "ten_a/pirate@1", "num_cpus": 0.25}]}})
    ingress = app._bound_deployment
    merged = ingress.init_kwargs["dedicated_handles"]
    assert sorted(merged) == sorted([pirate.id, banana.id])
    pirate_app = merged[pirate.id]._bound_deployment
    assert pirate_app.name == f"Merged-{pirate.id}"
    assert pirate_app.ray_actor_options["num_cpus"] == 0.25
    assert pirate_app.init_kwargs["dedicated"].sha256 == "a" * 64
    assert [t.adapter_id for t in ingress.init_kwargs["dedicated"]] == [pirate.id, banana.id]


def admin_client(tmp_path, paths=None):
    platform = build_platform_app(tmp_path, script=lambda *a: iter(()))
    platform.add_tenant("acme")
    if paths is not None:
        from loraplex.registry.registry import build_registry

        db = make_engine(platform.config.database_url)
        platform.app = build_ingress_app(platform.engine, platform.config, tenancy=platform.tenancy,
                                         registry=build_registry(platform.config, db), dedicated=paths)
    client = TestClient(platform.app, raise_server_exceptions=False)
    client.headers["Authorization"] = platform.keys["acme"]
    reply = client.post("/v1/adapters", data={"name": "pirate"},
                        files={"file": ("a.tar.gz", platform.adapter_archive(), "application/gzip")})
    assert reply.status_code == 201, reply.text
    return platform, client, reply.json()


def test_put_stores_a_mark_shown_pending_until_the_next_build(tmp_path):
    platform, client, uploaded = admin_client(tmp_path)
    tenant = platform.tenant_ids["acme"]
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    url = f"/admin/tenants/{tenant}/adapters/pirate@1/dedicated"
    assert client.put(url).status_code == 401  # a tenant key is not the admin token
    first = client.put(url, headers=admin)
    assert first.status_code == 201 and first.json()["deployment"] is None and "next build" in first.json()["takes_effect"]
    assert client.put(url, headers=admin).status_code == 200
    shown = client.get("/admin/dedicated", headers=admin).json()
    assert shown["data"] == [] and [p["adapter"] for p in shown["pending"]] == [f"{tenant}/pirate@1"]
    assert client.put(f"/admin/tenants/{tenant}/adapters/nope@1/dedicated", headers=admin).status_code == 404
    assert client.put(f"/admin/tenants/ten_other/adapters/pirate@1/dedicated", headers=admin).status_code == 404
    assert client.delete(url, headers=admin).status_code == 200
    assert client.delete(url, headers=admin).status_code == 404
    assert client.get("/admin/dedicated", headers=admin).json()["pending"] == []


def test_delete_unmarks_a_built_admin_version_at_once_and_refuses_a_config_one(tmp_path):
    from loraplex.dedicated.targets import DedicatedTarget

    paths = DedicatedPaths({})
    platform, client, uploaded = admin_client(tmp_path, paths)
    tenant = platform.tenant_ids["acme"]
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    version = AdapterCatalog(make_engine(platform.config.database_url)).resolve(tenant, "pirate@1")
    url = f"/admin/tenants/{tenant}/adapters/pirate@1/dedicated"
    paths.targets[version.id] = DedicatedTarget(version.id, tenant, "pirate", 1, version.sha256, "admin")
    assert client.put(url, headers=admin).status_code == 201
    paths.observe({f"Merged-{version.id}": ("HEALTHY", 1)}, {version.id})
    [shown] = client.get("/admin/dedicated", headers=admin).json()["data"]
    assert (shown["marked"], shown["healthy"], shown["deployment"]) == (True, True, f"Merged-{version.id}")
    assert client.delete(url, headers=admin).status_code == 200
    assert version.id not in paths.marked  # this replica stops the merged path at once
    paths.targets[version.id] = DedicatedTarget(version.id, tenant, "pirate", 1, version.sha256, "config")
    refused = client.delete(url, headers=admin)
    assert refused.status_code == 409 and "serve_config.yaml" in refused.json()["error"]["message"]


def test_a_database_down_at_build_builds_without_dedicated_replicas(caplog):
    # Nothing listens on port 1: the connection is refused at once.
    config = PlatformConfig.from_args({"database_url": "postgresql+psycopg://loraplex@127.0.0.1:1/loraplex",
                                       "dedicated": {"adapters": [{"adapter": "ten_a/pirate@1"}]}})
    assert dedicated_targets(config) == []
    assert "no dedicated replicas in this build" in caplog.text
