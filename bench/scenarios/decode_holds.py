"""A simulation (no model, no Ray): how long the tenant scheduler holds a decode out of shared steps
whose decodes do not all fit the step target, with the bound on steps held in a row
(step_plan.MAX_HELD_STEPS) and without it (each tenant's oldest first, always), side by side.

vLLM's own Scheduler and the TenantScheduler driven by fake steps (bench/fake_steps.py) on a fake
clock: each step takes `base + per_decode x decodes + per_prompt x prompt tokens` (+-10 %), and
the scheduler's cost fit learns from those times as it does from real ones. The load is issue
55's replica: 10 streams of 512 tokens from 6 tenants (4 with 2 streams, 2 with 1), prompts of
100-400 tokens, the shipped target (tpot 0.3 s x step_share 0.8).

    python -m bench decode_holds [--steps 600] [--costs 0.06:0.03,0.05:0.05,0.1:0.055,0.3:0.03] [--tenants 2,2,2,2,1,1]

Per run: the most steps in a row any stream was held, and any tenant (every stream of it: the
counter's order across tenants, which the bound leaves alone), the least and mean share of its
decoding steps a stream was carried in, the fewest and most tokens a stream had at the end.
"""

from __future__ import annotations

import random
import sys
from unittest import mock

from bench.processes import ROOT
from bench.report import Table

PER_PROMPT_S = 0.002


def simulate(base_s: float, per_decode_s: float, tenants: list[int], steps: int, tokens: int, seed: int,
             bound: bool) -> dict:
    from vllm.v1.outputs import ModelRunnerOutput

    from bench.fake_steps import FakeClock, fake_request, make_scheduler
    from loraplex.engine import step_plan, tenant_scheduler
    from loraplex.engine.config import TenantSchedulerConfig

    sys.path.insert(0, str(ROOT / "tests"))
    from model_dir import default_model_dir  # the tests' model: its config

    rng = random.Random(seed)
    clock = FakeClock()
    config = TenantSchedulerConfig(tpot_s=0.3, step_share=0.8, min_prompt_tokens=32)
    # Without the bound: main's rule before it, each tenant's oldest first, always.
    held_bound = step_plan.MAX_HELD_STEPS if bound else 10**9
    with mock.patch.object(tenant_scheduler, "time", clock), mock.patch.object(step_plan, "MAX_HELD_STEPS", held_bound):
        s = make_scheduler(tenant_scheduler.TenantScheduler, str(default_model_dir()),
                           {tenant_scheduler.CONFIG_KEY: config.settings()}, max_num_seqs=32)
        streams = [fake_request(f"t{t}", rng.randint(100, 400), max_tokens=tokens, arrival=float(i))
                   for i, t in enumerate(t for t, n in enumerate(tenants) for _ in range(n))]
        for r in rng.sample(streams, len(streams)):
            s.add_request(r)
        run = {r.request_id: 0 for r in streams}
        longest, carried, decoding_steps = dict(run), dict(run), dict(run)
        tenant_run = {f"t{t}": 0 for t in range(len(tenants))}  # steps in a row none of a tenant's decodes ran
        tenant_longest = dict(tenant_run)
        decodes_carried = 0
        for _ in range(steps):
            decoding = [r.request_id for r in streams
                        if r.request_id in s.requests and r.num_computed_tokens >= r.num_prompt_tokens]
            out = s.schedule()
            scheduled = out.num_scheduled_tokens
            for rid in decoding:
                decoding_steps[rid] += 1
                if rid in scheduled:
                    carried[rid] += 1
                    run[rid] = 0
                else:
                    run[rid] += 1
                    longest[rid] = max(longest[rid], run[rid])
            for tenant in {rid.split("-")[0] for rid in decoding}:
                if any(rid.split("-")[0] == tenant for rid in scheduled if rid in decoding):
                    tenant_run[tenant] = 0
                else:
                    tenant_run[tenant] += 1
                    tenant_longest[tenant] = max(tenant_longest[tenant], tenant_run[tenant])
            decodes = sum(1 for rid in scheduled if rid in decoding)
            decodes_carried += decodes
            prompt = sum(scheduled.values()) - decodes
            clock.now += (base_s + per_decode_s * decodes + PER_PROMPT_S * prompt) * rng.uniform(0.9, 1.1)
            ids = list(scheduled)
            sampled = [[] if s.requests[r].num_computed_tokens < s.requests[r].num_tokens else [11] for r in ids]
            s.update_from_output(out, ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                                                        sampled_token_ids=sampled))
    shares = [carried[rid] / decoding_steps[rid] for rid in run if decoding_steps[rid]]
    out_tokens = [r.num_output_tokens for r in streams]
    return dict(longest=max(longest.values()), tenant_longest=max(tenant_longest.values()), worst_share=min(shares),
                mean_share=sum(shares) / len(shares), fewest=min(out_tokens), most=max(out_tokens),
                per_step=decodes_carried / steps, seconds=clock.now - 1000.0)


def add_arguments(p) -> None:
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--costs", default="0.06:0.03,0.05:0.05,0.1:0.055,0.3:0.03",
                   help="base_s:per_decode_s of the fake steps, comma-separated")
    p.add_argument("--tenants", default="2,2,2,2,1,1", help="streams of each tenant")
    p.add_argument("--tokens", type=int, default=512)
    p.add_argument("--seed", type=int, default=0)


def run(a, out) -> None:
    tenants = [int(n) for n in a.tenants.split(",")]
    table = Table("simulated (fake steps, fake clock; not a measurement of an engine)", [
        ("cost", "step s (base + per decode)"), ("rule", "rule"),
        ("per_step", "decodes/step", "{:.1f}"), ("longest", "a stream's longest hold (steps in a row)", "{:d}"),
        ("tenant_longest", "a tenant's (all its streams held)", "{:d}"),
        ("worst_share", "worst stream's share of steps", "{:.2f}"), ("mean_share", "mean share", "{:.2f}"),
        ("fewest", "fewest tokens", "{:d}"), ("most", "most tokens", "{:d}"), ("seconds", "simulated s", "{:.0f}")])
    for cost in a.costs.split(","):
        base_s, per_decode_s = map(float, cost.split(":"))
        for bound, rule in ((False, "oldest first"), (True, "bound")):
            row = simulate(base_s, per_decode_s, tenants, a.steps, a.tokens, a.seed, bound)
            table.add(cost=f"{base_s:g} + {per_decode_s:g}", rule=rule, **row)
    out.table(table)
