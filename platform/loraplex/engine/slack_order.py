"""Who goes first by TTFT slack, within the fairness bound: the one rule the tenant scheduler's
prefill order (step_plan.prefill_order) and the fair queue's admission (fair_queue.py) share.

Each tenant with waiting work is a Claim: its tier, its virtual counter, the TTFT targets of its
waiting work and its slack (its class's TTFT target less how long its oldest has waited). When two
or more distinct TTFT targets wait, a tenant is urgent if

- its slack is finite (it has a target) and not negative: a request already past its target
  cannot meet it any more, and ordering it first would make the one that still can miss too
  (earliest-deadline-first's domino), so it waits its turn by counter;
- it is not batch work (a Batch API line is below every online request anyway);
- its counter is at most `bound` above the lowest counter of its tier: a tight class is served
  first without taking more than its share over time; a tenant that got further ahead waits its
  turn by counter again.

Urgent tenants go first within their tier, least slack first; the rest follow in the caller's
own order (VTC). With one TTFT target waiting, slack would only be arrival order, so the order
stays VTC's. A class without a TTFT target (batch work) waits with an infinite one (class_target):
a class of its own beside the others, whose slack is never finite, so it goes after every class
with a target; work with no class at all (health probes, Batch API lines) counts for none. Tiers
are never crossed. Counters are in the caller's units (engine-seconds in the
scheduler, weighted tokens in the queue), and so is its bound.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Optional


def class_target(slo_class: Optional[str], ttft_s: Optional[float]) -> Optional[float]:
    """The TTFT target work of this class waits with: its own, infinite for a class without one,
    None without a class."""
    if not slo_class:
        return None
    return math.inf if ttft_s is None else ttft_s


@dataclass(frozen=True)
class Claim:
    """One tenant's waiting work, as the order by slack sees it."""

    tenant: str
    tier: int  # the caller's tier, lower first; the bound is measured within a tier
    counter: float  # its virtual counter
    slack: float  # least TTFT slack of its waiting work, in seconds; inf: none has a finite target
    targets: frozenset = frozenset()  # the TTFT targets of its waiting work (class_target; None left out)
    batch: bool = False  # batch work: never urgent


def urgent_tenants(claims: Iterable[Claim], bound: Optional[float]) -> set[str]:
    """The tenants served first by slack (the module docstring); none when `bound` is None (classes
    off) or fewer than two distinct TTFT targets wait."""
    claims = list(claims)
    if bound is None or len(set().union(*(c.targets for c in claims))) < 2:
        return set()
    low: dict[int, float] = {}
    for c in claims:
        low[c.tier] = min(low.get(c.tier, math.inf), c.counter)
    return {c.tenant for c in claims
            if 0 <= c.slack < math.inf and not c.batch and c.counter - low[c.tier] <= bound}


def slack_rank(claim: Claim, urgent: set[str]) -> tuple[bool, float]:
    """The part of a sort key that puts the urgent first, least slack first; the caller's key puts
    its tier before it and its own order (counter, ...) after it."""
    first = claim.tenant in urgent
    return not first, claim.slack if first else 0.0
