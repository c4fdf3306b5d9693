"""RayBackend's handling of a limiter actor that died, with fake actor handles (no Ray)."""

import asyncio

import pytest

from loraplex.admission.limiter import BackendUnavailable
from loraplex.admission.ray_backend import RayBackend


class ActorDiedFake(Exception):
    """Stands in for ray.exceptions.ActorDiedError."""


class FakeActorHandle:
    def __init__(self, alive: bool):
        self.alive = alive
        self.acquire = self  # handle.acquire.remote(...)

    async def _answer(self):
        if not self.alive:
            raise ActorDiedFake()
        return {"epoch": "e", "granted": {"requests": 1}}

    def remote(self, *args):
        return self._answer()


class FakeHandlesBackend(RayBackend):
    """Hands out the queued handles in turn, as a name lookup would after each death."""

    def __init__(self, handles):
        super().__init__("app", None)
        self.queue = list(handles)
        self.lookups = 0

    def handle(self, shard):
        if self.handles[shard] is None:
            self.lookups += 1
            self.handles[shard] = self.queue.pop(0)
        return self.handles[shard]


def acquire(backend):
    return asyncio.run(backend.acquire("t", "h", {"requests": 1}, {"requests": 1}, {"requests": 1}))


def test_a_dead_handle_is_looked_up_again_and_the_call_retried_before_failing_open():
    # Another ingress replica already recreated the actor: this one must not admit unchecked.
    backend = FakeHandlesBackend([FakeActorHandle(alive=False), FakeActorHandle(alive=True)])
    assert acquire(backend)["granted"] == {"requests": 1}
    assert backend.lookups == 2


def test_unavailable_when_the_looked_up_actor_is_dead_too():
    backend = FakeHandlesBackend([FakeActorHandle(alive=False), FakeActorHandle(alive=False),
                                  FakeActorHandle(alive=True)])
    with pytest.raises(BackendUnavailable):
        acquire(backend)
    assert acquire(backend)["granted"] == {"requests": 1}  # the next call finds the new one


def test_an_existing_limiter_actor_is_given_the_settings_of_the_replica_that_looks_it_up(monkeypatch):
    # The actor is detached and found by name: a redeploy that changes the database or the budget
    # settings must reach it, not only a brand-new actor's constructor.
    import sys
    import types

    from loraplex.admission.actor import LimiterActor

    existing = LimiterActor("sqlite:///old.db", budget_cache_s=5.0, on_unavailable="open")
    existing._db = object()  # the old database's engine

    class Method:
        def __init__(self, fn):
            self.fn = fn

        def remote(self, *args, **kwargs):
            return self.fn(*args, **kwargs)

    class Handle:  # get_if_exists: the constructor's arguments are dropped, the actor is `existing`
        configure = Method(existing.configure)

    fake_ray = types.SimpleNamespace(remote=lambda cls: types.SimpleNamespace(
        options=lambda **kw: types.SimpleNamespace(remote=lambda *a, **k: Handle())))
    monkeypatch.setitem(sys.modules, "ray", fake_ray)
    backend = RayBackend("app", "postgresql://new/db", budget_cache_s=30.0, on_unavailable="closed")
    backend.handle(0)
    assert (existing.database_url, existing.budget_cache_s, existing.on_unavailable) == (
        "postgresql://new/db", 30.0, "closed")
    assert existing._db is None  # the next budget read opens the new database
