"""Fixtures for registry tests: a base-model spec, a good adapter dir, S3 on loopback."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from loopback import ServerUnavailable
from moto_s3 import moto_s3
from registry_builders import REPO, SMOLLM2_CONFIG, lora_config, lora_tensors, write_adapter

from loraplex.registry.model_spec import BaseModelSpec
from loraplex.registry.validator import AdapterValidator

DEFAULT_MODEL = REPO / "models" / "SmolLM2-135M-Instruct"



@pytest.fixture(scope="session")
def real_model_dir() -> Path:
    path = Path(os.environ.get("LORAPLEX_MODEL", DEFAULT_MODEL))
    if not (path / "config.json").exists():
        pytest.skip(f"no base model at {path}: run scripts/prepare_model.py or set LORAPLEX_MODEL")
    return path


@pytest.fixture
def model_dir(tmp_path) -> Path:
    path = tmp_path / "SmolLM2-135M-Instruct"
    path.mkdir()
    (path / "config.json").write_text(json.dumps(SMOLLM2_CONFIG))
    return path


@pytest.fixture
def spec(model_dir) -> BaseModelSpec:
    return BaseModelSpec.from_pretrained_dir(model_dir)


@pytest.fixture
def validator(spec) -> AdapterValidator:
    return AdapterValidator(spec, max_lora_rank=64)


@pytest.fixture
def good_adapter(tmp_path, spec) -> Path:
    return write_adapter(tmp_path / "good", lora_config(), lora_tensors(spec))


# --- S3 on loopback (moto server) ------------------------------------------------------------

@pytest.fixture(scope="session")
def s3_endpoint():
    pytest.importorskip("moto.server", reason="moto[server] is needed for the S3 test")
    pytest.importorskip("s3fs", reason="s3fs is needed for the S3 test")
    try:
        with moto_s3() as endpoint:
            yield endpoint
    except ServerUnavailable as exc:
        pytest.fail(str(exc))


@pytest.fixture
def s3_options(s3_endpoint) -> dict:
    return {"key": "testing", "secret": "testing",
            "client_kwargs": {"endpoint_url": s3_endpoint, "region_name": "us-east-1"}}
