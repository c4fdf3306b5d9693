"""LoadedAdapters: the LoRA versions one engine replica has registered with vLLM.

A version is loaded on first use: fetched from the adapter store into the node's cache, then
into vLLM's host-memory LoRA cache (`add_lora`, `max_cpu_loras`), timed as the replica's adapter
load. vLLM moves it into GPU slots (`max_loras`) per batch and evicts least recently used; one
it evicted from its host cache (seen when the metrics publisher samples the cache) is loaded
again, and counted again, on its next use. A deleted version is dropped once no request on this
replica still runs with it.

The node-local copies (the store's cache_dir) are bounded too: past registry.cache_max_bytes,
after each fetch, the least recently used versions this replica fetched that vLLM no longer holds
(evicted from its CPU tier) and that no request runs with are removed from the disk; each is
fetched again on its next use. A version vLLM holds is never removed (vLLM may read its files
again). Another replica on the node may share the dir: it fetches again whatever it finds gone.
A fetch the disk refuses (full: store.CacheDiskFull) removes such idle copies, least recently
used first, until the version's bytes are freed, and is retried once; then the request gets 503
adapter_cache_full.

Two operator controls: a pinned version (AdapterCatalog.pin) is loaded at once and pinned in
vLLM's CPU tier, so its LRU never evicts it (lora_residency says why not in a GPU slot); and
`max_cpu_lora_bytes` bounds the CPU tier by bytes as well as by count: after each load, the
least recently used idle, unpinned versions are removed from vLLM until the tier fits.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter

from vllm.lora.request import LoRARequest

from loraplex.contract import AdapterTarget, affinity_key
from loraplex.engine.lora_residency import PIN_RPC, UNPIN_RPC
from loraplex.metrics.replica_metrics import NoReplicaMetrics
from loraplex.disk_full import CacheDiskFull

logger = logging.getLogger(__name__)


def _dir_bytes(path) -> int:
    from pathlib import Path

    try:
        return sum(f.stat().st_size for f in Path(path).iterdir() if f.is_file())
    except OSError:  # not a local dir (a store that hands vLLM another path)
        return 0


class AdapterGone(LookupError):
    """The adapter version was deleted after the ingress resolved it: the request gets 404."""


class LoadedAdapters:
    def __init__(self, llm, serving_models, store, metrics=None, residency=None, max_cpu_bytes: int | None = None):
        self.llm = llm
        # async () -> LoRAResidency (VLLMEngine.lora_residency): the CPU tier's real bytes.
        self.residency = residency
        self.max_cpu_bytes = max_cpu_bytes  # None: vLLM's count (max_cpu_loras) alone bounds the tier
        self.pinned: set[int] = set()  # ids pinned in vLLM's CPU tier now
        self.want_pinned: dict[int, AdapterTarget] = {}  # the catalog's pinned versions, as last synced
        self._used_at: dict[str, float] = {}  # name -> time.monotonic() of its last acquire
        self.serving_models = serving_models  # vLLM's OpenAIServingModels: maps `model` -> LoRARequest
        self.store = store
        self.metrics = metrics or NoReplicaMetrics()  # loads, their seconds, evictions
        self.targets: dict[str, AdapterTarget] = {}
        self.in_flight: Counter[str] = Counter()
        # Catalog ids of deleted versions: refused from now on, and dropped once their running
        # requests end. Ids are never reused (the same weights uploaded after a delete are a new
        # version with a new id and name: AdapterCatalog.add), so this set never needs forgetting. A blob may outlive a deleted version (another
        # name with the same weights), so "not fetchable" alone would not keep it out.
        self.deleted: set[int] = set()
        # Names vLLM evicted from its host cache since their load: loaded again on next use.
        self.evicted: set[str] = set()
        self._resident: set[int] = set()  # vLLM's host cache at the last sample
        self._loaded_at: dict[str, float] = {}  # name -> time.monotonic() its last load ended
        self._loading: dict[str, asyncio.Future] = {}
        # (tenant, sha256) -> bytes of its copy in cache_dir, for the versions this replica fetched.
        self._cached_bytes: dict[tuple[str, str], int] = {}
        self.cache_max_bytes: int | None = getattr(store, "cache_max_bytes", None)

    async def acquire(self, target: AdapterTarget) -> None:
        if target.lora_int_id in self.deleted:
            raise AdapterGone(f"The model `{target.requested_as}` was deleted. List yours with GET /v1/models.")
        name = target.lora_name
        if name not in self.targets or name in self.evicted:
            task = self._loading.get(name)
            if task is None:  # one load however many requests wait for it
                task = self._loading[name] = asyncio.ensure_future(self._load(target))
                task.add_done_callback(lambda t, n=name: self._loading.pop(n) if self._loading.get(n) is t else None)
            await asyncio.shield(task)
        self.in_flight[name] += 1
        self._used_at[name] = time.monotonic()

    async def _load(self, target: AdapterTarget) -> None:
        started = time.monotonic()
        try:
            path = await self._fetch(target)
        except Exception as exc:
            # DELETE removes the blob after the catalog row: a version that is not in the
            # store any more was deleted (the store answers 404, or the file is gone).
            if isinstance(exc, FileNotFoundError) or getattr(exc, "status", None) == 404:
                raise AdapterGone(f"The model `{target.requested_as}` was deleted. "
                                  "List yours with GET /v1/models.") from exc
            raise
        self._cached_bytes[(target.tenant, target.sha256)] = _dir_bytes(path)
        request = LoRARequest(lora_name=target.lora_name, lora_int_id=target.lora_int_id, lora_path=str(path))
        # Into vLLM's host cache now, not inside the first batch that needs it: the load is
        # timed here, and a broken adapter fails this request alone.
        await self.llm.add_lora(request)
        self.serving_models.lora_requests[target.lora_name] = request
        self.targets[target.lora_name] = target
        self.evicted.discard(target.lora_name)
        self._resident.add(target.lora_int_id)
        self._loaded_at[target.lora_name] = now = time.monotonic()
        self.metrics.adapter_loaded(now - started)
        if target.lora_int_id in self.want_pinned:
            await self._pin(target.lora_int_id)
        await self._fit_bytes(keep=target.lora_name)
        await self._prune_cache(keep=(target.tenant, target.sha256))

    async def _fetch(self, target: AdapterTarget):
        """The version's copy in cache_dir; a full disk frees idle copies (LRU) and tries once more."""
        blob = (target.tenant, target.sha256)
        try:
            return await asyncio.to_thread(self.store.fetch_to_local_cache, *blob)
        except CacheDiskFull:
            try:
                need = await asyncio.to_thread(self.store.blob_bytes, *blob)
            except Exception:  # its size unknown: free every idle copy
                need = None
            used = sum(self._cached_bytes.values())
            left = await self._remove_idle(keep=blob, down_to=0 if need is None else used - need)
            if left == used:  # nothing could go: the retry would fail the same way
                raise
            logger.warning("adapter cache full: removed %d bytes of idle copies to fetch %s", used - left,
                           target.lora_name)
            return await asyncio.to_thread(self.store.fetch_to_local_cache, *blob)

    async def _prune_cache(self, keep: tuple[str, str]) -> None:
        """Remove least recently used idle copies vLLM no longer holds until cache_dir fits cache_max_bytes."""
        if self.cache_max_bytes is None:
            return
        used = await self._remove_idle(keep, self.cache_max_bytes)
        if used > self.cache_max_bytes:
            logger.warning("this replica's adapter copies in cache_dir take %d bytes, over registry.cache_max_bytes "
                           "%d: the rest are held by vLLM or running", used, self.cache_max_bytes)

    async def _remove_idle(self, keep: tuple[str, str], down_to: int) -> int:
        """Remove least recently used idle copies vLLM no longer holds until this replica's copies
        take at most down_to bytes (or none is idle); returns the bytes they take then."""
        used = sum(self._cached_bytes.values())
        by_blob: dict[tuple[str, str], list[str]] = {}
        for name, t in self.targets.items():
            by_blob.setdefault((t.tenant, t.sha256), []).append(name)
        # In use: a name vLLM holds (not evicted), a request runs with, or one loading now.
        idle = [blob for blob, names in by_blob.items()
                if blob != keep and blob in self._cached_bytes
                and all(n in self.evicted and self.in_flight[n] <= 0 and n not in self._loading for n in names)]
        idle.sort(key=lambda blob: max(self._used_at.get(n, 0.0) for n in by_blob[blob]))
        for blob in idle:
            if used <= down_to:
                break
            await asyncio.to_thread(self.store.evict_from_local_cache, *blob)
            used -= self._cached_bytes.pop(blob)
        return used

    async def _pin(self, lora_int_id: int) -> None:
        await self.llm.collective_rpc(PIN_RPC, args=(lora_int_id,))
        self.pinned.add(lora_int_id)

    async def sync_pins(self, pinned: list[AdapterTarget]) -> None:
        """The catalog's pinned versions (first pinned first): load and pin the new ones, unpin
        the rest. A pinned version that cannot be loaded is retried on the next sync."""
        self.want_pinned = {t.lora_int_id: t for t in pinned}
        for lid in list(self.pinned - set(self.want_pinned)):
            await self.llm.collective_rpc(UNPIN_RPC, args=(lid,))
            self.pinned.discard(lid)
        for lid, target in self.want_pinned.items():
            if lid in self.pinned and target.lora_name in self.targets and target.lora_name not in self.evicted:
                continue
            try:
                if target.lora_name in self.targets and target.lora_name not in self.evicted:
                    await self._pin(lid)  # loaded before it was pinned
                else:
                    await self.acquire(target)  # loads it, and pins it once in vLLM
                    await self.release(target)
            except AdapterGone:
                pass  # deleted since: the catalog stops listing it
            except Exception:
                logger.exception("could not pin adapter %s; retrying on the next sync", target.lora_name)

    async def _fit_bytes(self, keep: str) -> None:
        """Remove least recently used idle, unpinned versions from vLLM's CPU tier until its bytes
        fit max_cpu_bytes; each is loaded again on its next use."""
        if self.max_cpu_bytes is None or self.residency is None:
            return
        residency = await self.residency()
        used = sum(residency.cpu_bytes.values())
        by_id = {t.lora_int_id: name for name, t in self.targets.items()}
        idle = sorted((by_id[lid] for lid in residency.cpu
                       if lid in by_id and by_id[lid] != keep and lid not in residency.pinned
                       and self.in_flight[by_id[lid]] <= 0 and by_id[lid] not in self.evicted),
                      key=lambda name: self._used_at.get(name, 0.0))
        freed = 0
        for name in idle:
            if used <= self.max_cpu_bytes:
                break
            lid = self.targets[name].lora_int_id
            await self.llm.remove_lora(lid)
            used -= residency.cpu_bytes.get(lid, 0)
            self.evicted.add(name)
            self._resident.discard(lid)
            freed += 1
        self.metrics.adapters_evicted("bytes", freed)
        if used > self.max_cpu_bytes:
            logger.warning("vLLM's CPU tier holds %d bytes of adapters, over max_cpu_lora_bytes %d: the rest are "
                           "pinned or running", used, self.max_cpu_bytes)

    def note_resident(self, lora_int_ids: set[int], sampled_at: float = float("inf")) -> int:
        """vLLM's host-cache contents as listed (`list_loras`) at `sampled_at` (time.monotonic());
        returns how many of our versions it evicted since the last sample (LRU): each is loaded
        again on its next use. A version loaded after the listing was asked for is not judged."""
        evicted = 0
        for name, target in self.targets.items():
            lid = target.lora_int_id
            if self._loaded_at.get(name, 0.0) > sampled_at:
                continue
            if lid in self._resident and lid not in lora_int_ids and name not in self.evicted:
                self.evicted.add(name)
                evicted += 1
        self._resident = set(lora_int_ids) | {t.lora_int_id for n, t in self.targets.items()
                                              if self._loaded_at.get(n, 0.0) > sampled_at}
        return evicted

    async def release(self, target: AdapterTarget) -> None:
        self.in_flight[target.lora_name] -= 1
        if target.lora_int_id in self.deleted and self.in_flight[target.lora_name] <= 0:
            await self._drop(target.lora_name)

    async def retire(self, lora_int_ids: set[int]) -> None:
        """Deleted versions: drop the idle ones now, the busy ones when their last request ends."""
        self.deleted |= set(lora_int_ids)
        for name, target in list(self.targets.items()):
            if target.lora_int_id in lora_int_ids:
                if self.in_flight[name] <= 0:
                    await self._drop(name)

    def keys_of(self, lora_int_ids) -> set[str]:
        """The affinity keys (tenant/name) of these loaded versions, as the routers know them."""
        ids = set(lora_int_ids)
        return {affinity_key(t.tenant, t.name) for t in self.targets.values() if t.lora_int_id in ids}

    def loaded_ids(self) -> list[int]:
        return [t.lora_int_id for t in self.targets.values()]

    async def _drop(self, lora_name: str) -> None:
        target = self.targets.pop(lora_name)
        self.in_flight.pop(lora_name, None)
        self.serving_models.lora_requests.pop(lora_name, None)
        self.evicted.discard(lora_name)
        self._loaded_at.pop(lora_name, None)
        self._used_at.pop(lora_name, None)
        self._resident.discard(target.lora_int_id)
        self.pinned.discard(target.lora_int_id)  # removing it from vLLM unpins it there
        await self.llm.remove_lora(target.lora_int_id)
        self.metrics.adapters_evicted("deleted")
        # Blobs are by content: another name of this tenant may have the same weights loaded.
        if not any((t.tenant, t.sha256) == (target.tenant, target.sha256) for t in self.targets.values()):
            await asyncio.to_thread(self.store.evict_from_local_cache, target.tenant, target.sha256)
            self._cached_bytes.pop((target.tenant, target.sha256), None)
        logger.info("freed adapter %s", lora_name)
