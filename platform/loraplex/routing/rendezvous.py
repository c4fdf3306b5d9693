"""Rendezvous (highest-random-weight) hashing of an affinity key over replica ids.

Every ingress replica computes the same order without talking to the others, and when a replica
joins or leaves only the keys it wins (or won) change their first choice. The hash must be
stable across processes, so it is blake2b, never Python's salted hash().
"""
from collections.abc import Iterable
from functools import lru_cache
from hashlib import blake2b


def rendezvous_weight(key: str, replica_id: str) -> int:
    # A separator byte that cannot appear in UTF-8 keeps ("a", "bc") and ("ab", "c") apart.
    data = key.encode() + b"\xff" + replica_id.encode()
    return int.from_bytes(blake2b(data, digest_size=8).digest(), "big")


def rendezvous_order(key: str, replica_ids: Iterable[str]) -> list[str]:
    """Replica ids from the key's most to least preferred; independent of input order."""
    return list(_cached_order(key, tuple(sorted(replica_ids))))


@lru_cache(maxsize=65536)
def _cached_order(key: str, replica_ids: tuple[str, ...]) -> tuple[str, ...]:
    # Routing asks for the same (key, replica set) on every request of a tenant; hashing it
    # once keeps the per-request cost at a dict lookup. Ties (2^-64) fall back to the id.
    return tuple(sorted(replica_ids, key=lambda r: (-rendezvous_weight(key, r), r)))
