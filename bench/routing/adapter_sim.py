"""Adapters on simulated engine replicas: vLLM's LoRA slots, its CPU tier, prefix caches.

Closed loop, as python -m bench loadtest runs: `clients` users each send a request, wait for its end and
send the next; each request is for one of `adapters` adapters (one tenant each, with its own
system prompt) picked by Zipf popularity. Every replica schedules as vLLM's scheduler does with
LoRA: up to `max_num_seqs` running requests, whose distinct adapters are at most `max_loras`; a
waiting request whose adapter would be one too many is skipped until a slot's adapter has no
running request left (FCFS otherwise). Starting a request whose adapter is not in a slot costs
`swap_s` (from the CPU tier) or `load_s` + `swap_s` (from disk; the CPU tier holds
`max_cpu_loras`, least recently used out). TTFT = wait + swap/load + prefill of the uncached
prompt; a request then decodes at `decode_s` per token. Times are made-up but GPU-like (see
docs/route_sim.md); the policies are the code the Ray router runs, fed what the engines report
every `stats_period_s` (routing_stats: held keys, slots, CPU tier, demand) and the live queue
lengths Serve's router sees.
"""
from __future__ import annotations

import heapq
from collections import OrderedDict, deque
from dataclasses import dataclass, field

import numpy as np

from bench.percentile import percentile
from bench.routing.block_cache import BlockCache
from loraplex.routing.policy import RoutingPolicy
from loraplex.routing.residency import ResidencyAwarePolicy
from loraplex.routing.served_keys import KeyDemand, ServedKeys
from loraplex.routing.snapshot import ReplicaSnapshot, RouteRequest
from loraplex.routing.tenant_affinity import TenantAffinityPolicy


@dataclass(frozen=True)
class AdapterSimConfig:
    replicas: int = 2
    adapters: int = 8
    zipf: float = 1.1
    clients: int = 16
    requests: int = 6000
    max_loras: int = 4
    max_cpu_loras: int = 8
    max_num_seqs: int = 16
    block_tokens: int = 16
    prefix_blocks: int = 32  # each adapter's tenant has a 512-token system prompt
    suffix_tokens: tuple[int, int] = (32, 256)
    output_tokens: tuple[int, int] = (32, 256)
    cache_blocks: int = 256  # per replica: the prefixes of 8 adapters fit, with room for suffixes
    decode_s: float = 0.01
    prefill_s_per_token: float = 0.0002
    swap_s: float = 0.05
    load_s: float = 0.5
    stats_period_s: float = 10.0
    seed: int = 0


@dataclass
class AdapterSimResult:
    policy: str
    output_tok_s: float
    ttft_p50: float
    ttft_p95: float
    hit_rate: float
    loads: int  # disk -> CPU tier
    swaps: int  # CPU tier -> slot
    evictions: int  # out of the CPU tier
    ttft_p50_by_adapter: dict[str, float] = field(default_factory=dict)
    hit_by_adapter: dict[str, float] = field(default_factory=dict)


@dataclass
class _Replica:
    snap: ReplicaSnapshot
    cache: BlockCache
    served: ServedKeys
    demand: KeyDemand
    slots: OrderedDict = field(default_factory=OrderedDict)  # adapter -> None, LRU first
    cpu: OrderedDict = field(default_factory=OrderedDict)
    waiting: deque = field(default_factory=deque)
    running: dict = field(default_factory=dict)  # request n -> adapter


def sim_policies(cfg: AdapterSimConfig, clock) -> dict[str, RoutingPolicy]:
    """Today's router (the shipped tenant_affinity defaults) and the residency-aware one."""
    return {"tenant_affinity": TenantAffinityPolicy(min_bound=4, keys_per_replica=256),
            "residency_aware": ResidencyAwarePolicy(min_bound=4, keys_per_replica=256, clock=clock)}


def simulate_adapters(cfg: AdapterSimConfig, policy_name: str) -> AdapterSimResult:
    rng = np.random.default_rng(cfg.seed)
    weights = np.arange(1, cfg.adapters + 1, dtype=float) ** -cfg.zipf
    picks = rng.choice(cfg.adapters, size=cfg.requests, p=weights / weights.sum())
    suffix = rng.integers(cfg.suffix_tokens[0], cfg.suffix_tokens[1] + 1, cfg.requests)
    output = rng.integers(cfg.output_tokens[0], cfg.output_tokens[1] + 1, cfg.requests)
    now = [0.0]
    policy = sim_policies(cfg, lambda: now[0])[policy_name]
    reps = [_Replica(ReplicaSnapshot(f"replica-{i}"), BlockCache(cfg.cache_blocks), ServedKeys(),
                     KeyDemand()) for i in range(cfg.replicas)]
    by_id = {r.snap.replica_id: r for r in reps}
    events: list = []  # (time, seq, kind, payload)
    seq = iter(range(1 << 62))
    arrival, ttft, hits, prompts, key_of = {}, {}, {}, {}, {}
    counts = {"loads": 0, "swaps": 0, "evictions": 0}
    out_tokens = 0
    sent = 0

    def send() -> None:
        nonlocal sent
        if sent < cfg.requests:
            heapq.heappush(events, (now[0], next(seq), "arrive", sent))
            sent += 1

    def report() -> None:
        for r in reps:
            s = r.snap
            s.slot_adapters, s.cpu_adapters = frozenset(r.slots), frozenset(r.cpu)
            s.max_loras, s.adapter_demand = cfg.max_loras, r.demand.snapshot(now[0])
            s.waiting = len(r.waiting)
            s.held_keys = frozenset(r.served.recent())
            policy.on_stats(s.replica_id, reversed(r.served.recent()))
        heapq.heappush(events, (now[0] + cfg.stats_period_s, next(seq), "report", None))

    def start(r: _Replica, n: int) -> None:
        a = key_of[n]
        cost = 0.0
        if a not in r.slots:
            if a not in r.cpu:
                cost += cfg.load_s
                counts["loads"] += 1
                r.cpu[a] = None
                if len(r.cpu) > cfg.max_cpu_loras:
                    victim = next(k for k in r.cpu if k not in r.slots and k != a)
                    del r.cpu[victim]
                    counts["evictions"] += 1
            cost += cfg.swap_s
            counts["swaps"] += 1
            if len(r.slots) >= cfg.max_loras:
                busy = set(r.running.values())
                del r.slots[next(k for k in r.slots if k not in busy)]
            r.slots[a] = None
        r.slots.move_to_end(a)
        r.cpu.move_to_end(a)
        r.cache.touch(("suffix", n), int(suffix[n]) // cfg.block_tokens)
        cached = r.cache.touch(a, cfg.prefix_blocks) * cfg.block_tokens
        prompt = cfg.prefix_blocks * cfg.block_tokens + int(suffix[n])
        hits[n], prompts[n] = cached, prompt
        first = now[0] + cost + (prompt - cached) * cfg.prefill_s_per_token
        ttft[n] = first - arrival[n]
        r.running[n] = a
        heapq.heappush(events, (first + int(output[n]) * cfg.decode_s, next(seq), "finish", (r, n)))

    def schedule(r: _Replica) -> None:
        active = set(r.running.values())
        for n in list(r.waiting):
            if len(r.running) >= cfg.max_num_seqs:
                break
            if key_of[n] in active or len(active) < cfg.max_loras:
                r.waiting.remove(n)
                start(r, n)
                active.add(key_of[n])

    for _ in range(cfg.clients):
        send()
    report()
    while events:
        now[0], _, kind, payload = heapq.heappop(events)
        if kind == "report":
            if any(r.running or r.waiting for r in reps) or sent < cfg.requests:
                report()
        elif kind == "arrive":
            n = payload
            key_of[n] = key = f"tenant-{int(picks[n])}/adapter"
            arrival[n] = now[0]
            request = RouteRequest(key, cfg.prefix_blocks * cfg.block_tokens + int(suffix[n]), adapter=True)
            rid = policy.rank(request, [r.snap for r in reps])[0]
            policy.on_routed(request, rid)
            r = by_id[rid]
            r.snap.in_flight += 1
            r.served.touch(key)
            r.demand.touch(key, now[0])
            r.waiting.append(n)
            schedule(r)
        else:
            r, n = payload
            del r.running[n]
            r.snap.in_flight -= 1
            out_tokens += int(output[n])
            schedule(r)
            send()

    done = sorted(ttft)
    values = [ttft[n] for n in done]
    by_adapter: dict[str, list[int]] = {}
    for n in done:
        by_adapter.setdefault(key_of[n], []).append(n)
    return AdapterSimResult(
        policy=policy_name, output_tok_s=out_tokens / now[0],
        ttft_p50=percentile(values, 50), ttft_p95=percentile(values, 95),
        hit_rate=sum(hits.values()) / sum(prompts.values()), **counts,
        ttft_p50_by_adapter={k: percentile([ttft[n] for n in ns], 50) for k, ns in sorted(by_adapter.items())},
        hit_by_adapter={k: sum(hits[n] for n in ns) / sum(prompts[n] for n in ns) for k, ns in sorted(by_adapter.items())},
    )
