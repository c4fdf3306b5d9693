"""After the overload: the platform still serves (a request, /readyz, the same Engine processes),
and the usage ledger holds exactly one record per admitted request and counts every refusal."""

from __future__ import annotations

import asyncio
import math
import sqlite3
import time
from collections import Counter
from pathlib import Path
from typing import Optional

from bench.overload.client import Result

def ledger_rows(db_path: Path) -> dict[str, tuple]:
    with sqlite3.connect(db_path, timeout=30) as conn:
        return {r[0]: r[1:] for r in conn.execute(
            "SELECT request_id, tenant_id, status, completion_tokens, replica_id FROM usage_records")}


def rejection_counts(db_path: Path) -> Counter:
    with sqlite3.connect(db_path, timeout=30) as conn:
        return Counter({(t, r): n for t, r, n in conn.execute(
            "SELECT tenant_id, reason, SUM(count) FROM usage_rejections GROUP BY tenant_id, reason")})


def company(ones: list[Result], others: list[Result], replica_of: dict) -> tuple[float, Counter]:
    """How many other admitted requests shared each of `ones`' Engine replica while it ran, on
    average over `ones` (time-weighted within each), in all and per tenant."""
    per_tenant: Counter = Counter()
    for g in ones:
        for o in others:
            if o is not g and replica_of.get(o.request_id) == replica_of.get(g.request_id):
                overlap = min(g.sent + g.latency, o.sent + o.latency) - max(g.sent, o.sent)
                if overlap > 0:
                    per_tenant[o.tenant] += overlap / g.latency / len(ones)
    return sum(per_tenant.values()), per_tenant


def kind_of_503(message: str) -> str:
    if "in flight on this engine replica" in message:
        return "shed (requests in flight)"
    if "KV cache" in message:
        return "shed (KV cache)"
    if "queue is full" in message:
        return "Serve queue full"
    return f"other 503: {message[:120]}"


def fmt_s(x: Optional[float]) -> str:
    return "-" if x is None or math.isnan(x) else f"{x:.2f}"


async def after_overload(o, db_path: Path) -> int:
    """Section 6 and the ledger checks; prints the failures of every phase and returns the exit
    code (1 if any)."""
    from bench.overload.process_tree import ENGINE_KINDS, engine_processes

    client, tenants, ramp_tenants, general, failures = o.client, o.tenants, o.ramp_tenants, o.general, o.failures
    sampler, engines_before, all_ok = o.sampler, o.engines_before, o.admitted
    out = print
    # 6. No crash.
    out("\n## 6. After the overload", flush=True)
    after = await client.chat(tenants["gold"], general[0], "after")
    out(f"a normal gold request: {after.status} in {after.latency:.2f} s")
    if after.status != 200:
        failures.append(f"the request after the overload got {after.status}: {after.message[:200]}")
    ready = await client.http.get("/admin/readyz", headers=client.admin, timeout=60)  # the details: admin only
    body = ready.json() if ready.headers.get("content-type", "").startswith("application/json") else {}
    out(f"/admin/readyz: {ready.status_code}, Engine replicas healthy {body.get('healthy_replicas')}/{body.get('replicas')}")
    if ready.status_code != 200 or body.get("healthy_replicas") != 2:
        failures.append(f"/admin/readyz after the overload: {ready.status_code} {ready.text[:200]}")
    engines_after = engine_processes(sampler)
    same = engines_before == engines_after and {k for k, _, _ in engines_before} == set(ENGINE_KINDS)
    out(f"Engine replica, EngineCore and vLLM worker processes (pid, start time): {len(engines_before)} before, "
        f"{len(engines_after)} after, {'the same' if same else 'CHANGED'} "
        f"(pids {sorted(p for _, p, _ in engines_before)} -> {sorted(p for _, p, _ in engines_after)})")
    if not same:
        failures.append("Engine replica processes changed: a replica restarted")

    # The ledger: one record per admitted request (every phase), none for a refusal.
    admitted = {r.request_id: r for r in client.results if r.status == 200}
    refused_ids = {r.request_id for r in client.results if r.status in (429, 503) and r.request_id}
    deadline = time.time() + 30
    while True:
        rows = ledger_rows(db_path)
        if set(admitted) <= set(rows) or time.time() > deadline:
            break
        await asyncio.sleep(0.5)
    missing_records = set(admitted) - set(rows)
    extra = set(rows) - set(admitted)
    tenant_ids = {t.id: t.name for t in [*tenants.values(), *ramp_tenants]}
    wrong = [i for i, r in admitted.items() if i in rows and (tenant_ids.get(rows[i][0]) != r.tenant
                                                               or rows[i][2] != r.completion_tokens)]
    billed_refusals = refused_ids & set(rows)
    overload_ids = {r.request_id for r in all_ok}
    replicas_overload = Counter(rows[i][3] for i in overload_ids if i in rows)
    out(f"usage ledger: {len(rows)} records for {len(admitted)} admitted requests (all phases; "
        f"{len(overload_ids)} in the overload); missing {len(missing_records)}, without an admitted reply "
        f"{len(extra)}, tenant or completion tokens differing from the reply {len(wrong)}, refusals with a "
        f"record {len(billed_refusals)} (of {len(refused_ids)})")
    out(f"overload requests per Engine replica (ledger): {dict(replicas_overload)}")
    replica_of = {i: row[3] for i, row in rows.items()}
    gold_unloaded = [r for r in client.results if r.tenant == "gold" and r.phase == "unloaded" and r.status == 200]
    gold_loaded = [r for r in all_ok if r.tenant == "gold"]
    n_u, _ = company(gold_unloaded, list(admitted.values()), replica_of)
    n_l, by_tenant = company(gold_loaded, list(admitted.values()), replica_of)
    out(f"gold's company: while a gold request ran, other requests on its Engine replica: {n_u:.2f} unloaded, "
        f"{n_l:.2f} under overload (" + ", ".join(f"{t} {n:.2f}" for t, n in sorted(by_tenant.items())) + ")")
    if missing_records or extra or wrong or billed_refusals:
        failures.append("the usage ledger does not hold exactly one record per admitted request")
    # Refusals are counted (never billed): the platform's count against what the client saw.
    seen = Counter()
    for r in client.results:
        if r.status == 429:
            seen[(r.tenant, f"429:{r.code}")] += 1
        elif r.status == 503:  # as the ingress records the reason (openai_routes)
            kind = kind_of_503(r.message)
            seen[(r.tenant, "503:shed" if kind.startswith("shed") else
                  "503:queue_full" if kind == "Serve queue full" else "503")] += 1
    deadline = time.time() + 20
    while True:
        counted = Counter({(tenant_ids.get(t, t), reason): n for (t, reason), n in rejection_counts(db_path).items()})
        if counted == seen or time.time() > deadline:
            break
        await asyncio.sleep(0.5)
    out(f"refusals counted by the platform (usage_rejections) {'match' if counted == seen else 'DIFFER FROM'} "
        f"the client's: {dict(sorted(counted.items()))}")
    if counted != seen:
        out(f"  client saw: {dict(sorted(seen.items()))}")
        failures.append("the platform's refusal counts differ from the client's")

    out("\n" + ("NO FAILURES" if not failures else "FAILURES:\n  " + "\n  ".join(failures)))
    return 1 if failures else 0
