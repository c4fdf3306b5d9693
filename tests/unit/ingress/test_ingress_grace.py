"""A stopping Ingress replica (scale-down, `serve deploy` of a new version) waits for the requests
it carries: its graceful period outlasts the longest deadline (issue 48: Serve's default 20 s cut 2
of 16 streams in the redeploy drill)."""

from loraplex.ingress.config import IngressDeploymentConfig
from loraplex.ingress.deployment import ingress_deployment


def test_the_graceful_period_outlasts_the_request_deadline():
    for timeout_s in (300.0, 900.0):
        deployment = ingress_deployment(IngressDeploymentConfig(request_timeout_s=timeout_s))
        assert deployment._deployment_config.graceful_shutdown_timeout_s > timeout_s
