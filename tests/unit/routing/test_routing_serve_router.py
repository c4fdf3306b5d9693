"""TenantAffinityRouter driven through Serve's own routing loop, with fake replicas: no Ray
cluster, no engine. `route()` does what Serve's Router does around a request."""
import asyncio
import itertools
from dataclasses import dataclass, field

import pytest
from ray.serve._private.common import (DeploymentHandleSource, DeploymentID, ReplicaID,
                                       RequestMetadata)
from ray.serve.request_router import PendingRequest, RunningReplica

from loraplex.routing import rendezvous_order
from loraplex.routing.bounded_load import load_bound
from loraplex.routing.config import RoutingConfig
from loraplex.routing.policy import RoutingPolicy
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


@dataclass(frozen=True)
class Meta:  # the fields of loraplex.engine.protocol.RequestMeta the router reads
    request_id: str
    tenant_id: str
    adapter: str | None = None


@dataclass(frozen=True)
class Adapter:  # the fields of AdapterTarget the router reads
    tenant: str
    name: str
    lora_name: str = ""


@dataclass
class Chat:
    messages: list = field(default_factory=lambda: [{"role": "user", "content": "hi"}])
    max_tokens: int | None = None


def make_router(replicas, use_cache: bool = True, **kwargs) -> TenantAffinityRouter:
    router = TenantAffinityRouter(deployment_id=DEPLOYMENT,
                                  handle_source=DeploymentHandleSource.REPLICA,
                                  use_replica_queue_len_cache=use_cache)
    router.initialize_state(**kwargs)
    router.update_replicas(replicas)
    return router


def fleet(n: int, **kwargs) -> list[FakeReplica]:
    return [FakeReplica(f"r{i}", **kwargs) for i in range(n)]


def tenant_call(tenant: str, adapter: str | None = None, text: str = "hi") -> tuple:
    target = Adapter(tenant, adapter, f"{tenant}/{adapter}@abc") if adapter else None
    chat = Chat([{"role": "user", "content": text}])
    return chat, target, f"salt-{tenant}", Meta(f"req-{next(_ids)}", tenant)


async def route(router: TenantAffinityRouter, *args, complete: bool = True, **kwargs) -> str:
    """Route one call as Serve's Router does; `complete` finishes it at once (load back to 0)."""
    pr = PendingRequest(args=list(args), kwargs=kwargs, metadata=RequestMetadata(
        request_id="r", internal_request_id=f"int-{next(_ids)}", call_method="chat"))
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
    router = make_router(fleet(4), c=1.25, min_bound=0)
    placed = [await route(router, *tenant_call("ten_hot"), complete=False) for _ in range(40)]
    loads = {r: placed.count(r) for r in set(placed)}
    assert max(loads.values()) <= load_bound(39, 4, 1.25)
    order = rendezvous_order("ten_hot", ["r0", "r1", "r2", "r3"])
    assert len(loads) > 1 and set(loads) == set(order[:len(loads)])
    assert placed[0] == order[0]


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


async def test_calls_without_a_tenant_still_route():
    replicas = fleet(3)
    router = make_router(replicas)
    ids = {r.replica_id.unique_id for r in replicas}
    assert await route(router) in ids  # list_models(), ready(), num_unfinished_requests()
    assert await route(router, Chat()) in ids  # a request without meta
    assert not router.policy.held.holders("")


class Broken(RoutingPolicy):
    name = "broken"

    def rank(self, request, replicas):
        raise RuntimeError("bug in a policy")

    def on_routed(self, request, replica_id):
        raise RuntimeError("bug in a policy")


async def test_a_failing_policy_falls_back_to_power_of_two():
    router = make_router(fleet(3))
    router._policy = Broken()
    assert await route(router, *tenant_call("ten_a")) in {"r0", "r1", "r2"}
    # A policy that cannot even be built (bad options) routes by power of two too.
    router = make_router(fleet(3), policy="tenant_affinity", no_such_option=1)
    assert router.policy is None
    assert await route(router, *tenant_call("ten_a")) in {"r0", "r1", "r2"}


async def test_engine_reports_teach_and_correct_the_router():
    replicas = fleet(4)
    ids = [r.replica_id.unique_id for r in replicas]
    router = make_router(replicas, min_bound=0, stats_window_s=0.0)
    order = rendezvous_order("ten_a", ids)
    # Another ingress sent ten_a to its last choice; that engine's report says so.
    last = next(r for r in replicas if r.replica_id.unique_id == order[-1])
    last.stats = {"held_keys": ["ten_a", "ten_b"], "running": 1, "kv_usage": 0.5}
    router.update_replicas(replicas)
    assert await route(router, *tenant_call("ten_a")) == order[-1]
    assert router._kv_usage[order[-1]] == 0.5
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
    router = make_router(fleet(2), policy="least_pending_tokens")
    long_prompt = "x" * 4000  # ~1,000 tokens
    first = await route(router, Chat([{"role": "user", "content": long_prompt}], max_tokens=50),
                        None, None, Meta("q1", "ten_a"), complete=False)
    assert router._pending_tokens[first] == 1000 + len("user: \n") // 4 + 50
    # The next request avoids the replica with the pending tokens.
    second = await route(router, *tenant_call("ten_b"), complete=False)
    assert second != first
    for internal_id, (uid, _) in list(router._in_flight.items()):
        router.on_request_completed(ReplicaID(unique_id=uid, deployment_id=DEPLOYMENT),
                                    internal_id)
    assert router._pending_tokens == {}


async def test_prefix_policies_follow_the_shared_prompt():
    router = make_router(fleet(8), policy="prefix_tree", block_chars=16)
    system = "You are the support bot of a company that sells garden furniture. " * 4
    first = await route(router, *tenant_call("ten_a", text=system + "Where is my chair?"))
    for question in ("Do you ship to Norway?", "Is the teak oiled?"):
        assert await route(router, *tenant_call("ten_a", text=system + question)) == first


@pytest.mark.parametrize("policy", ["tenant_affinity", "power_of_two", "round_robin",
                                    "least_pending_tokens", "prefix_tree", "cache_aware",
                                    "sticky_hash"])
async def test_every_policy_routes_through_the_config(policy):
    config = RoutingConfig(policy=policy, tokens_per_replica=100_000)
    router_config = config.request_router_config()
    cls = router_config.get_request_router_class()  # what Serve unpickles on each handle
    assert cls.__name__ == "TenantAffinityRouter"
    assert router_config.request_routing_stats_period_s == config.stats_period_s
    router = cls(deployment_id=DEPLOYMENT, handle_source=DeploymentHandleSource.REPLICA,
                 use_replica_queue_len_cache=True)
    router.initialize_state(**router_config.request_router_kwargs)
    assert router.policy is not None and router.policy.name == policy
    router.update_replicas(fleet(3))
    assert await route(router, *tenant_call("ten_a", "bot")) in {"r0", "r1", "r2"}
    assert await route(router) in {"r0", "r1", "r2"}
