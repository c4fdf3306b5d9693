"""FairQueue: per-tenant queues in front of vLLM, served by VTC (tenant_counters.py).

An Engine replica hands a request to vLLM only while its dispatched sequences stay under the
dispatch limit; the rest wait here, one FIFO per tenant (docs/operations.md, "The fair queue").
When a slot frees:

- tiers first (the head request's `priority`), with aging: a lower tier still gets one dispatch
  every `aging_s` (its head queued that long, lowest counter first); aging never reorders tenants
  of one tier;
- within a tier, the lowest virtual counter: prompt_token_cost x prompt + completion_token_cost x
  completion tokens as they stream (charge), divided by the plan's weight;
- with SLO classes on (`slo_classes`), within a tier the head requests by TTFT slack first (their
  class's target less the time since the ingress received them, least first), under the
  scheduler's rule (slack_order.py): only while two or more TTFT targets wait, not a request
  already past its target, not a tenant more than `slack_bound_tokens` above the tier's lowest
  counter; the rest (a class without a TTFT target among them) by counter. The queue cannot price a prompt's prefill (the step cost is
  EngineCore's), so slack has no prefill estimate in it;
- reserved slots (`newcomer_slots` beside the limit, never above max_num_seqs in all): a tenant
  running fewer than its share of the limit (limit x weight / the active tenants' weights, at
  least 1) may take one when the limit's slots are taken, so a light tenant does not wait for a
  backlogged tenant's long request to end. While its tenant has nothing queued, a request in a
  reserved slot does not count against the limit (the backlogged tenant's freed slots are
  refilled beside it); once it queues too, it counts, so backlogged tenants share the limit;
- prefill pacing (`max_prefilling_per_tenant`, None: off): a tenant with that many requests not
  yet at their first token waits for one, and while it is next by VTC the free slot waits too;
  only while another tenant is active;
- batch lines (Entry.batch) wait in a FIFO of their own, start only while no online request is
  queued, into free slots, never past `batch_max_share` of the limit, and charge no counter;
- queue full (`max_queued`): the newest request of the tenant furthest over its share is refused
  (lowest priority, then the SLO class with the most slack, the largest TTFT target, none (batch
  work) first, then most sequences held per unit of weight, then highest counter), possibly
  one already queued; a tenant with nothing queued never is. Held requests decide rather than the
  counter, a long-run measure a tenant just lifted and charged one long prompt can top.

Pure logic with an injected clock: the Engine replica's glue (deployment.py) waits on each
Entry's `ready` callback, charges tokens as they stream, and calls `finish` when a request ends.
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, NamedTuple, Optional

from loraplex.engine.config import FairQueueConfig
from loraplex.engine.slack_order import Claim, slack_rank, urgent_tenants
from loraplex.engine.tenant_counters import TenantCounters

TOP_TIER = 100


@dataclass(eq=False)
class Entry:
    """One request in the queue (or dispatched from it)."""

    tenant: str
    priority: int = 0
    weight: float = 1.0
    deadline: Optional[float] = None  # wall-clock seconds; None: none
    ready: Callable[["Entry"], None] = lambda entry: None  # called once: dispatched or refused
    state: str = "new"  # new -> queued -> running -> done, or refused
    reason: Optional[str] = None  # why refused: fair_share, queue_deadline
    enqueued_at: float = 0.0
    dispatched_at: Optional[float] = None
    prefilling: bool = False  # dispatched, its first token not out yet (first_token() ends it)
    reserved: bool = False  # dispatched into a reserved slot (not counted against the limit)
    # What it runs in vLLM (EngineCall.sequences: n x prompts): the slots it takes. One that needs
    # more than the limit waits for the whole limit, then runs (it is never stuck).
    sequences: int = 1
    batch: bool = False  # a Batch API line: below every online request (the module docstring)
    # Its class's TTFT target (slack_order.class_target: inf for a class with none; None: no class);
    # no finite target: shed first within its tier.
    ttft_s: Optional[float] = None
    arrival: Optional[float] = None  # wall-clock seconds the ingress received it (its TTFT runs from there); None: at submit


@dataclass
class _Tenant:
    name: str
    counters: TenantCounters  # the queue's: this tenant's virtual counter is counters.get(name)
    queue: deque = field(default_factory=deque)
    running: int = 0  # sequences, as every count here (Entry.sequences)
    prefilling: int = 0  # of the running: dispatched, no first token yet
    reserved: int = 0  # of the running: dispatched into a reserved slot
    weight: float = 1.0  # its plan's, from its latest request
    # Since it became active: requests dispatched and the seconds they waited here in total (what
    # /admin/replicas shows: a tenant's TTFT spent in this queue rather than in vLLM).
    dispatches: int = 0
    queue_wait_s: float = 0.0

    @property
    def counter(self) -> float:
        return self.counters.get(self.name)


class _Pick(NamedTuple):
    """Whose head request is dispatched next, and whether into a reserved slot."""

    tenant: str
    reserved: bool


class FairQueue:
    def __init__(self, config: FairQueueConfig, limit, max_num_seqs: int,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time,
                 slo_classes: bool = False):
        self.config = config
        # The fairness bound of the order by TTFT slack (module docstring); None: classes off, by counter alone.
        self.slack_bound = config.slack_bound_tokens if slo_classes else None
        # The dispatch limit: called for its value now; told (saw_full) when a request had to queue.
        self.limit = limit
        self.max_num_seqs = max_num_seqs
        self.clock = clock
        self.wall = wall
        self.tenants: dict[str, _Tenant] = {}
        self.counters = TenantCounters()  # in weighted tokens (charge)
        # Of those, the ones with requests queued, and the active ones (queued or running): the
        # choices scan these, never the idle tenants.
        self.backlog: dict[str, _Tenant] = {}
        self.active: dict[str, _Tenant] = {}
        self.running = 0  # sequences dispatched (Entry.sequences), not requests
        self.reserved = 0  # of the running: in reserved slots
        self.queued = 0
        # No queued request has a deadline before this (wall clock): expire() skips its scan till then.
        self._next_deadline = float("inf")
        self._aged_dispatch_at = float("-inf")  # when aging last let a lower tier pass a higher one
        # The tenant whose head (several sequences) is next but does not fit yet: free slots
        # wait for it, an arrival does not take them (it would starve a request of n choices).
        self._blocked: Optional[str] = None
        self.refused = {"fair_share": 0, "queue_deadline": 0}
        self.batch_queue: deque[Entry] = deque()  # batch lines waiting, oldest first
        self.batch_running = 0  # sequences of batch lines dispatched (also in self.running)

    # -- the request path ------------------------------------------------------------------------
    def submit(self, entry: Entry) -> None:
        """Dispatch the entry now, queue it, or refuse it; `entry.ready` is called unless queued."""
        self.expire()
        if entry.arrival is None:
            entry.arrival = self.wall()
        if entry.batch:
            return self._submit_batch(entry)
        t = self.tenants.get(entry.tenant)
        if t is None:
            t = self.tenants[entry.tenant] = _Tenant(entry.tenant, self.counters)
        t.weight = entry.weight
        slot = self._slot_for(t, entry.sequences)  # None: none free; else whether it is a reserved one
        blocked = slot is False and self._blocked is not None and self._blocked in self.backlog
        if blocked:
            slot = None  # the free slots are a waiting head's
        if not t.queue and slot is not None and not self._paced(entry.tenant, t):  # it starts now (its deadline: the engine's)
            if not t.running:
                self.counters.arrive(entry.tenant, self.active)
            return self._dispatch(entry, t, slot)
        if self._expired(entry):  # it would have to wait, too close to its deadline to start
            return self._refuse(entry, "queue_deadline")
        if not t.queue:
            self.counters.arrive(entry.tenant, self.active)
        if self.queued >= self.config.max_queued:
            victim = self._victim(entry)
            if victim is entry:
                return self._refuse(entry, "fair_share")
            self._remove(victim)
            self._refuse(victim, "fair_share")
        if slot is None:  # the limit held it (not its tenant's pacing): what the adaptive limit hears
            self.limit.saw_full()
        entry.state, entry.enqueued_at = "queued", self.clock()
        t.queue.append(entry)
        self.backlog[entry.tenant] = self.active[entry.tenant] = t
        self.queued += 1
        if entry.deadline is not None:
            self._next_deadline = min(self._next_deadline, entry.deadline)
        if entry.sequences > 1 or blocked:  # free slots it did not take: VTC says who they wait for
            self.pump()

    def finish(self, entry: Entry) -> None:
        """A request ended (done, failed, cancelled) or left the queue: free what it held."""
        if entry.batch:
            return self._finish_batch(entry)
        if entry.state == "running":
            entry.state = "done"
            n = entry.sequences
            self.running -= n
            t = self.tenants[entry.tenant]
            t.running -= n
            self.reserved -= n * entry.reserved
            t.reserved -= n * entry.reserved
            if entry.prefilling:
                entry.prefilling = False
                t.prefilling -= n
        elif entry.state == "queued":
            self._remove(entry)
            entry.state = "done"
        self._forget(entry.tenant)
        self.pump()

    def first_token(self, entry: Entry) -> None:
        """The request's first token is out: its prefill no longer paces its tenant."""
        if entry.prefilling and entry.state == "running" and not entry.batch:
            entry.prefilling = False
            self.tenants[entry.tenant].prefilling -= entry.sequences
            self.pump()

    def charge(self, tenant: str, prompt_tokens: int, completion_tokens: int, weight: float = 1.0) -> None:
        """Add tokens just served to the tenant's virtual counter (prompt_token_cost x prompt +
        completion_token_cost x completion, divided by its weight)."""
        if tenant in self.tenants:
            c = self.config
            self.counters.charge(tenant, c.prompt_token_cost * prompt_tokens
                                 + c.completion_token_cost * completion_tokens, weight)

    def pump(self) -> None:
        """Dispatch queued requests while slots are free (also after the limit rose)."""
        self.expire()
        while self.queued:
            chosen = self._next()
            if chosen is None:
                return  # online work waits: no batch line may pass it
            name, reserved = chosen.tenant, chosen.reserved
            t = self.backlog[name]
            entry = t.queue.popleft()
            self.queued -= 1
            if not t.queue:
                del self.backlog[name]
            self._dispatch(entry, t, reserved)
        self._pump_batch()

    def expire(self) -> None:
        """Refuse every queued request too close to its deadline to start."""
        if self.wall() < self._next_deadline - self.config.deadline_margin_s:
            return
        self._next_deadline = float("inf")
        for entry in [e for e in self.batch_queue if self._expired(e)]:
            self.batch_queue.remove(entry)
            self._refuse(entry, "queue_deadline")
        for entry in self.batch_queue:
            if entry.deadline is not None:
                self._next_deadline = min(self._next_deadline, entry.deadline)
        for t in list(self.backlog.values()):
            for entry in list(t.queue):
                if self._expired(entry):
                    self._remove(entry)
                    self._refuse(entry, "queue_deadline")
                elif entry.deadline is not None:
                    self._next_deadline = min(self._next_deadline, entry.deadline)

    # -- batch lines (below every online request) ------------------------------------------------
    def _submit_batch(self, entry: Entry) -> None:
        entry.state, entry.enqueued_at = "queued", self.clock()
        self.batch_queue.append(entry)
        if entry.deadline is not None:
            self._next_deadline = min(self._next_deadline, entry.deadline)
        self.pump()

    def batch_cap(self) -> int:
        """Sequences batch lines may hold at most: batch_max_share of the limit (at least 1)."""
        return max(1, int(min(self.limit(), self.max_num_seqs) * self.config.batch_max_share))

    def _pump_batch(self) -> None:
        """Dispatch batch lines while no online request is queued and the limit and the batch cap have room."""
        limit, cap = min(self.limit(), self.max_num_seqs), self.batch_cap()
        while self.batch_queue and not self.queued:
            entry = self.batch_queue[0]
            n = entry.sequences
            if self.running + min(n, limit) > limit or self.batch_running + min(n, cap) > cap:
                return
            self.batch_queue.popleft()
            entry.state, entry.dispatched_at = "running", self.clock()
            self.running += n
            self.batch_running += n
            entry.ready(entry)

    def _finish_batch(self, entry: Entry) -> None:
        if entry.state == "running":
            self.running -= entry.sequences
            self.batch_running -= entry.sequences
        elif entry.state == "queued":
            self.batch_queue.remove(entry)
        entry.state = "done"
        self.pump()

    # -- the choices -----------------------------------------------------------------------------
    def _slots(self, need: int = 1) -> tuple[int, bool]:
        """(the limit now, whether only reserved slots can be free for `need` sequences): the
        limit counts every running sequence but those in reserved slots of tenants with nothing
        queued. A need over the limit needs the whole limit."""
        limit = min(self.limit(), self.max_num_seqs)
        need = min(need, limit)
        light = self.reserved - (sum(t.reserved for t in self.backlog.values()) if self.reserved else 0)
        return limit, not (self.running - light + need <= limit and self.running + need <= self.max_num_seqs)

    def _reserve_free(self, limit: int, need: int = 1) -> bool:
        return self.running + min(need, limit) <= min(limit + self.config.newcomer_slots, self.max_num_seqs)

    def _slot_for(self, t: _Tenant, need: int = 1) -> Optional[bool]:
        """The slot t's next request (of `need` sequences) would take: None if none is free,
        else whether it is reserved."""
        limit, reserved_only = self._slots(need)
        if not reserved_only:
            return False
        return True if (self._reserve_free(limit, need)
                        and self._under_share(t, limit, self._active_weight(t), need)) else None

    def _paced(self, name: str, t: _Tenant) -> bool:
        """Held by its own prefills, while another tenant is active: pacing protects the others'
        decodes, and a tenant alone would only start its requests more slowly for nobody."""
        cap = self.config.max_prefilling_per_tenant
        another_active = len(self.active) > (1 if name in self.active else 0)
        return cap is not None and t.prefilling >= cap and another_active

    def _active_weight(self, t: _Tenant) -> float:
        """The active tenants' weights, `t` counted even if it is not active yet."""
        total = sum(a.weight for a in self.active.values())
        return total if t.running or t.queue else total + t.weight  # active: something queued or running

    @staticmethod
    def _under_share(t: _Tenant, limit: int, active_weight: float, need: int = 1) -> bool:
        """May take reserved slots for `need` sequences: still within its share of the limit
        (at least 1) with them."""
        return t.running + min(need, limit) <= max(1, int(limit * t.weight / max(active_weight, 1e-9)))

    @staticmethod
    def tier(entry: Entry) -> int:
        return min(max(entry.priority, 0), TOP_TIER)

    def _next(self) -> Optional[_Pick]:
        """The tenant whose head request goes next, and whether into a reserved slot; None: none."""
        limit, newcomers_only = self._slots()  # newcomers_only: only a tenant under its share may go
        if newcomers_only and not self._reserve_free(limit):
            return None
        weight = sum(a.weight for a in self.active.values()) if newcomers_only else 0.0
        claims = self._claims()
        urgent = urgent_tenants(claims.values(), self.slack_bound) if claims else set()
        best, best_key = None, None  # by tier, then TTFT slack (classes on), then VTC
        for name, t in self.backlog.items():
            if newcomers_only and not self._under_share(t, limit, weight):
                continue
            by_slack = slack_rank(claims[name], urgent) if urgent else ()
            # Equal counters (a tenant just lifted to another's): the one running fewer goes first.
            key = (-self.tier(t.queue[0]), *by_slack, t.counter, t.running)
            if best_key is None or key < best_key:
                best, best_key = name, key
        if best is None:
            return None
        if self._paced(best, self.backlog[best]):
            # The slot waits for the best tenant's prefill (one step or so) rather than going to a
            # tenant further over its share: given away, a paced tenant would get one refill per
            # step whatever its weight, and slots freed together would split evenly.
            return None
        # A head of several sequences waits for as many slots, and the slots wait with it (given
        # to single ones, they would never free together).
        best_slot = self._head_slot(best, newcomers_only)
        self._blocked = best if best_slot is None else None
        # Aging: a lower tier than the best gets one dispatch per aging_s while it is passed over
        # (its head queued aging_s or more; the lowest counter of those).
        now, aging = self.clock(), self.config.aging_s
        if best_key[0] == 0 or now - self._aged_dispatch_at < aging:  # tier 0: no lower tier to let in
            return None if best_slot is None else _Pick(best, best_slot)
        aged, aged_counter = None, None
        for name, t in self.backlog.items():
            head = t.queue[0]
            if ((newcomers_only and not self._under_share(t, limit, weight)) or self.tier(head) >= -best_key[0]
                    or now - head.enqueued_at < aging or self._paced(name, t)):
                continue
            if aged_counter is None or t.counter < aged_counter:
                aged, aged_counter = name, t.counter
        if aged is None:
            return None if best_slot is None else _Pick(best, best_slot)
        aged_slot = self._head_slot(aged, newcomers_only)
        if aged_slot is None:
            return None
        self._aged_dispatch_at = now
        return _Pick(aged, aged_slot)

    def _claims(self) -> dict[str, Claim]:
        """Each backlogged tenant's head request as the order by slack sees it (slack_order.py):
        the head is what the tenant dispatches next. Empty with classes off."""
        if self.slack_bound is None:
            return {}
        now, claims = self.wall(), {}
        for name, t in self.backlog.items():
            head = t.queue[0]
            target = head.ttft_s
            claims[name] = Claim(name, -self.tier(head), t.counter,
                                 slack=target - (now - head.arrival) if target is not None else math.inf,
                                 targets=frozenset(() if target is None else (target,)))
        return claims

    def _head_slot(self, name: str, newcomers_only: bool) -> Optional[bool]:
        """The slot the tenant's head request takes (whether reserved), None if it does not fit."""
        t = self.backlog[name]
        need = t.queue[0].sequences
        return newcomers_only if need <= 1 else self._slot_for(t, need)

    def _victim(self, incoming: Entry) -> Entry:
        """The newest request of the tenant furthest over its share (module docstring), from the
        SLO class with the most slack first within a tier;
        `incoming` only if its own tenant is that tenant and already has requests queued."""
        worst, worst_key = None, None
        for name, t in self.backlog.items():
            mine = name == incoming.tenant
            newest = incoming if mine else t.queue[-1]
            held = (sum(e.sequences for e in t.queue) + t.running + mine * incoming.sequences) / max(newest.weight, 1e-9)
            # Within a tier, the class with the most slack first (no TTFT target: batch work), then by share.
            slack = newest.ttft_s if newest.ttft_s is not None else math.inf
            key = (self.tier(newest), -slack, -held, -t.counter)
            if worst_key is None or key < worst_key:
                worst, worst_key = newest, key
        return worst if worst is not None else incoming

    def _expired(self, entry: Entry) -> bool:
        return entry.deadline is not None and self.wall() >= entry.deadline - self.config.deadline_margin_s

    # -- bookkeeping -----------------------------------------------------------------------------
    def _dispatch(self, entry: Entry, t: _Tenant, reserved: bool) -> None:
        if entry.state == "queued":
            t.queue_wait_s += self.clock() - entry.enqueued_at
        entry.reserved = reserved
        n = entry.sequences
        self.reserved += n * entry.reserved
        t.reserved += n * entry.reserved
        entry.state, entry.dispatched_at = "running", self.clock()
        entry.prefilling = True
        self.running += n
        t.running += n
        t.prefilling += n
        t.dispatches += 1
        self.active[entry.tenant] = t
        entry.ready(entry)

    def _refuse(self, entry: Entry, reason: str) -> None:
        entry.state, entry.reason = "refused", reason
        self.refused[reason] += 1
        entry.ready(entry)
        if not entry.batch:
            self._forget(entry.tenant)

    def _remove(self, entry: Entry) -> None:
        t = self.tenants[entry.tenant]
        t.queue.remove(entry)
        self.queued -= 1
        if not t.queue:
            self.backlog.pop(entry.tenant, None)

    def _forget(self, tenant: str) -> None:
        """A tenant gone idle leaves the active set; it and its counter are dropped when the lift on
        its return restores as much (TenantCounters.forget): the dict stays bounded."""
        t = self.tenants.get(tenant)
        if t is None or t.queue or t.running:
            return
        self.active.pop(tenant, None)
        t.dispatches, t.queue_wait_s = 0, 0.0
        if self.counters.forget(tenant, self.active):
            del self.tenants[tenant]

    def snapshot(self, max_tenants: int = 32) -> dict:
        """For routing stats, metrics and /admin/replicas: the busiest tenants first."""
        # list() of the items is one C call: safe from the metrics publisher's thread.
        busy = sorted(list(self.active.items()),
                      key=lambda nt: (-len(nt[1].queue), -nt[1].running, nt[0]))[:max_tenants]
        # Then the idle tenants whose counter is kept (see _forget): it is still what their
        # next request is weighed by, and a gauge that was never set is not exported at all.
        idle = sorted(((n, t) for n, t in list(self.tenants.items()) if n not in self.active),
                      key=lambda nt: (-nt[1].counter, nt[0]))
        busy += idle[:max_tenants - len(busy)]
        return {
            "dispatch_limit": min(self.limit(), self.max_num_seqs),
            "dispatched": self.running,
            "queued": self.queued,
            "batch_queued": len(self.batch_queue),
            "batch_running": self.batch_running,
            "tenants": {n: {"queued": len(t.queue), "running": t.running, "prefilling": t.prefilling,
                            "counter": round(t.counter, 1),
                            "dispatches": t.dispatches, "queue_wait_s": round(t.queue_wait_s, 3)}
                        for n, t in busy},
        }

