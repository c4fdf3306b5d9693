from bench.routing.block_cache import BlockCache
from bench.routing.simulator import default_cache_blocks, sim_policy, simulate
from bench.routing.trace import TraceConfig, make_trace

SMALL = TraceConfig(tenants=60, zipf=1.1, requests=3000, inflight_per_replica=16, seed=3)


def test_block_cache_is_lru_and_trims_chains_from_the_tail():
    cache = BlockCache(capacity_blocks=10)
    assert cache.touch("a", 6) == 0
    assert cache.touch("b", 3) == 0
    assert cache.touch("a", 6) == 6  # a is now the most recent
    cache.touch("c", 4)  # 13 blocks: b (least recent, 3 blocks) goes whole
    assert cache.cached_blocks("b") == 0
    cache.touch("d", 2)  # 12 blocks: a (now least recent) loses 2 tail blocks
    assert cache.cached_blocks("a") == 4
    assert cache.touch("a", 6) == 4
    assert cache.used_blocks <= 10


def test_trace_is_seeded_and_honours_the_hot_share():
    a, b = make_trace(SMALL, 4), make_trace(SMALL, 4)
    assert (a.tenant == b.tenant).all() and (a.arrival == b.arrival).all()
    hot = make_trace(TraceConfig(tenants=60, requests=5000, hot_share=0.5), 4)
    assert 0.5 < (hot.tenant == 0).mean() < 0.7  # 0.5 plus its own Zipf share


def test_simulation_is_deterministic_and_ranks_policies_sensibly():
    replicas = 4
    trace = make_trace(SMALL, replicas)
    cache = default_cache_blocks(SMALL, replicas)
    results = {}
    for name in ("tenant_affinity", "round_robin", "sticky_hash", "prefix_tree"):
        first = simulate(sim_policy(name, cache, SMALL), trace, replicas, cache)
        assert simulate(sim_policy(name, cache, SMALL), trace, replicas, cache) == first
        results[name] = first
    affinity = results["tenant_affinity"]
    assert affinity.max_mean_load <= 1.25
    assert affinity.hit_rate > results["round_robin"].hit_rate
    assert results["sticky_hash"].hit_rate >= affinity.hit_rate * 0.9
    assert 0 <= min(r.hit_rate for r in results.values()) <= 0.8  # suffixes never hit
