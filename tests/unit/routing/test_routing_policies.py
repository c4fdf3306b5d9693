import pytest

from loraplex.routing import (POLICIES, ReplicaSnapshot, RouteRequest, TenantAffinityPolicy,
                              chain_hashes, make_policy, rendezvous_order)
from loraplex.routing.baselines import (LeastPendingTokensPolicy, PowerOfTwoPolicy,
                                        RoundRobinPolicy, StickyHashPolicy)
from loraplex.routing.cache_aware import CacheAwarePolicy
from loraplex.routing.prefix_index import PrefixIndex
from loraplex.routing.prefix_tree import PrefixTreePolicy


def snaps(*loads, tokens=None):
    tokens = tokens or [0] * len(loads)
    return [ReplicaSnapshot(f"r{i}", running=n, pending_tokens=t)
            for i, (n, t) in enumerate(zip(loads, tokens))]


def prompt_request(text, key="acme"):
    return RouteRequest(key, len(text), chain_hashes(text, block_size=4))


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_every_policy_ranks_known_replicas_and_survives_removal(name):
    policy = make_policy(name)
    replicas = snaps(3, 0, 5, 1)
    request = prompt_request("system prompt of acme, then a question")
    ranked = policy.rank(request, replicas)
    assert ranked and len(set(ranked)) == len(ranked)
    assert set(ranked) <= {r.replica_id for r in replicas}
    policy.on_routed(request, ranked[0])
    policy.on_replica_removed(ranked[0])
    rest = [r for r in replicas if r.replica_id != ranked[0]]
    assert set(policy.rank(request, rest)) <= {r.replica_id for r in rest}


def test_make_policy_rejects_unknown_names():
    with pytest.raises(ValueError, match="tenant_affinity"):
        make_policy("fastest")


def test_tenant_affinity_remembers_routed_keys_until_the_replica_goes():
    policy = TenantAffinityPolicy()
    replicas = snaps(0, 0, 0, 0)
    second = rendezvous_order("acme", [r.replica_id for r in replicas])[1]
    policy.on_routed(RouteRequest("acme"), second)
    assert policy.rank(RouteRequest("acme"), replicas)[0] == second
    policy.on_replica_removed(second)
    assert policy.rank(RouteRequest("acme"), replicas)[0] != second


def test_tenant_affinity_uses_engine_reports():
    policy = TenantAffinityPolicy()
    ids = [f"r{i}" for i in range(4)]
    last = rendezvous_order("acme/bot", ids)[-1]
    replicas = snaps(0, 0, 0, 0)
    replicas[ids.index(last)].held_keys = frozenset({"acme/bot"})
    assert policy.rank(RouteRequest("acme/bot"), replicas)[0] == last


def test_engine_stats_replace_what_the_router_believed():
    policy = TenantAffinityPolicy()
    ids = [f"r{i}" for i in range(4)]
    last = rendezvous_order("acme", ids)[-1]
    policy.on_routed(RouteRequest("acme"), last)
    assert policy.rank(RouteRequest("acme"), snaps(0, 0, 0, 0))[0] == last
    policy.on_stats(last, ["other"])  # the engine evicted acme's adapter
    assert policy.rank(RouteRequest("acme"), snaps(0, 0, 0, 0))[0] == rendezvous_order(
        "acme", ids)[0]


def test_tenant_affinity_forgets_least_recent_keys_beyond_its_estimate():
    policy = TenantAffinityPolicy(keys_per_replica=2)
    for key in ("a", "b", "c"):
        policy.on_routed(RouteRequest(key), "r0")
    assert policy.held.holders("a") == set()
    assert policy.held.holders("c") == {"r0"}


def test_power_of_two_prefers_the_shorter_of_its_two_samples():
    policy = PowerOfTwoPolicy(seed=1)
    replicas = snaps(4, 2)
    assert policy.rank(RouteRequest("t"), replicas) == ["r1", "r0"]


def test_round_robin_rotates():
    policy = RoundRobinPolicy()
    replicas = snaps(0, 0, 0)
    assert [policy.rank(RouteRequest("t"), replicas)[0] for _ in range(4)] == [
        "r0", "r1", "r2", "r0"]


def test_least_pending_tokens_orders_by_tokens_not_requests():
    ranked = LeastPendingTokensPolicy().rank(RouteRequest("t"), snaps(1, 5, tokens=[900, 100]))
    assert ranked == ["r1", "r0"]


def test_sticky_hash_ignores_load():
    replicas = snaps(100, 100, 100)
    top = rendezvous_order("t", [r.replica_id for r in replicas])[0]
    replicas[int(top[1:])].running = 10_000
    assert StickyHashPolicy().rank(RouteRequest("t"), replicas)[0] == top


def test_chain_hashes_share_a_prefix_and_drop_the_partial_block():
    a = chain_hashes("abcdefgh-tail", block_size=4)
    b = chain_hashes("abcdefgX", block_size=4)
    assert len(a) == 3 and len(b) == 2
    assert a[0] == b[0] and a[1] != b[1]
    assert chain_hashes([1, 2, 3, 4, 5], block_size=2) == chain_hashes([1, 2, 3, 4], block_size=2)


def test_prefix_index_matches_and_trims_least_recent_tails():
    index = PrefixIndex(blocks_per_replica=4)
    index.insert("r0", (1, 2, 3))
    assert index.match((1, 2, 9), ["r0", "r1"]) == {"r0": 2}
    index.insert("r0", (7, 8))  # 5 blocks > 4: the oldest, block 3 (r0's tail), goes
    assert index.match((1, 2, 3), ["r0"]) == {"r0": 2}
    index.remove_replica("r0")
    assert index.match((1,), ["r0"]) == {}


def test_prefix_tree_follows_the_match_and_places_new_prefixes_on_small_trees():
    policy = PrefixTreePolicy(seed=0)
    replicas = snaps(0, 0, 0)
    shared = "you are acme's support bot. "
    policy.on_routed(prompt_request(shared + "q1"), "r2")
    assert policy.rank(prompt_request(shared + "q2"), replicas)[0] == "r2"
    # No match: a replica with an empty tree, least loaded first.
    assert policy.rank(prompt_request("something else entirely"), snaps(0, 3, 1))[0] == "r0"


def test_cache_aware_balances_only_past_both_thresholds():
    policy = CacheAwarePolicy(balance_abs_threshold=4, balance_rel_threshold=1.5)
    shared = "you are acme's support bot. "
    policy.on_routed(prompt_request(shared + "q1"), "r0")
    request = prompt_request(shared + "q2")
    assert policy.rank(request, snaps(4, 0, 1))[0] == "r0"  # diff 4 is not > 4
    assert policy.rank(request, snaps(9, 0, 1))[0] == "r1"  # 9 - 0 > 4 and 9 > 0 * 1.5
    # Below the cache threshold: the smallest tree, i.e. an untouched replica.
    assert policy.rank(prompt_request("unrelated words here"), snaps(0, 1, 2))[0] == "r1"
