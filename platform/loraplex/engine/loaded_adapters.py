"""LoadedAdapters: the LoRA versions one engine replica has registered with vLLM.

A version is registered on first use (fetched from the adapter store into the node's cache);
vLLM itself loads it into its CPU cache (`max_cpu_loras`) and GPU slots (`max_loras`) on demand,
evicting least recently used. A deleted version is dropped once no request on this replica
still runs with it.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter

from vllm.lora.request import LoRARequest

from loraplex.engine.protocol import AdapterTarget

logger = logging.getLogger(__name__)


class AdapterGone(LookupError):
    """The adapter version was deleted after the ingress resolved it: the request gets 404."""


class LoadedAdapters:
    def __init__(self, llm, serving_models, store):
        self.llm = llm
        self.serving_models = serving_models  # vLLM's OpenAIServingModels: maps `model` -> LoRARequest
        self.store = store
        self.targets: dict[str, AdapterTarget] = {}
        self.in_flight: Counter[str] = Counter()
        self.retiring: set[str] = set()
        self._fetching: dict[str, asyncio.Task] = {}

    async def acquire(self, target: AdapterTarget) -> None:
        if target.lora_name in self.retiring:
            raise AdapterGone(f"The model `{target.requested_as}` was deleted. List yours with GET /v1/models.")
        if target.lora_name not in self.targets:
            task = self._fetching.get(target.lora_name)
            if task is None:
                task = asyncio.ensure_future(asyncio.to_thread(
                    self.store.fetch_to_local_cache, target.tenant, target.name, target.sha256))
                self._fetching[target.lora_name] = task
            try:
                path = await asyncio.shield(task)
            except Exception as exc:
                # DELETE removes the blob after the catalog row: a version that is not in the
                # store any more was deleted (the store answers 404, or the file is gone).
                if isinstance(exc, FileNotFoundError) or getattr(exc, "status", None) == 404:
                    raise AdapterGone(f"The model `{target.requested_as}` was deleted. "
                                      "List yours with GET /v1/models.") from exc
                raise
            finally:
                self._fetching.pop(target.lora_name, None)
            self.serving_models.lora_requests[target.lora_name] = LoRARequest(
                lora_name=target.lora_name, lora_int_id=target.lora_int_id, lora_path=str(path))
            self.targets[target.lora_name] = target
        self.in_flight[target.lora_name] += 1

    async def release(self, target: AdapterTarget) -> None:
        self.in_flight[target.lora_name] -= 1
        if target.lora_name in self.retiring and self.in_flight[target.lora_name] <= 0:
            await self._drop(target.lora_name)

    async def retire(self, lora_int_ids: set[int]) -> None:
        """Deleted versions: drop the idle ones now, the busy ones when their last request ends."""
        for name, target in list(self.targets.items()):
            if target.lora_int_id in lora_int_ids:
                self.retiring.add(name)
                if self.in_flight[name] <= 0:
                    await self._drop(name)

    def loaded_ids(self) -> list[int]:
        return [t.lora_int_id for t in self.targets.values()]

    async def _drop(self, lora_name: str) -> None:
        target = self.targets.pop(lora_name)
        self.retiring.discard(lora_name)
        self.in_flight.pop(lora_name, None)
        self.serving_models.lora_requests.pop(lora_name, None)
        await self.llm.remove_lora(target.lora_int_id)
        await asyncio.to_thread(self.store.evict_from_local_cache, target.tenant, target.name, target.sha256)
        logger.info("freed adapter %s", lora_name)
