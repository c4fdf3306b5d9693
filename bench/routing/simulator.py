"""Replays a trace against simulated replicas using the real policy code.

Each replica has a BlockCache and a count of in-flight requests; a request occupies its replica
for a service time proportional to its tokens. Replicas do not slow down under load (latency is
not modelled), so a policy's imbalance shows up directly as the load it causes.
"""
import heapq
from dataclasses import dataclass

from bench.routing.block_cache import BlockCache
from bench.routing.policies import make_policy
from bench.routing.prefix_index import PrefixPolicy, PrefixRequest
from bench.routing.trace import Trace, TraceConfig
from loraplex.routing.policy import RoutingPolicy
from loraplex.routing.snapshot import ReplicaSnapshot, RouteRequest

_SUFFIX_BASE = 1 << 48  # block ids above this are per-request suffix blocks


@dataclass(frozen=True)
class SimResult:
    policy: str
    replicas: int
    zipf: float
    hot_share: float
    hit_rate: float  # cached prompt tokens / prompt tokens
    max_mean_load: float  # max / mean of per-replica work (time-averaged in-flight requests)
    peak_max_mean: float  # max / mean of in-flight requests seen at arrivals, averaged
    hot_hit_rate: float  # hit rate of tenant 0 alone (the hot tenant when there is one)


def default_cache_blocks(config: TraceConfig, replicas: int, pool_factor: float = 1.5) -> int:
    """Per-replica capacity: the pool holds every prefix pool_factor times over, one replica
    holds only a slice of them."""
    return int(pool_factor * config.tenants * config.prefix_blocks / replicas)


def sim_policy(name: str, cache_blocks: int, config: TraceConfig) -> RoutingPolicy:
    """A policy told what a real deployment would configure: the replicas' cache size."""
    options = {
        # The router mirrors each replica's prefix cache in tokens, as the prefix policies
        # mirror it in blocks.
        "tenant_affinity": {"tokens_per_replica": cache_blocks * config.block_tokens},
        "prefix_tree": {"blocks_per_replica": cache_blocks, "seed": config.seed},
        "cache_aware": {"blocks_per_replica": cache_blocks},
        "power_of_two": {"seed": config.seed},
    }.get(name, {})
    return make_policy(name, **options)


def simulate(policy: RoutingPolicy, trace: Trace, replicas: int, cache_blocks: int,
             warmup: float = 0.25) -> SimResult:
    """Route every request of the trace; measure after the first `warmup` fraction."""
    cfg = trace.config
    snaps = [ReplicaSnapshot(f"replica-{i}") for i in range(replicas)]
    slot = {s.replica_id: i for i, s in enumerate(snaps)}
    caches = [BlockCache(cache_blocks) for _ in snaps]
    work = [0.0] * replicas
    departures: list[tuple[float, int, int]] = []  # (end time, replica slot, pending tokens)
    prefix_hashes: dict[int, tuple[int, ...]] = {}
    start = int(warmup * len(trace))
    hit = prompt = hot_hit = hot_prompt = 0
    in_flight = peak_sum = 0.0

    for n in range(len(trace)):
        now = float(trace.arrival[n])
        while departures and departures[0][0] <= now:
            _, i, tokens = heapq.heappop(departures)
            snaps[i].in_flight -= 1
            snaps[i].pending_tokens -= tokens
            in_flight -= 1
        tenant, suffix = int(trace.tenant[n]), int(trace.suffix_blocks[n])
        key, prompt_tokens = f"tenant-{tenant}", trace.prompt_tokens(n)
        if isinstance(policy, PrefixPolicy):
            # A tenant's prefix block i is the same chain for all its requests; a suffix's
            # blocks are unique to the request.
            if tenant not in prefix_hashes:
                prefix_hashes[tenant] = tuple(tenant * 4096 + b for b in range(cfg.prefix_blocks))
            request = PrefixRequest(key, prompt_tokens, prefix_hashes[tenant] + tuple(
                _SUFFIX_BASE + n * 64 + b for b in range(suffix)))
        else:
            request = RouteRequest(key, prompt_tokens)
        replica_id = policy.rank(request, snaps)[0]
        policy.on_routed(request, replica_id)
        i = slot[replica_id]
        # Suffix first: vLLM frees a request's blocks tail first, so the shared prefix is the
        # most recently used chain and the unique suffix goes first.
        caches[i].touch(("suffix", n), suffix)
        cached = caches[i].touch(tenant, cfg.prefix_blocks) * cfg.block_tokens

        tokens = request.prompt_tokens + int(trace.output_tokens[n])
        service = trace.service_time(n)
        snaps[i].in_flight += 1
        snaps[i].pending_tokens += tokens
        in_flight += 1
        heapq.heappush(departures, (now + service, i, tokens))
        if n >= start:
            hit += cached
            prompt += request.prompt_tokens
            work[i] += service
            peak_sum += max(s.in_flight for s in snaps) / (in_flight / replicas)
            if tenant == 0:
                hot_hit += cached
                hot_prompt += request.prompt_tokens

    measured = len(trace) - start
    return SimResult(
        policy=policy.name, replicas=replicas, zipf=cfg.zipf, hot_share=cfg.hot_share,
        hit_rate=hit / max(prompt, 1),
        max_mean_load=max(work) / (sum(work) / replicas),
        peak_max_mean=peak_sum / max(measured, 1),
        hot_hit_rate=hot_hit / max(hot_prompt, 1),
    )
