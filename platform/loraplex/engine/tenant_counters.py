"""TenantCounters: VTC's virtual counters (Sheng et al., OSDI 2024), one per tenant.

A tenant's counter is the cost it was served divided by its plan's weight; whoever serves next
serves the lowest. The fair queue (fair_queue.py) and the tenant scheduler (tenant_scheduler.py)
each keep one: the queue in the replica's process charges what it sees stream back (weighted
tokens), the scheduler in EngineCore what the step cost (engine-seconds); the rules are these.
"""

from __future__ import annotations

from typing import Iterable


class TenantCounters:
    def __init__(self):
        self.counter: dict[str, float] = {}

    def get(self, tenant: str) -> float:
        return self.counter.get(tenant, 0.0)

    def arrive(self, tenant: str, active: Iterable[str]) -> None:
        """A tenant with nothing in flight sends a request: lift it to the lowest active counter
        (no credit for idle time)."""
        others = [self.counter.get(t, 0.0) for t in active if t != tenant]
        if others:
            self.counter[tenant] = max(self.counter.get(tenant, 0.0), min(others))

    def charge(self, tenant: str, cost: float, weight: float = 1.0) -> None:
        self.counter[tenant] = self.counter.get(tenant, 0.0) + cost / max(weight, 1e-9)

    def forget(self, tenant: str, active: Iterable[str]) -> bool:
        """Drop an idle tenant's counter if the lift on its return restores as much (it is 0, or at
        or below the lowest active counter): kept above it, it returns without credit. True if dropped."""
        return self._drop_restorable(tenant, self._lowest(active))

    def forget_idle(self, active: set[str]) -> None:
        """forget() every tenant not in `active`: the dict stays bounded."""
        low = self._lowest(active)
        for tenant in [t for t in self.counter if t not in active]:
            self._drop_restorable(tenant, low)

    def _lowest(self, active: Iterable[str]) -> float | None:
        return min((self.counter.get(t, 0.0) for t in active), default=None)

    def _drop_restorable(self, tenant: str, low: float | None) -> bool:
        value = self.counter.get(tenant, 0.0)
        if value == 0.0 or (low is not None and value <= low):
            self.counter.pop(tenant, None)
            return True
        return False
