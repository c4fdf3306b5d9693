"""KeyCache: a fresh key is a dict lookup; revocation, suspension and limit changes reach a
replica within refresh_s (the refresher, or the request path once an entry is older); during an
outage a key verified within ttl_s keeps working with its last known limits, an unknown one gets
503 + Retry-After (not 401); the size bound holds. Real TenantService on SQLite and PostgreSQL;
the outage is every new connection failing with OperationalError (tests/db_outage.py)."""

import pytest

from db_outage import outage
from loraplex.db.unavailable import StoreUnavailable
from loraplex.tenancy.service import InvalidAPIKey, TenantSuspended
from loraplex.tenancy.config import KeyCacheConfig
from loraplex.tenancy.key_cache import KeyCache


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


@pytest.fixture
def clock():
    return Clock()


def make_cache(service, clock, **cfg):
    # stale_s 0 unless a test is about it: the refresh_s bound is then exact.
    return KeyCache(service, KeyCacheConfig(**{"refresh_s": 10, "ttl_s": 100, "stale_s": 0, **cfg}), clock=clock)


def authenticate(cache, key):
    """What ingress/auth.py does: the dict lookup, else the database."""
    return cache.cached(key) or cache.verify(key)


def tenant_with_key(service, name="acme", **limits):
    tenant = service.create_tenant(name, limits=limits or None)
    record, key = service.issue_key(tenant.id)
    return tenant, record, key


def test_fresh_key_is_served_without_the_database(service, clock):
    cache = make_cache(service, clock)
    tenant, _, key = tenant_with_key(service)
    assert cache.cached(key) is None  # never seen: the caller must verify
    assert cache.verify(key).tenant_id == tenant.id
    with outage(service.engine):  # any query now would fail
        clock.t += 9.9
        assert cache.cached(key).tenant_id == tenant.id


def test_an_entry_past_refresh_s_is_verified_again(service, clock):
    cache = make_cache(service, clock)
    _, record, key = tenant_with_key(service)
    cache.verify(key)
    service.revoke_key(record.id)  # on another replica: this cache is not told
    clock.t += 9.9
    assert cache.cached(key) is not None  # within the bound
    clock.t += 0.1
    assert cache.cached(key) is None  # past it: back to the database, which says revoked
    with pytest.raises(InvalidAPIKey, match="revoked"):
        cache.verify(key)
    assert len(cache) == 0


def test_a_lagging_refresh_serves_the_entry_for_stale_s_without_the_database(service, clock):
    """A slow database: the refresher has not re-verified an entry within refresh_s, and the
    request path serves it (no query) until refresh_s + stale_s, then asks the database."""
    cache = make_cache(service, clock, stale_s=5)
    tenant, record, key = tenant_with_key(service)
    cache.verify(key)
    service.revoke_key(record.id)  # on another replica: this cache is not told
    asked = []
    real = service.authenticate
    service.authenticate = lambda k: asked.append(1) or real(k)
    clock.t += 14.9
    assert cache.cached(key).tenant_id == tenant.id  # past refresh_s, within stale_s
    assert asked == [] and cache.served_stale == 1
    clock.t += 0.1  # refresh_s + stale_s: the revocation bound while the database is slow
    assert cache.cached(key) is None
    with pytest.raises(InvalidAPIKey, match="revoked"):
        cache.verify(key)
    assert asked == [1]


def test_a_refresh_under_way_serves_the_entry_past_stale_s(service, clock):
    """A database slow enough that one refresh outlasts refresh_s + stale_s: while it is under way
    (it re-verifies the entry), requests are served from the entry, never from a query of their
    own; once it has landed, the bound is refresh_s + stale_s from that refresh's start (the
    refresher starts the next at once: its period counts from the last start)."""
    cache = make_cache(service, clock, stale_s=5)
    tenant, _, key = tenant_with_key(service)
    cache.verify(key)
    asked, during = [], []
    real_auth, real_refresh = service.authenticate, service.principals_by_hash
    service.authenticate = lambda k: asked.append(1) or real_auth(k)

    def slow_refresh(digests):  # a fake of a slow database: the clock passes while it runs
        clock.t += 20
        during.append(cache.cached(key))
        return real_refresh(digests)

    service.principals_by_hash = slow_refresh
    clock.t += 6
    assert cache.refresh() is True
    assert during[0] is not None and during[0].tenant_id == tenant.id and asked == []
    # Landed: verified as of its start, 20 s ago, past refresh_s + stale_s, and nothing re-verifying
    # it now: the request path asks.
    assert cache.cached(key) is None
    assert cache.verify(key).tenant_id == tenant.id and asked == [1]


def test_the_refresh_landing_ends_the_stale_period(service, clock):
    cache = make_cache(service, clock, stale_s=5)
    _, record, key = tenant_with_key(service)
    cache.verify(key)
    clock.t += 12
    assert cache.cached(key) is not None and cache.served_stale == 1
    service.revoke_key(record.id)
    assert cache.refresh() is True  # the lagging refresh lands: revoked
    assert cache.cached(key) is None


def test_the_refresher_period_counts_from_the_start_of_the_last_refresh(service):
    """A refresh that takes longer than refresh_s / 2 is followed at once by the next, so the
    entries' age stays within one period plus one refresh's duration."""
    import threading
    import time

    cache = KeyCache(service, KeyCacheConfig(refresh_s=0.4, ttl_s=100))
    starts, done = [], threading.Event()

    def slow_refresh():  # a fake of a slow database: each refresh takes 0.3 s (> refresh_s / 2)
        starts.append(time.monotonic())
        time.sleep(0.3)
        if len(starts) >= 4:
            done.set()
        return True

    cache.refresh = slow_refresh
    cache.start()
    assert done.wait(5)
    cache.close()
    gaps = [b - a for a, b in zip(starts, starts[1:])]
    assert max(gaps) < 0.45, gaps  # 0.3 s, not 0.3 + 0.2 s (the period after the refresh ended)


def test_refresher_applies_revocation_suspension_and_limits_within_the_bound(service, clock):
    cache = make_cache(service, clock)
    a, a_key_rec, a_key = tenant_with_key(service, "a")
    b, _, b_key = tenant_with_key(service, "b")
    c, _, c_key = tenant_with_key(service, "c", requests_per_minute=10)
    for key in (a_key, b_key, c_key):
        cache.verify(key)
    service.revoke_key(a_key_rec.id)
    service.update_tenant(b.id, status="suspended")
    service.update_tenant(c.id, limits={"requests_per_minute": 99})
    clock.t += 5  # the refresher's period (refresh_s / 2)
    assert cache.refresh() is True
    assert cache.cached(a_key) is None and cache.cached(b_key) is None
    with pytest.raises(InvalidAPIKey):
        cache.verify(a_key)
    with pytest.raises(TenantSuspended):
        cache.verify(b_key)
    assert cache.cached(c_key).limits.requests_per_minute == 99
    clock.t += 9.9  # refreshed at +5: still fresh at +14.9 with no further query
    with outage(service.engine):
        assert cache.cached(c_key) is not None


def test_refresh_keeps_entries_fresh_so_requests_never_wait(service, clock):
    cache = make_cache(service, clock)
    _, _, key = tenant_with_key(service)
    cache.verify(key)
    for _ in range(10):
        clock.t += 5
        cache.refresh()
        assert cache.cached(key) is not None


def test_outage_serves_keys_verified_within_ttl_with_their_limits(service, clock):
    cache = make_cache(service, clock)
    tenant, _, key = tenant_with_key(service, tokens_per_minute=500)
    cache.verify(key)
    with outage(service.engine):
        clock.t += 50  # past refresh_s: the database would be asked, and cannot answer
        assert cache.refresh() is False
        assert not cache.health.reachable
        principal = authenticate(cache, key)
        assert principal.tenant_id == tenant.id and principal.limits.tokens_per_minute == 500
        assert cache.served_in_outage >= 1
        clock.t += 49.9
        assert authenticate(cache, key).tenant_id == tenant.id
        clock.t += 0.1  # ttl_s since the last verification: no longer trusted
        with pytest.raises(StoreUnavailable) as err:
            authenticate(cache, key)
    assert err.value.status == 503 and err.value.headers["Retry-After"]
    # Back: the next probe (at most refresh_s / 2 after the last failed one) verifies it again.
    clock.t += 5
    assert authenticate(cache, key).tenant_id == tenant.id
    assert cache.health.reachable


def test_unknown_key_during_outage_is_503_not_401(service, clock):
    cache = make_cache(service, clock)
    tenant_with_key(service)
    with outage(service.engine):
        with pytest.raises(StoreUnavailable) as err:
            authenticate(cache, "lpx-" + "x" * 43)
    assert err.value.status == 503 and err.value.code == "store_unavailable"
    assert "Retry-After" in err.value.headers
    # A key that cannot be ours needs no database: 401 even now.
    with outage(service.engine):
        with pytest.raises(InvalidAPIKey):
            authenticate(cache, "sk-not-ours")


def test_outage_does_not_query_per_request(service, clock):
    """While down, requests with a key held here do not wait for connection attempts: the first
    finds the outage, then the refresher alone probes, and its success ends the outage."""
    cache = make_cache(service, clock)
    _, _, key = tenant_with_key(service)
    cache.verify(key)
    attempts = []
    real = service.authenticate
    service.authenticate = lambda k: attempts.append(1) or real(k)
    with outage(service.engine):
        clock.t += 20
        for _ in range(50):
            authenticate(cache, key)
        assert len(attempts) == 1
        clock.t += 30
        authenticate(cache, key)
        assert len(attempts) == 1  # the request path does not probe for a key it holds
        assert cache.refresh() is False  # the refresher does
    assert cache.refresh() is True and cache.health.reachable
    authenticate(cache, key)
    assert len(attempts) == 1


def test_revocation_on_this_replica_holds_at_once(service, clock):
    cache = make_cache(service, clock)
    tenant, record, key = tenant_with_key(service)
    other_tenant, _, other = tenant_with_key(service, "other")
    cache.verify(key), cache.verify(other)
    cache.forget_key(record.id)
    assert cache.cached(key) is None and cache.cached(other) is not None
    cache.verify(key)
    cache.forget_tenant(tenant.id)
    assert cache.cached(key) is None and cache.cached(other) is not None


def test_size_bound_forgets_the_least_recently_used(service, clock):
    cache = make_cache(service, clock, max_entries=2)
    keys = [tenant_with_key(service, f"t{i}")[2] for i in range(3)]
    cache.verify(keys[0]), cache.verify(keys[1])
    cache.cached(keys[0])  # used: keys[1] is now the least recently used
    cache.verify(keys[2])
    assert len(cache) == 2
    assert cache.cached(keys[1]) is None
    assert cache.cached(keys[0]) is not None and cache.cached(keys[2]) is not None


def test_unused_keys_are_forgotten_after_ttl(service, clock):
    cache = make_cache(service, clock)
    _, _, key = tenant_with_key(service)
    cache.verify(key)
    clock.t += 100
    cache.refresh()
    assert len(cache) == 0


def test_refresh_s_setting_is_the_bound(service, clock):
    """The knob takes effect: a longer refresh_s keeps an entry longer without a query."""
    _, _, key = tenant_with_key(service)
    short, long = make_cache(service, clock, refresh_s=2), make_cache(service, clock, refresh_s=30)
    short.verify(key), long.verify(key)
    clock.t += 5
    assert short.cached(key) is None and long.cached(key) is not None


# --- unknown keys and a busy pool (issue 34) -----------------------------------------------------

class CountingService:
    """The TenantService, counting the authentication queries made."""

    def __init__(self, service):
        self.service, self.queries = service, 0

    def authenticate(self, key):
        self.queries += 1
        return self.service.authenticate(key)

    def __getattr__(self, name):
        return getattr(self.service, name)


def test_a_random_key_costs_one_query_per_negative_s(service, clock):
    counting = CountingService(service)
    cache = make_cache(counting, clock, negative_s=5)
    random_key = "lpx-" + "r" * 40
    for _ in range(20):
        with pytest.raises(InvalidAPIKey):
            authenticate(cache, random_key)
    assert counting.queries == 1
    clock.t += 5.1  # the negative entry expires: looked up again
    with pytest.raises(InvalidAPIKey):
        authenticate(cache, random_key)
    assert counting.queries == 2


def test_negative_s_zero_looks_every_unknown_key_up(service, clock):
    counting = CountingService(service)
    cache = make_cache(counting, clock, negative_s=0)
    for _ in range(3):
        with pytest.raises(InvalidAPIKey):
            authenticate(cache, "lpx-" + "r" * 40)
    assert counting.queries == 3


def test_unknown_keys_are_bounded_by_max_entries(service, clock):
    cache = make_cache(service, clock, negative_s=5, max_entries=3)
    for i in range(10):
        with pytest.raises(InvalidAPIKey):
            authenticate(cache, f"lpx-{i:040d}")
    assert len(cache._unknown) == 3


class ExhaustedPool:
    """Every query: QueuePool found no free connection within pool_timeout."""

    def __init__(self, service):
        self.service = service

    def authenticate(self, key):
        from sqlalchemy.exc import TimeoutError as PoolTimeout

        raise PoolTimeout("QueuePool limit of size 5 overflow 10 reached, connection timed out")

    principals_by_hash = ping = lambda self, *a: self.authenticate(None)

    def __getattr__(self, name):
        return getattr(self.service, name)


def test_an_exhausted_pool_is_503_busy_not_an_outage(service, clock):
    from loraplex.db.unavailable import StoreBusy

    tenant, _, known = tenant_with_key(service)
    cache = make_cache(service, clock)
    cache.verify(known)
    cache.service = ExhaustedPool(service)
    clock.t += 11  # past refresh_s: the known key needs verifying
    with pytest.raises(StoreBusy) as e:
        cache.verify("lpx-" + "u" * 40)
    assert e.value.status == 503 and e.value.headers["Retry-After"]
    assert cache.verify(known).tenant_id == tenant.id  # verified within ttl_s: served as last known
    assert cache.refresh() is False
    assert cache._down_at is None and cache.health.reachable  # never the outage mode
