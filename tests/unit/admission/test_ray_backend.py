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
