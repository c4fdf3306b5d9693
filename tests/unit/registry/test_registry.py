"""AdapterRegistry: an upload becomes weights in the store and a version in the catalog."""

from __future__ import annotations

import pytest
from registry_builders import lora_config, lora_tensors, tar_dir, write_adapter, zip_dir

from loraplex.registry.config import RegistryConfig
from loraplex.db.engine import make_engine
from loraplex.registry.archive import UploadTooLarge
from loraplex.registry.catalog import AdapterCatalog
from loraplex.registry.bases import ServedBases
from loraplex.registry.registry import AdapterRegistry
from loraplex.registry.store import AdapterNotFound, AdapterStore, InvalidName


def make_registry(tmp_path, validator, **limits) -> AdapterRegistry:
    cfg = RegistryConfig(store_url=str(tmp_path / "store"), cache_dir=str(tmp_path / "cache"), **limits)
    return AdapterRegistry(cfg, ServedBases.one(validator), AdapterStore(cfg), AdapterCatalog(make_engine(f"sqlite:///{tmp_path}/db")))


@pytest.fixture
def registry(tmp_path, validator) -> AdapterRegistry:
    return make_registry(tmp_path, validator)


def test_upload_resolve_fetch_delete(registry, good_adapter, spec, tmp_path):
    v1 = registry.upload("acme", "bot", tar_dir(good_adapter, tmp_path / "a.tar.gz"))
    assert (v1.version, v1.rank, v1.target_modules) == (1, 8, ["q_proj", "v_proj"])
    assert registry.resolve("acme", "bot") == v1
    assert registry.store.fetch_to_local_cache("acme", v1.sha256).is_dir()

    other = write_adapter(tmp_path / "other", lora_config(), lora_tensors(spec, fill=0.5))
    v2 = registry.upload("acme", "bot", tar_dir(other, tmp_path / "b.tar.gz"))
    assert (v2.version, registry.resolve("acme", "bot")) == (2, v2)
    assert registry.delete("acme", "bot@2") == [v2]
    assert not registry.store.exists("acme", v2.sha256) and registry.store.exists("acme", v1.sha256)
    with pytest.raises(AdapterNotFound):
        registry.resolve("acme", "bot@2")


def test_same_content_same_version_whatever_the_packing(registry, good_adapter, tmp_path):
    a = registry.upload("acme", "bot", tar_dir(good_adapter, tmp_path / "a.tar.gz"))
    b = registry.upload("acme", "bot", zip_dir(good_adapter, tmp_path / "b.zip", prefix="bot/"))
    (good_adapter / "README.md").write_text("peft writes one of these; it is not part of the hash")
    with open(tar_dir(good_adapter, tmp_path / "c.tgz", prefix="x/"), "rb") as stream:
        c = registry.upload("acme", "bot", stream)
    assert a == b == c
    assert [v.version for v in registry.list("acme")] == [1]


def test_weights_shared_by_two_names_stay_until_the_last_goes(registry, good_adapter, tmp_path):
    archive = tar_dir(good_adapter, tmp_path / "a.tar.gz")
    a, b = registry.upload("acme", "bot", archive), registry.upload("acme", "bot-copy", archive)
    c = registry.upload("globex", "bot", archive)
    assert a.sha256 == b.sha256 == c.sha256 and len({a.lora_name, b.lora_name, c.lora_name}) == 3
    assert len({a.id, b.id, c.id}) == 3  # one lora_int_id per version

    registry.delete("acme", "bot")
    assert registry.store.exists("acme", a.sha256)  # bot-copy still runs on it
    assert registry.resolve("globex", "bot") == c
    registry.delete("acme", "bot-copy")
    assert not registry.store.exists("acme", a.sha256) and registry.store.exists("globex", c.sha256)


def test_reupload_after_delete_is_a_new_version(registry, good_adapter, tmp_path):
    archive = tar_dir(good_adapter, tmp_path / "a.tar.gz")
    v1 = registry.upload("acme", "bot", archive)
    registry.delete("acme", "bot")
    again = registry.upload("acme", "bot", archive)
    assert (again.version, again.sha256) == (2, v1.sha256) and again.id != v1.id
    assert again.lora_name != v1.lora_name  # vLLM sees another LoRA, with another lora_int_id
    assert registry.store.exists("acme", again.sha256)
    assert [v.version for v in registry.list("acme")] == [2]


@pytest.mark.parametrize("name", ["", "../x", "a/b", "bot@2", ".hidden", "x" * 65, "sp ace"])
def test_unsafe_names_are_refused(registry, good_adapter, tmp_path, name):
    with pytest.raises(InvalidName) as e:
        registry.upload("acme", name, tar_dir(good_adapter, tmp_path / "a.tar.gz"))
    assert e.value.status == 400


def test_oversize_stream_is_413_and_stores_nothing(tmp_path, validator, good_adapter):
    registry = make_registry(tmp_path, validator, max_upload_bytes=1024)
    with open(tar_dir(good_adapter, tmp_path / "a.tar.gz"), "rb") as stream:
        with pytest.raises(UploadTooLarge) as e:
            registry.upload("acme", "bot", stream)
    assert e.value.status == 413
    assert registry.list("acme") == [] and not any((tmp_path / "store").glob("*/*"))


# --- temporary files: gone on every path (issue 34) -------------------------------------------

def _leftovers(tmp_root):
    return sorted(p.name for p in tmp_root.iterdir())


@pytest.fixture
def tmp_root(tmp_path, monkeypatch):
    import tempfile

    root = tmp_path / "tmp"
    root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    return root


def test_no_temporary_file_is_left_on_success_refusal_exception_or_cancellation(
        registry, good_adapter, tmp_path, tmp_root, monkeypatch):
    import io
    import threading
    import zipfile

    from loraplex.registry.archive import UploadCancelled

    archive = tar_dir(good_adapter, tmp_path / "a.tar.gz")
    with open(archive, "rb") as stream:
        registry.upload("acme", "ok", stream)  # success
    assert _leftovers(tmp_root) == []

    bomb = tmp_path / "bomb.zip"
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_BZIP2) as zf:
        zf.writestr("adapter_model.safetensors", bytes(64 << 20))
    with pytest.raises(UploadTooLarge), open(bomb, "rb") as stream:
        registry.upload("acme", "bomb", stream)  # refusal
    assert _leftovers(tmp_root) == []

    def broken(path):
        raise RuntimeError("validator bug")

    monkeypatch.setattr(registry.bases.default.validator, "validate", broken)
    with pytest.raises(RuntimeError), open(archive, "rb") as stream:
        registry.upload("acme", "boom", stream)  # exception
    assert _leftovers(tmp_root) == []

    cancelled = threading.Event()
    cancelled.set()
    with pytest.raises(UploadCancelled):
        registry.upload("acme", "gone", io.BytesIO(archive.read_bytes()), cancelled=cancelled)  # cancellation
    assert _leftovers(tmp_root) == []


# --- the delete/upload race (issue 34) ---------------------------------------------------------

def test_a_delete_racing_an_upload_of_the_same_weights_never_leaves_a_live_version_without_its_blob(
        registry, good_adapter, tmp_path):
    """`y` holds the weights; an upload puts them under `x` while a delete of `y` decides they are
    unused and removes them. The delete's check and removal run in one transaction under the
    tenant's lock, so the upload's row commits wholly before (the blob stays) or after (it is put
    again): here the upload's add starts while the delete is between its check and its removal."""
    import threading
    import time

    archive = tar_dir(good_adapter, tmp_path / "a.tar.gz")
    y = registry.upload("acme", "y", archive)
    store_delete = registry.store.delete
    in_removal, results = threading.Event(), {}

    def slow_delete(tenant, sha256):
        in_removal.set()
        time.sleep(0.5)  # the upload's add runs now, if nothing orders it after us
        store_delete(tenant, sha256)

    registry.store.delete = slow_delete
    deleter = threading.Thread(target=lambda: results.setdefault("deleted", registry.delete("acme", "y")))
    original_add = registry.catalog.add

    def add_during_removal(*args, **kwargs):
        in_removal.wait(5)
        return original_add(*args, **kwargs)

    registry.catalog.add = add_during_removal
    deleter.start()
    x = registry.upload("acme", "x", archive)
    deleter.join()
    assert x.sha256 == y.sha256 and registry.resolve("acme", "x") == x
    assert registry.store.exists("acme", x.sha256)  # the live version's weights are there
    assert registry.store.fetch_to_local_cache("acme", x.sha256).is_dir()


def test_delete_then_upload_of_the_same_weights_puts_the_blob_back(registry, good_adapter, tmp_path):
    archive = tar_dir(good_adapter, tmp_path / "a.tar.gz")
    registry.upload("acme", "y", archive)
    original_add = registry.catalog.add

    def delete_first(*args, **kwargs):  # the delete of y runs between the upload's put and its add
        registry.catalog.add = original_add
        registry.delete("acme", "y")
        return original_add(*args, **kwargs)

    registry.catalog.add = delete_first
    x = registry.upload("acme", "x", archive)
    assert registry.store.exists("acme", x.sha256)


# --- quotas (issue 34) -------------------------------------------------------------------------

def test_versions_quota_refuses_a_new_version_with_409_naming_it(registry, good_adapter, spec, tmp_path):
    from loraplex.registry.quota import AdapterQuota, QuotaExceeded

    quota = AdapterQuota(max_versions=1)
    archive = tar_dir(good_adapter, tmp_path / "a.tar.gz")
    v1 = registry.upload("acme", "bot", archive, quota=quota)
    assert registry.upload("acme", "bot", archive, quota=quota) == v1  # the same weights: no new version
    other = tar_dir(write_adapter(tmp_path / "o", lora_config(), lora_tensors(spec, fill=0.5)), tmp_path / "o.tgz")
    for name in ("bot", "second"):
        with pytest.raises(QuotaExceeded) as e:
            registry.upload("acme", name, other, quota=quota)
        assert e.value.status == 409 and "max_adapter_versions" in str(e.value) and "is 1" in str(e.value)
        assert "delete versions" in str(e.value)
    assert [v.version for v in registry.list("acme")] == [1]
    assert registry.upload("globex", "bot", other, quota=quota).version == 1  # per tenant
    registry.delete("acme", "bot")  # the fix the message names
    assert registry.upload("acme", "second", other, quota=quota).version == 1


def test_bytes_quota_refuses_with_413_and_leaves_no_blob(registry, good_adapter, spec, tmp_path):
    from loraplex.registry.quota import AdapterQuota, QuotaExceeded

    first = registry.upload("acme", "bot", tar_dir(good_adapter, tmp_path / "a.tar.gz"))
    quota = AdapterQuota(max_bytes=first.size_bytes + 10)
    other = tar_dir(write_adapter(tmp_path / "o", lora_config(), lora_tensors(spec, fill=0.5)), tmp_path / "o.tgz")
    with pytest.raises(QuotaExceeded) as e:
        registry.upload("acme", "big", other, quota=quota)
    assert e.value.status == 413 and "max_adapter_bytes" in str(e.value)
    blobs = [p for p in (tmp_path / "store" / "acme").iterdir()]
    assert [p.name for p in blobs if registry.store.exists("acme", p.name)] == [first.sha256]  # refused: gone
