"""serve_config.cluster.yaml and deploy/rayservice.yaml: a config Serve accepts, with nothing
node-local, autoscaling in the deployments: entry, and the manifest carrying the same app."""

from pathlib import Path

import yaml

from loraplex.cluster import check_at_build, node_local_problems
from loraplex.config import PlatformConfig

ROOT = Path(__file__).resolve().parents[2]


def cluster_config() -> dict:
    return yaml.safe_load((ROOT / "serve_config.cluster.yaml").read_text())


def test_the_cluster_profile_is_a_serve_config_with_shared_state_only():
    from ray.serve.schema import ServeDeploySchema

    config = cluster_config()
    ServeDeploySchema(**config)  # what `serve deploy` validates
    assert config["proxy_location"] == "EveryNode"
    [app] = config["applications"]
    platform = PlatformConfig.from_args(app["args"])
    assert node_local_problems(platform) == []
    assert platform.database_url.startswith("postgresql://") and platform.registry.store_url.startswith("s3://")
    check_at_build(platform, nodes=["a", "b", "c"])  # accepted on a multi-node cluster
    # Autoscaling where Serve applies it in place, not under args (a change there replaces replicas).
    engine = next(d for d in app["deployments"] if d["name"] == "Engine")
    scaling = engine["autoscaling_config"]
    assert "num_replicas" not in engine and platform.engine_deployment.autoscaling is None
    assert 1 <= scaling["min_replicas"] <= scaling["max_replicas"]
    # Serve never autoscales if a replica may hold fewer requests than the target.
    assert scaling["target_ongoing_requests"] < platform.engine_deployment.max_ongoing_requests
    assert platform.engine_deployment.num_gpus == platform.engine.tensor_parallel_size


def test_the_rayservice_manifest_serves_the_cluster_profile():
    manifest = yaml.safe_load((ROOT / "deploy" / "rayservice.yaml").read_text())
    assert manifest["kind"] == "RayService"
    assert yaml.safe_load(manifest["spec"]["serveConfigV2"]) == cluster_config()
    cluster = manifest["spec"]["rayClusterConfig"]
    assert cluster["rayVersion"].startswith("2.60")
    [gpu] = cluster["workerGroupSpecs"]
    engine = next(d for d in cluster_config()["applications"][0]["deployments"] if d["name"] == "Engine")
    assert gpu["minReplicas"] <= engine["autoscaling_config"]["min_replicas"]
    assert gpu["maxReplicas"] >= engine["autoscaling_config"]["max_replicas"]
    # The head pod restarting must not take the app with it (GCS fault tolerance, KubeRay >= 1.3);
    # the replicas then live on the workers, whose proxies keep serving.
    assert cluster["gcsFaultToleranceOptions"]["redisAddress"]
    assert cluster["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"
    assert yaml.safe_load(manifest["spec"]["serveConfigV2"])["proxy_location"] == "EveryNode"
