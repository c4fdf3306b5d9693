"""The overload benchmark's load phases, in order: tenants and warm-up, the capacity ramp, gold
alone (one at a time, then its own arrivals), the overload with its process tree sampled."""

from __future__ import annotations

import itertools
import random
import statistics
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Iterator, Optional

from bench.overload.checks import fmt_s
from bench.overload.client import Client, Result, Tenant, closed_loop, open_loop
from bench.overload.process_tree import ProcessSampler, engine_processes
from bench.overload.workload import Prompt
from bench.percentile import percentile
from bench.report import Output, Table

out = print


@dataclass
class Overload:
    """What the phases share: the tenants, the prompts, and each phase's measurements."""

    args: object
    client: Client
    tenants: dict[str, Tenant]
    ramp_tenants: list[Tenant]
    gold_pool: list[Prompt]
    general: list[Prompt]
    general_iter: Iterator[Prompt]
    failures: list[str] = field(default_factory=list)
    capacity: float = 0.0
    rate: float = 0.0  # the overload's arrivals per second
    unloaded: list[float] = field(default_factory=list)  # gold one at a time, latencies
    alone: list[float] = field(default_factory=list)  # gold's own arrivals without the others
    results: list[Result] = field(default_factory=list)  # the overload's
    window: float = 0.0
    drained: float = 0.0
    sampler: Optional[ProcessSampler] = None
    engines_before: set = field(default_factory=set)
    report: Output = field(default_factory=lambda: Output("overload", []))  # the tables and verdicts

    @property
    def admitted(self) -> list[Result]:
        return [r for r in self.results if r.status == 200]


async def setup(args, client: Client, prompts: list[Prompt]) -> Overload:
    """The tenants through the admin API, then every replica's first batches (not measured)."""
    tenants = {t.name: t for t in (Tenant("gold", 100, args.shares["gold"]),
                                   Tenant("silver", 50, args.shares["silver"]),
                                   Tenant("capped", 50, args.shares["capped"]),
                                   Tenant("bronze", 0, args.shares["bronze"]))}
    ramp_tenants = [Tenant(f"ramp-{i}", 100, 0) for i in range(4)]
    for t in [*tenants.values(), *ramp_tenants]:
        await client.create_tenant(t)
    gold_pool, general = prompts[:args.gold_pool], prompts[args.gold_pool:]
    general_iter = itertools.cycle(general)

    await closed_loop(client, ramp_tenants, general_iter, 8, 4, "warm-up")
    await client.chat(tenants["gold"], general[-1], "warm-up")
    return Overload(args, client, tenants, ramp_tenants, gold_pool, general, general_iter)


async def capacity_ramp(o: Overload) -> None:
    args, client, failures, ramp_tenants, general_iter, tenants = (
        o.args, o.client, o.failures, o.ramp_tenants, o.general_iter, o.tenants)
    # 1. Capacity: closed-loop ramp.
    out("\n## 1. Capacity: closed-loop ramp (4 tenants of priority 100: nothing is shed)\n")
    out("requests/s: completions while exactly `concurrency` requests were in flight, over that time "
        "(the drain at the end is left out)\n")
    ramp = Table("", [("concurrency", "concurrency", "{:d}"), ("requests", "requests", "{:d}"),
                      ("seconds", "seconds", "{:.1f}"), ("rps", "requests/s", "{:.2f}"),
                      ("tokens", "completion tok/s", "{:.1f}"), ("p50", "latency p50 s", "{:.2f}"),
                      ("p95", "latency p95 s", "{:.2f}"), ("bad", "not 200", "{:d}")])
    capacity, best = 0.0, None
    for c in args.ramp:
        n = max(6, args.ramp_requests_per_slot * c + 4)
        results, seconds, rps = await closed_loop(client, ramp_tenants, general_iter, n, c, f"ramp-{c}")
        ok = [r for r in results if r.status == 200]
        bad = len(results) - len(ok)
        if bad:
            failures.append(f"ramp c={c}: {bad} requests not 200: "
                            f"{Counter((r.status, r.message[:80]) for r in results if r.status != 200)}")
        tokens = rps * statistics.mean(r.completion_tokens for r in ok) if ok else 0.0
        ramp.add(concurrency=c, requests=len(results), seconds=seconds, rps=rps, tokens=tokens,
                 p50=percentile([r.latency for r in ok], 50), p95=percentile([r.latency for r in ok], 95), bad=bad)
        out(f"  ramp {c}: {rps:.2f} requests/s", flush=True)
        if rps > capacity:
            capacity, best = rps, c
    o.report.table(ramp)
    rate = args.overload_factor * capacity
    o.report.note(f"capacity = {capacity:.2f} requests/s (the ramp's highest throughput, at concurrency {best}); "
        f"open-loop rate = {args.overload_factor:g} x {capacity:.2f} = {rate:.2f} requests/s")

    # The capped tenant's limit, through the admin API: a share of what it will offer.
    offered_per_min = rate * tenants["capped"].share * 60
    rpm = args.capped_rpm or max(2, round(offered_per_min * args.capped_fraction))
    await client.set_limits(tenants["capped"], {"requests_per_minute": rpm})
    o.capacity, o.rate = capacity, rate


async def gold_baselines(o: Overload) -> None:
    args, client, failures, tenants, gold_pool, capacity = o.args, o.client, o.failures, o.tenants, o.gold_pool, o.capacity
    # 2. Gold unloaded.
    unloaded = []
    for p in gold_pool:
        r = await client.chat(tenants["gold"], p, "unloaded")
        if r.status != 200:
            failures.append(f"gold unloaded: {r.status} {r.message[:100]}")
        else:
            unloaded.append(r.latency)
    out(f"\n## 2. gold unloaded: {len(unloaded)} sequential requests (its pool of {len(gold_pool)} prompts): "
        f"p50 {fmt_s(percentile(unloaded, 50))} s, p95 {fmt_s(percentile(unloaded, 95))} s", flush=True)
    # Gold's own traffic alone: the same Poisson arrivals it gets in the overload, no other
    # tenant. Gold then shares its replica with its own requests only: what the overload adds
    # on top of that is what the other tenants cost it.
    gold_rate = args.overload_factor * capacity * tenants["gold"].share
    alone_results, _, _ = await open_loop(client, [replace(tenants["gold"], share=1.0)], gold_rate,
                                          args.alone_duration, args.max_requests,
                                          {"gold": itertools.cycle(gold_pool)}, random.Random(args.seed + 1), "alone")
    alone = [r.latency for r in alone_results if r.status == 200]
    if len(alone) != len(alone_results):
        failures.append(f"gold alone: {len(alone_results) - len(alone)} requests not 200")
    out(f"gold alone at its overload arrival rate ({gold_rate:.2f} requests/s, Poisson, {args.alone_duration:g} s, "
        f"{len(alone)} requests): p50 {fmt_s(percentile(alone, 50))} s, p95 {fmt_s(percentile(alone, 95))} s", flush=True)
    o.unloaded, o.alone = unloaded, alone


async def overload(o: Overload, root_pid: int) -> None:
    args, client, tenants, gold_pool, general_iter, rate = o.args, o.client, o.tenants, o.gold_pool, o.general_iter, o.rate
    # 3. The overload, memory sampled over the run's process tree.
    sampler = ProcessSampler(root_pid, args.sample_s)
    engines_before = engine_processes(sampler)
    out(f"\n## 3. Overload: Poisson arrivals at {rate:.2f} requests/s for {args.duration:g} s "
        f"(at most {args.max_requests})", flush=True)
    gold_cycle = itertools.cycle(gold_pool)
    prompts_of = {"gold": gold_cycle, **{name: general_iter for name in ("silver", "capped", "bronze")}}
    sampler.start()
    t0 = time.perf_counter()
    results, window, lag = await open_loop(client, list(tenants.values()), rate, args.duration,
                                           args.max_requests, prompts_of, random.Random(args.seed))
    drained = time.perf_counter() - t0
    sampler.stop_event.set()
    sampler.join()
    out(f"offered over {window:.1f} s (last arrival sent {lag * 1000:.0f} ms late); every reply in after "
        f"{drained:.1f} s\n")
    o.sampler, o.engines_before, o.results, o.window, o.drained = sampler, engines_before, results, window, drained
