"""Where vLLM holds each LoRA: its GPU slots (`max_loras`, what a batch can use) or its CPU tier
(`max_cpu_loras`, host memory), which are pinned, and how many bytes each takes there.

AsyncLLM lists only the CPU tier (`list_loras`). The slots live in the worker's LoRA manager,
inside vLLM's EngineCore process, so this is a worker extension (vLLM's
`worker_extension_cls`): its method is mixed into the worker class and called by name with
`collective_rpc`. It reads vLLM 0.32's LRUCacheLoRAModelManager (`_active_adapters` = slots,
`_registered_adapters` = CPU tier, both LRU caches with `pinned_items`).

It also pins an adapter in the CPU tier alone. vLLM's own `pin_lora` pins it in a GPU slot as
well, but vLLM's scheduler still admits `max_loras` distinct adapters into a batch: with one slot
held by a pinned adapter outside the batch, activating the batch's last adapter
(`LRUCacheLoRAModelManager.activate_adapter`) evicts another adapter of the same batch from its
slot. A pinned adapter in the CPU tier is never loaded from disk again; moving it into a slot is
a copy. `pin_lora` has no inverse either; `_unpin` here is one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from loraplex.engine import cpu_lora_ops

cpu_lora_ops.install()  # in vLLM's worker, which imports this module as its extension

EXTENSION = "loraplex.engine.lora_residency.LoRAResidencyExtension"  # vLLM resolves a dotted qualname
RPC = "loraplex_lora_residency"
PIN_RPC, UNPIN_RPC = "loraplex_pin_lora_cpu", "loraplex_unpin_lora_cpu"


@dataclass(frozen=True)
class LoRAResidency:
    """One sample of vLLM's LoRA tiers, by lora_int_id."""

    slots: frozenset[int] = frozenset()  # in GPU slots: a batch can run them now
    cpu: frozenset[int] = frozenset()  # in the CPU tier (a slot's adapter is there too)
    pinned: frozenset[int] = frozenset()  # never evicted by vLLM's LRU
    cpu_bytes: dict[int, int] = field(default_factory=dict)  # host bytes of each CPU-tier adapter
    known_slots: bool = True  # False: the engine could not list its slots (CPU tier only)
    slot_loads: int = 0  # adapters moved into a slot since the first sample (vLLM counts none)

    @classmethod
    def of(cls, reply: dict | None, cpu_ids: set[int] | None = None) -> "LoRAResidency":
        if not reply:
            return cls(cpu=frozenset(cpu_ids or ()), known_slots=False)
        return cls(slots=frozenset(reply["slots"]), cpu=frozenset(reply["cpu"]), pinned=frozenset(reply["pinned"]),
                   cpu_bytes={int(k): int(v) for k, v in reply["cpu_bytes"].items()},
                   slot_loads=int(reply.get("slot_loads", 0)))


def _nbytes(weights) -> int:
    total = 0
    for t in (getattr(weights, "lora_a", None), getattr(weights, "lora_b", None)):
        for part in (t if isinstance(t, (list, tuple)) else [t]):
            if part is not None and hasattr(part, "element_size"):
                total += part.numel() * part.element_size()
    return total


def count_slot_loads(manager) -> int:
    """Slot loads counted on `manager` (a LoRAModelManager) so far; the first call starts the
    count by wrapping the instance's activate_adapter (vLLM's worker calls it through the
    instance for every adapter of a batch; it returns True when it moved one into a slot)."""
    if not hasattr(manager, "_loraplex_slot_loads"):
        manager._loraplex_slot_loads = 0
        activate = manager.activate_adapter

        def counted(lora_id: int) -> bool:
            moved = activate(lora_id)
            if moved:
                manager._loraplex_slot_loads += 1
            return moved

        manager.activate_adapter = counted
    return manager._loraplex_slot_loads


class LoRAResidencyExtension:
    """Mixed into vLLM's worker (worker_extension_cls); runs in the EngineCore process."""

    def _loraplex_manager(self):
        runner = getattr(self, "model_runner", None)
        return getattr(getattr(runner, "lora_manager", None), "_adapter_manager", None)

    def loraplex_pin_lora_cpu(self, lora_id: int) -> bool:
        """Keep the adapter in the CPU tier whatever vLLM's LRU wants (it must be registered)."""
        self._loraplex_manager()._registered_adapters.pin(lora_id)
        return True

    def loraplex_unpin_lora_cpu(self, lora_id: int) -> bool:
        registered = self._loraplex_manager()._registered_adapters
        if lora_id in registered.pinned_items:
            registered._unpin(lora_id)
        return True

    def loraplex_lora_residency(self) -> dict | None:
        manager = self._loraplex_manager()
        if manager is None:  # LoRA disabled, or a vLLM whose manager looks otherwise
            return None
        registered, active = manager._registered_adapters, manager._active_adapters
        return {
            "slots": [int(k) for k in active.keys()],
            "cpu": [int(k) for k in registered.keys()],
            "pinned": [int(k) for k in registered.pinned_items],
            "cpu_bytes": {int(k): sum(_nbytes(w) for w in model.loras.values())
                          for k, model in registered.cache.items()},
            "slot_loads": count_slot_loads(manager),
        }
