"""The overload's tables: per tenant (with gold's latency against its baselines, Retry-After
and refusal kinds), and the process tree's peak RSS and CPU."""

from __future__ import annotations

import os
import statistics
from collections import Counter, defaultdict

import psutil

from bench.overload.checks import fmt_s, kind_of_503
from bench.overload.phases import Overload
from bench.overload.process_tree import ENGINE_KINDS
from bench.percentile import or_nan, percentile
from bench.report import Table


def tenant_table(o: Overload) -> None:
    results, tenants, window, capacity, drained = o.results, o.tenants, o.window, o.capacity, o.drained
    unloaded, alone, failures, out = o.unloaded, o.alone, o.failures, o.report.note
    # 4. Per tenant.
    table = Table("", [("tenant", "tenant"), ("priority", "priority"), ("limit", "limit"), ("offered", "offered", "{:d}"),
                       ("offered_per_s", "offered/s", "{:.2f}"), ("ok", "200", "{:d}"), ("ok_per_s", "200/s", "{:.2f}"),
                       ("r429", "429", "{:d}"), ("r503", "503", "{:d}"), ("other", "other", "{:d}"),
                       ("p50_s", "200 latency p50 s", "{:.2f}"), ("p99_s", "200 latency p99 s", "{:.2f}"),
                       ("refusal_p50_ms", "refusal latency p50 ms", "{:.0f}")])
    by = defaultdict(list)
    for r in results:
        by[r.tenant].append(r)
    for t in tenants.values():
        rs = by[t.name]
        ok = [r.latency for r in rs if r.status == 200]
        refused = [r.latency for r in rs if r.status in (429, 503)]
        other = [r for r in rs if r.status not in (200, 429, 503)]
        limit = f"{t.limits['requests_per_minute']} req/min" if t.limits.get("requests_per_minute") else "-"
        table.add(tenant=t.name, priority=t.priority, limit=limit, offered=len(rs), offered_per_s=len(rs) / window,
                  ok=len(ok), ok_per_s=len(ok) / window, r429=sum(r.status == 429 for r in rs),
                  r503=sum(r.status == 503 for r in rs), other=len(other), p50_s=percentile(ok, 50),
                  p99_s=percentile(ok, 99), refusal_p50_ms=percentile(refused, 50) * 1000 if refused else None)
    all_ok = [r for r in results if r.status == 200]
    table.add(tenant="all", priority="", limit="", offered=len(results), offered_per_s=len(results) / window,
              ok=len(all_ok), ok_per_s=len(all_ok) / window, r429=sum(r.status == 429 for r in results),
              r503=sum(r.status == 503 for r in results), other=sum(r.status not in (200, 429, 503) for r in results),
              p50_s=percentile([r.latency for r in all_ok], 50), p99_s=percentile([r.latency for r in all_ok], 99))
    o.report.table(table)
    out(f"admitted {len(all_ok) / window:.2f} requests/s under overload = "
        f"{len(all_ok) / window / capacity:.0%} of capacity; completion tokens "
        f"{sum(r.completion_tokens for r in all_ok) / drained:.1f}/s over the {drained:.0f} s to the last reply")
    loaded = [r.latency for r in by["gold"] if r.status == 200]
    p95_u, p95_l = percentile(unloaded, 95), percentile(loaded, 95)
    ratio = or_nan(p95_l) / p95_u if unloaded and loaded else float("nan")
    p95_a = percentile(alone, 95)
    ratio_alone = or_nan(p95_l) / p95_a if alone and loaded else float("nan")
    out(f"gold p95: one at a time {fmt_s(p95_u)} s, its own traffic alone {fmt_s(p95_a)} s, under overload "
        f"{fmt_s(p95_l)} s ({len(loaded)} requests): {ratio_alone:.2f}x its own traffic alone (target <= 2x: "
        f"{'MET' if ratio_alone <= 2 else 'MISSED'}), {ratio:.2f}x one at a time; "
        f"p50 {fmt_s(percentile(unloaded, 50))} s / {fmt_s(percentile(alone, 50))} s -> {fmt_s(percentile(loaded, 50))} s")
    refusals = [r for r in results if r.status in (429, 503)]
    missing = [r for r in refusals if not (r.retry_after or "").strip().isdigit()]
    values = Counter(r.retry_after for r in refusals)
    out(f"Retry-After on every 429/503: {'yes' if not missing else 'NO'} "
        f"({len(refusals) - len(missing)}/{len(refusals)}; values {dict(sorted(values.items(), key=str))})")
    if missing:
        failures.append(f"{len(missing)} refusals without a Retry-After header")
    kinds = Counter((r.status, r.code if r.status == 429 else kind_of_503(r.message)) for r in refusals)
    out("refusals by kind: " + ", ".join(f"{s} {k}: {n}" for (s, k), n in sorted(kinds.items(), key=str)))
    for (s, k), n in kinds.items():
        if s == 503 and k.startswith("other 503"):
            failures.append(f"{n} x {k}")
    other = [r for r in results if r.status not in (200, 429, 503)]
    for r in other[:10]:
        out(f"  FAILED: {r.tenant} -> {r.status}: {r.message[:200]}")
    if other:
        failures.append(f"{len(other)} overload requests neither 200, 429 nor 503")
    prompt_toks = [r.prompt_tokens for r in all_ok]
    completion = [r.completion_tokens for r in all_ok]
    out(f"admitted requests: prompt {statistics.mean(prompt_toks):.0f} tokens mean (max {max(prompt_toks)}, "
        f"with the chat template), completion {statistics.mean(completion):.1f} tokens mean (max {max(completion)})"
        if all_ok else "no admitted requests")


def memory_table(o: Overload) -> None:
    sampler, args, out = o.sampler, o.args, o.report.note
    # 5. Memory (and CPU).
    table = Table(f"## 5. Peak RSS during the overload ({sampler.samples} samples, every {args.sample_s:g} s, "
                  f"over the serve run's process tree), and CPU used over the same {sampler.elapsed:.0f} s",
                  [("process", "process"), ("count", "count", "{:d}"),
                   ("peak_rss_mib", "peak RSS per process MiB", "{:,.0f}"),
                   ("peak_kind_mib", "peak RSS of all of this kind MiB", "{:,.0f}"), ("cores", "CPU cores (mean)", "{:.2f}")])
    pids_of: dict[str, list[int]] = defaultdict(list)
    for pid, kind in sampler.kind.items():
        pids_of[kind].append(pid)
    tree_cpu = 0.0
    for kind in sorted(pids_of, key=lambda k: -sampler.peak_kind_total[k]):
        cores = sum(sampler.cpu_cores(pid) for pid in pids_of[kind])
        tree_cpu += cores
        table.add(process=kind, count=len(pids_of[kind]),
                  peak_rss_mib=max(sampler.peak_rss[pid] for pid in pids_of[kind]) / 2**20,
                  peak_kind_mib=sampler.peak_kind_total[kind] / 2**20, cores=cores)
    table.add(process="**whole tree**", count=len(sampler.kind), peak_kind_mib=sampler.peak_total / 2**20, cores=tree_cpu)
    o.report.table(table)
    out("(RSS counts pages shared between processes, e.g. forked workers' libraries, in each.)")
    busy, me = sampler.busy / sampler.elapsed, sampler.me_cpu / sampler.elapsed
    out(f"machine's CPUs busy {busy:.2f} of {os.cpu_count()} cores: the serve run {tree_cpu:.2f}, this load generator "
        f"{me:.2f}, other processes {max(0.0, busy - tree_cpu - me):.2f}")
    workers = [pid for pid, kind in sampler.kind.items() if kind == ENGINE_KINDS[2]]
    affinity = []
    for pid in workers:
        try:
            affinity.append(sorted(psutil.Process(pid).cpu_affinity()))
        except psutil.Error:
            pass
    out(f"vLLM CPU workers' CPU affinity: {affinity} (machine: {sorted(psutil.Process().cpu_affinity())})")
