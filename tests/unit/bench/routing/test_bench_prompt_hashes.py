"""Prompt hashing for the prefix-matching comparison policies. Chat and Completion stand in for
vLLM's OpenAI requests (importing vLLM takes seconds); prompt_of reads only their fields."""
from dataclasses import dataclass, field

from bench.routing.cache_aware import CacheAwarePolicy
from bench.routing.prefix_tree import PrefixTreePolicy
from bench.routing.prompt_hashes import chain_hashes, prompt_hashes, prompt_of
from loraplex.contract import AdapterTarget, EngineCall
from loraplex.routing.config import RoutingConfig


@dataclass
class Chat:
    messages: list = field(default_factory=list)


@dataclass
class Completion:
    prompt: object = ""


def test_prompt_text_of_chats_and_completions():
    chat = Chat([{"role": "system", "content": "Be brief."},
                 {"role": "user", "content": [{"type": "text", "text": "Hi"},
                                              {"type": "image_url", "image_url": {}}]}])
    assert prompt_of(chat) == "system: Be brief.\nuser: Hi\n"
    assert prompt_of(Completion("once upon")) == "once upon"
    assert prompt_of(Completion(["a", "b"])) == "a\nb"
    assert prompt_of(Completion([1, 2, 3])) == [1, 2, 3]
    assert prompt_of(Completion([[4, 5], [6]])) == [4, 5]
    assert prompt_of(Completion(None)) is None and prompt_of(None) is None


def test_chain_hashes_share_a_prefix_and_drop_the_partial_block():
    a = chain_hashes("abcdefgh-tail", block_size=4)
    b = chain_hashes("abcdefgX", block_size=4)
    assert len(a) == 3 and len(b) == 2
    assert a[0] == b[0] and a[1] != b[1]
    assert chain_hashes([1, 2, 3, 4, 5], block_size=2) == chain_hashes([1, 2, 3, 4], block_size=2)


def test_prompt_hashes_share_a_tenants_prefix_and_never_another_salts():
    system = "You answer questions about invoices. " * 8

    def chat(question):
        return Chat([{"role": "system", "content": system}, {"role": "user", "content": question}])

    a1 = prompt_hashes(chat("q1"), "salt-a", block_chars=32)
    a2 = prompt_hashes(chat("another question"), "salt-a", block_chars=32)
    shared = len(system) // 32 - 1
    assert a1[:shared] == a2[:shared]
    assert not set(a1) & set(prompt_hashes(chat("q1"), "salt-b", block_chars=32))
    # The adapter's weights (lora_name) are in the chain too, as in vLLM's block hashes.
    assert not set(a1) & set(prompt_hashes(chat("q1"), "salt-a", "acme/bot@abc", block_chars=32))
    # Token-id prompts hash blocks of block_chars / 4 ids after one pseudo-token for the head.
    assert len(prompt_hashes(Completion(list(range(100))), "s", block_chars=64)) == 101 // 16
    assert prompt_hashes(Completion("x" * 1000), max_prefix_chars=128, block_chars=64) == (
        prompt_hashes(Completion("x" * 126), block_chars=64))
    assert prompt_hashes(Completion(None)) == ()


def test_prefix_policies_route_from_the_call_and_its_request():
    bot = AdapterTarget("acme/bot@abc", 7, "acme", "bot", "abc", "bot", version=1)
    call = EngineCall("req-1", "acme", adapter=bot, cache_salt="salt-a", routing_key="acme/bot",
                      prompt_tokens=300)
    request = Completion("You are acme's bot. " * 20)
    route = PrefixTreePolicy(block_chars=32).route(call, request)
    assert (route.key, route.prompt_tokens) == ("acme/bot", 300)
    assert route.prefix_hashes == prompt_hashes(request, "salt-a", "acme/bot@abc", block_chars=32)


def test_prefix_policies_size_their_index_to_the_replicas_cache():
    config = RoutingConfig(policy="bench.routing.cache_aware:CacheAwarePolicy",
                           tokens_per_replica=4096, policy_options={"block_chars": 32})
    policy = config.make_policy()
    assert isinstance(policy, CacheAwarePolicy) and policy.block_chars == 32
    assert policy.index.blocks_per_replica == 4096 * 4 // 32  # ~4 characters a token
