"""The comparison policies (bench.routing) on snapshots, as the simulator and router run them."""
import pytest

from bench.routing.baselines import (LeastPendingTokensPolicy, PowerOfTwoPolicy,
                                     RoundRobinPolicy, StickyHashPolicy)
from bench.routing.cache_aware import CacheAwarePolicy
from bench.routing.policies import POLICIES, make_policy, serve_policy
from bench.routing.prefix_index import PrefixIndex, PrefixRequest
from bench.routing.prefix_tree import PrefixTreePolicy
from bench.routing.prompt_hashes import chain_hashes
from loraplex.routing.config import RoutingConfig
from loraplex.routing.rendezvous import rendezvous_order
from loraplex.routing.snapshot import ReplicaSnapshot, RouteRequest


def snaps(*loads, tokens=None):
    tokens = tokens or [0] * len(loads)
    return [ReplicaSnapshot(f"r{i}", in_flight=n, pending_tokens=t)
            for i, (n, t) in enumerate(zip(loads, tokens))]


def prompt_request(text, key="acme"):
    return PrefixRequest(key, len(text), chain_hashes(text, block_size=4))


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


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_every_policy_has_a_name_a_deployment_config_accepts(name):
    config = RoutingConfig(policy=serve_policy(name))
    if name == "power_of_two":
        assert config.policy == "power_of_two"  # on real replicas, Serve's own router
    else:
        assert type(config.make_policy()) is POLICIES[name]
    with pytest.raises(ValueError, match="fastest"):
        serve_policy("fastest")


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
    replicas[int(top[1:])].in_flight = 10_000
    assert StickyHashPolicy().rank(RouteRequest("t"), replicas)[0] == top


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
