"""CallerWatch: stop the requests of an Ingress replica that died (issue 48).

A client that goes away is noticed by its Ingress replica, which cancels the handle call, and the
Engine replica aborts the vLLM request. An Ingress replica that dies (SIGKILL, OOM, node lost)
cancels nothing: Ray does not cancel an actor's streaming call when its caller dies, so the Engine
would generate every token of every request it held for no one, and bill them.

So each generation call names its caller (EngineCall.caller: the Ingress replica's Serve actor
name), and while an Engine replica holds calls of a caller (queued or running), it asks Ray every
`period_s` whether that actor still exists. Once it does not, the calls' tasks are cancelled: the
same path as a client disconnect (the vLLM request aborted, billed for what was generated,
`client_disconnect`; a call still queued leaves the queue unrun and unbilled).
One lookup per caller per period, only while it has calls here; nothing per token.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Callable, Optional

logger = logging.getLogger(__name__)


def serve_actor_alive(name: str) -> bool:
    """Whether the Serve actor `name` exists (Ray frees a dead actor's name). Blocking: a GCS call."""
    import ray
    from ray.serve._private.constants import SERVE_NAMESPACE

    try:
        ray.get_actor(name, namespace=SERVE_NAMESPACE)
    except ValueError:
        return False
    return True


class CallerWatch:
    def __init__(self, period_s: float, is_alive: Callable[[str], bool] = serve_actor_alive):
        self.period_s = period_s
        self.is_alive = is_alive  # blocking; run off the event loop
        self.calls: dict[str, set[asyncio.Task]] = {}  # caller -> the tasks running its calls
        self.aborted = 0  # calls cancelled because their caller died
        self._loop_task: Optional[asyncio.Task] = None

    def watch(self, caller: Optional[str]) -> Optional[tuple[str, asyncio.Task]]:
        """Watch the running task as one call of `caller` (None: no caller to watch); give what it
        returns to unwatch when the call ends."""
        task = asyncio.current_task() if caller else None
        if task is None:
            return None
        self.calls.setdefault(caller, set()).add(task)
        if self._loop_task is None or self._loop_task.done():
            self._loop_task = asyncio.get_running_loop().create_task(self._watch(), name="caller-watch")
        return caller, task

    def unwatch(self, watched: Optional[tuple[str, asyncio.Task]]) -> None:
        if watched is None:
            return
        caller, task = watched
        tasks = self.calls.get(caller)
        if tasks is not None:
            tasks.discard(task)
            if not tasks:
                del self.calls[caller]

    async def _watch(self) -> None:
        while self.calls:
            await asyncio.sleep(self.period_s)
            for caller in list(self.calls):
                try:
                    alive = await asyncio.to_thread(self.is_alive, caller)
                except Exception:  # Ray's control plane busy or down: assume alive, ask again
                    logger.debug("could not look up caller %s", caller, exc_info=True)
                    continue
                if not alive:
                    self.abort(caller)

    def abort(self, caller: str) -> None:
        tasks = self.calls.pop(caller, set())
        if tasks:
            logger.warning("ingress replica %s is gone: aborting its %d request(s)", caller, len(tasks))
        for task in tasks:
            self.aborted += 1
            task.cancel()
