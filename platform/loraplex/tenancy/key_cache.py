"""KeyCache: the API keys (by sha256) and tenants this ingress replica has verified, so that
authenticating a request is a dict lookup, and verified keys keep working while the database is
down.

The bounds (KeyCacheConfig):
- **Revocation, suspension, a limit change: within `refresh_s`** on every replica while the
  database answers promptly, **within `refresh_s + stale_s`** while it is slow. An entry is fresh
  while it was verified less than `refresh_s` ago (its `verified_at` is when the verifying query
  started, so a change committed before that query is seen by it); a background thread
  re-verifies every entry each `refresh_s / 2` (counted from the start of the previous refresh,
  so a slow refresh does not stretch the period) in one query per 500 keys, so in steady state
  no request waits for the database. An entry the refresher has not re-verified in time is still
  served for `stale_s` more, and for as long as a refresh is under way (stale-while-revalidate,
  up to `ttl_s`: a slow database must not put its latency on requests once the refresh lags, and
  the refresh under way is what re-verifies the entry); only one older than that, with no refresh
  under way, is verified on the request path (one query, in a thread). The replica that serves a revocation, suspension or PATCH forgets the
  entries it touches at once.
- **Outage: `ttl_s`.** While the database cannot be reached, an entry verified less than `ttl_s`
  ago keeps working with its last known tenant and limits; any other key gets 503 + Retry-After
  (StoreUnavailable: we cannot tell a valid key from a wrong one, so never 401). No revocation
  can be made during an outage (the admin API needs the database); one committed less than
  `refresh_s` before the outage began takes effect at the first refresh after it ends.
- **Size: `max_entries`**, the least recently used forgotten first; a key unused for `ttl_s` is
  forgotten by the refresher.
- **Unknown keys: `negative_s`.** A key the database did not know (or knows revoked) is refused
  with 401 from memory for negative_s (at most max_entries of them): random keys cost one query
  each per negative_s, not one per request.
- **A busy pool is not an outage.** No free connection within pool_timeout (every connection in
  use) answers 503 StoreBusy + Retry-After to a key without a recent entry, serves one with an
  entry verified within ttl_s, and leaves the outage mode and /readyz alone.

During an outage the cache does not ask the database for a key it holds: the refresher probes it
each period (`ping` when it holds nothing) and its first success ends the outage. Only a key with
no entry within `ttl_s` tries the database on the request path, at most once per `refresh_s / 2`,
so requests never queue behind connection attempts to a dead (or a slow, timing out) database.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Optional

from loraplex.db.health import StoreHealth
from loraplex.db.unavailable import StoreBusy, StoreUnavailable, is_pool_exhausted, is_unavailable
from loraplex.errors import StatusError
from loraplex.tenancy.config import KeyCacheConfig
from loraplex.tenancy.keys import hash_key
from loraplex.tenancy.models import Principal
from loraplex.tenancy.service import InvalidAPIKey, TenantService, check_key_format

logger = logging.getLogger(__name__)

UNKNOWN_DURING_OUTAGE = ("this API key cannot be checked (this server has not verified it within "
                         "tenancy.key_cache.ttl_s)")


@dataclass
class _Entry:
    principal: Principal
    verified_at: float  # clock time the verifying query started
    used_at: float


class KeyCache:
    def __init__(self, service: TenantService, config: KeyCacheConfig | None = None,
                 health: StoreHealth | None = None, clock=time.monotonic):
        self.service = service
        self.config = config or KeyCacheConfig()
        self.health = health or StoreHealth()
        self.clock = clock
        self._entries: OrderedDict[str, _Entry] = OrderedDict()  # key digest -> entry, least recently used first
        # key digest -> (clock time it was found unknown, the 401): refused from memory for negative_s.
        self._unknown: OrderedDict[str, tuple[float, InvalidAPIKey]] = OrderedDict()
        self.unknown_served = 0  # 401s answered from memory
        self._lock = threading.Lock()  # the refresher thread and the request path both change it
        self._down_at: Optional[float] = None  # clock time of the last failed query; None: reachable
        self.served_in_outage = 0  # authentications answered from an entry because the database was down
        self.served_stale = 0  # answered from an entry past refresh_s (within stale_s) while the refresh lags
        self._refreshing = False  # a refresh is under way: it re-verifies every entry it started with
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    # -- the request path --------------------------------------------------------------------------
    def cached(self, bearer_key: Optional[str]) -> Optional[Principal]:
        """The principal of a fresh entry (no I/O), else None: then call `verify` (in a thread).
        InvalidAPIKey (401) at once for a missing or malformed key."""
        check_key_format(bearer_key)
        digest = hash_key(bearer_key)
        now = self.clock()
        with self._lock:
            entry = self._entries.get(digest)
            if entry is None:
                unknown = self._unknown.get(digest)
                if unknown is not None and now - unknown[0] < self.config.negative_s:
                    self.unknown_served += 1
                    raise InvalidAPIKey(unknown[1].message)
                return None
            age = now - entry.verified_at
            if age >= self.config.refresh_s:
                if age >= self.config.ttl_s:
                    return None  # no longer trusted, whatever the database's state: verify it
                if self._down_at is not None:
                    self.served_in_outage += 1  # the database is down: its last known state stands
                elif age >= self.config.refresh_s + self.config.stale_s and not self._refreshing:
                    return None  # too stale to serve and nothing re-verifying it: the request path
                else:
                    self.served_stale += 1  # the database is slow: the refresher re-verifies it
            entry.used_at = now
            self._entries.move_to_end(digest)
            return entry.principal

    def verify(self, bearer_key: Optional[str]) -> Principal:
        """Authenticate against the database (blocking) and cache the result. InvalidAPIKey 401,
        TenantSuspended 403 (the entry is forgotten), or StoreUnavailable 503 when the database
        cannot be reached and the key has no entry verified within ttl_s."""
        check_key_format(bearer_key)
        digest = hash_key(bearer_key)
        started = self.clock()
        if self._down_at is not None and started - self._down_at < self.config.refresh_s / 2:
            return self._outage_answer(digest, started, None)  # tried moments ago: do not queue on it
        try:
            principal = self.service.authenticate(bearer_key)
        except StatusError as exc:
            self._up()
            self.forget_digest(digest)
            if isinstance(exc, InvalidAPIKey) and self.config.negative_s > 0:
                self._put_unknown(digest, exc, started)
            raise
        except Exception as exc:
            if is_pool_exhausted(exc):
                # Up but busy: not an outage (no outage mode, no degraded readiness); a key
                # verified within ttl_s is served as last known, any other waits for a connection.
                return self._busy_answer(digest, exc)
            if not is_unavailable(exc):
                raise
            self._down(exc)
            return self._outage_answer(digest, self.clock(), exc)
        self._up()
        self._put(digest, principal, started)
        return principal

    def _busy_answer(self, digest: str, exc: BaseException) -> Principal:
        with self._lock:
            entry = self._entries.get(digest)
            if entry is not None and self.clock() - entry.verified_at < self.config.ttl_s:
                return entry.principal
        raise StoreBusy("this API key cannot be checked now")

    def _outage_answer(self, digest: str, now: float, exc: BaseException | None) -> Principal:
        with self._lock:
            entry = self._entries.get(digest)
            if entry is not None and now - entry.verified_at < self.config.ttl_s:
                entry.used_at = now
                self.served_in_outage += 1
                return entry.principal
        raise StoreUnavailable(UNKNOWN_DURING_OUTAGE, exc)

    # -- the replica's own changes ----------------------------------------------------------------
    def forget_digest(self, digest: str) -> None:
        with self._lock:
            self._entries.pop(digest, None)

    def forget_key(self, key_id: str) -> None:
        """A key this replica revoked: refused from its next request here."""
        self._forget(lambda e: e.principal.key_id == key_id)

    def forget_tenant(self, tenant_id: str) -> None:
        """A tenant this replica suspended or changed: its keys are verified again on next use."""
        self._forget(lambda e: e.principal.tenant_id == tenant_id)

    def _forget(self, match) -> None:
        with self._lock:
            for digest in [d for d, e in self._entries.items() if match(e)]:
                del self._entries[digest]

    def __len__(self) -> int:
        return len(self._entries)

    # -- refresh ---------------------------------------------------------------------------------
    def refresh(self) -> bool:
        """Re-verify every entry (forget the unused, revoked, suspended and vanished ones); with
        none, ping. False when the database could not be reached (entries stay as they were)."""
        started = self.clock()
        self._refreshing = True
        try:
            return self._refresh(started)
        finally:
            self._refreshing = False

    def _refresh(self, started: float) -> bool:
        with self._lock:
            for digest in [d for d, e in self._entries.items() if started - e.used_at >= self.config.ttl_s]:
                del self._entries[digest]
            for digest in [d for d, (at, _) in self._unknown.items() if started - at >= self.config.negative_s]:
                del self._unknown[digest]
            digests = list(self._entries)
        try:
            found = self.service.principals_by_hash(digests) if digests else self.service.ping()
        except Exception as exc:
            if is_pool_exhausted(exc):
                return False  # busy, not down: the entries stand, the next period tries again
            if not is_unavailable(exc):
                logger.exception("key cache: refresh failed")
            self._down(exc)
            return False
        self._up()
        with self._lock:
            for digest in digests:
                entry, fresh = self._entries.get(digest), found.get(digest) if found else None
                if entry is None:
                    continue
                if isinstance(fresh, Principal):
                    entry.principal, entry.verified_at = fresh, max(entry.verified_at, started)
                elif entry.verified_at <= started:  # revoked, suspended or gone (not re-added since)
                    del self._entries[digest]
        return True

    def start(self) -> "KeyCache":
        if self._thread is None:
            self._thread = threading.Thread(target=self._refresh_loop, name="key-cache-refresh", daemon=True)
            self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()

    def _refresh_loop(self) -> None:
        period = self.config.refresh_s / 2
        started = time.monotonic()
        # Each refresh starts `period` after the previous one started (at once if that one took
        # longer): a refresh's own duration must not add to the age entries reach before the next.
        while not self._stop.wait(max(0.0, started + period - time.monotonic())):
            started = time.monotonic()
            try:
                self.refresh()
            except Exception:  # never let the refresher die: entries would all fall to the request path
                logger.exception("key cache: refresh failed")

    # -- helpers ---------------------------------------------------------------------------------
    def _put(self, digest: str, principal: Principal, verified_at: float) -> None:
        with self._lock:
            self._entries[digest] = _Entry(principal, verified_at, self.clock())
            self._entries.move_to_end(digest)
            while len(self._entries) > self.config.max_entries:
                self._entries.popitem(last=False)

    def _put_unknown(self, digest: str, exc: InvalidAPIKey, found_at: float) -> None:
        with self._lock:
            self._unknown[digest] = (found_at, exc)
            self._unknown.move_to_end(digest)
            while len(self._unknown) > self.config.max_entries:
                self._unknown.popitem(last=False)

    def _down(self, exc: BaseException) -> None:
        if self._down_at is None:
            logger.warning("key cache: the database cannot be reached (%r); serving keys verified within "
                           "%g s, refusing others with 503", exc, self.config.ttl_s)
        self._down_at = self.clock()
        self.health.failed(exc)

    def _up(self) -> None:
        if self._down_at is not None:
            logger.warning("key cache: the database is reachable again")
        self._down_at = None
        self.health.ok()
