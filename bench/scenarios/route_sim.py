"""Compare routing policies on a simulated multi-tenant trace (no Ray, no GPU).

    python -m bench route_sim                # the full table (about 90 s of CPU on one core)
    python -m bench route_sim --replicas 8 --zipf 1.1 --policies tenant_affinity sticky_hash
    python -m bench route_sim --adapters     # LoRA slots: today's placement vs residency_aware

Every policy is the code the Ray router runs (loraplex.routing for tenant affinity,
bench.routing for the comparison policies); see docs/route_sim.md.
"""
import time
from dataclasses import replace

from bench.report import Table
from bench.routing.adapter_sim import AdapterSimConfig, simulate_adapters
from bench.routing.policies import POLICIES
from bench.routing.simulator import SimResult, default_cache_blocks, sim_policy, simulate
from bench.routing.trace import TraceConfig, make_trace

LOAD_LIMIT = 1.25  # the max/mean load the acceptance test allows
STICKY_SLACK = 0.95  # tenant affinity must keep this share of sticky hashing's hit rate


def simulate_cell(config: TraceConfig, replicas: int, policies: list[str],
                  pool_factor: float) -> list[SimResult]:
    trace = make_trace(config, replicas)
    cache_blocks = default_cache_blocks(config, replicas, pool_factor)
    return [simulate(sim_policy(name, cache_blocks, config), trace, replicas, cache_blocks)
            for name in policies]


def table(results: list[SimResult], title: str = "") -> Table:
    return Table(title, [("policy", "policy"), ("replicas", "replicas", "{:d}"), ("zipf", "zipf", "{:g}"),
                         ("hit_rate", "hit rate", "{:.4f}"), ("max_mean_load", "max/mean load", "{:.2f}"),
                         ("peak_max_mean", "peak max/mean", "{:.2f}")],
                 [{k: getattr(r, k) for k in ("policy", "replicas", "zipf", "hit_rate", "max_mean_load", "peak_max_mean")}
                  for r in results])


def hot_table(results: list[SimResult], title: str) -> Table:
    return Table(title, [("policy", "policy"), ("replicas", "replicas", "{:d}"), ("zipf", "zipf", "{:g}"),
                         ("hot_share", "hot share", "{:.2f}"), ("hit_rate", "hit rate", "{:.4f}"),
                         ("hot_hit_rate", "hot tenant hit", "{:.4f}"), ("max_mean_load", "max/mean load", "{:.2f}")],
                 [{k: getattr(r, k) for k in ("policy", "replicas", "zipf", "hot_share", "hit_rate", "hot_hit_rate",
                                              "max_mean_load")} for r in results])


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


def run_adapters(out, seed: int) -> None:
    """Each cell with today's placement and the residency-aware one, and their ratio."""
    table = Table("Adapters: closed loop, 8 clients per replica, one adapter per tenant (Zipf), max_loras 4, "
                  "max_cpu_loras 8, 16 seqs per replica (bench/routing/adapter_sim.py)",
                  [("policy", "policy"), ("replicas", "repl", "{:d}"), ("adapters", "adapters", "{:d}"),
                   ("zipf", "zipf", "{:g}"), ("output_tok_s", "out tok/s", "{:.0f}"), ("ttft_p50", "TTFT p50", "{:.3f}"),
                   ("ttft_p95", "TTFT p95", "{:.3f}"), ("hit_rate", "hit rate", "{:.3f}"), ("loads", "loads", "{:d}"),
                   ("swaps", "swaps", "{:d}"), ("worst", "worst adapter hit vs today", "{:+.1f} points")])
    for replicas, adapters, zipf in ADAPTER_CELLS:
        cfg = AdapterSimConfig(replicas=replicas, adapters=adapters, zipf=zipf, clients=8 * replicas,
                               max_num_seqs=16, seed=seed, requests=1500 * replicas)
        rows = {name: simulate_adapters(cfg, name) for name in ADAPTER_POLICIES}
        today = rows["tenant_affinity"]
        for name, r in rows.items():
            worst = min(r.hit_by_adapter[k] - today.hit_by_adapter[k] for k in today.hit_by_adapter)
            table.add(policy=name, replicas=replicas, adapters=adapters, zipf=zipf, output_tok_s=r.output_tok_s,
                      ttft_p50=r.ttft_p50, ttft_p95=r.ttft_p95, hit_rate=r.hit_rate, loads=r.loads, swaps=r.swaps,
                      worst=worst * 100)
        new = rows["residency_aware"]
        table.add(policy="new / today", output_tok_s=f"{new.output_tok_s / today.output_tok_s:.2f}x",
                  ttft_p50=f"{new.ttft_p50 / today.ttft_p50:.2f}x", ttft_p95=f"{new.ttft_p95 / today.ttft_p95:.2f}x",
                  swaps=f"{new.swaps / max(today.swaps, 1):.2f}x")
    out.table(table)


def add_arguments(parser) -> None:
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


def run(args, out) -> None:
    started = time.perf_counter()
    if args.adapters:
        run_adapters(out, args.seed)
        out.note(f"({time.perf_counter() - started:.0f} s)")
        return
    base = TraceConfig(tenants=args.tenants, requests=args.requests,
                       inflight_per_replica=args.inflight, seed=args.seed)
    results, verdicts = [], []
    for replicas in args.replicas:
        for zipf in args.zipf:
            cell = simulate_cell(replace(base, zipf=zipf), replicas, args.policies, args.pool_factor)
            results += cell
            verdicts.append(f"{replicas} replicas, zipf {zipf}: {verdict(cell)}")
    out.table(table(results, f"{args.tenants} tenants, {args.requests} requests, {args.inflight:g} in flight per "
                             f"replica, caches hold every prefix {args.pool_factor:g}x over, seed {args.seed}"))
    for line in verdicts:
        out.note(line)
    if args.hot_share > 0:
        hot = [r for replicas in args.replicas
               for r in simulate_cell(replace(base, zipf=args.hot_zipf, hot_share=args.hot_share),
                                      replicas, args.policies, args.pool_factor)]
        out.table(hot_table(hot, f"One hot tenant: {args.hot_share:.0%} of all requests go to tenant 0 on top of "
                                 "its Zipf share"))
    out.note(f"({time.perf_counter() - started:.0f} s)")
