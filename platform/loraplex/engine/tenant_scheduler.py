"""The tenant scheduler: vLLM's own Scheduler, told each step which prompt tokens to carry.

vLLM runs this class inside EngineCore (`scheduler_cls`, chosen by `scheduler_cls_for`); its
settings travel in `additional_config[CONFIG_KEY]` and each request's tenant and weight in its
sampling params' `extra_args` (set by VLLMEngine from the EngineCall, never by the client).
The choices are step_plan.py's; the step costs step_cost.py's. This file only describes a step
to the plan and applies it through the knobs vLLM's `schedule()` already reads, then restores
them:

- the order of `running` (decodes first, then mid-prefill requests in plan order) and of
  `waiting` (plan order; vLLM's priority queue is replaced by a FCFS deque re-sorted each step);
- prompt work the plan holds back, and a shared step's decodes past its target, are taken out of
  both lists for the step (and out of the
  active-request count, so no extra request is admitted in its place);
- `max_num_scheduled_tokens` (this step's token budget: its decodes + the plan's prompt budget)
  and `long_prefill_token_threshold` (the plan's chunk cap) on a private copy of the scheduler
  config.

Everything else (KV allocation, preemption, prefix caching, LoRA slots, async scheduling) is
vLLM's. A step whose work is one tenant's is vLLM's own step, untouched.
After each step its measured time feeds the cost fit, and each request's share of it is charged
to its tenant's virtual counter (engine-seconds / weight).
"""

from __future__ import annotations

import copy
import json
import logging
import os
import time
from dataclasses import dataclass
from typing import Optional

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.request_queue import FCFSRequestQueue
from vllm.v1.core.sched.scheduler import Scheduler

from loraplex.engine.step_cost import StepCost
from loraplex.engine.step_plan import DecodeWork, PromptWork, TenantCounters, is_shared, keep_decodes, plan_step

# Under "vllm.": EngineCore configures vLLM's loggers only, and this runs in EngineCore.
logger = logging.getLogger("vllm.loraplex.tenant_scheduler")

CONFIG_KEY = "loraplex_tenant_scheduler"  # additional_config's entry with TenantSchedulerSettings
TENANT_ARG, WEIGHT_ARG = "loraplex_tenant", "loraplex_weight"  # a request's extra_args
BATCH_ARG = "loraplex_batch"  # a Batch API line (EngineCall.batch): below every online request
NO_TENANT = "-"  # requests without one (health probes)
# A tenant's batch lines are a tenant of their own here (`<tenant>#batch`: '#' is in no tenant id),
# so they never share a rank with its online work, and sort after every online tier: vLLM
# priorities run 0..100 (100 - EngineCall.priority), batch lines' tiers start past them.
BATCH_SUFFIX, BATCH_TIER = "#batch", 1000


@dataclass(frozen=True)
class TenantSchedulerSettings:
    """What EngineCore's scheduler reads (from config.TenantSchedulerConfig, resolved)."""

    step_target_s: Optional[float]  # a shared step's target time (TPOT target x step_share); None: no cap
    min_prompt_tokens: int  # floor of a shared step's prompt budget, and the least share worth a step
    max_prompt_tokens: Optional[int]  # ceiling of any step's prompt tokens; None: vLLM's token budget
    idle_grace_s: float  # a tenant with work this recently still shares the steps
    pause_batch: bool  # batch lines wait out every step that has online work
    horizon_steps: int  # the cost fit's memory
    min_steps: int  # steps before the fit replaces the prior


def request_tenant(request) -> tuple[str, float]:
    """(the scheduler's tenant key, its weight): a batch line's key is `<tenant>#batch`."""
    args = (request.sampling_params.extra_args or {}) if request.sampling_params is not None else {}
    tenant = str(args.get(TENANT_ARG, NO_TENANT))
    return tenant + BATCH_SUFFIX if args.get(BATCH_ARG) else tenant, float(args.get(WEIGHT_ARG, 1.0))


def tier(r) -> int:
    """The request's rank among tiers (lower first): vLLM's priority, past every online one for a batch line."""
    return r.priority + BATCH_TIER if _tenant(r).endswith(BATCH_SUFFIX) else r.priority


class TenantFairness:
    """The behaviour, mixed in front of vLLM's Scheduler or AsyncScheduler."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        raw = (self.vllm_config.additional_config or {}).get(CONFIG_KEY, {})
        self.settings = TenantSchedulerSettings(**raw)
        # Our own copy: the chunk cap is set per step, and nothing else may see it change.
        self.scheduler_config = copy.copy(self.scheduler_config)
        self._threshold = self.scheduler_config.long_prefill_token_threshold
        self._token_budget = self.max_num_scheduled_tokens
        self._max_active = self.max_num_active_reqs
        self._paused = 0  # batch lines left out of the step being scheduled (pause_batch)
        self.cost = StepCost(horizon_steps=self.settings.horizon_steps, min_steps=self.settings.min_steps)
        self.counters = TenantCounters()
        self.waiting = FCFSRequestQueue()  # re-sorted each step (tier, counter, arrival)
        self._steps: dict[int, tuple] = {}  # id(SchedulerOutput) -> what the step carried
        self._sized = False  # the step being scheduled has the TPOT-sized prompt budget
        self._seen_at: dict[str, float] = {}  # tenant -> when a step last saw its work (idle_grace_s)
        # LORAPLEX_SCHEDULER_TRACE=<file>: one JSON line per step (what it carried, its time, the fit,
        # the counters), for reading a replica's choices after the fact; unset: nothing written.
        trace = os.environ.get("LORAPLEX_SCHEDULER_TRACE")
        self._trace = open(trace, "a", buffering=1) if trace else None
        self.shared_steps = 0  # steps whose prompt budget was the TPOT-sized one (for tests and logs)
        logger.info("tenant scheduler on: %s", self.settings)

    # -- requests --------------------------------------------------------------------------------
    def add_request(self, request) -> None:
        if request.request_id not in self.requests:
            tenant = _tenant(request)  # read once here, kept on the request
            active = {_tenant(r) for r in self.requests.values()}
            if tenant not in active:
                self.counters.arrive(tenant, active)
        super().add_request(request)

    # -- the step --------------------------------------------------------------------------------
    def schedule(self, *args, **kwargs):
        """A step without the batch lines while online work is in the engine (pause_batch): they stay
        in `running` / `waiting` with their KV, and are left out of the step as held decodes are."""
        paused = self._paused_batch()
        if not paused:
            return self._schedule(*args, **kwargs)
        running = [r for r in self.running if r.request_id in paused]
        waiting = [r for r in self.waiting if r.request_id in paused]
        self.running = [r for r in self.running if r.request_id not in paused]
        self.waiting = FCFSRequestQueue(r for r in self.waiting if r.request_id not in paused)
        self._paused = len(running)  # they hold their slots: no request is admitted in their place
        self.max_num_active_reqs = self._max_active - self._paused
        try:
            return self._schedule(*args, **kwargs)
        finally:
            self.running.extend(running)
            for r in waiting:
                self.waiting.add_request(r)
            self._paused = 0
            self.max_num_active_reqs = self._max_active

    def _paused_batch(self) -> set[str]:
        """The batch lines this step leaves out: all of them while an online request runs or waits."""
        if not self.settings.pause_batch:
            return set()
        batch, online = set(), False
        for r in (*self.running, *self.waiting):
            if _tenant(r).endswith(BATCH_SUFFIX):
                batch.add(r.request_id)
            else:
                online = True
        return batch if online else set()

    def _schedule(self, *args, **kwargs):
        started = time.monotonic()  # the step's time runs from here to the end of its update
        decodes, prefills = [], []
        for r in self.running:
            (prefills if r.is_prefill_chunk else decodes).append(r)
        waiting = list(self.waiting)
        work = [_work(r, True) for r in prefills] + [_work(r, False) for r in waiting]
        s = self.settings
        present = {_tenant(r) for r in self.running} | {w.tenant for w in work}
        for tenant in present:
            self._seen_at[tenant] = started
        # Not the health probes' (no tenant): a 1-token probe must not size a lone tenant's steps for seconds.
        recent = [t for t, at in self._seen_at.items()
                  if t not in present and t != NO_TENANT and started - at < s.idle_grace_s]
        if len(self._seen_at) > 4 * len(present) + 64:  # bounded: only the recent ones matter
            self._seen_at = {t: at for t, at in self._seen_at.items() if started - at < s.idle_grace_s}
        held_decodes = self._over_step_target(decodes, work, recent)
        if held_decodes:  # their tenants still share the step
            recent += [_tenant(r) for r in decodes if r.request_id in held_decodes]
            decodes = [r for r in decodes if r.request_id not in held_decodes]
        ceiling = max(self._token_budget - len(decodes), 0)
        if s.max_prompt_tokens is not None:
            ceiling = min(ceiling, s.max_prompt_tokens)
        shared_budget = (self.cost.prompt_budget(len(decodes), s.step_target_s)
                         if s.step_target_s is not None else None)
        plan = plan_step([_tenant(r) for r in decodes], work, self.counters, shared_budget,
                         ceiling, s.min_prompt_tokens, recent=recent)
        if (not plan.protected and not plan.hidden and not plan.chunk_cap and not held_decodes
                and s.max_prompt_tokens is None):
            # One tenant's step (or no prompts beside others' decodes): vLLM's own.
            self.waiting = FCFSRequestQueue(sorted(waiting, key=lambda r: (tier(r), r.arrival_time)))
            self._sized = False
            output = super().schedule(*args, **kwargs)
            self._note_step(output, started)
            return output
        rank = {key: i for i, key in enumerate(plan.order)}
        hidden = plan.hidden | self._over_lora_slots(waiting, plan.hidden, rank)
        held_running = [r for r in prefills if r.request_id in hidden] + [r for r in self.running
                                                                           if r.request_id in held_decodes]
        held_waiting = [r for r in waiting if r.request_id in hidden]
        self.running = decodes + sorted((r for r in prefills if r.request_id not in hidden),
                                        key=lambda r: rank.get(r.request_id, len(rank)))
        self.waiting = FCFSRequestQueue(sorted((r for r in waiting if r.request_id not in hidden),
                                               key=lambda r: rank.get(r.request_id, len(rank))))
        self.max_num_scheduled_tokens = min(len(decodes) + plan.prompt_budget, self._token_budget)
        self.scheduler_config.long_prefill_token_threshold = plan.chunk_cap or self._threshold
        self.max_num_active_reqs = self._max_active - self._paused - len(held_running)
        self.shared_steps += plan.protected
        # The step's budget was the TPOT-sized one: its time tells how far off the fit is for such steps.
        self._sized = plan.protected and shared_budget is not None and plan.prompt_budget == shared_budget
        try:
            output = super().schedule(*args, **kwargs)
        finally:
            self.running.extend(held_running)
            for r in held_waiting:
                self.waiting.add_request(r)
            self.max_num_scheduled_tokens = self._token_budget
            self.scheduler_config.long_prefill_token_threshold = self._threshold
            self.max_num_active_reqs = self._max_active - self._paused
        self._note_step(output, started)
        return output

    def _over_step_target(self, decodes: list, work: list, recent: list) -> set[str]:
        """Decodes a shared step leaves out because, with them all, its decodes alone (and the least
        prompt work, when some waits) would run past the step's target: a backlogged tenant's full
        batch beside a light tenant's few made every step of this CPU 0.3 s, the whole TPOT target.
        Who waits is step_plan.keep_decodes' choice (the heaviest tenant's newest)."""
        s = self.settings
        if s.step_target_s is None or not is_shared((_tenant(r) for r in decodes), work, recent):
            return set()
        cap = self.cost.decode_capacity(s.step_target_s, s.min_prompt_tokens if work else 0)
        if len(decodes) <= cap:
            return set()
        kept = keep_decodes([DecodeWork(r.request_id, _tenant(r), tier(r), r.arrival_time, r.loraplex_weight)
                             for r in decodes], self.counters, cap)
        return {r.request_id for r in decodes if r.request_id not in kept}

    def _over_lora_slots(self, waiting: list, hidden: set[str], rank: dict[str, int]) -> set[str]:
        """Waiting requests whose adapter would make the running set hold more than max_loras.
        vLLM counts only the adapters of the running requests it schedules this step; with some
        held back it would admit new adapters in their place, and the next step, with them all
        back, would hold more adapters than the batch has slots for."""
        if not self.lora_config:
            return set()
        loras = {r.lora_request.lora_int_id for r in self.running if r.lora_request and r.lora_request.lora_int_id > 0}
        over = set()
        for r in sorted((r for r in waiting if r.request_id not in hidden), key=lambda r: rank.get(r.request_id, len(rank))):
            lora = r.lora_request.lora_int_id if r.lora_request else 0
            if lora > 0 and lora not in loras:
                if len(loras) >= self.lora_config.max_loras:
                    over.add(r.request_id)
                else:
                    loras.add(lora)
        return over

    def _note_step(self, output, started: float) -> None:
        carried = []
        for req_id, n in output.num_scheduled_tokens.items():
            r = self.requests[req_id]
            before = r.num_computed_tokens - n  # vLLM already advanced it by this step's tokens
            prompt = max(0, min(n, r.num_prompt_tokens - before))
            carried.append((_tenant(r), getattr(r, "loraplex_weight", 1.0), n - prompt, prompt))
        if carried:
            if len(self._steps) > 16:  # a step vLLM never reported back (should not happen): bounded
                self._steps.clear()
            self._steps[id(output)] = (started, carried, self._sized)

    def _write_trace(self, started: float, carried: list, sized: bool) -> None:
        self._trace.write(_trace_line(started, carried, sized, self.cost, self.counters) + "\n")

    def update_from_output(self, scheduler_output, model_runner_output):
        outputs = super().update_from_output(scheduler_output, model_runner_output)
        step = self._steps.pop(id(scheduler_output), None)
        if step is not None:
            started, carried, sized = step
            self.cost.observe(sum(c[2] for c in carried), sum(c[3] for c in carried), time.monotonic() - started,
                              sized=sized)

            tokens = sum(c[2] + c[3] for c in carried)
            for tenant, weight, decode, prompt in carried:
                self.counters.charge(tenant, self.cost.seconds(decode, prompt, tokens), weight)
            if self._trace is not None:
                self._write_trace(started, carried, sized)
            if self.cost.steps % 1000 == 0:  # how the fit sees this engine now, in its log
                logger.info("tenant scheduler: %d steps, %d shared; step cost %s", self.cost.steps,
                            self.shared_steps, self.cost.coefficients)
            if len(self.counters.counter) > 2 * len(self.requests) + 64:
                self.counters.forget_idle({_tenant(r) for r in self.requests.values()})
        return outputs


def _trace_line(started: float, carried: list, sized: bool, cost, counters) -> str:
    per: dict = {}
    for tenant, _, decode, prompt in carried:
        d, p = per.get(tenant, (0, 0))
        per[tenant] = (d + decode, p + prompt)
    c = cost.coefficients
    return json.dumps({"at": round(started, 4), "seconds": round(time.monotonic() - started, 4), "sized": sized,
                       "tokens": per, "fit": [round(c.base_s, 5), round(c.per_decode_s, 6), round(c.per_prompt_s, 6)],
                       "bias_s": round(cost.bias_s, 4), "counters": {t: round(v, 3) for t, v in counters.counter.items()}})


def _tenant(r) -> str:
    """The request's tenant, read once (add_request); a request that came another way is read now."""
    tenant = getattr(r, "loraplex_tenant", None)
    if tenant is None:
        r.loraplex_tenant, r.loraplex_weight = request_tenant(r)
        tenant = r.loraplex_tenant
    return tenant


def _work(r, running: bool) -> PromptWork:
    return PromptWork(key=r.request_id, tenant=_tenant(r), tier=tier(r),
                      remaining=max(r.num_tokens - r.num_computed_tokens, 1), running=running,
                      arrival=r.arrival_time, weight=r.loraplex_weight, batch=_tenant(r).endswith(BATCH_SUFFIX))


class TenantScheduler(TenantFairness, Scheduler):
    pass


class AsyncTenantScheduler(TenantFairness, AsyncScheduler):
    pass


def scheduler_cls_for(vllm_config) -> type:
    """The tenant scheduler over the scheduler vLLM would pick itself (async scheduling on GPUs)."""
    return AsyncTenantScheduler if vllm_config.scheduler_config.async_scheduling else TenantScheduler
