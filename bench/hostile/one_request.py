"""Attacks of one tenant's largest requests (issue 46): before, one chat request of `n: 16000` or
one completions request of 1,000 prompts held a whole Engine replica, and every other tenant was
refused (503) for as long as its client waited.

- n_at_plan_cap: chat requests of `n` at the attacker's plan cap (its effective max_n) with long
  answers, as many at once as its plan lets it (max_concurrent_requests sequences), plus one more
  loop that meets the plan's concurrency limit.
- n_at_server_bound: a tenant whose own limits lift every cap sends `n` at the server's bound
  (the pool's max_num_seqs: the whole batch) and one past it (400 naming the bound).
- many_prompts: completions of 1,000 prompts (400 naming max_prompts_per_request, at once) beside
  requests of as many prompts as the plan allows, with long answers.
- waits_out_deadline: the largest chat request the plan allows, with an answer longer than its
  deadline (X-LoRAPlex-Timeout), waited out to the server's 504.

Each runs the bystander (bench/hostile/attack.py) beside it; the table says how many of the
bystander's requests were within the `slo:` targets.
"""

from __future__ import annotations

from collections import Counter

from bench.hostile.attack import AttackContext, AttackResult, send_loops

LONG = 256  # completion tokens of each attacking sequence (ignore_eos): it holds its slot for a while
# The attacker's own limits in n_at_server_bound: none of the plan's caps, the server's bound only.
LIFTED = {"max_n": 100_000, "max_prompts_per_request": 100_000, "max_sequences_per_request": 100_000,
          "max_concurrent_requests": 100_000}


async def effective_limits(ctx: AttackContext, tenant: str) -> dict:
    return (await ctx.admin("GET", f"/admin/tenants/{tenant}")).json()["effective_limits"]


def chat(ctx: AttackContext, n: int, max_tokens: int = LONG) -> dict:
    return {"model": ctx.model, "n": n, "max_tokens": max_tokens, "ignore_eos": True, "temperature": 1.0,
            "messages": [{"role": "user", "content": "Tell me a long story about a lighthouse."}]}


def prompts(ctx: AttackContext, count: int, max_tokens: int = LONG) -> dict:
    return {"model": ctx.model, "prompt": [f"Story {i}: once upon a time" for i in range(count)],
            "max_tokens": max_tokens, "ignore_eos": True}


async def n_at_plan_cap(ctx: AttackContext) -> AttackResult:
    limits = await effective_limits(ctx, ctx.attacker_tenant)
    n = limits.get("max_n") or 16
    fits = max(1, (limits.get("max_concurrent_requests") or n) // n)
    got: Counter = Counter()
    by = await ctx.bystander_during(
        lambda: send_loops(ctx, ctx.attacker_key, [("/v1/chat/completions", chat(ctx, n))], fits + 1, got),
        warmup_s=3.0)
    return AttackResult("n_at_plan_cap", f"chat n={n} (the plan's max_n), max_tokens {LONG}, {fits + 1} at a time "
                        f"(its plan runs {fits}: max_concurrent_requests {limits.get('max_concurrent_requests')})",
                        got, by, ctx.alone)


async def n_at_server_bound(ctx: AttackContext, max_tokens: int = LONG) -> AttackResult:
    bound = ctx.server_bound
    _, key = await ctx.new_tenant("lifted", **LIFTED)
    got: Counter = Counter()
    bodies = [("/v1/chat/completions", chat(ctx, bound, max_tokens)), ("/v1/chat/completions", chat(ctx, bound + 1)),
              ("/v1/chat/completions", chat(ctx, 16000))]
    by = await ctx.bystander_during(lambda: send_loops(ctx, key, bodies, 2, got), warmup_s=3.0)
    return AttackResult("n_at_server_bound", f"chat n={bound} (the pool's max_num_seqs), n={bound + 1} and n=16000, "
                        f"max_tokens {max_tokens}, 2 at a time; the attacker's own limits lift every plan cap "
                        f"({LIFTED})", got, by, ctx.alone)


async def many_prompts(ctx: AttackContext) -> AttackResult:
    limits = await effective_limits(ctx, ctx.attacker_tenant)
    allowed = limits.get("max_prompts_per_request") or 16
    fits = max(1, (limits.get("max_concurrent_requests") or allowed) // allowed)
    got: Counter = Counter()
    bodies = [("/v1/completions", prompts(ctx, 1000)), ("/v1/completions", prompts(ctx, allowed))]
    by = await ctx.bystander_during(lambda: send_loops(ctx, ctx.attacker_key, bodies, fits + 1, got), warmup_s=3.0)
    return AttackResult("many_prompts", f"completions of 1,000 prompts and of {allowed} (the plan's "
                        f"max_prompts_per_request), max_tokens {LONG}, {fits + 1} at a time", got, by, ctx.alone)


async def waits_out_deadline(ctx: AttackContext, deadline_s: float = 20.0) -> AttackResult:
    limits = await effective_limits(ctx, ctx.attacker_tenant)
    n = limits.get("max_n") or 16
    got: Counter = Counter()
    body = chat(ctx, n, max_tokens=1500)  # longer than the deadline allows on this CPU
    by = await ctx.bystander_during(
        lambda: send_loops(ctx, ctx.attacker_key, [("/v1/chat/completions", body)], 1, got,
                           headers={"X-LoRAPlex-Timeout": str(deadline_s)}), warmup_s=3.0)
    return AttackResult("waits_out_deadline", f"chat n={n}, max_tokens 1500, X-LoRAPlex-Timeout {deadline_s:g} s, "
                        "the client waiting for the server's answer", got, by, ctx.alone)


ATTACKS = [n_at_plan_cap, n_at_server_bound, many_prompts, waits_out_deadline]
