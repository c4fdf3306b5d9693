"""TenantAffinityRouter: Ray Serve's RequestRouter around any loraplex RoutingPolicy.

Set on the Engine deployment (engine/deployment.py, through
`RoutingConfig.request_router_config(TenantAffinityRouter)`); every DeploymentHandle to the
Engine (the ingress replicas') builds one and routes each call through it. One class
serves every policy a RoutingConfig can name (built in, or loaded by import path), so policies
run side by side on the same deployment.

Per call of `Engine.generate(call, request)`:
- the call's `EngineCall` (contract.generate_args: the first argument, or the keyword `call`) carries the routing key,
  the prompt estimate and max_tokens; the policy turns it into its RouteRequest
  (`RoutingPolicy.route`; prefix-matching policies also read the OpenAI request). Calls whose
  first argument is no EngineCall (health probes, base_models, ready, ...) or whose
  routing_key is None get Serve's power of two;
- each candidate's load is its queue length as Serve knows it (the cache its probes and the
  replicas' accept/reject replies fill; missing entries are probed now), plus the requests this
  router ranked it first for and has not sent yet (a burst), plus the requests its engine last
  reported waiting in vLLM or queued in its fair queue (see ReplicaSnapshot.load); its pending tokens are what this
  router sent there (prompt + max_tokens, or `output_tokens`) and has not seen complete;
- the policy ranks the replicas; Serve tries the first `ranked_choices` one at a time, in that
  order, then the least loaded of the rest, skipping replicas whose queue is full.
After routing, the policy learns where the request went; the engines' routing stats
(`served_keys`) correct what it believes each replica holds, and replicas that leave are
dropped from it. Any error in the policy is logged and the call falls back to the power of
two: routing never fails a request.
"""
import logging
import time
from collections import Counter, OrderedDict
from typing import Any

from ray.serve._private.request_router.pow_2_router import PowerOfTwoChoicesRequestRouter
from ray.serve.request_router import (LocalityMixin, MultiplexMixin, PendingRequest, ReplicaID,
                                      RequestRouter, RunningReplica)

from loraplex.contract import generate_args
from loraplex.metrics import recorder as process_metrics
from loraplex.routing.config import RoutingConfig
from loraplex.routing.decision import FALLBACK, routing_decision
from loraplex.routing.policy import RoutingPolicy
from loraplex.routing import served_keys
from loraplex.routing.served_keys import EngineReport
from loraplex.routing.snapshot import ReplicaSnapshot, RouteRequest

logger = logging.getLogger("ray.serve")

# (RouteRequest, pending tokens, sequences), or False: no key; cached on the PendingRequest across rounds.
_ROUTE_ATTR = "_loraplex_route"
# The key's holders when the policy last ranked the request (see routing.decision); absent: the
# request went by power of two.
_HOLDERS_ATTR = "_loraplex_holders"
_ERROR_LOG_INTERVAL_S = 60.0
# A choice not sent within this long (its request was cancelled) stops counting as load.
_CHOSEN_TTL_S = 2.0


class TenantAffinityRouter(LocalityMixin, MultiplexMixin, RequestRouter):
    # No FIFOMixin: a replica chosen for a request's key must go to that request, not to
    # whichever request waits longest.

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._policy: RoutingPolicy | None = None
        self._pending_tokens: dict[str, int] = {}  # replica unique id -> tokens in flight
        self._in_flight: dict[str, tuple[str, int, int]] = {}  # internal request id -> (replica, tokens, sequences)
        # Sequences past one of the requests in flight per replica: Serve's queue length counts a
        # request of n x prompts sequences as one, the engine runs all of them.
        self._extra_sequences: dict[str, int] = {}
        self._recent: dict[str, OrderedDict[str, float]] = {}  # replica -> key -> routed at
        self._reported: dict[str, tuple] = {}  # replica -> the held_keys last applied
        self._reports: dict[str, EngineReport] = {}  # replica -> its engine's last stats
        # Requests ranked to a replica and not yet sent: internal request id -> (replica, when).
        # Serve counts a request in its queue-length cache only when the request's coroutine
        # sends it, after the routing task chose; a burst chosen in between would all see the
        # same loads and pile onto one replica past the bound.
        self._chosen: dict[str, tuple[str, float]] = {}
        self._last_error_log: dict[str, float] = {}
        self.initialize_state()

    def initialize_state(self, **config: Any) -> None:
        """Called by Serve with RequestRouterConfig.request_router_kwargs: a RoutingConfig as
        JSON (see RoutingConfig.request_router_kwargs); without arguments, the defaults.

        Besides the policy, the router reads ranked_choices, output_tokens and stats_period_s:
        keys routed to a replica within two periods survive an engine report that does not
        list them yet (a report can be a period old when it arrives, plus jitter).
        """
        try:
            self.config = RoutingConfig(**config)
            self._policy = self.config.make_policy()
        except Exception:
            # A bad config must not take requests down with it: route by power of two.
            logger.exception("routing config %r failed to build its policy; using power of two",
                             config)
            self.config = RoutingConfig(policy="power_of_two")
            self._policy = None
        self.ranked_choices = self.config.ranked_choices
        self.stats_window_s = 2 * self.config.stats_period_s
        self.output_tokens = self.config.output_tokens

    @property
    def policy(self) -> RoutingPolicy | None:
        return self._policy

    # -- choosing ----------------------------------------------------------------------------

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None
                              ) -> list[list[RunningReplica]]:
        if pending_request is not None:
            candidate_replicas = _without_avoided(candidate_replicas, pending_request)
        if self._policy is not None and pending_request is not None and candidate_replicas:
            try:
                ranks = await self._ranked(candidate_replicas, pending_request)
            except Exception:
                self._log_error("rank")
                ranks = None
            if ranks:
                # Back off between rounds when every ranked replica refused (queues full).
                pending_request.routing_context.should_backoff = True
                return ranks
        if pending_request is not None and hasattr(pending_request, _HOLDERS_ATTR):
            delattr(pending_request, _HOLDERS_ATTR)  # this round goes by power of two
        return await PowerOfTwoChoicesRequestRouter.choose_replicas(
            self, candidate_replicas=candidate_replicas, pending_request=pending_request)

    async def _ranked(self, candidates: list[RunningReplica],
                      pending_request: PendingRequest) -> list[list[RunningReplica]] | None:
        routed = self._route_of(pending_request)
        if routed is None:
            return None
        snapshots, by_id = await self._snapshots(candidates)
        if not snapshots:
            return None
        ranked = self._policy.rank(routed[0], snapshots)
        setattr(pending_request, _HOLDERS_ATTR, self._policy.holders(routed[0], snapshots))
        full = {s.replica_id for s in snapshots  # Serve's bound counts requests, not sequences
                if s.in_flight - self._extra_sequences.get(s.replica_id, 0) >= by_id[s.replica_id].max_ongoing_requests}
        head, seen = [], set()
        for replica_id in ranked:
            replica = by_id.get(replica_id)
            if replica is None or replica_id in seen:
                continue
            seen.add(replica_id)
            if replica_id not in full:  # Serve would only probe a full one to skip it
                head.append(replica)
        if not seen:
            return None
        if head:  # Serve takes the first ranked replica whose queue has room: this one
            internal_id = pending_request.metadata.internal_request_id
            self._chosen.pop(internal_id, None)
            self._chosen[internal_id] = (head[0].replica_id.unique_id, time.monotonic())
        tail = head[self.ranked_choices:]
        head = head[:self.ranked_choices]
        # The rest: Serve takes the least loaded of them (full queues last, re-probed).
        tail += [r for r in candidates
                 if r.replica_id.unique_id not in seen or r.replica_id.unique_id in full]
        return [[r] for r in head] + ([tail] if tail else [])

    def _route_of(self, pending_request: PendingRequest) -> tuple[RouteRequest, int, int] | None:
        routed = getattr(pending_request, _ROUTE_ATTR, None)
        if routed is None:
            routed = self._route(pending_request.args, pending_request.kwargs) or False
            setattr(pending_request, _ROUTE_ATTR, routed)
        return routed or None

    def _route(self, args: list, kwargs: dict) -> tuple[RouteRequest, int, int] | None:
        """The policy's RouteRequest, the call's pending tokens and its sequences, for an EngineCall with a key."""
        call, request = generate_args(args, kwargs)
        if call is None or call.routing_key is None:
            return None
        tokens = call.prompt_tokens + call.sequences * (call.max_tokens or self.output_tokens)
        return self._policy.route(call, request), tokens, call.sequences

    async def _snapshots(self, candidates: list[RunningReplica]
                         ) -> tuple[list[ReplicaSnapshot], dict[str, RunningReplica]]:
        queue_lens: dict[str, int] = {}
        missing = []
        for r in candidates:
            q = (self._replica_queue_len_cache.get(r.replica_id)
                 if self._use_replica_queue_len_cache else None)
            if q is None:
                missing.append(r)
            else:
                queue_lens[r.replica_id.unique_id] = q
        if missing:
            # Fills the cache too. A replica that does not answer within the probe deadline (a
            # busy host) stays a candidate, loaded with the larger of what this router has in
            # flight there and what its engine last reported (every router's requests, but up
            # to a stats period old): leaving it out would starve it, since only routed
            # requests refresh the cache.
            sent = self._in_flight_counts()
            for r, q in await self._probe_queue_lens(missing, 0):
                uid = r.replica_id.unique_id
                if q is None:
                    report = self._reports.get(uid, EngineReport())
                    # Into Serve's cache too, or Serve would skip the replica for the same
                    # missed probe; its reply to the routed request corrects the estimate.
                    q = max(sent.get(uid, 0), report.running + report.waiting + report.queued)
                    if self._use_replica_queue_len_cache:
                        self._replica_queue_len_cache.update(r.replica_id, q)
                queue_lens[uid] = q
        by_id = {r.replica_id.unique_id: r for r in candidates}
        chosen = self._chosen_counts()
        snapshots = []
        for uid, q in queue_lens.items():
            report = self._reports.get(uid, EngineReport())
            adapters = report.adapters
            snapshots.append(ReplicaSnapshot(
                uid, in_flight=q + chosen.get(uid, 0) + self._extra_sequences.get(uid, 0),
                waiting=report.waiting + report.queued,
                kv_usage=report.kv_usage, pending_tokens=self._pending_tokens.get(uid, 0),
                slot_adapters=adapters.slots if adapters else None, cpu_adapters=adapters.cpu if adapters else None,
                max_loras=adapters.max_loras if adapters else 0, adapter_demand=adapters.demand if adapters else {}))
        return snapshots, by_id

    def _in_flight_counts(self) -> Counter[str]:
        counts: Counter[str] = Counter()
        for uid, _, sequences in self._in_flight.values():
            counts[uid] += sequences
        return counts

    def _chosen_counts(self) -> Counter[str]:
        horizon = time.monotonic() - _CHOSEN_TTL_S
        while self._chosen and next(iter(self._chosen.values()))[1] < horizon:
            self._chosen.pop(next(iter(self._chosen)))
        return Counter(uid for uid, _ in self._chosen.values())

    # -- learning ----------------------------------------------------------------------------

    def on_send_request(self, replica_id: ReplicaID) -> None:
        super().on_send_request(replica_id)  # Serve's cache now counts one more request there
        uid = replica_id.unique_id
        for internal_id, (chosen_uid, _) in self._chosen.items():  # oldest first
            if chosen_uid == uid:
                del self._chosen[internal_id]
                break

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID,
                          result: Any) -> None:
        super().on_request_routed(pending_request, replica_id, result)
        self._count_decision(pending_request, replica_id)
        routed = getattr(pending_request, _ROUTE_ATTR, None)
        if not routed or self._policy is None:
            return
        route, tokens, sequences = routed
        uid = replica_id.unique_id
        try:
            self._policy.on_routed(route, uid)
        except Exception:
            self._log_error("on_routed")
        now = time.monotonic()
        recent = self._recent.setdefault(uid, OrderedDict())
        recent.pop(route.key, None)
        recent[route.key] = now
        _drop_older(recent, now - self.stats_window_s)
        internal_id = pending_request.metadata.internal_request_id
        self._in_flight[internal_id] = (uid, tokens, sequences)
        self._pending_tokens[uid] = self._pending_tokens.get(uid, 0) + tokens
        if sequences > 1:
            self._extra_sequences[uid] = self._extra_sequences.get(uid, 0) + sequences - 1

    @staticmethod
    def _count_decision(pending_request: PendingRequest, replica_id: ReplicaID) -> None:
        """One loraplex_routing_decisions_total per generation call (EngineCall), in the ingress's
        metrics; other calls (probes, base_models) are not counted."""
        call, _ = generate_args(pending_request.args, pending_request.kwargs)
        if call is None:
            return
        holders = getattr(pending_request, _HOLDERS_ATTR, FALLBACK)
        decision = FALLBACK if holders is FALLBACK else routing_decision(replica_id.unique_id, holders)
        try:
            process_metrics.installed().replica.routed(decision)
        except Exception:
            logger.debug("routing decision metric failed", exc_info=True)

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        super().on_request_completed(replica_id, internal_request_id)
        entry = self._in_flight.pop(internal_request_id, None)
        if entry is not None:
            uid, tokens, sequences = entry
            _take(self._pending_tokens, uid, tokens)
            _take(self._extra_sequences, uid, sequences - 1)

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        before = set(self._replica_id_set)
        super().update_replicas(replicas)
        for replica_id in before - self._replica_id_set:
            self._forget_replica(replica_id)
        for r in replicas:
            self._apply_stats(r)

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self._forget_replica(replica_id)

    def _forget_replica(self, replica_id: ReplicaID) -> None:
        uid = replica_id.unique_id
        for d in (self._pending_tokens, self._extra_sequences, self._recent, self._reported, self._reports):
            d.pop(uid, None)
        served_keys.forget_status(uid)
        self._chosen = {k: v for k, v in self._chosen.items() if v[0] != uid}
        self._in_flight = {k: v for k, v in self._in_flight.items() if v[0] != uid}
        if self._policy is not None:
            try:
                self._policy.on_replica_removed(uid)
            except Exception:
                self._log_error("on_replica_removed")

    def _apply_stats(self, replica: RunningReplica) -> None:
        """Take a replica's routing stats (see served_keys) into the router and the policy."""
        try:
            report = EngineReport.of(replica.routing_stats)
        except Exception:
            return
        if report is None:
            return
        uid = replica.replica_id.unique_id
        self._reports[uid] = report
        stats = replica.routing_stats
        served_keys.record_status(uid, {
            "replica_id": uid, "running": report.running, "waiting": report.waiting, "queued": report.queued,
            "kv_usage": round(report.kv_usage, 4), **(stats.get("status") or {}), "reported_at": time.time()})
        held = report.held_keys
        if held is None or self._policy is None:
            return
        if self._reported.get(uid) == held:
            return  # a rebroadcast of a report already applied
        self._reported[uid] = held
        # The report may predate what this router routed there since: keep those keys.
        recent = self._recent.get(uid, OrderedDict())
        _drop_older(recent, time.monotonic() - self.stats_window_s)
        keys = [*reversed(held), *recent]  # least recent first
        try:
            self._policy.on_stats(uid, keys)
        except Exception:
            self._log_error("on_stats")

    def _log_error(self, what: str) -> None:
        now = time.monotonic()
        if now - self._last_error_log.get(what, -_ERROR_LOG_INTERVAL_S) >= _ERROR_LOG_INTERVAL_S:
            self._last_error_log[what] = now
            logger.exception("routing policy %s failed in %s; falling back to power of two "
                             "(logged at most once a minute)", self.config.policy, what)


def _without_avoided(candidates: list[RunningReplica], pending_request: PendingRequest) -> list[RunningReplica]:
    """A request moved off a lost replica (EngineCall.avoid_replica) goes elsewhere while another
    replica remains: Serve may not have heard of the death yet."""
    call, _ = generate_args(pending_request.args, pending_request.kwargs)
    if call is None or call.avoid_replica is None:
        return candidates
    others = [r for r in candidates if r.replica_id.unique_id != call.avoid_replica]
    return others or candidates


def _drop_older(recent: OrderedDict, horizon: float) -> None:
    while recent and next(iter(recent.values())) < horizon:
        recent.popitem(last=False)


def _take(counts: dict[str, int], key: str, n: int) -> None:
    """Subtract n from counts[key], dropping the key at 0."""
    left = counts.get(key, 0) - n
    if left > 0:
        counts[key] = left
    else:
        counts.pop(key, None)
