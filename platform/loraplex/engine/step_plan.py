"""StepPlan: which prompt tokens one engine step carries, and whose (the tenant scheduler's choices).

Sarathi-Serve's stall-free batching with VTC's fair counter applied where tokens are scheduled
(Agrawal et al., OSDI 2024; Sheng et al., OSDI 2024), as plain logic over plain records: the
vLLM glue (tenant_scheduler.py) describes the step's work and applies the plan.

- Decodes first: every running request that is decoding gets its token; prompt tokens come after.
- Shared steps are sized: when the step's work belongs to two or more tenants and decodes
  run, the step's prompt tokens are capped so the step ends within the TPOT target
  (`StepCost.prompt_budget`), between `floor` and `ceiling`. A long prompt is cut into chunks
  that fit, so a neighbour's decodes never wait behind a whole document. A tenant that had work
  moments ago still counts (`recent`): a chat client's next request follows its last by a moment,
  and would otherwise arrive during an uncapped step (6 s for 2,048 prompt tokens on this CPU) and
  wait it out. One tenant alone is never capped (its prompts against its own decodes are its own trade, and capping it would only
  slow it below bare vLLM): its steps are vLLM's own.
- A shared step's decodes fit the target too: when a step's decodes alone would run past it (a
  backlogged tenant's full batch beside a light tenant's few), the decodes are cut to what fits
  (`StepCost.decode_capacity`) and shared the same way, tier then class (tightest TPOT first)
  then counter, max-min by weight: the
  light tenant's decodes all run, and of the heavy tenant's its oldest (so they finish, as they
  would have had it been alone with a smaller batch; taking turns made all of them slow, and in
  a 20-tenant overload none finished). Prompt work waiting makes room out of the decodes too, but
  never out of the first tenant's: the step keeps its decodes and as many of each other tenant's
  (`first_tenant_room`). The held ones keep their KV blocks and slots. A decode
  held `MAX_HELD_STEPS` steps in a row goes first among its tenant's: oldest first alone held a
  tenant's newer stream for its older one's whole length (a stall of minutes, to its deadline).
- The budget is split across tenants by their virtual counters: tenants in order of tier (the
  request's vLLM priority), then counter; as many as the budget can give `floor` tokens each are
  served this step, max-min fair by weight (a short prompt gets all it needs, the rest share the
  remainder in proportion to their weights: the water level). A tenant whose first prompt needs more than its share
  gets that share as a chunk; its further prompts wait. A tenant that arrives now has its
  counter lifted to the lowest active one (no credit for idle time) and so is among the first
  served in the very next step.
- Batch lines (PromptWork.batch) get only what the online tenants leave of the budget: the water
  fill runs over the online tenants first, then over the batch ones with the rest.
- SLO classes: when prompts of two or more classes (distinct TTFT targets) wait, the tenants
  within the fairness bound of the lowest counter are served by TTFT slack, the least first, each
  taking what it needs (`prefill_order`); with one class the order is VTC's, as above.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable, Optional

from loraplex.engine.slack_order import Claim, slack_rank, urgent_tenants
from loraplex.engine.tenant_counters import TenantCounters

# Steps in a row a decode may be held before it goes first among its tenant's: its stream stalls
# at most this many steps (~2 s at the CPU profile's 0.24 s step target), and the tenant's oldest
# keep most of its share (all but one step in 9 when it has one decode more than fits).
MAX_HELD_STEPS = 8


@dataclass(frozen=True)
class PromptWork:
    """A request with prompt tokens still to compute (mid-prefill in vLLM's running list, or waiting)."""

    key: str
    tenant: str
    tier: int  # vLLM's priority: lower runs first
    remaining: int  # prompt tokens still to compute (an upper bound: a prefix-cache hit may cut it)
    running: bool
    arrival: float
    weight: float = 1.0  # the tenant's plan weight: its share of a step against others'
    batch: bool = False  # a Batch API line: served from what online work leaves of the step
    ttft_s: Optional[float] = None  # its class's TTFT target (slack_order.class_target: inf for none; None: no class)


@dataclass(frozen=True)
class DecodeWork:
    """A running request past its prefill: one token a step, if the step carries it."""

    key: str
    tenant: str
    tier: int
    arrival: float  # a tenant's oldest decodes go first
    weight: float = 1.0
    held_steps: int = 0  # steps in a row this decode was held out of the step, up to the last one
    tpot_s: float = math.inf  # its class's TPOT target (inf: none, or classes off): the tighter goes first


@dataclass
class StepPlan:
    shared: bool  # the step's work is two or more tenants': its prompt budget is the TPOT-sized one
    prompt_budget: int  # prompt tokens this step may carry
    chunk_cap: int  # prompt tokens one request may take this step (0: no cap)
    order: list[str] = field(default_factory=list)  # the served prompt work, in the order to schedule it
    held: set[str] = field(default_factory=set)  # prompt work held out of this step
    shares: dict[str, int] = field(default_factory=dict)  # tenant -> prompt tokens granted


def is_shared(decode_tenants: Iterable[str], work: Iterable[PromptWork], recent: Iterable[str] = ()) -> bool:
    """The step's work (or work moments ago) belongs to two or more tenants: its time is sized."""
    return len(set(decode_tenants) | {w.tenant for w in work} | set(recent)) > 1


def keep_decodes(decodes: list[DecodeWork], counters: TenantCounters, cap: int) -> set[str]:
    """The decodes a shared step carries when it cannot carry them all: `cap` of them, split across
    tenants in order of tier, then class (the tightest TPOT target first: the step is sized for
    it, and a hold that kept a looser class's decodes instead would slow everyone and pace no
    one), then counter, max-min by weight (a tenant with few gets all of them), and within a
    tenant those held MAX_HELD_STEPS steps in a row first (the longest held first), then its oldest."""
    if len(decodes) <= cap:
        return {d.key for d in decodes}
    by_tenant, rank = _decode_levels(sorted(decodes, key=_decode_order))
    kept: set[str] = set()
    left = max(cap, 1)
    for level in sorted(set(rank.values())):
        group = sorted((t for t in by_tenant if rank[t] == level), key=lambda t: counters.get(t))
        shares = _water_fill({t: len(by_tenant[t]) for t in group}, left,
                             {t: by_tenant[t][0].weight for t in group})
        for t in group:
            kept.update(d.key for d in by_tenant[t][:shares[t]])
        left -= sum(shares.values())
        if left <= 0:
            break
    return kept


def first_tenant_room(decodes: list[DecodeWork], counters: TenantCounters) -> int:
    """The least cap with which keep_decodes keeps every decode of the tenant it serves first (the
    lowest tier, then class, then counter): at that level, each tenant's decodes up to as many as
    the first tenant has (its max-min share)."""
    by_tenant, level = _decode_levels(decodes)
    if not level:
        return 0
    first = min(by_tenant, key=lambda t: (*level[t], counters.get(t)))
    n = len(by_tenant[first])
    return sum(min(len(ds), n) for t, ds in by_tenant.items() if level[t] == level[first])


def _decode_levels(decodes: list[DecodeWork]) -> tuple[dict[str, list[DecodeWork]], dict[str, tuple]]:
    """Each tenant's decodes (in the given order) and its level among them: (tier, class TPOT), the lowest first."""
    by_tenant: dict[str, list[DecodeWork]] = {}
    for d in decodes:
        by_tenant.setdefault(d.tenant, []).append(d)
    return by_tenant, {t: (min(d.tier for d in ds), min(d.tpot_s for d in ds)) for t, ds in by_tenant.items()}


def _decode_order(d: DecodeWork) -> tuple:
    """A tenant's decodes in the order its share of a step takes them: held too long, then oldest."""
    return -d.held_steps if d.held_steps >= MAX_HELD_STEPS else 0, d.arrival, d.key


def plan_step(decode_tenants: list[str], work: list[PromptWork], counters: TenantCounters,
              budget_when_shared: Optional[int], ceiling: int, floor: int,
              recent: Iterable[str] = (), now: float = 0.0, slack_bound: Optional[float] = None) -> StepPlan:
    """The plan for one step. `decode_tenants`: the tenant of each decoding request;
    `budget_when_shared`: the TPOT-sized prompt budget (None: no target, the ceiling); `recent`:
    tenants with nothing in the engine now that had work moments ago (their next request is
    likely on its way, and would wait out a whole uncapped step); `now`: the clock of the work's
    arrivals; `slack_bound`: the fairness bound of the order by TTFT slack (prefill_order; None: off)."""
    # Shared: another tenant's decodes to keep on pace, its prompt to let through soon (a step with
    # another's 1,800-token chunk in it took 5.8 s here), or its next request, soon.
    shared = is_shared(decode_tenants, work, recent)
    budget = ceiling
    if shared and budget_when_shared is not None:
        budget = min(max(budget_when_shared, floor), ceiling)
    by_tenant: dict[str, list[PromptWork]] = {}
    for w in sorted(work, key=lambda w: (not w.running, w.arrival)):  # a tenant's mid-prefill one first
        by_tenant.setdefault(w.tenant, []).append(w)
    if len(by_tenant) <= 1 and not shared:  # one tenant's prompts, no one else's decodes: vLLM's own step
        return StepPlan(False, budget, 0, order=[w.key for ws in by_tenant.values() for w in ws])
    ranked, urgent = prefill_order(by_tenant, counters, now, slack_bound)
    served = ranked[:max(1, budget // max(floor, 1))]
    demand = {t: sum(w.remaining for w in by_tenant[t]) for t in served}
    weights = {t: by_tenant[t][0].weight for t in served}
    batch = {t for t in served if by_tenant[t][0].batch}
    # The urgent (by TTFT slack, within the fairness bound) take what they need in turn; the rest share what is left.
    shares: dict[str, int] = {}
    for t in (t for t in served if t in urgent):
        shares[t] = min(demand[t], budget - sum(shares.values()))
    rest = {t: d for t, d in demand.items() if t not in batch and t not in urgent}
    shares.update(_water_fill(rest, budget - sum(shares.values()), weights))
    shares.update(_water_fill({t: demand[t] for t in batch}, budget - sum(shares.values()), weights))
    level = max((shares[t] for t in served if shares[t] < sum(w.remaining for w in by_tenant[t])), default=0)
    if level and urgent:  # vLLM's chunk cap is one for all: an urgent prompt must fit under it whole
        level = max(level, *(shares[t] for t in served if t in urgent))
    order, held = [], {w.key for t in ranked[len(served):] for w in by_tenant[t]}
    for t in served:
        left = shares[t]
        for w in by_tenant[t]:
            fits = w.remaining <= left
            # A mid-prefill chunk vLLM would schedule first (running) past its share under that cap waits a step.
            over = urgent and w.running and min(w.remaining, left) < min(w.remaining, level or w.remaining)
            if left > 0 and (fits or left == shares[t]) and not over:  # whole prompts, or the tenant's first as a chunk
                order.append(w.key)
                left -= min(w.remaining, left)
            else:
                held.add(w.key)
    return StepPlan(shared, budget, level, order=order, held=held, shares=shares)


def prefill_order(by_tenant: dict[str, list[PromptWork]], counters: TenantCounters, now: float,
                  slack_bound: Optional[float]) -> tuple[list[str], set[str]]:
    """The tenants with prompt work in the order the step serves them, and the urgent among them.

    By tier, then counter (VTC), then arrival; within a tier the urgent by TTFT slack first
    (slack_order.py: two or more TTFT targets waiting, within `slack_bound` of the tier's lowest
    counter, not past its target), each taking what it needs of the budget before the others
    share it. The slack of a tenant's work: its class's target less how long its oldest prompt
    has waited."""
    def vtc(t: str) -> tuple:
        return min(w.tier for w in by_tenant[t]), counters.get(t), min(w.arrival for w in by_tenant[t])
    if slack_bound is None:  # classes off: nothing to weigh
        return sorted(by_tenant, key=vtc), set()
    claims = {t: Claim(t, vtc(t)[0], counters.get(t),
                       slack=min((w.ttft_s - (now - w.arrival) for w in ws if w.ttft_s is not None), default=math.inf),
                       targets=frozenset(w.ttft_s for w in ws if w.ttft_s is not None), batch=ws[0].batch)
              for t, ws in by_tenant.items()}
    urgent = urgent_tenants(claims.values(), slack_bound)
    return sorted(by_tenant, key=lambda t: (vtc(t)[0], *slack_rank(claims[t], urgent), *vtc(t)[1:])), urgent


def _water_fill(demand: dict[str, int], budget: int, weight: dict[str, float] | None = None) -> dict[str, int]:
    """Weighted max-min fair split of `budget` over `demand`: each open tenant gets its weight's
    part of what is left, up to its demand, until nothing is (whole tokens; the remainder to the first)."""
    weight = weight or {}
    share = {t: 0 for t in demand}
    left, open_ = budget, [t for t in demand if demand[t] > 0]
    while left > 0 and open_:
        round_left, total = left, sum(max(weight.get(t, 1.0), 1e-9) for t in open_)
        for t in list(open_):
            each = max(int(round_left * max(weight.get(t, 1.0), 1e-9) / total + 1e-9), 1)
            give = min(each, demand[t] - share[t], left)
            share[t] += give
            left -= give
            if share[t] >= demand[t]:
                open_.remove(t)
            if left == 0:
                break
    return share
