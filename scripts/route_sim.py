"""Compare routing policies on a simulated multi-tenant trace (no Ray, no GPU).

    python scripts/route_sim.py                # the full table (about 90 s of CPU on one core)
    python scripts/route_sim.py --replicas 8 --zipf 1.1 --policies tenant_affinity sticky_hash
    python scripts/route_sim.py --adapters     # LoRA slots: today's placement vs residency_aware

Every policy is the code the Ray router runs (loraplex.routing for tenant affinity,
bench.routing for the comparison policies); see docs/route_sim.md.
"""
import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

# bench/ sits at the repository root, next to scripts/.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.routing.policies import POLICIES  # noqa: E402
from bench.routing.simulator import (SimResult, default_cache_blocks, sim_policy,  # noqa: E402
                                     simulate)
from bench.routing.adapter_sim import AdapterSimConfig, simulate_adapters  # noqa: E402
from bench.routing.trace import TraceConfig, make_trace  # noqa: E402

LOAD_LIMIT = 1.25  # the max/mean load the acceptance test allows
STICKY_SLACK = 0.95  # tenant affinity must keep this share of sticky hashing's hit rate


def run(config: TraceConfig, replicas: int, policies: list[str],
        pool_factor: float) -> list[SimResult]:
    trace = make_trace(config, replicas)
    cache_blocks = default_cache_blocks(config, replicas, pool_factor)
    return [simulate(sim_policy(name, cache_blocks, config), trace, replicas, cache_blocks)
            for name in policies]


def print_table(results: list[SimResult]) -> None:
    print(f"{'policy':<22}| replicas | zipf | hit rate | max/mean load | peak max/mean")
    for r in results:
        print(f"{r.policy:<22}| {r.replicas:>8} | {r.zipf:>4} | {r.hit_rate:>8.4f} "
              f"| {r.max_mean_load:>13.2f} | {r.peak_max_mean:>13.2f}")


def print_hot_table(results: list[SimResult]) -> None:
    print(f"{'policy':<22}| replicas | zipf | hot share | hit rate | hot tenant hit "
          f"| max/mean load")
    for r in results:
        print(f"{r.policy:<22}| {r.replicas:>8} | {r.zipf:>4} | {r.hot_share:>9.2f} "
              f"| {r.hit_rate:>8.4f} | {r.hot_hit_rate:>14.4f} | {r.max_mean_load:>13.2f}")


def verdict(results: list[SimResult]) -> str:
    """The issue's acceptance test for one (replicas, zipf) cell."""
    by_name = {r.policy: r for r in results}
    ta, sticky = by_name.get("tenant_affinity"), by_name.get("sticky_hash")
    if ta is None:
        return "no tenant_affinity row"
    others = [r for r in results if r.policy not in ("tenant_affinity", "sticky_hash")]
    bounded = [r for r in others if r.max_mean_load <= LOAD_LIMIT]
    checks = [
        (f"load {ta.max_mean_load:.2f} <= {LOAD_LIMIT}", ta.max_mean_load <= LOAD_LIMIT),
        ("hit >= every policy within the load limit",
         all(ta.hit_rate >= r.hit_rate for r in bounded)),
        ("hit >= every policy at any load", all(ta.hit_rate >= r.hit_rate for r in others)),
    ]
    if sticky is not None:
        share = ta.hit_rate / sticky.hit_rate
        checks.append((f"{share:.1%} of sticky's hit", share >= STICKY_SLACK))
    return "; ".join(f"{text}: {'yes' if ok else 'NO'}" for text, ok in checks)


ADAPTER_CELLS = [(2, 8, 1.1), (2, 8, 0.6), (2, 16, 1.1), (4, 16, 1.1), (8, 64, 1.1)]  # replicas, adapters, zipf
ADAPTER_POLICIES = ["tenant_affinity", "residency_aware"]


def run_adapters(seed: int) -> None:
    """Each cell with today's placement and the residency-aware one, and their ratio."""
    print("Adapters: closed loop, 8 clients per replica, one adapter per tenant (Zipf), max_loras 4, "
          "max_cpu_loras 8, 16 seqs per replica (bench/routing/adapter_sim.py)\n")
    print(f"{'policy':<16}| repl | adapters | zipf | out tok/s | TTFT p50 | TTFT p95 | hit rate | loads | swaps "
          "| worst adapter hit vs today")
    for replicas, adapters, zipf in ADAPTER_CELLS:
        cfg = AdapterSimConfig(replicas=replicas, adapters=adapters, zipf=zipf, clients=8 * replicas,
                               max_num_seqs=16, seed=seed, requests=1500 * replicas)
        rows = {name: simulate_adapters(cfg, name) for name in ADAPTER_POLICIES}
        today = rows["tenant_affinity"]
        for name, r in rows.items():
            worst = min(r.hit_by_adapter[k] - today.hit_by_adapter[k] for k in today.hit_by_adapter)
            print(f"{name:<16}| {replicas:>4} | {adapters:>8} | {zipf:>4} | {r.output_tok_s:>9.0f} | "
                  f"{r.ttft_p50:>8.3f} | {r.ttft_p95:>8.3f} | {r.hit_rate:>8.3f} | {r.loads:>5} | {r.swaps:>5} "
                  f"| {worst * 100:+.1f} points")
        new = rows["residency_aware"]
        print(f"{'  new / today':<16}|      |          |      | {new.output_tok_s / today.output_tok_s:>8.2f}x | "
              f"{new.ttft_p50 / today.ttft_p50:>7.2f}x | {new.ttft_p95 / today.ttft_p95:>7.2f}x |          | "
              f"      | {new.swaps / max(today.swaps, 1):.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replicas", type=int, nargs="+", default=[8, 64])
    parser.add_argument("--zipf", type=float, nargs="+", default=[0.6, 1.1])
    parser.add_argument("--policies", nargs="+", default=list(POLICIES), choices=list(POLICIES))
    parser.add_argument("--tenants", type=int, default=1000)
    parser.add_argument("--requests", type=int, default=30_000)
    parser.add_argument("--inflight", type=float, default=64.0,
                        help="offered load: mean in-flight requests per replica")
    parser.add_argument("--pool-factor", type=float, default=1.5,
                        help="the replicas' caches together hold every prefix this many times")
    parser.add_argument("--hot-share", type=float, default=0.3,
                        help="share of traffic of the one hot tenant (0 skips that scenario)")
    parser.add_argument("--hot-zipf", type=float, default=0.6)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--adapters", action="store_true",
                        help="only the adapter table: LoRA slots and CPU tier, today's placement vs residency_aware")
    args = parser.parse_args()
    if args.adapters:
        started = time.perf_counter()
        run_adapters(args.seed)
        print(f"\n({time.perf_counter() - started:.0f} s)")
        return

    base = TraceConfig(tenants=args.tenants, requests=args.requests,
                       inflight_per_replica=args.inflight, seed=args.seed)
    started = time.perf_counter()
    print(f"{args.tenants} tenants, {args.requests} requests, {args.inflight:g} in flight per "
          f"replica, caches hold every prefix {args.pool_factor:g}x over, seed {args.seed}\n")
    results, verdicts = [], []
    for replicas in args.replicas:
        for zipf in args.zipf:
            cell = run(replace(base, zipf=zipf), replicas, args.policies, args.pool_factor)
            results += cell
            verdicts.append(f"{replicas} replicas, zipf {zipf}: {verdict(cell)}")
    print_table(results)
    print()
    print("\n".join(verdicts))

    if args.hot_share > 0:
        hot = [r for replicas in args.replicas
               for r in run(replace(base, zipf=args.hot_zipf, hot_share=args.hot_share),
                            replicas, args.policies, args.pool_factor)]
        print(f"\nOne hot tenant: {args.hot_share:.0%} of all requests go to tenant 0 on top of "
              f"its Zipf share\n")
        print_hot_table(hot)
    print(f"\n({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
