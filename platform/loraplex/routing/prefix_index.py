"""An approximate, router-side index of which replica caches which prompt prefix.

Prompts are cut into fixed-size blocks and each block gets a hash chained over all blocks before
it, so one hash names a whole prefix (as vLLM's block hashes do) and a set of hashes per replica
is a prefix tree without the tree. Each replica's set is an LRU capped at an estimate of its
cache size, which stands in for Ray's and SGLang's timed tree eviction.
"""
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from hashlib import blake2b


def chain_hashes(prompt: str | Sequence[int], block_size: int = 64) -> tuple[int, ...]:
    """Chained hashes of the prompt's full blocks (characters of a text, or token ids).

    A trailing partial block is left out: engines cache only full blocks.
    """
    hashes, prev = [], b""
    for start in range(0, len(prompt) - block_size + 1, block_size):
        block = prompt[start:start + block_size]
        data = block.encode() if isinstance(block, str) else repr(list(block)).encode()
        prev = blake2b(prev + data, digest_size=8).digest()
        hashes.append(int.from_bytes(prev, "big"))
    return tuple(hashes)


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
