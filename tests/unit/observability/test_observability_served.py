from loraplex.observability.served import load_served


def test_replica_counts_come_from_deployments_as_in_serve(tmp_path):
    config = tmp_path / "serve.yaml"
    config.write_text("""
applications:
  - name: app
    import_path: loraplex.app:build_app
    args: {engine_deployment: {num_replicas: 5}}
    deployments:
      - {name: Engine, autoscaling_config: {min_replicas: 2, max_replicas: 8}}
      - {name: Ingress, num_replicas: 3}
""")
    assert load_served(config).deployments() == {"Engine": 2, "Ingress": 3}
    config.write_text("""
applications:
  - {name: app, import_path: loraplex.app:build_app, args: {engine_deployment: {num_replicas: 5}}}
""")
    assert load_served(config).deployments() == {"Engine": 5, "Ingress": 1}
    config.write_text("""
applications:
  - name: app
    import_path: loraplex.app:build_app
    args: {engine_deployment: {autoscaling: {min_replicas: 3, max_replicas: 6}}}
""")
    assert load_served(config).deployments() == {"Engine": 3, "Ingress": 1}  # the args' autoscaling minimum
