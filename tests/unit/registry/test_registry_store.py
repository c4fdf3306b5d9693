"""AdapterStore: blobs by (tenant, sha256), verified node-local copies, local and S3 (moto)."""

from __future__ import annotations

import json
import uuid

import pytest
from registry_builders import lora_config, lora_tensors, tar_dir, write_adapter, zip_dir

from loraplex.registry.config import RegistryConfig
from loraplex.registry.archive import extract_archive
from loraplex.registry.store import AdapterNotFound, AdapterStore, InvalidName
from loraplex.registry.store import write_canonical


@pytest.fixture
def local_store(tmp_path) -> AdapterStore:
    return AdapterStore(RegistryConfig(store_url=str(tmp_path / "store"), cache_dir=str(tmp_path / "cache")))


@pytest.fixture
def s3_store(s3_options, tmp_path) -> AdapterStore:
    import boto3

    bucket = f"adapters-{uuid.uuid4().hex[:8]}"
    boto3.client("s3", aws_access_key_id="testing", aws_secret_access_key="testing",
                 endpoint_url=s3_options["client_kwargs"]["endpoint_url"],
                 region_name="us-east-1").create_bucket(Bucket=bucket)
    return AdapterStore(RegistryConfig(store_url=f"s3://{bucket}/prod/adapters", storage_options=s3_options,
                                       cache_dir=str(tmp_path / "cache")))


def round_trip(store: AdapterStore, validator, good_adapter, spec, tmp_path):
    blob = store.put("acme", validator.validate(good_adapter))
    assert len(blob.sha256) == 64 and blob.size_bytes > 0 and blob.created
    assert store.exists("acme", blob.sha256) and not store.exists("globex", blob.sha256)
    assert store.put("acme", validator.validate(good_adapter)) == blob._replace(created=False)  # same content: a no-op

    # An engine on another node: fetch into its own cache, byte-identical and verified.
    local = store.fetch_to_local_cache("acme", blob.sha256)
    assert local.is_relative_to(tmp_path / "cache")
    assert (local / "adapter_model.safetensors").read_bytes() == \
        (good_adapter / "adapter_model.safetensors").read_bytes()
    assert json.loads((local / "adapter_config.json").read_text()) == lora_config()
    assert validator.validate(local).target_modules == ["q_proj", "v_proj"]
    assert store.fetch_to_local_cache("acme", blob.sha256) == local  # cached

    # Different content -> another blob; the first stays as it was.
    other = store.put("acme", validator.validate(write_adapter(tmp_path / "other", lora_config(),
                                                               lora_tensors(spec, fill=0.5))))
    assert other.sha256 != blob.sha256

    # Delete: gone from the store (404 before any download), idempotent, the other survives.
    store.delete("acme", other.sha256)
    store.delete("acme", other.sha256)
    assert not store.exists("acme", other.sha256) and store.exists("acme", blob.sha256)
    with pytest.raises(AdapterNotFound) as e:
        store.fetch_to_local_cache("acme", other.sha256, cache_dir=tmp_path / "c2")
    assert e.value.status == 404
    store.evict_from_local_cache("acme", blob.sha256)
    assert not local.exists()


def test_local_round_trip(local_store, validator, good_adapter, spec, tmp_path):
    round_trip(local_store, validator, good_adapter, spec, tmp_path)
    sha = local_store.put("acme", validator.validate(good_adapter)).sha256
    assert sorted(p.name for p in (tmp_path / "store" / "acme" / sha).iterdir()) == [  # <root>/<tenant>/<sha>
        "COMPLETE", "adapter_config.json", "adapter_model.safetensors"]


def test_s3_round_trip(s3_store, validator, good_adapter, spec, tmp_path):
    round_trip(s3_store, validator, good_adapter, spec, tmp_path)


def test_s3_store_seen_from_another_process_view(s3_store, s3_options, validator, good_adapter, tmp_path):
    """A second store object (another replica) sees blobs the first one wrote."""
    blob = s3_store.put("acme", validator.validate(good_adapter))
    other = AdapterStore(RegistryConfig(store_url=s3_store.root, storage_options=s3_options,
                                        cache_dir=str(tmp_path / "node2")))
    assert other.exists("acme", blob.sha256)
    assert (other.fetch_to_local_cache("acme", blob.sha256) / "adapter_config.json").exists()


def test_same_content_same_sha_whatever_the_packing(validator, good_adapter, tmp_path):
    def sha_of(archive):
        peft_dir = extract_archive(archive, tmp_path / f"x-{archive.name}")
        return write_canonical(validator.validate(peft_dir), tmp_path / f"c-{archive.name}").sha256

    a = sha_of(tar_dir(good_adapter, tmp_path / "a.tar.gz"))
    b = sha_of(zip_dir(good_adapter, tmp_path / "b.zip", prefix="bot/"))
    (good_adapter / "README.md").write_text("peft writes one of these; it is not part of the hash")
    c = sha_of(tar_dir(good_adapter, tmp_path / "c.tgz", prefix="x/"))
    assert a == b == c


def test_tenants_never_share_a_blob(local_store, validator, good_adapter):
    adapter = validator.validate(good_adapter)
    a, b = local_store.put("acme", adapter), local_store.put("globex", adapter)
    assert a == b
    local_store.delete("acme", a.sha256)
    assert local_store.exists("globex", b.sha256) and not local_store.exists("acme", a.sha256)


def test_corrupt_stored_copy_is_not_served(local_store, validator, good_adapter, tmp_path):
    blob = local_store.put("acme", validator.validate(good_adapter))
    weights = tmp_path / "store" / "acme" / blob.sha256 / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1] + b"!")
    with pytest.raises(RuntimeError, match="corrupt"):
        local_store.fetch_to_local_cache("acme", blob.sha256)
    assert not (tmp_path / "cache" / "acme" / blob.sha256).exists()


@pytest.mark.parametrize("tenant", ["", "../x", "a/b", ".hidden", "x" * 65])
def test_unsafe_tenant_ids_are_refused(local_store, validator, good_adapter, tenant):
    with pytest.raises(InvalidName) as e:
        local_store.put(tenant, validator.validate(good_adapter))
    assert e.value.status == 400


@pytest.mark.parametrize("sha", ["", "../../etc", "ABC", "0" * 63])
def test_only_a_sha256_names_a_blob(local_store, sha):
    assert not local_store.exists("acme", sha)
    with pytest.raises(AdapterNotFound):
        local_store.fetch_to_local_cache("acme", sha)
