"""The adapter store down or frozen (a fake filesystem whose calls block or fail): every call is bounded
by registry.store_timeout_s and answers 503 AdapterStoreUnavailable with Retry-After, naming the store;
cached copies are served without it; an upload leaves no catalog row and no visible blob; all of it
works again once the store answers, without a new AdapterStore."""

from __future__ import annotations

import threading
import time

import pytest
from registry_builders import tar_dir

from loraplex.registry.config import RegistryConfig
from loraplex.db.engine import make_engine
from loraplex.registry.bases import ServedBases
from loraplex.registry.catalog import AdapterCatalog
from loraplex.registry.registry import AdapterRegistry
from loraplex.registry.store import AdapterStore, dir_sha256
from loraplex.store_io import AdapterStoreUnavailable, BoundedStore

BOUND_S = 0.3
HOLD_S = 5.0  # a frozen call's own end, so a test without the bound fails slowly instead of hanging


class FreezableFS:
    """A filesystem whose calls named in `frozen` block (as a stopped server with open connections
    does) until thawed, and whose calls in `failing` raise a refused connection."""

    def __init__(self, fs):
        self.fs = fs
        self.frozen: set[str] = set()
        self.failing: set[str] = set()
        self.thawed = threading.Event()
        self.calls: list[str] = []

    def freeze(self, *ops):
        self.frozen, self.thawed = set(ops), threading.Event()

    def thaw(self):
        self.frozen = set()
        self.thawed.set()

    def __getattr__(self, name):
        attr = getattr(self.fs, name)
        if name == "invalidate_cache" or not callable(attr):
            return attr

        def call(*args, **kwargs):
            self.calls.append(name)
            if name in self.frozen:
                self.thawed.wait(HOLD_S)
            if name in self.failing:
                raise ConnectionRefusedError(111, "Connection refused")
            return attr(*args, **kwargs)
        return call


EVERY_OP = ("exists", "makedirs", "put_file", "pipe_file", "get_file", "rm_file", "cat_file")


def frozen_store(tmp_path, **cfg) -> tuple[AdapterStore, FreezableFS]:
    store = AdapterStore(RegistryConfig(store_url=str(tmp_path / "store"), cache_dir=str(tmp_path / "cache"),
                                        store_timeout_s=BOUND_S, **cfg))
    store.fs = fs = FreezableFS(store.fs)
    return store, fs


def assert_store_503(exc: AdapterStoreUnavailable, store: AdapterStore):
    assert exc.status == 503 and exc.code == "adapter_store_unavailable"
    assert exc.headers["Retry-After"].isdigit() and int(exc.headers["Retry-After"]) > 0
    assert "adapter store" in exc.message and store.root in exc.message
    assert exc.refusal_reason == "503:adapter_store_unavailable"


def test_a_frozen_call_ends_at_the_bound_as_a_503_and_is_counted():
    failures, gate = [], threading.Event()
    io = BoundedStore("s3://bucket/adapters", BOUND_S, on_failure=failures.append)
    started = time.monotonic()
    with pytest.raises(AdapterStoreUnavailable) as e:
        io.call("read", "the thing could not be read", lambda: gate.wait(HOLD_S) or "late")
    took = time.monotonic() - started
    assert took < BOUND_S + 1.0, f"a frozen store held the caller {took:.1f} s"
    assert "s3://bucket/adapters" in e.value.message and "0.3 s" in e.value.message
    assert e.value.headers["Retry-After"] == "10" and failures == ["read"]
    gate.set()
    assert io.call("read", "x", lambda: "ok") == "ok"  # the store answers again: so does the call


def test_a_refused_connection_is_a_503_but_an_answer_from_the_store_is_passed_on():
    failures = []
    io = BoundedStore("s3://b/a", BOUND_S, on_failure=failures.append)

    def refused():
        raise ConnectionRefusedError(111, "Connection refused")

    def missing():
        raise FileNotFoundError("s3://b/a/x")
    with pytest.raises(AdapterStoreUnavailable) as e:
        io.call("write", "the upload was not stored", refused)
    assert "ConnectionRefusedError" in e.value.message and failures == ["write"]
    with pytest.raises(FileNotFoundError):  # the store answered: not found (a deleted version: 404)
        io.call("read", "x", missing)
    assert failures == ["write"]


@pytest.mark.parametrize("frozen_ops", [EVERY_OP, ("get_file",)], ids=["frozen", "frozen-mid-download"])
def test_an_uncached_version_is_a_503_within_the_bound_a_cached_one_needs_no_store(
        tmp_path, validator, good_adapter, frozen_ops):
    store, fs = frozen_store(tmp_path)
    blob = store.put("acme", validator.validate(good_adapter))
    cached = store.fetch_to_local_cache("acme", blob.sha256)
    fs.freeze(*frozen_ops)
    fs.calls.clear()
    assert store.fetch_to_local_cache("acme", blob.sha256) == cached and fs.calls == []
    started = time.monotonic()
    with pytest.raises(AdapterStoreUnavailable) as e:
        store.fetch_to_local_cache("acme", blob.sha256, cache_dir=tmp_path / "other-node")
    assert time.monotonic() - started < BOUND_S + 1.0
    assert_store_503(e.value, store)
    assert "not yet on this replica" in e.value.message
    assert not (tmp_path / "other-node" / "acme" / blob.sha256).exists()
    fs.thaw()  # the store is back: the same AdapterStore fetches it
    assert store.fetch_to_local_cache("acme", blob.sha256, cache_dir=tmp_path / "other-node").is_dir()


@pytest.mark.parametrize("frozen_op", ["exists", "put_file", "pipe_file"])
def test_an_upload_into_a_frozen_store_is_a_503_and_leaves_nothing_half_written(
        tmp_path, validator, good_adapter, frozen_op):
    store, fs = frozen_store(tmp_path)
    cfg = RegistryConfig(store_url=store.root, cache_dir=str(tmp_path / "cache"), store_timeout_s=BOUND_S)
    registry = AdapterRegistry(cfg, ServedBases.one(validator), store,
                               AdapterCatalog(make_engine(f"sqlite:///{tmp_path}/db")))
    archive = tar_dir(good_adapter, tmp_path / "a.tar.gz")
    fs.freeze(frozen_op)
    started = time.monotonic()
    with pytest.raises(AdapterStoreUnavailable) as e:
        registry.upload("acme", "bot", archive)
    assert time.monotonic() - started < BOUND_S + 1.0
    assert_store_503(e.value, store)
    assert registry.list("acme") == []  # no catalog row
    fs.thaw()
    time.sleep(0.2)  # the frozen call, released, finishes in its thread
    # No partial blob visible: one whose COMPLETE exists holds all its files (a COMPLETE written after
    # the bound, once the store answers, completes weights no row names: never served, reused by a re-upload).
    for blob in (tmp_path / "store" / "acme").glob("*") if (tmp_path / "store" / "acme").exists() else []:
        if store.exists("acme", blob.name):
            assert dir_sha256(blob) == blob.name
    version = registry.upload("acme", "bot", archive)  # back: the same upload goes through
    assert version.version == 1 and store.exists("acme", version.sha256)


def test_registry_store_timeout_s_is_the_bound(tmp_path):
    store = AdapterStore(RegistryConfig(store_url=str(tmp_path / "s"), store_timeout_s=7.5))
    assert store.io.timeout_s == 7.5
