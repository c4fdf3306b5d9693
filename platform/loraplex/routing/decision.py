"""Which kind of choice the router made for a request, for `loraplex_routing_decisions_total`.

- affinity: it went to a replica that held its key (tenant, or tenant/adapter): a warm prefix
  cache and adapter;
- new_key: no candidate held the key, so it was placed fresh (rendezvous order, under the
  new-key load bound);
- spill: replicas held the key but were over the load bound (or full), and another took it;
- ranked: the policy tracks no holders (a comparison policy): ranked, neither of the above;
- fallback: Serve's power of two chose: the call had no key, no policy was built, or it failed.
"""

from __future__ import annotations

from collections.abc import Collection

AFFINITY, NEW_KEY, SPILL, RANKED, FALLBACK = "affinity", "new_key", "spill", "ranked", "fallback"
DECISIONS = (AFFINITY, NEW_KEY, SPILL, RANKED, FALLBACK)


def routing_decision(replica_id: str, holders: Collection[str] | None) -> str:
    """The decision for a request sent to `replica_id`, given the replicas the policy saw holding
    its key when it ranked them (None: the policy does not track holders)."""
    if holders is None:
        return RANKED
    if replica_id in holders:
        return AFFINITY
    return SPILL if holders else NEW_KEY
