"""The tenant scheduler: vLLM's own Scheduler, told each step which prompt tokens to carry.

vLLM runs this class inside EngineCore (`scheduler_cls`, chosen by `scheduler_cls_for`); its
settings travel in `additional_config[CONFIG_KEY]` and each request's tenant and weight in its
sampling params' `extra_args` (set by VLLMEngine from the EngineCall, never by the client).
The choices are step_plan.py's; the step costs step_cost.py's. This file only describes a step
to the plan and applies it through the knobs vLLM's `schedule()` already reads, then restores
them:

- the order of `running` (decodes first, then mid-prefill requests in plan order) and of
  `waiting` (plan order; vLLM's priority queue is replaced by a FCFS deque re-sorted each step);
- what is held out of the step (batch lines paused for online work, prompt work the plan holds
  back, a shared step's decodes past its target): taken out of both lists and out of the
  active-request count (nothing is admitted in its place), put back after the step, one place (`_run`);
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
import math
import os
import time
from dataclasses import dataclass
from typing import Optional

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.request_queue import FCFSRequestQueue
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.engine.core import EngineCore

from loraplex.engine.slack_order import class_target
from loraplex.engine.step_cost import StepCost
from loraplex.engine.step_plan import (DecodeWork, PromptWork, first_tenant_room, is_shared, keep_decodes,
                                       plan_step)
from loraplex.engine.tenant_counters import TenantCounters

# Under "vllm.": EngineCore configures vLLM's loggers only, and this runs in EngineCore.
logger = logging.getLogger("vllm.loraplex.tenant_scheduler")

CONFIG_KEY = "loraplex_tenant_scheduler"  # additional_config's entry with TenantSchedulerSettings
UNREACHABLE_UTILITY = "loraplex_unreachable_steps"  # EngineCore's utility method: the counts per class
ARG_PREFIX = "loraplex_"  # ours in a request's extra_args: a client's own are dropped (VLLMEngine)
TENANT_ARG, WEIGHT_ARG = "loraplex_tenant", "loraplex_weight"  # a request's extra_args
BATCH_ARG = "loraplex_batch"  # a Batch API line (EngineCall.batch): below every online request
CLASS_ARG, TTFT_ARG, TPOT_ARG = "loraplex_slo_class", "loraplex_ttft_s", "loraplex_tpot_s"  # EngineCall.slo
NO_TENANT = "-"  # requests without one (health probes)
# A tenant's batch lines are a tenant of their own here (`<tenant>#batch`: '#' is in no tenant id),
# so they never share a rank with its online work, and sort after every online tier: vLLM
# priorities run 0..100 (100 - EngineCall.priority), batch lines' tiers start past them.
BATCH_SUFFIX, BATCH_TIER = "#batch", 1000
# Decodes are held out of a shared step only where its fixed cost is at most this share of its target.
HOLD_FIXED_SHARE = 0.5


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
    step_share: float = 0.8  # a shared step's target as a share of the tightest class's TPOT target
    classes: bool = True  # size steps by the requests' SLO classes and order prefill by TTFT slack
    slack_bound_s: float = 1.0  # the counter lead (engine-seconds / weight) past which slack no longer orders a tenant


@dataclass
class Step:
    """What vLLM's schedule() sees of one step: the requests it may schedule, in order, and its knobs."""

    running: list
    waiting: list
    token_budget: Optional[int] = None  # max_num_scheduled_tokens (decodes + prompt budget); None: vLLM's
    chunk_cap: int = 0  # long_prefill_token_threshold; 0: vLLM's
    sized: bool = False  # its prompt budget is the TPOT-sized one (what StepCost.observe corrects for)


@dataclass(frozen=True)
class Carried:
    """One request's tokens in a step: what its tenant is charged for."""

    tenant: str
    weight: float
    decode: int
    prompt: int


@dataclass(frozen=True)
class StepRecord:
    """A scheduled step, until vLLM reports it done (update_from_output)."""

    started: float
    carried: list[Carried]
    sized: bool


def slo_args(slo) -> dict:
    """A request's extra_args for its SLO class (contract.SloTargets; None: none)."""
    if slo is None:
        return {}
    args = {CLASS_ARG: slo.name}
    if slo.ttft_s is not None:
        args[TTFT_ARG] = float(slo.ttft_s)
    if slo.tpot_s is not None:
        args[TPOT_ARG] = float(slo.tpot_s)
    return args


def request_slo(request) -> tuple[str, Optional[float], Optional[float]]:
    """(class, TTFT target, TPOT target) from the request's extra_args; ("", None, None) without a class."""
    args = (request.sampling_params.extra_args or {}) if request.sampling_params is not None else {}
    ttft, tpot = args.get(TTFT_ARG), args.get(TPOT_ARG)
    return (str(args.get(CLASS_ARG, "")), float(ttft) if ttft is not None else None,
            float(tpot) if tpot is not None else None)


def request_tenant(request) -> tuple[str, float]:
    """(the scheduler's tenant key, its weight): a batch line's key is `<tenant>#batch`."""
    args = (request.sampling_params.extra_args or {}) if request.sampling_params is not None else {}
    tenant = str(args.get(TENANT_ARG, NO_TENANT))
    return tenant + BATCH_SUFFIX if args.get(BATCH_ARG) else tenant, float(args.get(WEIGHT_ARG, 1.0))


def tier(r) -> int:
    """The request's rank among tiers (lower first): vLLM's priority, past every online one for a batch line."""
    return r.priority + BATCH_TIER if is_batch(r) else r.priority


def is_batch(r) -> bool:
    """A Batch API line (its tenant key is `<tenant>#batch`)."""
    return _tenant(r).endswith(BATCH_SUFFIX)


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
        self.cost = StepCost(horizon_steps=self.settings.horizon_steps, min_steps=self.settings.min_steps)
        self.counters = TenantCounters()
        self.waiting = FCFSRequestQueue()  # re-sorted each step (tier, counter, arrival)
        self._steps: dict[int, StepRecord] = {}  # id(SchedulerOutput) -> what the step carried
        self._seen_at: dict[str, float] = {}  # tenant -> when a step last saw its work (idle_grace_s)
        # LORAPLEX_SCHEDULER_TRACE=<file>: one JSON line per step (what it carried, its time, the fit,
        # the counters), for reading a replica's choices after the fact; unset: nothing written.
        trace = os.environ.get("LORAPLEX_SCHEDULER_TRACE")
        self._trace = open(trace, "a", buffering=1) if trace else None
        self.shared_steps = 0  # steps whose prompt budget was the TPOT-sized one (for tests and logs)
        # Per SLO class (classes on): shared steps its TPOT target was the tightest for, but out of
        # reach (one decode, and the least prompt work when some waits, overrun it): the class
        # cannot be met on this engine, and is said so. tpot_s's target is no class's: not counted.
        self.unreachable: dict[str, int] = {}
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
        """One step: the plan says what it carries; everything else (batch lines paused for online
        work, prompt work the plan holds back, a shared step's decodes past its target) is taken out
        of `running` and `waiting` for vLLM's schedule() and put back after it."""
        started = time.monotonic()  # the step's time runs from here to the end of its update
        s = self.settings
        held_batch = self._held_batch()
        running = [r for r in self.running if r.request_id not in held_batch]
        waiting = [r for r in self.waiting if r.request_id not in held_batch]
        decodes = [r for r in running if not r.is_prefill_chunk]
        prefills = [r for r in running if r.is_prefill_chunk]
        work = [_work(r, True) for r in prefills] + [_work(r, False) for r in waiting]
        recent = self._recent({_tenant(r) for r in running} | {w.tenant for w in work}, started)
        target, in_reach, missed = self._step_target(decodes, prefills + waiting, bool(work))
        held_decodes = self._over_step_target(decodes, work, recent, target)
        for r in decodes:  # steps in a row each was held (keep_decodes bounds them)
            r.loraplex_held_steps = getattr(r, "loraplex_held_steps", 0) + 1 if r.request_id in held_decodes else 0
        if held_decodes:  # their tenants still share the step
            recent += [_tenant(r) for r in decodes if r.request_id in held_decodes]
            decodes = [r for r in decodes if r.request_id not in held_decodes]
        ceiling = max(self._token_budget - len(decodes), 0)
        if s.max_prompt_tokens is not None:
            ceiling = min(ceiling, s.max_prompt_tokens)
        shared_budget = self.cost.prompt_budget(len(decodes), target) if target is not None else None
        plan = plan_step([_tenant(r) for r in decodes], work, self.counters, shared_budget,
                         ceiling, s.min_prompt_tokens, recent=recent, now=time.time(),
                         slack_bound=s.slack_bound_s if s.classes else None)
        if plan.shared:
            for name in missed:
                self.unreachable[name] = self.unreachable.get(name, 0) + 1
        if (not plan.shared and not plan.held and not plan.chunk_cap and not held_decodes
                and s.max_prompt_tokens is None):
            # One tenant's step (or no prompts beside others' decodes): vLLM's own.
            step = Step(running, sorted(waiting, key=lambda r: (tier(r), r.arrival_time)))
        else:
            rank = {key: i for i, key in enumerate(plan.order)}
            held = plan.held | self._over_lora_slots(waiting, plan.held, rank)

            def by_rank(r) -> int:
                return rank.get(r.request_id, len(rank))

            step = Step(decodes + sorted((r for r in prefills if r.request_id not in held), key=by_rank),
                        sorted((r for r in waiting if r.request_id not in held), key=by_rank),
                        token_budget=min(len(decodes) + plan.prompt_budget, self._token_budget),
                        chunk_cap=plan.chunk_cap,
                        # Its budget was the TPOT-sized one: its time tells how far off the fit is for such steps.
                        # (a step sized past a target out of reach has no target to correct for)
                        sized=(in_reach and plan.shared and shared_budget is not None
                               and plan.prompt_budget == shared_budget))
            self.shared_steps += plan.shared
        output = self._run(step, args, kwargs)
        self._note_step(output, started, step.sized)
        return output

    def _run(self, step: Step, args, kwargs):
        """vLLM's schedule() over the step's lists and knobs; every request held out of them goes back after."""
        kept = {r.request_id for r in step.running}
        held_running = [r for r in self.running if r.request_id not in kept]
        kept = {r.request_id for r in step.waiting}
        held_waiting = [r for r in self.waiting if r.request_id not in kept]
        self.running = step.running
        self.waiting = FCFSRequestQueue(step.waiting)
        # The held keep their slots: no request is admitted in their place.
        self.max_num_active_reqs = self._max_active - len(held_running)
        self.max_num_scheduled_tokens = self._token_budget if step.token_budget is None else step.token_budget
        self.scheduler_config.long_prefill_token_threshold = step.chunk_cap or self._threshold
        try:
            return super().schedule(*args, **kwargs)
        finally:
            self.running.extend(held_running)
            for r in held_waiting:
                self.waiting.add_request(r)
            self.max_num_active_reqs = self._max_active
            self.max_num_scheduled_tokens = self._token_budget
            self.scheduler_config.long_prefill_token_threshold = self._threshold

    def _recent(self, present: set[str], now: float) -> list[str]:
        """Tenants with no work in this step that had some within idle_grace_s (they still share it).
        Not the health probes' (no tenant): a 1-token probe must not size a lone tenant's steps for seconds."""
        grace = self.settings.idle_grace_s
        for tenant in present:
            self._seen_at[tenant] = now
        recent = [t for t, at in self._seen_at.items() if t not in present and t != NO_TENANT and now - at < grace]
        if len(self._seen_at) > 4 * len(present) + 64:  # bounded: only the recent ones matter
            self._seen_at = {t: at for t, at in self._seen_at.items() if now - at < grace}
        return recent

    def _held_batch(self) -> set[str]:
        """The batch lines held out of this step (pause_batch): all of them while an online request
        runs or waits; they keep their KV and go on when none is left."""
        if not self.settings.pause_batch:
            return set()
        batch, online = set(), False
        for r in (*self.running, *self.waiting):
            if is_batch(r):
                batch.add(r.request_id)
            else:
                online = True
        return batch if online else set()

    def _step_target(self, decodes: list, prompts: list, prompt_work: bool) -> tuple[Optional[float], bool, list[str]]:
        """(a shared step's target time, whether a step can reach it, the classes whose tighter
        targets it cannot reach).

        The target: the tightest TPOT target x step_share among the classes with decodes in the
        step (without decodes, among those with prompt work) that a step can reach; the settings'
        target with classes off or when none has one; None without any. When none is in reach,
        the tightest: the step carries the least prompt work (min_prompt_tokens) and, its fixed
        cost past half the target, holds no decode (_over_step_target). Unsized instead, a
        neighbour's long prompts filled vLLM's whole token budget (9 s steps on a slow CPU)."""
        s = self.settings
        candidates = [(s.step_target_s, "")] if s.step_target_s is not None else []
        if s.classes:
            for group in (decodes, prompts):
                targets = sorted({(r.loraplex_tpot * s.step_share, r.loraplex_class)
                                  for r in group if _slo(r)[2] is not None})
                if targets:
                    candidates = targets
                    break
        missed = []
        for target, name in candidates:
            if self._reachable(target, s.min_prompt_tokens if prompt_work else 0):
                return target, True, missed
            if name:
                missed.append(name)
        return (candidates[0][0] if candidates else None), False, missed

    def _reachable(self, target: float, prompt_tokens: int) -> bool:
        """A step of one decode (and the least prompt work worth a step, when some waits) ends within
        `target` (the fit's figures)."""
        return self.cost.step_seconds(1, prompt_tokens) + max(self.cost.bias_s, 0.0) <= target

    def _over_step_target(self, decodes: list, work: list, recent: list, target: Optional[float]) -> set[str]:
        """Decodes a shared step leaves out because, with them all, its decodes alone (and the least
        prompt work, when some waits) would run past the step's target: a backlogged tenant's full
        batch beside a light tenant's few made every step of this CPU 0.3 s, the whole TPOT target.
        Who waits is step_plan.keep_decodes' choice (the heaviest tenant's newest). The room for
        prompt work comes out of the other tenants' decodes, never the first tenant's (tier, class,
        counter): its decodes and as many of each other's run (first_tenant_room), as far as
        decodes alone fit: held so that a neighbour's document got its chunk, a chat tenant's own
        streams ran at a fraction of the pace (docs/operations.md). None is held
        where the step's fixed cost is past HOLD_FIXED_SHARE of the target: there the held would
        buy the kept little time at a large cost (on a CPU with 0.2 s steps, 28 of 48 decodes held
        to make a 0.296 s step 0.24 s: the backlogged tenant at 0.2x of alone)."""
        s = self.settings
        if target is None or not is_shared((_tenant(r) for r in decodes), work, recent):
            return set()
        if self.cost.step_seconds(0, 0) + max(self.cost.bias_s, 0.0) > HOLD_FIXED_SHARE * target:
            return set()
        cap = self.cost.decode_capacity(target, s.min_prompt_tokens if work else 0)
        if len(decodes) <= cap:
            return set()
        ranked = [DecodeWork(r.request_id, _tenant(r), tier(r), r.arrival_time, r.loraplex_weight,
                             getattr(r, "loraplex_held_steps", 0),
                             r.loraplex_tpot if s.classes and _slo(r)[2] is not None else math.inf) for r in decodes]
        # Prompt work takes its room from the other tenants' decodes, never from the first tenant's.
        cap = max(cap, min(first_tenant_room(ranked, self.counters), self.cost.decode_capacity(target)))
        if len(decodes) <= cap:
            return set()
        kept = keep_decodes(ranked, self.counters, cap)
        return {r.request_id for r in decodes if r.request_id not in kept}

    def _over_lora_slots(self, waiting: list, held: set[str], rank: dict[str, int]) -> set[str]:
        """Waiting requests whose adapter would make the running set hold more than max_loras.
        vLLM counts only the adapters of the running requests it schedules this step; with some
        held back it would admit new adapters in their place, and the next step, with them all
        back, would hold more adapters than the batch has slots for."""
        if not self.lora_config:
            return set()
        loras = {r.lora_request.lora_int_id for r in self.running if r.lora_request and r.lora_request.lora_int_id > 0}
        over = set()
        for r in sorted((r for r in waiting if r.request_id not in held), key=lambda r: rank.get(r.request_id, len(rank))):
            lora = r.lora_request.lora_int_id if r.lora_request else 0
            if lora > 0 and lora not in loras:
                if len(loras) >= self.lora_config.max_loras:
                    over.add(r.request_id)
                else:
                    loras.add(lora)
        return over

    def _note_step(self, output, started: float, sized: bool) -> None:
        carried = []
        for req_id, n in output.num_scheduled_tokens.items():
            r = self.requests[req_id]
            before = r.num_computed_tokens - n  # vLLM already advanced it by this step's tokens
            prompt = max(0, min(n, r.num_prompt_tokens - before))
            carried.append(Carried(_tenant(r), getattr(r, "loraplex_weight", 1.0), n - prompt, prompt))
        if carried:
            if len(self._steps) > 16:  # a step vLLM never reported back (should not happen): bounded
                self._steps.clear()
            self._steps[id(output)] = StepRecord(started, carried, sized)

    def update_from_output(self, scheduler_output, model_runner_output):
        outputs = super().update_from_output(scheduler_output, model_runner_output)
        step = self._steps.pop(id(scheduler_output), None)
        if step is not None:
            decode = sum(c.decode for c in step.carried)
            prompt = sum(c.prompt for c in step.carried)
            self.cost.observe(decode, prompt, time.monotonic() - step.started, sized=step.sized)
            for c in step.carried:
                self.counters.charge(c.tenant, self.cost.seconds(c.decode, c.prompt, decode + prompt), c.weight)
            if self._trace is not None:
                self._trace.write(_trace_line(step, self.cost, self.counters) + "\n")
            if self.cost.steps % 1000 == 0:  # how the fit sees this engine now, in its log
                logger.info("tenant scheduler: %d steps, %d shared; step cost %s; unreachable steps by class %s",
                            self.cost.steps, self.shared_steps, self.cost.coefficients, self.unreachable)
            if len(self.counters.counter) > 2 * len(self.requests) + 64:
                self.counters.forget_idle({_tenant(r) for r in self.requests.values()})
        return outputs


def _trace_line(step: StepRecord, cost: StepCost, counters: TenantCounters) -> str:
    per: dict[str, tuple[int, int]] = {}
    for c in step.carried:
        d, p = per.get(c.tenant, (0, 0))
        per[c.tenant] = (d + c.decode, p + c.prompt)
    fit = cost.coefficients
    return json.dumps({"at": round(step.started, 4), "seconds": round(time.monotonic() - step.started, 4),
                       "sized": step.sized, "tokens": per,
                       "fit": [round(fit.base_s, 5), round(fit.per_decode_s, 6), round(fit.per_prompt_s, 6)],
                       "bias_s": round(cost.bias_s, 4), "counters": {t: round(v, 3) for t, v in counters.counter.items()}})


def _tenant(r) -> str:
    """The request's tenant, read once (add_request); a request that came another way is read now."""
    tenant = getattr(r, "loraplex_tenant", None)
    if tenant is None:
        r.loraplex_tenant, r.loraplex_weight = request_tenant(r)
        tenant = r.loraplex_tenant
    return tenant


def _slo(r) -> tuple[str, Optional[float], Optional[float]]:
    """The request's (class, TTFT target, TPOT target), read once and kept on it."""
    if not hasattr(r, "loraplex_class"):
        r.loraplex_class, r.loraplex_ttft, r.loraplex_tpot = request_slo(r)
    return r.loraplex_class, r.loraplex_ttft, r.loraplex_tpot


def _work(r, running: bool) -> PromptWork:
    return PromptWork(key=r.request_id, tenant=_tenant(r), tier=tier(r),
                      remaining=max(r.num_tokens - r.num_computed_tokens, 1), running=running,
                      arrival=r.arrival_time, weight=r.loraplex_weight, batch=is_batch(r),
                      ttft_s=class_target(*_slo(r)[:2]))


class TenantScheduler(TenantFairness, Scheduler):
    pass


class AsyncTenantScheduler(TenantFairness, AsyncScheduler):
    pass


def scheduler_cls_for(vllm_config) -> type:
    """The tenant scheduler over the scheduler vLLM would pick itself (async scheduling on GPUs)."""
    return AsyncTenantScheduler if vllm_config.scheduler_config.async_scheduling else TenantScheduler


def _unreachable_steps(engine_core) -> dict[str, int]:
    """The scheduler's unreachable-step count per SLO class, for the replica's metrics.

    vLLM carries a scheduler's figures to its client only in SchedulerStats, whose fields are
    fixed, so the replica asks EngineCore through its utility calls
    (`engine_core.call_utility_async(UNREACHABLE_UTILITY)`), which look the method up on the
    EngineCore object. Set here: vLLM imports this module in EngineCore's process to build the
    scheduler, before any call can come."""
    return dict(getattr(engine_core.scheduler, "unreachable", {}))


setattr(EngineCore, UNREACHABLE_UTILITY, _unreachable_steps)
