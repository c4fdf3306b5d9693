"""AdapterStore: content addressing, immutable versions, local and S3 (moto) round trips."""

from __future__ import annotations

import json
import uuid

import pytest
from registry_builders import lora_config, lora_tensors, tar_dir, write_adapter, zip_dir

from loraplex.registry import (AdapterIngestor, AdapterNotFound, AdapterStore, AdapterVersion,
                               ArchiveLimits, InvalidName, UploadTooLarge)


@pytest.fixture
def local_store(tmp_path) -> AdapterStore:
    return AdapterStore(root=str(tmp_path / "store"), cache_dir=str(tmp_path / "cache"))


@pytest.fixture
def s3_store(s3_options, tmp_path) -> AdapterStore:
    import boto3

    bucket = f"adapters-{uuid.uuid4().hex[:8]}"
    boto3.client("s3", aws_access_key_id="testing", aws_secret_access_key="testing",
                 endpoint_url=s3_options["client_kwargs"]["endpoint_url"],
                 region_name="us-east-1").create_bucket(Bucket=bucket)
    return AdapterStore(root=f"s3://{bucket}/prod/adapters", storage_options=s3_options,
                        cache_dir=str(tmp_path / "cache"))


def round_trip(store: AdapterStore, validator, good_adapter, spec, tmp_path):
    v1 = store.put("acme", "support-bot", validator.validate(good_adapter))
    assert (v1.version, v1.rank, v1.target_modules) == (1, 8, ["q_proj", "v_proj"])
    assert len(v1.sha256) == 64 and v1.created_at.endswith("Z")
    assert v1.lora_name == f"acme/support-bot@{v1.sha256}"
    assert store.get("acme", "support-bot", v1.sha256) == v1

    # An engine on another node: fetch into its own cache, byte-identical and verified.
    local = store.fetch_to_local_cache("acme", "support-bot", v1.sha256)
    assert local.is_relative_to(tmp_path / "cache")
    assert (local / "adapter_model.safetensors").read_bytes() == \
        (good_adapter / "adapter_model.safetensors").read_bytes()
    assert json.loads((local / "adapter_config.json").read_text()) == lora_config()
    assert validator.validate(local).target_modules == v1.target_modules
    assert store.fetch_to_local_cache("acme", "support-bot", v1.sha256) == local  # cached

    # Different content -> a new immutable version; v1 stays as it was.
    other = write_adapter(tmp_path / "other", lora_config(), lora_tensors(spec, fill=0.5))
    v2 = store.put("acme", "support-bot", validator.validate(other))
    assert v2.version == 2 and v2.sha256 != v1.sha256
    assert [v.version for v in store.list_versions("acme", "support-bot")] == [1, 2]
    assert store.resolve("acme", "support-bot") == v2
    assert store.resolve("acme", "support-bot", "1") == v1
    assert store.resolve("acme", "support-bot", v2.sha256) == v2
    assert list(store.list_adapters("acme")) == ["support-bot"]
    assert store.list_adapters("globex") == {}

    # Delete one version: it 404s, the number is never reused, the other survives.
    store.delete("acme", "support-bot", v2.sha256)
    with pytest.raises(AdapterNotFound) as e:
        store.get("acme", "support-bot", v2.sha256)
    assert e.value.status == 404
    third = write_adapter(tmp_path / "third", lora_config(), lora_tensors(spec, fill=1.0))
    assert store.put("acme", "support-bot", validator.validate(third)).version == 3
    store.delete("acme", "support-bot")
    assert store.list_versions("acme", "support-bot") == []
    with pytest.raises(AdapterNotFound):
        store.resolve("acme", "support-bot")
    with pytest.raises(AdapterNotFound):
        store.fetch_to_local_cache("acme", "support-bot", v2.sha256, cache_dir=tmp_path / "c2")


def test_local_round_trip(local_store, validator, good_adapter, spec, tmp_path):
    round_trip(local_store, validator, good_adapter, spec, tmp_path)
    assert (tmp_path / "store" / "acme" / "support-bot").is_dir()  # <root>/<tenant>/<name>/<sha>


def test_s3_round_trip(s3_store, validator, good_adapter, spec, tmp_path):
    round_trip(s3_store, validator, good_adapter, spec, tmp_path)


def test_s3_store_seen_from_another_process_view(s3_store, s3_options, validator, good_adapter,
                                                 tmp_path):
    """A second store object (another replica) sees versions the first one wrote."""
    v = s3_store.put("acme", "bot", validator.validate(good_adapter))
    other = AdapterStore(root=s3_store.root, storage_options=s3_options,
                         cache_dir=str(tmp_path / "node2"))
    assert other.resolve("acme", "bot") == v
    assert (other.fetch_to_local_cache("acme", "bot", v.sha256) / "adapter_config.json").exists()


def test_same_content_same_sha_whatever_the_packing(local_store, validator, good_adapter, tmp_path):
    ingest = AdapterIngestor(validator, local_store)
    a = ingest.ingest("acme", "bot", tar_dir(good_adapter, tmp_path / "a.tar.gz"))
    b = ingest.ingest("acme", "bot", zip_dir(good_adapter, tmp_path / "b.zip", prefix="bot/"))
    (good_adapter / "README.md").write_text("peft writes one of these; it is not part of the hash")
    with open(tar_dir(good_adapter, tmp_path / "c.tgz", prefix="x/"), "rb") as stream:
        c = ingest.ingest("acme", "bot", stream)
    assert a == b == c
    assert [v.version for v in local_store.list_versions("acme", "bot")] == [1]


def test_same_content_under_another_name_or_tenant_is_separate(local_store, validator, good_adapter):
    adapter = validator.validate(good_adapter)
    a = local_store.put("acme", "bot", adapter)
    b = local_store.put("acme", "bot-copy", adapter)
    c = local_store.put("globex", "bot", adapter)
    assert a.sha256 == b.sha256 == c.sha256 and a.lora_name != b.lora_name != c.lora_name
    local_store.delete("acme", "bot")
    assert local_store.resolve("globex", "bot") == c


def test_reupload_after_delete_revives_same_number(local_store, validator, good_adapter):
    adapter = validator.validate(good_adapter)
    v1 = local_store.put("acme", "bot", adapter)
    local_store.delete("acme", "bot")
    again = local_store.put("acme", "bot", adapter)
    assert (again.version, again.sha256, again.deleted_at) == (1, v1.sha256, None)


def test_corrupt_stored_copy_is_not_served(local_store, validator, good_adapter, tmp_path):
    v = local_store.put("acme", "bot", validator.validate(good_adapter))
    weights = tmp_path / "store" / "acme" / "bot" / v.sha256 / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1] + b"!")
    with pytest.raises(RuntimeError, match="corrupt"):
        local_store.fetch_to_local_cache("acme", "bot", v.sha256)
    assert not (tmp_path / "cache" / "acme" / "bot" / v.sha256).exists()


@pytest.mark.parametrize("name", ["", "../x", "a/b", "bot@2", ".hidden", "x" * 65, "sp ace"])
def test_unsafe_names_are_refused(local_store, validator, good_adapter, name):
    with pytest.raises(InvalidName) as e:
        local_store.put("acme", name, validator.validate(good_adapter))
    assert e.value.status == 400


def test_ingest_maps_oversize_stream_to_413(local_store, validator, good_adapter, tmp_path):
    ingest = AdapterIngestor(validator, local_store, ArchiveLimits(max_upload_bytes=1024))
    with open(tar_dir(good_adapter, tmp_path / "a.tar.gz"), "rb") as stream:
        with pytest.raises(UploadTooLarge) as e:
            ingest.ingest("acme", "bot", stream)
    assert e.value.status == 413
    assert local_store.list_adapters("acme") == {}


def test_version_response_body(local_store, validator, good_adapter):
    body = local_store.put("acme", "bot", validator.validate(good_adapter)).to_response()
    assert set(body) == {"name", "version", "sha256", "rank", "target_modules", "base_model",
                         "size_bytes", "created_at"}
    assert AdapterVersion.from_json(json.dumps({**body, "tenant": "acme"}).encode()).name == "bot"
