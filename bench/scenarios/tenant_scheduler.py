"""What the tenant scheduler adds to each engine step, at GPU batch sizes: vLLM's own Scheduler
and LoRAPlex's TenantScheduler side by side, each driven by the same fake steps (bench/fake_steps.py:
no model, instant outputs), so the table is the schedulers' own CPU time per step.

    python -m bench tenant_scheduler [--steps 300] [--batches 32,256] [--tenants 8,64]

Each cell: `batch` requests decoding (spread over `tenants` tenants), plus one waiting document
prompt per tenant, refilled as they are admitted, so every step plans a shared budget.
"""

from __future__ import annotations

import sys
import time

from bench.processes import ROOT
from bench.report import Table

# A GPU-like step: 10 ms, 0.05 ms a decode, 0.02 ms a prompt token (base_s, per_decode_s,
# per_prompt_s of engine/step_cost.py's Coefficients); a 50 ms TPOT target.
GPU_COSTS = dict(base_s=0.010, per_decode_s=0.00005, per_prompt_s=0.00002)


def us_per_step(cls, batch: int, tenants: int, steps: int) -> float:
    # vLLM loads in ~10 s: here, not when the entry point lists or parses the scenarios.
    from bench.fake_steps import fake_request, fake_step, make_scheduler
    from loraplex.engine.config import TenantSchedulerConfig
    from loraplex.engine.step_cost import Coefficients
    from loraplex.engine.tenant_scheduler import CONFIG_KEY, TenantScheduler

    sys.path.insert(0, str(ROOT / "tests"))
    from model_dir import default_model_dir  # the tests' model: its tokenizer and config

    config = TenantSchedulerConfig(tpot_s=0.05)
    s = make_scheduler(cls, str(default_model_dir()), {CONFIG_KEY: config.settings()}, max_num_seqs=batch + tenants,
                       token_budget=8192, blocks=200_000)
    if cls is TenantScheduler:
        s.cost.prior, s.cost.min_steps = Coefficients(**GPU_COSTS), 10**9
    for i in range(batch):
        s.add_request(fake_request(f"t{i % tenants}", 64, max_tokens=10**6))
    for _ in range(3):
        fake_step(s)  # every one of them decoding
    docs = {f"t{t}": None for t in range(tenants)}
    elapsed = 0.0
    for _ in range(steps):
        for t, r in docs.items():  # one document waiting per tenant, refilled once admitted
            if r is None or r.request_id not in s.requests or r.num_computed_tokens >= r.num_prompt_tokens:
                docs[t] = fake_request(t, 2000, max_tokens=1)
                s.add_request(docs[t])
        started = time.perf_counter()
        fake_step(s)
        elapsed += time.perf_counter() - started
    return elapsed / steps * 1e6


def add_arguments(p) -> None:
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batches", default="32,256")
    p.add_argument("--tenants", default="8,64")


def run(a, out) -> None:
    from vllm.v1.core.sched.scheduler import Scheduler

    from loraplex.engine.tenant_scheduler import TenantScheduler

    table = Table("", [("batch", "decoding requests", "{:d}"), ("tenants", "tenants", "{:d}"),
                       ("vllm_us", "vLLM Scheduler µs/step", "{:.0f}"), ("ours_us", "TenantScheduler µs/step", "{:.0f}"),
                       ("added_us", "added µs/step", "{:+.0f}"), ("ratio", "ratio", "{:.2f}x")])
    for batch in map(int, a.batches.split(",")):
        for tenants in map(int, a.tenants.split(",")):
            vllm = us_per_step(Scheduler, batch, tenants, a.steps)
            ours = us_per_step(TenantScheduler, batch, tenants, a.steps)
            table.add(batch=batch, tenants=tenants, vllm_us=vllm, ours_us=ours, added_us=ours - vllm, ratio=ours / vllm)
    out.table(table)
