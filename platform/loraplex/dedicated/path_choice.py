"""Merged or LoRA, per call: the pure part of the dedicated path (no Ray, no clock of its own).

A call goes to its version's merged replica when that version has a dedicated deployment in this
app, is still marked (config, or an admin mark not removed since), the deployment is healthy by
Serve's last status (a RUNNING replica, not UNHEALTHY / DEPLOY_FAILED) and no call to it failed
within `failure_backoff_s`. Anything else takes the LoRA pool, which serves every version.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Literal

from loraplex.contract import EngineCall
from loraplex.dedicated.targets import DedicatedTarget

Path = Literal["merged", "lora"]
UNHEALTHY_STATUSES = frozenset({"UNHEALTHY", "DEPLOY_FAILED"})


@dataclass
class DedicatedPaths:
    targets: dict[int, DedicatedTarget]  # adapter id -> the version's deployment in this app
    failure_backoff_s: float = 15.0
    marked: set[int] = field(default_factory=set)  # ids with a live mark now (config ones always)
    healthy: set[int] = field(default_factory=set)
    failed_until: dict[int, float] = field(default_factory=dict)

    def __post_init__(self):
        self.marked = set(self.marked) or set(self.targets)

    @classmethod
    def of(cls, targets: Iterable[DedicatedTarget], failure_backoff_s: float) -> "DedicatedPaths":
        return cls({t.adapter_id: t for t in targets}, failure_backoff_s)

    def choose(self, call: EngineCall, now: float) -> Path:
        a = call.adapter
        if a is None or a.lora_int_id not in self.targets:
            return "lora"
        i = a.lora_int_id
        if i in self.marked and i in self.healthy and now >= self.failed_until.get(i, 0.0):
            return "merged"
        return "lora"

    def observe(self, deployments: dict[str, tuple[str, int]], admin_marked: set[int]) -> None:
        """Serve's view (deployment name -> (status, RUNNING replicas)) and the live admin marks."""
        healthy = set()
        for i, t in self.targets.items():
            status, running = deployments.get(t.deployment_name, ("", 0))
            if running > 0 and status not in UNHEALTHY_STATUSES:
                healthy.add(i)
        self.healthy = healthy
        self.marked = {i for i, t in self.targets.items() if t.source == "config" or i in admin_marked}

    def failed(self, adapter_id: int, now: float) -> None:
        """A call to the merged replica failed before its first token: LoRA for a while."""
        self.failed_until[adapter_id] = now + self.failure_backoff_s

    def unmark(self, adapter_id: int) -> None:
        self.marked.discard(adapter_id)

    def state(self, adapter_id: int, now: float) -> dict:
        return {"marked": adapter_id in self.marked, "healthy": adapter_id in self.healthy,
                "backing_off": now < self.failed_until.get(adapter_id, 0.0)}
