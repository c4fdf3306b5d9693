"""A simulated replica's prefix cache: LRU over block chains, with fixed capacity in blocks.

A request touches its tenant's prefix chain and its own unique suffix chain as wholes, so the
cache tracks chains, not blocks; eviction trims the least recent chain from its tail, which is
what vLLM does (it frees a finished request's blocks tail first).
"""
from collections import OrderedDict
from collections.abc import Hashable


class BlockCache:
    def __init__(self, capacity_blocks: int):
        self.capacity_blocks = capacity_blocks
        self.used_blocks = 0
        self._chains: OrderedDict[Hashable, int] = OrderedDict()  # chain -> cached leading blocks

    def cached_blocks(self, chain: Hashable) -> int:
        return self._chains.get(chain, 0)

    def touch(self, chain: Hashable, blocks: int) -> int:
        """Serve `blocks` leading blocks of `chain`; returns how many were already cached."""
        cached = self._chains.pop(chain, 0)
        self._chains[chain] = max(blocks, cached)
        self.used_blocks += max(blocks - cached, 0)
        self._evict()
        return min(cached, blocks)

    def _evict(self) -> None:
        while self.used_blocks > self.capacity_blocks:
            chain, blocks = next(iter(self._chains.items()))
            excess = self.used_blocks - self.capacity_blocks
            if blocks > excess:
                self._chains[chain] = blocks - excess  # keeps its LRU position
                self.used_blocks -= excess
            else:
                del self._chains[chain]
                self.used_blocks -= blocks
