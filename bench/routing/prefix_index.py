"""The base of the prefix-matching policies: a router-side index of which replica caches which
prompt prefix, fed with each call's prompt hashes (prompt_hashes).

A set of chained block hashes per replica is a prefix tree without the tree. Each replica's set
is an LRU capped at an estimate of its cache size, which stands in for Ray's and SGLang's timed
tree eviction.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from bench.routing.prompt_hashes import (CHARS_PER_TOKEN, DEFAULT_BLOCK_CHARS,
                                         DEFAULT_MAX_PREFIX_CHARS, prompt_hashes)
from loraplex.routing.policy import RoutingPolicy, RoutingSettings
from loraplex.routing.snapshot import RouteRequest

if TYPE_CHECKING:
    from loraplex.contract import EngineCall


@dataclass(slots=True)
class PrefixRequest(RouteRequest):
    prefix_hashes: tuple[int, ...] = ()  # chained hashes of the prompt's blocks


class PrefixIndex:
    def __init__(self, blocks_per_replica: int):
        self.blocks_per_replica = blocks_per_replica
        self._blocks: dict[str, OrderedDict[int, None]] = {}

    def size(self, replica_id: str) -> int:
        return len(self._blocks.get(replica_id, ()))

    def insert(self, replica_id: str, hashes: Sequence[int]) -> None:
        blocks = self._blocks.setdefault(replica_id, OrderedDict())
        # Tail first, so the head is most recent and LRU trims a prefix from its end, as the
        # engine's own cache does; trimming the head would orphan the rest of the chain.
        for h in reversed(hashes):
            if h in blocks:
                blocks.move_to_end(h)
            else:
                blocks[h] = None
        while len(blocks) > self.blocks_per_replica:
            blocks.popitem(last=False)

    def match(self, hashes: Sequence[int], replica_ids: Iterable[str]) -> dict[str, int]:
        """Matched leading blocks per replica (replicas with no match are left out)."""
        matched = {}
        for r in replica_ids:
            blocks = self._blocks.get(r)
            # Most replicas miss the first block, so one lookup each is the common cost.
            if not hashes or not blocks or hashes[0] not in blocks:
                continue
            n = 1
            while n < len(hashes) and hashes[n] in blocks:
                n += 1
            matched[r] = n
        return matched

    def remove_replica(self, replica_id: str) -> None:
        self._blocks.pop(replica_id, None)


class PrefixPolicy(RoutingPolicy):
    """A policy that ranks by PrefixRequest.prefix_hashes against its PrefixIndex.

    block_chars, max_prefix_chars: how prompts are hashed (see prompt_hashes);
    blocks_per_replica: the index's size per replica, from RoutingConfig.tokens_per_replica
    when a deployment sets it.
    """

    def __init__(self, blocks_per_replica: int = 1 << 20, block_chars: int = DEFAULT_BLOCK_CHARS,
                 max_prefix_chars: int = DEFAULT_MAX_PREFIX_CHARS):
        self.index = PrefixIndex(blocks_per_replica)
        self.block_chars = block_chars
        self.max_prefix_chars = max_prefix_chars

    @classmethod
    def from_config(cls, config: RoutingSettings) -> PrefixPolicy:
        options = dict(config.policy_options)
        if config.tokens_per_replica and "blocks_per_replica" not in options:
            block_chars = options.get("block_chars", DEFAULT_BLOCK_CHARS)
            options["blocks_per_replica"] = max(
                1, config.tokens_per_replica * CHARS_PER_TOKEN // block_chars)
        return cls(**options)

    def route(self, call: EngineCall, request: Any) -> PrefixRequest:
        lora_name = call.adapter.lora_name if call.adapter is not None else None
        return PrefixRequest(call.routing_key, call.prompt_tokens, prompt_hashes(
            request, call.cache_salt, lora_name, self.block_chars, self.max_prefix_chars))

    def on_routed(self, request: PrefixRequest, replica_id: str) -> None:
        self.index.insert(replica_id, request.prefix_hashes)

    def on_replica_removed(self, replica_id: str) -> None:
        self.index.remove_replica(replica_id)
