"""Synthetic multi-tenant trace: Zipf tenant popularity, shared system prompts, Poisson arrivals.

Each tenant has one system prompt (its prefix chain of blocks) that all its requests share; each
request adds a unique suffix and some output. Times are in units of one token's service time.
"""
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class TraceConfig:
    tenants: int = 1000
    zipf: float = 1.1  # popularity of the k-th tenant is proportional to k^-zipf
    requests: int = 30_000
    block_tokens: int = 16
    prefix_blocks: int = 64  # a 1,024-token system prompt per tenant
    suffix_blocks: tuple[int, int] = (4, 28)  # unique user part: 64 to 448 tokens
    output_tokens: tuple[int, int] = (32, 256)
    output_cost: float = 4.0  # a decoded token costs this many prompt tokens of service
    inflight_per_replica: float = 32.0  # offered load: mean concurrent requests per replica
    # When > 0, this share of all requests goes to tenant 0 (the most popular one) on top of
    # its Zipf share: a tenant whose burst outgrows any single replica.
    hot_share: float = 0.0
    seed: int = 0


@dataclass(frozen=True)
class Trace:
    config: TraceConfig
    tenant: np.ndarray  # tenant index per request
    arrival: np.ndarray  # arrival time per request, increasing
    suffix_blocks: np.ndarray
    output_tokens: np.ndarray

    def __len__(self) -> int:
        return len(self.tenant)

    def prompt_tokens(self, n: int) -> int:
        return (self.config.prefix_blocks + int(self.suffix_blocks[n])) * self.config.block_tokens

    def service_time(self, n: int) -> float:
        # Independent of cache hits, so every policy faces the same offered work.
        return self.prompt_tokens(n) + self.config.output_cost * int(self.output_tokens[n])


def make_trace(config: TraceConfig, replicas: int) -> Trace:
    rng = np.random.default_rng(config.seed)
    weights = np.arange(1, config.tenants + 1, dtype=float) ** -config.zipf
    tenant = rng.choice(config.tenants, size=config.requests, p=weights / weights.sum())
    if config.hot_share > 0:
        tenant[rng.random(config.requests) < config.hot_share] = 0
    suffix = rng.integers(config.suffix_blocks[0], config.suffix_blocks[1] + 1, config.requests)
    output = rng.integers(config.output_tokens[0], config.output_tokens[1] + 1, config.requests)
    mean_service = ((config.prefix_blocks + suffix.mean()) * config.block_tokens
                    + config.output_cost * output.mean())
    # Little's law: arrival rate = in-flight / service time.
    rate = config.inflight_per_replica * replicas / mean_service
    arrival = np.cumsum(rng.exponential(1.0 / rate, config.requests))
    return Trace(config, tenant, arrival, suffix, output)
