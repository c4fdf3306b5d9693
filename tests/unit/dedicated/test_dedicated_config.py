"""dedicated: in the config: a version reference `<tenant>/<name>@<version>`, sizes, the merge dtype."""

import pytest
from pydantic import ValidationError

from loraplex.config import PlatformConfig
from loraplex.dedicated.config import DedicatedAdapterConfig


def test_a_dedicated_adapter_is_a_tenant_name_and_version():
    config = PlatformConfig.from_args({"dedicated": {"adapters": [{"adapter": "ten_a/pirate@3", "num_cpus": 0.5}],
                                                     "merge_dtype": "bfloat16", "health_poll_s": 1}})
    [entry] = config.dedicated.adapters
    assert (entry.tenant, entry.ref, entry.num_cpus, entry.num_gpus) == ("ten_a", "pirate@3", 0.5, 0.0)
    assert config.dedicated.merge_dtype == "bfloat16" and config.dedicated.admin_marks


@pytest.mark.parametrize("ref", ["pirate@1", "ten_a/pirate", "ten_a/pirate@latest", "ten_a/@1", "/pirate@1"])
def test_anything_but_one_version_is_refused_with_the_form_to_write(ref):
    with pytest.raises(ValidationError, match="<tenant id>/<name>@<version>"):
        DedicatedAdapterConfig(adapter=ref)


def test_unknown_keys_and_dtypes_are_refused():
    with pytest.raises(ValidationError):
        PlatformConfig.from_args({"dedicated": {"adapters": [{"adapter": "t/a@1", "replicas": 2}]}})
    with pytest.raises(ValidationError):
        PlatformConfig.from_args({"dedicated": {"merge_dtype": "int8"}})


def test_every_field_has_a_description():
    from loraplex.dedicated.config import DedicatedConfig

    for model in (DedicatedConfig, DedicatedAdapterConfig):
        assert all(f.description for f in model.model_fields.values()), model
