"""Which affinity keys each replica probably holds, as the router has seen it.

The router learns this from what it routed; engines' stats (loaded adapters) correct it. Each
replica's set is an LRU capped at an estimate of how many keys fit in its cache, so keys the
engine has long evicted stop attracting traffic.
"""
from collections import OrderedDict
from collections.abc import Iterable


class HeldKeys:
    def __init__(self, keys_per_replica: int | None = None):
        self.keys_per_replica = keys_per_replica  # None: never forget (engine stats prune)
        self._by_replica: dict[str, OrderedDict[str, None]] = {}
        self._by_key: dict[str, set[str]] = {}

    def holders(self, key: str) -> set[str]:
        return self._by_key.get(key, set())

    def add(self, replica_id: str, key: str) -> None:
        keys = self._by_replica.setdefault(replica_id, OrderedDict())
        if key in keys:
            keys.move_to_end(key)
            return
        keys[key] = None
        self._by_key.setdefault(key, set()).add(replica_id)
        while self.keys_per_replica is not None and len(keys) > self.keys_per_replica:
            old, _ = keys.popitem(last=False)
            self._forget(old, replica_id)

    def replace(self, replica_id: str, keys: Iterable[str]) -> None:
        """Take an engine's report as the truth for that replica."""
        self.remove_replica(replica_id)
        for key in keys:
            self.add(replica_id, key)

    def remove_replica(self, replica_id: str) -> None:
        for key in self._by_replica.pop(replica_id, ()):
            self._forget(key, replica_id)

    def _forget(self, key: str, replica_id: str) -> None:
        owners = self._by_key[key]
        owners.discard(replica_id)
        if not owners:
            del self._by_key[key]
