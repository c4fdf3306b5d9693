"""Which affinity keys each replica probably holds, as the router has seen it.

The router learns this from what it routed; engines' stats (loaded adapters, served keys)
correct it. Each replica's set is an LRU, so keys the engine has long evicted stop attracting
traffic. Two caps, either or both:

- keys_per_replica: a count of keys, the simple estimate;
- tokens_per_replica: the replica's prefix-cache capacity in tokens. The set then mirrors the
  engine's own LRU block cache: every request adds its unique tail, the part beyond its key's
  shared prefix, and refreshes that prefix, so a replica that serves many requests forgets
  sooner, as its cache does. A key's shared prefix is estimated as the shortest prompt the key
  has sent (a system prompt plus the shortest user turn), since the router does not read
  prompts for this policy.

Each (replica, key) also keeps when this router first saw the replica hold the key (a logical
clock): the policy ranks a key's holders oldest first, so a key that spilled onto a replica
that joined returns to the replica it had before instead of following the load there.
"""
from collections import OrderedDict
from collections.abc import Iterable
from itertools import count


class HeldKeys:
    def __init__(self, keys_per_replica: int | None = None,
                 tokens_per_replica: int | None = None):
        self.keys_per_replica = keys_per_replica  # None: no count cap
        self.tokens_per_replica = tokens_per_replica  # None: no token budget
        # Per replica, least recent first: ("k", key) -> shared tokens, ("t", n) -> tail tokens.
        self._lru: dict[str, OrderedDict[tuple, int]] = {}
        self._tokens: dict[str, int] = {}  # sum of the sizes in _lru[replica]
        self._keys: dict[str, int] = {}  # number of ("k", ...) entries in _lru[replica]
        self._by_key: dict[str, set[str]] = {}
        self._shared: dict[str, int] = {}  # shortest prompt seen per key still held somewhere
        self._tails = count()
        self._since: dict[str, dict[str, int]] = {}  # key -> replica -> clock when first held
        self._clock = 0

    def since(self, key: str) -> dict[str, int]:
        """When this router first saw each holder hold the key (smaller: longer held)."""
        return self._since.get(key, {})

    def holders(self, key: str) -> set[str]:
        return self._by_key.get(key, set())

    def keys(self, replica_id: str) -> list[str]:
        """The replica's keys, least recent first."""
        return [k for kind, k in self._lru.get(replica_id, ()) if kind == "k"]

    def add(self, replica_id: str, key: str, prompt_tokens: int = 0,
            since: int | None = None) -> None:
        """A request of `key` with `prompt_tokens` (0 if unknown) went to the replica.
        `since` (default: now) is when the replica started holding the key, if it is new."""
        held_since = self._since.setdefault(key, {})
        if replica_id not in held_since:
            if since is None:
                self._clock += 1
                since = self._clock
            held_since[replica_id] = since
        lru = self._lru.setdefault(replica_id, OrderedDict())
        shared = self._shared.get(key)
        shared = prompt_tokens if shared is None else min(shared, prompt_tokens)
        self._shared[key] = shared
        if self.tokens_per_replica is not None and prompt_tokens > shared:
            # The unique tail goes in before the prefix: engines free a request's blocks tail
            # first, so the shared prefix stays the most recent.
            self._put(replica_id, lru, ("t", next(self._tails)), prompt_tokens - shared)
        self._put(replica_id, lru, ("k", key), shared)
        self._by_key.setdefault(key, set()).add(replica_id)
        self._evict(replica_id, lru)

    def replace(self, replica_id: str, keys: Iterable[str]) -> None:
        """Take an engine's report (least recent first) as the truth for that replica.
        Keys it held before keep their age; keys new to it count from now, without advancing
        the clock, so the reports of one stats round are equally old."""
        before = {key: self._since[key][replica_id] for key in self.keys(replica_id)}
        self.remove_replica(replica_id)
        for key in keys:
            self.add(replica_id, key, self._shared.get(key, 0), before.get(key, self._clock))

    def remove_replica(self, replica_id: str) -> None:
        lru = self._lru.pop(replica_id, None)
        self._tokens.pop(replica_id, None)
        self._keys.pop(replica_id, None)
        for kind, key in lru or ():
            if kind == "k":
                self._forget(key, replica_id)

    def _put(self, replica_id: str, lru: OrderedDict, entry: tuple, size: int) -> None:
        old = lru.pop(entry, None)
        if old is None:
            if entry[0] == "k":
                self._keys[replica_id] = self._keys.get(replica_id, 0) + 1
        else:
            self._tokens[replica_id] -= old
        lru[entry] = size
        self._tokens[replica_id] = self._tokens.get(replica_id, 0) + size

    def _evict(self, replica_id: str, lru: OrderedDict) -> None:
        def over() -> bool:
            return ((self.keys_per_replica is not None
                     and self._keys[replica_id] > self.keys_per_replica)
                    or (self.tokens_per_replica is not None
                        and self._tokens[replica_id] > self.tokens_per_replica))

        # The entry just added (the last) always stays: a replica holds at least what it serves.
        while len(lru) > 1 and over():
            (kind, key), size = lru.popitem(last=False)
            self._tokens[replica_id] -= size
            if kind == "k":
                self._keys[replica_id] -= 1
                self._forget(key, replica_id)

    def _forget(self, key: str, replica_id: str) -> None:
        owners = self._by_key[key]
        owners.discard(replica_id)
        self._since.get(key, {}).pop(replica_id, None)
        if not owners:
            del self._by_key[key]
            self._shared.pop(key, None)
            self._since.pop(key, None)
