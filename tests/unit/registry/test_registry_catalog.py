"""AdapterCatalog: the one authority on versions (numbering, resolving, listing, deleting), on
SQLite and PostgreSQL."""

from __future__ import annotations

import threading

import pytest

from loraplex.db.engine import make_engine
from loraplex.registry.catalog import AdapterCatalog, group_by_name
from loraplex.registry.store import AdapterNotFound

FACTS = {"rank": 8, "target_modules": ["q_proj", "v_proj"], "base_model": "SmolLM2-135M-Instruct",
         "size_bytes": 1234}


def sha(c: str) -> str:
    return c * 64


@pytest.fixture
def catalog(db_url):
    engine = make_engine(db_url)
    yield AdapterCatalog(engine)
    engine.dispose()  # Postgres cannot drop a database with open connections


def test_versions_are_numbered_resolved_and_listed(catalog):
    v1 = catalog.add("acme", "bot", sha("a"), **FACTS)
    assert (v1.version, v1.sha256, v1.rank, v1.target_modules) == (1, sha("a"), 8, ["q_proj", "v_proj"])
    assert v1.lora_name == f"acme/bot@1:{sha('a')}" and v1.created_at.endswith("Z")
    assert catalog.add("acme", "bot", sha("a"), **FACTS) == v1  # same weights: same version, same id
    v2 = catalog.add("acme", "bot", sha("b"), **FACTS)
    assert v2.version == 2 and v2.id != v1.id

    assert catalog.resolve("acme", "bot") == v2  # latest
    assert catalog.resolve("acme", "bot@") == v2
    assert catalog.resolve("acme", "bot@1") == v1
    assert catalog.resolve("acme", f"bot@{sha('b')}") == v2
    for ref in ("bot@3", "bot@0", f"bot@{sha('c')}", "other"):
        with pytest.raises(AdapterNotFound) as e:
            catalog.resolve("acme", ref)
        assert e.value.status == 404
    with pytest.raises(AdapterNotFound):
        catalog.resolve("globex", "bot")  # another tenant's adapter is just missing

    other = catalog.add("acme", "another", sha("a"), **FACTS)  # same weights, another name
    assert other.version == 1 and other.id not in (v1.id, v2.id)
    assert [(v.name, v.version) for v in catalog.list("acme")] == [("another", 1), ("bot", 1), ("bot", 2)]
    assert list(group_by_name(catalog.list("acme"))) == ["another", "bot"]
    assert catalog.list("globex") == []


def test_delete_one_version_or_all_and_numbers_are_never_reused(catalog):
    v1 = catalog.add("acme", "bot", sha("a"), **FACTS)
    v2 = catalog.add("acme", "bot", sha("b"), **FACTS)
    assert catalog.delete("acme", "bot@2") == [v2]
    assert catalog.resolve("acme", "bot") == v1
    assert catalog.deleted_among([v1.id, v2.id]) == {v2.id} and catalog.deleted_among([]) == set()
    assert catalog.add("acme", "bot", sha("c"), **FACTS).version == 3

    assert [v.version for v in catalog.delete("acme", "bot")] == [1, 3]
    assert catalog.list("acme") == []
    for ref in ("bot", "bot@1"):
        with pytest.raises(AdapterNotFound):
            catalog.delete("acme", ref)

    # The same weights again after a delete: a new version with a new id (lora_int_id) and name,
    # never the deleted row revived, so a replica that saw the delete keeps refusing only that id.
    again = catalog.add("acme", "bot", sha("a"), **FACTS)
    assert again.version == 4 and again.id not in (v1.id, v2.id) and again.lora_name != v1.lora_name
    assert catalog.resolve("acme", "bot") == again == catalog.resolve("acme", f"bot@{sha('a')}")
    assert catalog.deleted_among([v1.id, again.id]) == {v1.id}
    with pytest.raises(AdapterNotFound):
        catalog.resolve("acme", "bot@1")
    assert catalog.add("acme", "bot", sha("a"), **FACTS) == again  # while live: the same version


def test_a_registry_v1_database_lets_deleted_weights_come_back(db_url):
    """A database made before registry v2 had (tenant, name, sha256) unique over deleted rows
    too; its migration keeps the rows and ids and lifts that for deleted rows."""
    from datetime import datetime, timezone

    from sqlalchemy import MetaData, Table, UniqueConstraint, insert

    from loraplex.db.migrations import Migration, migrate
    from loraplex.registry.catalog import adapter_versions

    engine = make_engine(db_url)
    old = Table("adapter_versions", MetaData(), *[c._copy() for c in adapter_versions.columns],
                UniqueConstraint("tenant_id", "name", "version", name="uq_adapter_versions_tenant_name_version"),
                UniqueConstraint("tenant_id", "name", "sha256", name="uq_adapter_versions_tenant_name_sha256"))
    migrate(engine, [Migration("registry", 1, "adapter_versions", lambda conn: old.create(conn))])
    now = datetime.now(timezone.utc)
    with engine.begin() as conn:
        conn.execute(insert(old).values(id=7, tenant_id="acme", name="bot", version=1, sha256=sha("a"), rank=8,
                                        target_modules=["q_proj"], base_model=None, size_bytes=1, created_at=now,
                                        deleted_at=now))
    catalog = AdapterCatalog(engine)  # applies registry v2
    again = catalog.add("acme", "bot", sha("a"), **FACTS)
    assert (again.version, catalog.deleted_among([7, again.id])) == (2, {7}) and again.id != 7
    with pytest.raises(Exception):  # two live rows of one name and weights stay impossible
        with engine.begin() as conn:
            conn.execute(insert(adapter_versions).values(
                tenant_id="acme", name="bot", version=3, sha256=sha("a"), rank=8, target_modules=["q_proj"],
                base_model=None, size_bytes=1, created_at=now))
    engine.dispose()


def test_sha_in_use_counts_live_versions_of_the_tenant_only(catalog):
    catalog.add("acme", "bot", sha("a"), **FACTS)
    catalog.add("acme", "copy", sha("a"), **FACTS)
    catalog.delete("acme", "bot")
    assert catalog.sha_in_use("acme", sha("a"))
    catalog.delete("acme", "copy")
    assert not catalog.sha_in_use("acme", sha("a"))
    assert not catalog.sha_in_use("globex", sha("b"))


def test_concurrent_uploads_to_one_name_get_distinct_numbers(catalog):
    results, errors = [], []

    def add(c):
        try:
            results.append(catalog.add("acme", "bot", sha(c), **FACTS).version)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=add, args=(c,)) for c in "abcdef"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and sorted(results) == [1, 2, 3, 4, 5, 6]


def test_response_body(catalog):
    body = catalog.add("acme", "bot", sha("a"), **FACTS).to_response()
    assert set(body) == {"name", "version", "sha256", "rank", "target_modules", "base_model",
                         "size_bytes", "created_at", "pinned"}


def test_pins_are_listed_first_pinned_first_bounded_and_dropped_on_delete(catalog):
    a = catalog.add("acme", "a", sha("a"), **FACTS)
    b = catalog.add("globex", "b", sha("b"), **FACTS)
    c = catalog.add("acme", "c", sha("c"), **FACTS)
    assert catalog.pin("globex", "b", True, max_pinned=2).pinned
    assert catalog.pin("acme", "a@1", True, max_pinned=2).pinned
    assert [v.id for v in catalog.pinned()] == [b.id, a.id] and catalog.resolve("acme", "a").pinned
    with pytest.raises(Exception) as e:
        catalog.pin("acme", "c", True, max_pinned=2)
    assert e.value.status == 409
    assert catalog.pin("acme", "a", True, max_pinned=2).pinned  # pinning a pinned one again is no new pin
    assert not catalog.pin("globex", "b", False).pinned
    catalog.delete("acme", "a")
    assert catalog.pinned() == [] and catalog.pin("acme", "c", True, max_pinned=2).id == c.id
    with pytest.raises(AdapterNotFound):
        catalog.pin("globex", "a", True)


def test_pins_are_bounded_and_listed_per_base_model(catalog):
    """Each base's pool has its own CPU tier: a pin counts against its base's bound only, and a
    pool's replicas load their own base's pins only (an adapter of another base would not fit)."""
    facts = {k: v for k, v in FACTS.items() if k != "base_model"}
    small = [catalog.add("acme", f"s{i}", sha(c), base_model="small", **facts) for i, c in enumerate("de")]
    large = catalog.add("acme", "l0", sha("f"), base_model="large", **facts)
    bounds = {"small": 1, "large": 1}
    assert catalog.pin("acme", "s0", True, max_pinned=bounds).pinned
    with pytest.raises(Exception) as e:  # small's one place is taken
        catalog.pin("acme", "s1", True, max_pinned=bounds)
    assert e.value.status == 409
    assert catalog.pin("acme", "l0", True, max_pinned=bounds).pinned  # large has its own place
    assert [v.id for v in catalog.pinned("small")] == [small[0].id]
    assert [v.id for v in catalog.pinned("large")] == [large.id]
    assert [v.id for v in catalog.pinned()] == [small[0].id, large.id]
