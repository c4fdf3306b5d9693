"""TenantAffinityRouter driven through Serve's own routing loop, with fake replicas: no Ray
cluster, no engine. `route()` does what Serve's Router does around a request."""
import asyncio
import itertools
import random
from dataclasses import dataclass, field

import pytest
from ray.serve._private.common import (DeploymentHandleSource, DeploymentID, ReplicaID,
                                       RequestMetadata)
from ray.serve._private.request_router.pow_2_router import PowerOfTwoChoicesRequestRouter
from ray.serve.request_router import PendingRequest, RunningReplica

from bench.routing.policies import POLICIES, serve_policy
from loraplex.contract import AdapterTarget, EngineCall, affinity_key
from loraplex.routing.rendezvous import rendezvous_order
from loraplex.routing.bounded_load import load_bound
from loraplex.routing.config import RoutingConfig
from loraplex.routing.policy import RoutingPolicy
from loraplex.routing import serve_router
from loraplex.routing.serve_router import TenantAffinityRouter

DEPLOYMENT = DeploymentID(name="Engine", app_name="loraplex")
_ids = itertools.count()


class FakeReplica(RunningReplica):
    """What the router reads of a replica; answers queue-length probes with `queue_len`."""

    def __init__(self, uid: str, queue_len: int = 0, max_ongoing: int = 1000,
                 stats: dict | None = None):
        self._rid = ReplicaID(unique_id=uid, deployment_id=DEPLOYMENT)
        self.queue_len = queue_len
        self._max_ongoing = max_ongoing
        self.stats = stats or {}
        self.probes = 0

    @property
    def replica_id(self) -> ReplicaID:
        return self._rid

    @property
    def node_id(self) -> str:
        return ""

    @property
    def availability_zone(self):
        return None

    @property
    def multiplexed_model_ids(self) -> set:
        return set()

    @property
    def max_ongoing_requests(self) -> int:
        return self._max_ongoing

    @property
    def routing_stats(self) -> dict:
        return self.stats

    @property
    def is_cross_language(self) -> bool:
        return False

    async def get_queue_len(self, *, deadline_s: float) -> int:
        self.probes += 1
        if self.queue_len is None:  # a busy replica that misses every probe deadline
            await asyncio.sleep(deadline_s + 1)
        return self.queue_len

    def push_proxy_handle(self, handle) -> None:
        pass


@dataclass
class Chat:
    """Stands in for vLLM's ChatCompletionRequest (importing vLLM takes seconds): the router
    never reads it, the prefix policies read `messages` (bench.routing.prompt_hashes)."""

    messages: list = field(default_factory=lambda: [{"role": "user", "content": "hi"}])


def make_router(replicas, use_cache: bool = True, **kwargs) -> TenantAffinityRouter:
    router = TenantAffinityRouter(deployment_id=DEPLOYMENT,
                                  handle_source=DeploymentHandleSource.REPLICA,
                                  use_replica_queue_len_cache=use_cache)
    router.initialize_state(**kwargs)
    router.update_replicas(replicas)
    return router


def fleet(n: int, **kwargs) -> list[FakeReplica]:
    return [FakeReplica(f"r{i}", **kwargs) for i in range(n)]


def engine_call(tenant: str, adapter: str | None = None, **fields) -> EngineCall:
    """What the ingress builds for a tenant's request (routing key from affinity_key)."""
    target = AdapterTarget(f"{tenant}/{adapter}@abc", 7, tenant, adapter, "abc", adapter,
                           version=1) if adapter else None
    return EngineCall(f"req-{next(_ids)}", tenant, "key_1", target, f"salt-{tenant}",
                      routing_key=affinity_key(tenant, adapter), **fields)


def tenant_call(tenant: str, adapter: str | None = None, text: str = "hi", **fields) -> tuple:
    """The arguments of Engine.generate(call, request)."""
    return (engine_call(tenant, adapter, **{"prompt_tokens": len(text) // 4, **fields}),
            Chat([{"role": "user", "content": text}]))


def pending(*args, **kwargs) -> PendingRequest:
    return PendingRequest(args=list(args), kwargs=kwargs, metadata=RequestMetadata(
        request_id="r", internal_request_id=f"int-{next(_ids)}", call_method="generate"))


async def route(router: TenantAffinityRouter, *args, complete: bool = True, **kwargs) -> str:
    """Route one call as Serve's Router does; `complete` finishes it at once (load back to 0)."""
    pr = pending(*args, **kwargs)
    replica = await asyncio.wait_for(router._choose_replica_for_request(pr), timeout=5)
    router.on_send_request(replica.replica_id)
    router.on_request_routed(pr, replica.replica_id, None)
    if complete:
        router.decrement_queue_len_cache(replica.replica_id)
        router.on_request_completed(replica.replica_id, pr.metadata.internal_request_id)
    return replica.replica_id.unique_id


IDS8 = [f"r{i}" for i in range(8)]


@pytest.mark.parametrize("use_cache", [True, False])  # False: Serve probes every time
async def test_a_tenant_always_goes_to_its_rendezvous_replica(use_cache):
    router = make_router(fleet(8), use_cache=use_cache, min_bound=0)
    home = rendezvous_order("ten_a", IDS8)[0]
    assert {await route(router, *tenant_call("ten_a")) for _ in range(20)} == {home}
    # An adapter makes another key, with its own home.
    assert await route(router, *tenant_call("ten_a", "bot")) == rendezvous_order(
        "ten_a/bot", IDS8)[0]


async def test_a_replica_that_misses_probe_deadlines_still_gets_its_tenants():
    replicas = fleet(2)
    router = make_router(replicas, min_bound=0)  # with Serve's queue-length cache, as deployed
    tenants = [f"ten_{i}" for i in range(12)]
    homes = {t: rendezvous_order(t, ["r0", "r1"])[0] for t in tenants}
    replicas[1].queue_len = None  # r1's probes never answer in time
    got = {t: await route(router, *tenant_call(t)) for t in tenants}
    assert got == homes and "r1" in got.values()


async def test_tenants_spread_over_the_replicas():
    router = make_router(fleet(8), min_bound=0)
    chosen = {}
    for i in range(200):
        tenant = f"ten_{i}"
        chosen[tenant] = await route(router, *tenant_call(tenant))
        assert chosen[tenant] == rendezvous_order(tenant, IDS8)[0]
    counts = [list(chosen.values()).count(r) for r in IDS8]
    assert min(counts) >= 10  # 25 each on average


async def test_a_hot_tenant_spreads_over_its_rendezvous_order_within_the_bound():
    router = make_router(fleet(4), load_factor=1.25, min_bound=0)
    placed = [await route(router, *tenant_call("ten_hot"), complete=False) for _ in range(40)]
    loads = {r: placed.count(r) for r in set(placed)}
    assert max(loads.values()) <= load_bound(39, 4, 1.25)
    order = rendezvous_order("ten_hot", ["r0", "r1", "r2", "r3"])
    assert len(loads) > 1 and set(loads) == set(order[:len(loads)])
    assert placed[0] == order[0]


async def test_a_burst_chosen_before_any_send_still_keeps_the_bound():
    """Serve hands a routing task's choice to the request's coroutine, which sends it (and counts
    it in the queue-length cache) only when it next runs: a burst chosen in between must see the
    choices already made, or every request of a hot tenant lands on its first replica."""
    router = make_router(fleet(4), load_factor=1.25, min_bound=0)
    burst = [pending(*tenant_call("ten_hot")) for _ in range(40)]
    chosen = await asyncio.wait_for(asyncio.gather(*(router._choose_replica_for_request(pr) for pr in burst)), 5)
    placed = [r.replica_id.unique_id for r in chosen]
    assert max(placed.count(r) for r in set(placed)) <= load_bound(39, 4, 1.25)
    for pr, replica in zip(burst, chosen):  # sent: the cache counts them, the choices go
        router.on_send_request(replica.replica_id)
        router.on_request_routed(pr, replica.replica_id, None)
    assert not router._chosen


async def test_a_full_replica_is_skipped_for_the_next_in_the_ranking():
    replicas = fleet(4, max_ongoing=8)
    order = rendezvous_order("ten_a", [r.replica_id.unique_id for r in replicas])
    next(r for r in replicas if r.replica_id.unique_id == order[0]).queue_len = 8
    router = make_router(replicas, min_bound=100)  # the bound alone would keep it home
    assert await route(router, *tenant_call("ten_a")) == order[1]


async def test_removing_a_replica_moves_only_its_keys():
    replicas = fleet(6)
    router = make_router(replicas, min_bound=0)
    tenants = [f"ten_{i}" for i in range(60)]
    before = {t: await route(router, *tenant_call(t)) for t in tenants}
    gone = before["ten_0"]
    router.update_replicas([r for r in replicas if r.replica_id.unique_id != gone])
    assert not any(gone in router.policy.held.holders(t) for t in tenants)
    after = {t: await route(router, *tenant_call(t)) for t in tenants}
    assert {t for t in tenants if after[t] != before[t]} == {
        t for t in tenants if before[t] == gone}
    # A dead actor is forgotten the same way.
    victim = after["ten_1"]
    router.on_replica_actor_died(ReplicaID(unique_id=victim, deployment_id=DEPLOYMENT))
    assert victim not in router.policy.held.holders("ten_1")
    assert await route(router, *tenant_call("ten_1")) != victim


async def test_calls_without_a_routing_key_still_route():
    replicas = fleet(3)
    router = make_router(replicas)
    ids = {r.replica_id.unique_id for r in replicas}
    assert await route(router) in ids  # list_models(), ready(), num_unfinished_requests()
    assert await route(router, EngineCall("q1"), Chat()) in ids  # an open deployment
    # Only an EngineCall carries a key: a client's request naming a tenant is not one.
    chat = Chat()
    chat.tenant_id, chat.routing_key = "ten_x", "ten_x"
    assert await route(router, chat, engine_call("ten_a")) in ids
    assert router.policy.held._by_key == {}


async def test_the_call_may_come_by_keyword():
    router = make_router(fleet(8), min_bound=0)
    call, chat = tenant_call("ten_a")
    assert await route(router, call=call, request=chat) == rendezvous_order("ten_a", IDS8)[0]
    assert router.policy.held.holders("ten_a")


class Broken(RoutingPolicy):
    name = "broken"

    def __init__(self):
        self.calls = 0

    def rank(self, request, replicas):
        self.calls += 1
        raise RuntimeError("bug in a policy")

    def on_routed(self, request, replica_id):
        raise RuntimeError("bug in a policy")


@pytest.fixture
def logged(monkeypatch) -> list[str]:
    """The router's logged errors (Serve's logger need not propagate to caplog)."""
    messages = []
    monkeypatch.setattr(serve_router.logger, "exception",
                        lambda msg, *args: messages.append(msg % args))
    return messages


async def assert_power_of_two(router, replicas, *args):
    """The router's choice for this call is exactly Serve's PowerOfTwoChoicesRequestRouter's:
    one rank of two distinct random candidates (a policy ranks one replica per rank)."""
    for seed in range(5):
        pr = pending(*args)
        random.seed(seed)
        got = await router.choose_replicas(replicas, pr)
        random.seed(seed)
        p2c = await PowerOfTwoChoicesRequestRouter.choose_replicas(
            router, candidate_replicas=replicas, pending_request=pending(*args))
        assert got == p2c
        [pair] = got
        assert len({r.replica_id.unique_id for r in pair}) == 2


async def test_a_failing_policy_falls_back_to_power_of_two(logged):
    replicas = fleet(3)
    router = make_router(replicas, min_bound=0)
    policy = router._policy = Broken()
    await assert_power_of_two(router, replicas, *tenant_call("ten_a"))
    assert policy.calls == 5  # the policy was asked, failed, and was not used
    # Logged, at most once a minute, naming the policy and where it failed.
    assert logged == ["routing policy tenant_affinity failed in rank; falling back to power of two "
                      "(logged at most once a minute)"]
    # Whole routes still succeed (on_routed fails too, and is logged), and they spread like
    # power of two: the affinity policy would send every ten_a call to one replica.
    random.seed(0)
    placed = {await route(router, *tenant_call("ten_a")) for _ in range(20)}
    assert len(placed) > 1 and placed <= {"r0", "r1", "r2"}
    assert [m.split(" failed in ")[1].split(";")[0] for m in logged] == ["rank", "on_routed"]


@pytest.mark.parametrize("bad", [{"no_such_option": 1}, {"policy_options": {"no_such_option": 1}},
                                 {"policy": "no_such_policy"}, {"policy": "bench.routing.nowhere:Policy"}])
async def test_a_config_that_cannot_build_its_policy_routes_by_power_of_two(bad, logged):
    replicas = fleet(3)
    router = make_router(replicas, **bad)
    assert router.policy is None and router.config.policy == "power_of_two"
    assert len(logged) == 1 and "failed to build its policy" in logged[0]
    await assert_power_of_two(router, replicas, *tenant_call("ten_a"))
    assert await route(router, *tenant_call("ten_a")) in {"r0", "r1", "r2"}


async def test_calls_without_a_key_take_power_of_two_not_the_policy():
    replicas = fleet(3)
    router = make_router(replicas, min_bound=0)
    await assert_power_of_two(router, replicas)  # no arguments: a health probe
    await assert_power_of_two(router, replicas, EngineCall("q1"), Chat())  # no routing key
    # While a keyed call gets the policy's ranking: its home replica alone first.
    ranks = await router.choose_replicas(replicas, pending(*tenant_call("ten_a")))
    assert [r.replica_id.unique_id for r in ranks[0]] == [rendezvous_order("ten_a", ["r0", "r1", "r2"])[0]]


async def test_engine_reports_teach_and_correct_the_router():
    replicas = fleet(4)
    ids = [r.replica_id.unique_id for r in replicas]
    router = make_router(replicas, min_bound=0)
    router.stats_window_s = 0.0  # every key this router routed is older than the reports
    order = rendezvous_order("ten_a", ids)
    # Another ingress sent ten_a to its last choice; that engine's report says so.
    last = next(r for r in replicas if r.replica_id.unique_id == order[-1])
    last.stats = {"held_keys": ["ten_a", "ten_b"], "running": 1, "kv_usage": 0.5}
    router.update_replicas(replicas)
    assert await route(router, *tenant_call("ten_a")) == order[-1]
    assert router._reports[order[-1]].kv_usage == 0.5
    # Then it evicted ten_a: the next report drops it, and ten_a goes home.
    last.stats = {"held_keys": ["ten_b"]}
    router.update_replicas(replicas)
    assert await route(router, *tenant_call("ten_a")) == order[0]


async def test_a_report_keeps_keys_routed_after_it_was_taken():
    replicas = fleet(4)
    router = make_router(replicas, min_bound=0)  # stats window 10 s
    home = await route(router, *tenant_call("ten_a"))
    replica = next(r for r in replicas if r.replica_id.unique_id == home)
    replica.stats = {"held_keys": ["ten_z"]}  # taken before ten_a arrived
    router.update_replicas(replicas)
    assert home in router.policy.held.holders("ten_a")
    assert home in router.policy.held.holders("ten_z")


async def test_pending_tokens_count_what_is_in_flight():
    router = make_router(fleet(2), policy=serve_policy("least_pending_tokens"))
    first = await route(router, *tenant_call("ten_a", max_tokens=50, prompt_tokens=1000),
                        complete=False)
    assert router._pending_tokens[first] == 1000 + 50
    # The next request avoids the replica with the pending tokens; without max_tokens it
    # counts the configured output_tokens.
    second = await route(router, *tenant_call("ten_b", prompt_tokens=10), complete=False)
    assert second != first
    assert router._pending_tokens[second] == 10 + RoutingConfig().output_tokens
    for internal_id, (uid, _, _) in list(router._in_flight.items()):
        router.on_request_completed(ReplicaID(unique_id=uid, deployment_id=DEPLOYMENT),
                                    internal_id)
    assert router._pending_tokens == {}


async def test_a_request_counts_as_its_sequences_on_its_replica():
    # Serve's queue length counts one request of n x prompts as one; the router adds the rest, so a
    # replica running one 8-sequence request is as loaded as one running 8 requests.
    home, other = rendezvous_order("ten_a", ["r0", "r1"])
    router = make_router(fleet(2), load_factor=1.25, min_bound=0)
    assert await route(router, *tenant_call("ten_a", sequences=8), complete=False) == home
    assert await route(router, *tenant_call("ten_a"), complete=False) == other  # 8 + 1 over the bound of 6
    for internal_id, (uid, _, _) in list(router._in_flight.items()):
        router.on_request_completed(ReplicaID(unique_id=uid, deployment_id=DEPLOYMENT), internal_id)
    assert router._extra_sequences == {}


async def test_an_engines_waiting_queue_adds_to_its_load():
    replicas = fleet(2, queue_len=0)
    home, other = rendezvous_order("ten_a", ["r0", "r1"])
    router = make_router(replicas, use_cache=False, min_bound=4)  # probes read queue_len
    home_replica = next(r for r in replicas if r.replica_id.unique_id == home)
    home_replica.queue_len = 2
    assert await route(router, *tenant_call("ten_a")) == home  # 2 + 1 <= the bound, 4
    # Its engine then reports 4 requests queued, no batch slot for them: 2 in flight + 4
    # waiting = 6, over the bound of ceil(1.25 x (6 + 1) / 2) = 5, so ten_a goes elsewhere.
    home_replica.stats = {"held_keys": ["ten_a"], "running": 0, "waiting": 4}
    router.update_replicas(replicas)
    assert await route(router, *tenant_call("ten_a")) == other


async def test_requests_in_an_engines_fair_queue_add_to_its_load():
    replicas = fleet(2, queue_len=0)
    home, other = rendezvous_order("ten_a", ["r0", "r1"])
    router = make_router(replicas, use_cache=False, min_bound=4)
    home_replica = next(r for r in replicas if r.replica_id.unique_id == home)
    home_replica.queue_len = 2
    home_replica.stats = {"held_keys": ["ten_a"], "running": 2, "waiting": 0, "queued": 0}
    router.update_replicas(replicas)
    assert await route(router, *tenant_call("ten_a")) == home
    # 4 held in its fair queue (not yet in vLLM): over the bound as if vLLM had them waiting.
    home_replica.stats = {"held_keys": ["ten_a"], "running": 2, "waiting": 0, "queued": 4}
    router.update_replicas(replicas)
    assert await route(router, *tenant_call("ten_a")) == other


async def test_a_missed_probe_is_filled_from_the_engines_report():
    replicas = fleet(2)
    router = make_router(replicas, use_cache=False)
    replicas[1].queue_len = None  # r1 misses every probe deadline
    replicas[1].stats = {"held_keys": [], "running": 5, "waiting": 2, "kv_usage": 0.9}
    router.update_replicas(replicas)
    snapshots, _ = await router._snapshots(replicas)
    r1 = next(s for s in snapshots if s.replica_id == "r1")
    assert (r1.in_flight, r1.waiting, r1.load, r1.kv_usage) == (7, 2, 9, 0.9)


async def test_prefix_policies_follow_the_shared_prompt():
    router = make_router(fleet(8), policy=serve_policy("prefix_tree"),
                         policy_options={"block_chars": 16})
    system = "You are the support bot of a company that sells garden furniture. " * 4
    first = await route(router, *tenant_call("ten_a", text=system + "Where is my chair?"))
    for question in ("Do you ship to Norway?", "Is the teak oiled?"):
        assert await route(router, *tenant_call("ten_a", text=system + question)) == first


@pytest.mark.parametrize("policy", sorted(POLICIES))
async def test_every_policy_routes_through_the_config(policy):
    # Built-in names as they are, comparison policies by import path (as bench_routing does).
    config = RoutingConfig(policy=serve_policy(policy), tokens_per_replica=100_000)
    router_config = config.request_router_config(TenantAffinityRouter)
    cls = router_config.get_request_router_class()  # what Serve unpickles on each handle
    assert cls.__name__ == "TenantAffinityRouter"
    assert router_config.request_routing_stats_period_s == config.stats_period_s
    router = cls(deployment_id=DEPLOYMENT, handle_source=DeploymentHandleSource.REPLICA,
                 use_replica_queue_len_cache=True)
    router.initialize_state(**router_config.request_router_kwargs)
    assert router.config == config
    if policy == "power_of_two":
        assert router.policy is None  # Serve's own router
    else:
        assert router.policy is not None and router.policy.name == policy
    router.update_replicas(fleet(3))
    assert await route(router, *tenant_call("ten_a", "bot")) in {"r0", "r1", "r2"}
    assert await route(router) in {"r0", "r1", "r2"}


_SHIPPED_ROUTER = """
import asyncio, json, sys
from ray import cloudpickle
from ray.serve._private.common import DeploymentHandleSource, DeploymentID, ReplicaID
from ray.serve.request_router import RunningReplica
from loraplex.routing.config import RoutingConfig
from loraplex.routing.served_keys import replica_statuses

class Replica(RunningReplica):  # what _apply_stats reads of one
    replica_id = routing_stats = None
    def __init__(self, uid, stats):
        self.replica_id = ReplicaID(unique_id=uid, deployment_id=DeploymentID(name="Engine", app_name="loraplex"))
        self.routing_stats = stats
    node_id, availability_zone, multiplexed_model_ids, max_ongoing_requests, is_cross_language = "", None, set(), 9, False
    def push_proxy_handle(self, handle): pass

async def main():  # Serve builds and updates a router on its event loop
    shipped = cloudpickle.loads(sys.stdin.buffer.read())  # as an ingress replica gets the router
    router = shipped(deployment_id=DeploymentID(name="Engine", app_name="loraplex"),
                     handle_source=DeploymentHandleSource.REPLICA, use_replica_queue_len_cache=True)
    router.initialize_state(**RoutingConfig().request_router_kwargs())
    router.update_replicas([Replica(f"r{i}", {"held_keys": [], "status": {"slot_loads": i}}) for i in range(2)])
    print(json.dumps([(s["replica_id"], s["slot_loads"]) for s in replica_statuses()]))

asyncio.run(main())
"""


def test_a_router_as_serve_ships_it_writes_the_statuses_the_ingress_reads():
    """Serve pickles the router's module by value, so the class an ingress replica runs is a
    copy whose module globals are its own: GET /admin/replicas fell back to one replica, asked
    now, on every pool (bench_placement's 0 slot loads on r1). Unpickled in a fresh process, as
    Serve does, the router must write where replica_statuses() reads."""
    import json
    import os
    import subprocess
    import sys

    config = RoutingConfig().request_router_config(TenantAffinityRouter)
    out = subprocess.run([sys.executable, "-c", _SHIPPED_ROUTER], input=config.get_serialized_request_router_cls(),
                         capture_output=True, check=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)})
    assert json.loads(out.stdout.decode().strip().splitlines()[-1]) == [["r0", 0], ["r1", 1]]
