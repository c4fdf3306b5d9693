"""The adapter simulator keeps vLLM's LoRA rule (at most max_loras distinct adapters running on a
replica) and reproduces docs/route_sim.md's 2-replica, 8-adapter cell."""

from dataclasses import replace

import bench.routing.adapter_sim as sim
from bench.routing.adapter_sim import AdapterSimConfig, simulate_adapters


def test_no_replica_ever_runs_more_distinct_adapters_than_its_slots(monkeypatch):
    seen = []
    start = sim._Replica.__init__

    def spy(self, *args, **kwargs):
        start(self, *args, **kwargs)
        seen.append(self)
    monkeypatch.setattr(sim._Replica, "__init__", spy)
    peaks = []
    original = sim.heapq.heappush

    def push(heap, item):
        for r in seen:
            peaks.append(len(set(r.running.values())))
        original(heap, item)
    monkeypatch.setattr(sim.heapq, "heappush", push)
    cfg = AdapterSimConfig(requests=800, max_loras=2)
    result = simulate_adapters(cfg, "tenant_affinity")
    assert max(peaks) <= cfg.max_loras and result.swaps > 0 and 0 < result.hit_rate < 1


def test_residency_aware_swaps_less_and_cuts_the_tail_in_the_documented_cell():
    cfg = AdapterSimConfig(replicas=2, adapters=8, zipf=1.1, clients=16, requests=3000)
    today, new = simulate_adapters(cfg, "tenant_affinity"), simulate_adapters(cfg, "residency_aware")
    assert new.swaps < today.swaps and new.ttft_p95 < today.ttft_p95 and new.output_tok_s > today.output_tok_s
    assert simulate_adapters(replace(cfg, seed=1), "residency_aware").swaps < \
        simulate_adapters(replace(cfg, seed=1), "tenant_affinity").swaps
