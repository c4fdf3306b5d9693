"""A simulation of SLO classes on one replica (no model, no Ray): vLLM's own Scheduler and the
TenantScheduler (classes on, and off: the single-SLO scheduler) driven by fake steps on a fake
clock, each step taking `base + per_decode x decodes + per_prompt x prompt tokens` (+-10 %), the
scheduler's cost fit learning from those times. For bench/scenarios/slo_classes.py --simulate."""

from __future__ import annotations

import random
import sys
from dataclasses import dataclass
from unittest import mock

from bench.processes import ROOT


@dataclass(frozen=True)
class Load:
    tenant: str
    slo: tuple  # (class, ttft_s or None, tpot_s or None)
    rate: float  # Poisson arrivals per simulated second
    prompt: tuple[int, int]  # prompt tokens, uniform in [lo, hi]
    tokens: int


# CPU-profile classes (serve_config.yaml) and a mix of them on one replica.
MIX = [Load("interactive", ("interactive", 1.0, 0.3), 0.5, (60, 150), 16),
       Load("chat", ("chat", 2.5, 0.3), 0.4, (50, 300), 64),
       Load("agent", ("agent", 5.0, 0.2), 0.06, (100, 300), 256),
       Load("batch", ("batch", None, None), 0.25, (800, 1200), 32)]
# A chat tenant beside a neighbour sending 1,000-token prompts (fairness's `longprompt`, open loop):
# at the slower CPU's costs (0.18 s a step, 4.5 ms a prompt token) the neighbour alone is past capacity.
LONGPROMPT = [Load("long", ("chat", 2.5, 0.3), 0.3, (900, 1100), 16),
              Load("chat", ("chat", 2.5, 0.3), 0.5, (40, 60), 16)]
# A light chat tenant beside a decode-heavy neighbour (fairness's `noisy`: many 96-token answers in flight).
NOISY = [Load("heavy", ("chat", 2.5, 0.3), 1.0, (50, 300), 96),
         Load("chat", ("chat", 2.5, 0.3), 0.5, (40, 60), 16)]
MIXES = {"classes": MIX, "longprompt": LONGPROMPT, "noisy": NOISY}


def simulate(variant: str, mix: list[Load], seconds: float, seed: int = 0, costs=(0.06, 0.004, 0.0015)) -> dict:
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.outputs import ModelRunnerOutput

    from bench.fake_steps import FakeClock, fake_request, make_scheduler
    from loraplex.contract import SloTargets
    from loraplex.engine import tenant_scheduler
    from loraplex.engine.config import TenantSchedulerConfig

    sys.path.insert(0, str(ROOT / "tests"))
    from model_dir import default_model_dir

    rng = random.Random(seed)
    clock = FakeClock()
    arrivals = []
    for load in mix:
        t = clock.now
        while True:
            t += rng.expovariate(load.rate)
            if t >= clock.now + seconds:
                break
            arrivals.append((t, load))
    arrivals.sort(key=lambda a: a[0])
    config = TenantSchedulerConfig(tpot_s=0.3, slo_classes=variant == "classes")
    cls = Scheduler if variant == "vllm" else tenant_scheduler.TenantScheduler
    base, per_decode, per_prompt = costs
    with mock.patch.object(tenant_scheduler, "time", clock):
        s = make_scheduler(cls, str(default_model_dir()), {tenant_scheduler.CONFIG_KEY: config.settings()},
                           max_num_seqs=32)
        reqs, first, done, load_of = {}, {}, {}, {}
        i, end = 0, clock.now + seconds
        while clock.now < end or s.requests:
            while i < len(arrivals) and arrivals[i][0] <= clock.now:
                at, load = arrivals[i]
                name, ttft, tpot = load.slo
                r = fake_request(load.tenant, rng.randint(*load.prompt), max_tokens=load.tokens, arrival=at,
                                 slo=SloTargets(name, ttft, tpot))
                reqs[r.request_id], load_of[r.request_id] = r, load
                s.add_request(r)
                i += 1
            if not s.requests:
                clock.now = arrivals[i][0] if i < len(arrivals) else end
                continue
            out = s.schedule()
            scheduled = out.num_scheduled_tokens
            decodes = sum(1 for rid in scheduled if reqs[rid].num_computed_tokens - scheduled[rid] >= reqs[rid].num_prompt_tokens)
            prompt = sum(scheduled.values()) - decodes
            clock.now += (base + per_decode * decodes + per_prompt * prompt) * rng.uniform(0.9, 1.1)
            ids = list(scheduled)
            sampled = [[] if s.requests[r].num_computed_tokens < s.requests[r].num_tokens else [11] for r in ids]
            s.update_from_output(out, ModelRunnerOutput(req_ids=ids, req_id_to_index={r: k for k, r in enumerate(ids)},
                                                        sampled_token_ids=sampled))
            for rid in ids:
                r = reqs[rid]
                if r.num_output_tokens >= 1 and rid not in first:
                    first[rid] = clock.now
                if r.num_output_tokens >= r.sampling_params.max_tokens and rid not in done:
                    done[rid] = clock.now
            if clock.now > end + 600:
                break
    per: dict = {}
    good_tokens = total_tokens = 0
    for rid, r in reqs.items():
        load = load_of[rid]
        _, ttft_t, tpot_t = load.slo
        stats = per.setdefault(load.tenant, {"sent": 0, "good": 0, "ttft": [], "tpot": []})
        stats["sent"] += 1
        if rid not in done:
            continue
        ttft = first[rid] - r.arrival_time
        tpot = (done[rid] - first[rid]) / max(load.tokens - 1, 1)
        stats["ttft"].append(ttft)
        stats["tpot"].append(tpot)
        total_tokens += load.tokens
        if (ttft_t is None or ttft <= ttft_t) and (tpot_t is None or tpot <= tpot_t):
            stats["good"] += 1
            good_tokens += load.tokens
    span = max(done.values(), default=end) - (end - seconds)
    unreachable = dict(getattr(s, "unreachable", {}))
    return {"tenants": per, "goodput": good_tokens / span, "throughput": total_tokens / span, "span": span,
            "unreachable": unreachable}


def p95(xs: list[float]) -> float | None:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(0.95 * len(xs)))] if xs else None
