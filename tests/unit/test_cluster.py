"""Multi-node rules (loraplex/cluster.py, app.py): node-local state is refused on a cluster of
several nodes, at deploy and in a replica away from the app's node, with the problem and the fix;
node-local paths expand per node; the admin token and autoscaling reach the deployments."""

import pytest
from pydantic import ValidationError

from loraplex.app import build_app
from loraplex.cluster import (
    NodeLocalStateError,
    check_at_build,
    check_model_on_this_node,
    check_on_replica,
    for_this_node,
    node_local_problems,
    store_is_node_local,
)
from loraplex.config import PlatformConfig

PG = "postgresql://u:p@db:5432/loraplex"
S3 = {"store_url": "s3://bucket/adapters"}


def config(**args) -> PlatformConfig:
    return PlatformConfig.from_args(args)


def shared() -> PlatformConfig:
    return config(database_url=PG, registry=S3)


@pytest.mark.parametrize("url,local", [
    ("adapters", True), ("/srv/adapters", True), ("file:///srv/adapters", True), ("memory://a", True),
    ("simplecache::file:///srv/a", True), ("s3://b/p", False), ("gs://b/p", False),
    ("simplecache::s3://b/p", False),
])
def test_which_stores_are_node_local(url, local):
    assert store_is_node_local(url) is local


def test_sqlite_and_a_local_store_are_each_named_with_their_fix():
    [db] = node_local_problems(config(registry=S3))
    assert "database_url is SQLite" in db and "postgresql://" in db
    [store] = node_local_problems(config(database_url=PG, registry={"store_url": "/srv/adapters"}))
    assert "registry.store_url is a node-local directory (/srv/adapters)" in store
    assert "s3://" in store and "store_shared: true" in store
    assert node_local_problems(shared()) == []
    assert node_local_problems(config(database_url=PG, registry={"store_url": "/nfs/a", "store_shared": True})) == []
    assert len(node_local_problems(config())) == 2  # the single-node defaults


def test_deploying_node_local_state_on_two_nodes_is_refused():
    with pytest.raises(NodeLocalStateError) as refused:
        check_at_build(config(), nodes=["a", "b"])
    message = str(refused.value)
    assert "multi-node Ray cluster (2 alive nodes)" in message
    assert "database_url is SQLite" in message and "registry.store_url" in message
    assert "docs/deploy.md" in message
    # One node: SQLite and a local dir are what a single machine runs on.
    check_at_build(config(), nodes=["a"])
    # Shared state: any number of nodes.
    check_at_build(shared(), nodes=["a", "b", "c"])


def test_a_replica_away_from_the_apps_node_refuses_node_local_state():
    """The cluster had one node at deploy time and grew (an autoscaler added one): a replica
    placed on the new node must not open its own empty SQLite file or adapter dir."""
    with pytest.raises(NodeLocalStateError, match="the Engine replica on node b.*deployed on node a"):
        check_on_replica(config(), "a", "Engine", node_id="b", nodes=["a", "b"])
    check_on_replica(config(), "a", "Engine", node_id="a", nodes=["a", "b"])  # its state is here
    check_on_replica(config(), "a", "Ingress", node_id="b", nodes=["b"])  # the only node left
    check_on_replica(shared(), "a", "Engine", node_id="b", nodes=["a", "b"])
    check_on_replica(config(), None, "Engine", node_id="b", nodes=["a", "b"])  # built outside Ray


def test_a_model_path_missing_on_this_node_is_refused(tmp_path):
    check_model_on_this_node(str(tmp_path))
    check_model_on_this_node("HuggingFaceTB/SmolLM2-135M-Instruct")  # an id: each node downloads it
    with pytest.raises(NodeLocalStateError, match="every node can read"):
        check_model_on_this_node(str(tmp_path / "missing-model"))


def test_node_local_paths_expand_on_each_node(tmp_path, monkeypatch):
    args = {"registry": {"cache_dir": "$NODE_DIR/cache"}, "accounting": {"spool_dir": "${NODE_DIR}/spool"}}
    resolved = PlatformConfig.from_args(args).resolved(tmp_path)
    assert resolved.registry.cache_dir == "$NODE_DIR/cache"  # not pinned to the build node's cwd
    monkeypatch.setenv("NODE_DIR", "/data/node-7")
    here = for_this_node(resolved)
    assert (here.registry.cache_dir, here.accounting.spool_dir) == ("/data/node-7/cache", "/data/node-7/spool")


def bound(app):
    """(Ingress deployment, Engine deployment) of a built app."""
    ingress = app._bound_deployment
    return ingress, ingress.init_args[0]._bound_deployment


def test_the_admin_token_resolved_at_build_reaches_every_ingress_replica_and_no_engine(monkeypatch):
    monkeypatch.setenv("LORAPLEX_ADMIN_TOKEN", "from-the-deploying-node")
    ingress, engine = bound(build_app({"tenancy": {"admin_token": "in-config"}}))
    assert ingress.init_args[1].tenancy.admin_token.get_secret_value() == "from-the-deploying-node"
    # Least privilege: Engine replicas never answer /admin, so they are never given the token.
    assert engine.init_args[0].tenancy.admin_token is None
    assert "from-the-deploying-node" not in repr(engine.init_args) + repr(engine.init_kwargs)
    monkeypatch.delenv("LORAPLEX_ADMIN_TOKEN")
    ingress, engine = bound(build_app({"tenancy": {"admin_token": "in-config"}}))
    assert ingress.init_args[1].tenancy.admin_token.get_secret_value() == "in-config"
    assert engine.init_args[0].tenancy.admin_token is None


def test_autoscaling_under_args_becomes_serves_autoscaling_config():
    autoscaling = {"min_replicas": 1, "max_replicas": 3, "target_ongoing_requests": 4, "downscale_delay_s": 30}
    _, engine = bound(build_app({"engine_deployment": {"autoscaling": autoscaling}}))
    serve_config = engine._deployment_config.autoscaling_config
    assert (serve_config.min_replicas, serve_config.max_replicas) == (1, 3)
    assert (serve_config.target_ongoing_requests, serve_config.downscale_delay_s) == (4, 30)
    # The replicas' init args never carry it: Serve would restart them when it changes.
    assert engine.init_args[0].engine_deployment.autoscaling is None
    _, fixed = bound(build_app({"engine_deployment": {"num_replicas": 2}}))
    assert fixed._deployment_config.autoscaling_config is None and fixed._deployment_config.num_replicas == 2


def test_autoscaling_is_checked_by_serves_own_schema():
    with pytest.raises(ValidationError, match="max_replicas"):
        config(engine_deployment={"autoscaling": {"min_replicas": 3, "max_replicas": 1}})
    with pytest.raises(ValidationError, match="not both"):
        config(engine_deployment={"num_replicas": 2, "autoscaling": {"max_replicas": 3}})


def test_merged_dedicated_replicas_get_no_admin_token(monkeypatch):
    from types import SimpleNamespace

    import loraplex.app as app_module

    target = SimpleNamespace(adapter_id="ten_x/a@1", deployment_name="Dedicated_x", num_cpus=1.0, num_gpus=0.0,
                             base_model=None)
    monkeypatch.setattr(app_module, "dedicated_targets", lambda config: [target])
    monkeypatch.setenv("LORAPLEX_ADMIN_TOKEN", "secret-admin")
    ingress, _ = bound(build_app({}))
    merged = ingress.init_kwargs["dedicated_handles"]["ten_x/a@1"]._bound_deployment
    assert merged.init_args[0].tenancy.admin_token is None
    assert "secret-admin" not in repr(merged.init_args) + repr(merged.init_kwargs)


def test_each_base_model_gets_its_own_engine_pool_and_the_ingress_all_of_them():
    app = build_app({"models": [{"engine": {"model": "models/small"}, "engine_deployment": {"num_replicas": 2}},
                                {"name": "large", "engine": {"model": "/m/large"},
                                 "engine_deployment": {"num_replicas": 3, "num_cpus": 0.5}}]})
    ingress, engine = bound(app)
    large = ingress.init_kwargs["pools"]["large"]._bound_deployment
    assert list(ingress.init_kwargs["pools"]) == ["large"]  # the first pool is the positional engine
    assert (engine.name, large.name) == ("Engine", "Engine-large")
    assert (engine._deployment_config.num_replicas, large._deployment_config.num_replicas) == (2, 3)
    assert large.ray_actor_options["num_cpus"] == 0.5
    # Each pool's replicas are built for their own base.
    assert engine.init_args[0].engine.model_id == "small" and large.init_args[0].engine.model_id == "large"
    assert large.init_args[0].engine.model == "/m/large"


def test_a_pools_custom_resources_place_its_replicas_and_no_other_pools():
    app = build_app({"models": [{"engine": {"model": "small"}},
                                {"engine": {"model": "large"}, "engine_deployment": {"resources": {"a100-80g": 1}}}]})
    ingress, engine = bound(app)
    large = ingress.init_kwargs["pools"]["large"]._bound_deployment
    assert large.ray_actor_options["resources"] == {"a100-80g": 1}
    assert "resources" not in engine.ray_actor_options
