"""`serve run serve_config.yaml` imports loraplex.app:build_app and calls it with the config's
args: Ray Serve refuses a builder whose signature has anything but one parameter (a keyword-only
`engine_cls` broke every `serve run`)."""

import inspect

from loraplex.app import build_app, build_platform


def test_build_app_is_a_builder_serve_accepts():
    # Ray's own rule (ray/serve/_private/api.py, call_user_app_builder_with_args_if_necessary).
    assert len(inspect.signature(build_app).parameters) == 1


def test_build_platform_takes_the_engine_to_inject():
    assert "engine_cls" in inspect.signature(build_platform).parameters
