"""Adapter hot-loading benchmark: cold vs warm first-request latency, and 1,000+ adapters served.

Starts LoRAPlex in-process (Ray Serve + the real vLLM engine on the default model), registers
--adapters distinct LoRA adapters for one tenant over the REST API, then:
  * cold: the first request to a never-used adapter (fetch from the store + vLLM load), vs
    warm: the same request again right after;
  * sampled: --sample adapters drawn from all registered ones, each must answer 200, with
    vLLM's CPU cache (max_cpu_loras) far smaller than the set, so LRU eviction is exercised;
  * the engine replica id before and after, to show nothing restarted.
Every request asks for 1 token, so latency is dominated by adapter handling, not decoding.

    python -m bench adapters [--adapters 1000] [--sample 100] [--cold 10]
"""

from __future__ import annotations

import random
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from bench.demo_adapters import synthetic_adapter
from bench.local_serve import local_serve
from bench.processes import ROOT
from bench.report import Table
from bench.state import with_fresh_state
from bench.stream.platform import wait_http
from bench.tenants import new_tenant_key

MODEL = ROOT / "models" / "SmolLM2-135M-Instruct"
ADMIN = "bench-admin-token"


def deploy(port: int, state: Path, max_cpu_loras: int) -> str:
    from ray import serve

    from loraplex.app import build_app

    serve.run(build_app(with_fresh_state({
        "tenancy": {"admin_token": ADMIN},
        "engine": {"model": str(MODEL), "gpu_memory_utilization": 0.25, "max_loras": 4,
                   "max_cpu_loras": max_cpu_loras, "max_lora_rank": 16},
    }, state)), name="loraplex", route_prefix="/")
    base = f"http://127.0.0.1:{port}"
    wait_http(base, "/readyz", timeout_s=600)
    return base


def one_token(client: httpx.Client, model: str) -> tuple[int, float]:
    started = time.perf_counter()
    response = client.post("/v1/chat/completions", json={
        "model": model, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 1, "temperature": 0})
    return response.status_code, time.perf_counter() - started


def add_arguments(parser) -> None:
    parser.add_argument("--adapters", type=int, default=1000)
    parser.add_argument("--sample", type=int, default=100)
    parser.add_argument("--cold", type=int, default=10)
    parser.add_argument("--max-cpu-loras", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)


def run(args, out) -> None:
    with local_serve(object_store_memory=256 * 1024**2) as port, \
            tempfile.TemporaryDirectory(prefix="loraplex-bench-") as tmp:
        measure(args, out, port, Path(tmp))


def measure(args, out, port: int, state: Path) -> None:
    from ray import serve

    base = deploy(port, state, args.max_cpu_loras)
    engine = serve.get_deployment_handle("Engine", app_name="loraplex")
    key = new_tenant_key(base, ADMIN, "bench")
    client = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {key}"}, timeout=300)
    replica_before = engine.ready.remote().result()["replica_id"]

    uploads = []
    for i in range(args.adapters):
        archive = synthetic_adapter(args.seed * 1_000_000 + i)
        started = time.perf_counter()
        response = client.post("/v1/adapters", data={"name": f"a{i:04d}"},
                               files={"file": ("a.tar.gz", archive, "application/gzip")})
        uploads.append(time.perf_counter() - started)
        assert response.status_code == 201, response.text
    registered = len(client.get("/v1/models").json()["data"]) - 1

    one_token(client, "SmolLM2-135M-Instruct")
    base_warm = [one_token(client, "SmolLM2-135M-Instruct")[1] for _ in range(5)]
    cold, warm = [], []
    for i in range(args.cold):
        status, seconds = one_token(client, f"a{i:04d}")
        assert status == 200
        cold.append(seconds)
        warm.append(one_token(client, f"a{i:04d}")[1])

    rng = random.Random(args.seed)
    sample = rng.sample(range(args.adapters), min(args.sample, args.adapters))
    sampled = [one_token(client, f"a{i:04d}") for i in sample]
    ok = sum(status == 200 for status, _ in sampled)
    replica_after = engine.ready.remote().result()["replica_id"]

    table = Table(f"adapters registered: {registered} (rank 4, q_proj+v_proj, fp16); "
                  f"max_cpu_loras={args.max_cpu_loras}, max_loras=4",
                  [("case", "case"), ("n", "n", "{:d}"), ("p50_ms", "p50 ms", "{:.1f}"), ("max_ms", "max ms", "{:.1f}")])
    for case, values in (("upload (validate + store + catalog)", uploads), ("base model, 1 token (warm)", base_warm),
                         ("adapter first request (cold: fetch + load)", cold), ("same adapter again (warm)", warm),
                         ("sampled adapters of all registered", [s for _, s in sampled])):
        table.add(case=case, n=len(values), p50_ms=statistics.median(values) * 1000, max_ms=max(values) * 1000)
    out.table(table)
    out.note(f"cold/warm p50 ratio: {statistics.median(cold) / statistics.median(warm):.1f}x")
    out.note(f"sampled adapters answered 200: {ok}/{len(sampled)}; engine replica {replica_before} -> {replica_after}"
             f" ({'no restart' if replica_before == replica_after else 'RESTARTED'})")
