"""The worker extension's slot-load count (lora_residency.count_slot_loads), over a fake of vLLM's
LRUCacheLoRAModelManager: slots in LRU order, an activation of an adapter not in a slot moves it in
(evicting the oldest once the slots are full) and returns True, as vLLM's does."""

from collections import OrderedDict
from types import SimpleNamespace

from loraplex.engine.lora_residency import LoRAResidency, LoRAResidencyExtension, count_slot_loads


class FakeLRU(OrderedDict):
    pinned_items: set = set()

    @property
    def cache(self):
        return {k: SimpleNamespace(loras={}) for k in self}


class FakeLoRAManager:
    """vLLM's LRUCacheLoRAModelManager at the seam the worker calls: activate_adapter(id)."""

    def __init__(self, slots: int):
        self.slots = slots
        self._active_adapters, self._registered_adapters = FakeLRU(), FakeLRU()

    def activate_adapter(self, lora_id: int) -> bool:
        self._registered_adapters[lora_id] = None
        if lora_id in self._active_adapters:
            self._active_adapters.move_to_end(lora_id)
            return False
        if len(self._active_adapters) >= self.slots:
            self._active_adapters.popitem(last=False)
        self._active_adapters[lora_id] = None
        return True


def test_slot_loads_count_moves_into_a_slot_not_touches_of_a_resident_adapter():
    manager = FakeLoRAManager(slots=2)
    assert count_slot_loads(manager) == 0  # the count starts here
    for lora_id in (1, 1, 2, 1, 3, 2, 1):  # 3 evicts 2, 2 evicts 1, 1 evicts 3
        manager.activate_adapter(lora_id)
    assert count_slot_loads(manager) == 5  # 1, 2, 3, 2 again, 1 again
    assert count_slot_loads(manager) == 5  # asking again wraps nothing twice


def test_the_residency_reply_carries_the_slot_loads_to_the_replica():
    manager = FakeLoRAManager(slots=4)
    worker = LoRAResidencyExtension()
    worker.model_runner = SimpleNamespace(lora_manager=SimpleNamespace(_adapter_manager=manager))
    assert worker.loraplex_lora_residency()["slot_loads"] == 0
    manager.activate_adapter(7)
    manager.activate_adapter(7)
    reply = worker.loraplex_lora_residency()
    assert reply["slot_loads"] == 1 and reply["slots"] == [7]
    assert LoRAResidency.of(reply).slot_loads == 1
    assert LoRAResidency.of({k: v for k, v in reply.items() if k != "slot_loads"}).slot_loads == 0
