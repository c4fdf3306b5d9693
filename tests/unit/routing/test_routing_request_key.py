"""routing_key / route_request read Engine calls duck-typed; these fakes mirror the fields of
loraplex.engine.protocol's AdapterTarget and RequestMeta and vLLM's OpenAI requests."""
from dataclasses import dataclass, field

import pytest

from loraplex.routing.request_key import (affinity_key, expected_tokens, prompt_of,
                                          route_request, routing_key)
from loraplex.routing.served_keys import ServedKeys, routing_stats


@dataclass(frozen=True)
class Meta:
    request_id: str
    tenant_id: str
    api_key_id: str | None = None
    adapter: str | None = None


@dataclass(frozen=True)
class Adapter:
    lora_name: str
    lora_int_id: int
    tenant: str
    name: str
    sha256: str = "abc"
    requested_as: str = ""


@dataclass
class Chat:
    messages: list = field(default_factory=list)
    max_tokens: int | None = None
    max_completion_tokens: int | None = None


@dataclass
class Completion:
    prompt: object = ""
    max_tokens: int | None = None


BOT = Adapter("ten_a/bot@abc", 7, "ten_a", "bot")


def test_routing_key_is_the_tenant_plus_the_adapter_name():
    chat = Chat([{"role": "user", "content": "hi"}])
    assert routing_key((chat, None, "salt", Meta("r1", "ten_a")), {}) == "ten_a"
    assert routing_key((chat, BOT, "salt", Meta("r1", "ten_a", adapter="bot@3")), {}) == (
        "ten_a/bot")
    # Keyword calls, and meta alone naming the adapter as name@version.
    assert routing_key((chat,), {"adapter": BOT, "meta": Meta("r1", "ten_a")}) == "ten_a/bot"
    assert routing_key((chat, None, None, Meta("r1", "ten_a", adapter="bot@3")), {}) == (
        "ten_a/bot")
    assert routing_key((chat, BOT), {}) == "ten_a/bot"  # no meta: the adapter's tenant
    assert affinity_key("ten_a") == "ten_a" and affinity_key("ten_a", "bot") == "ten_a/bot"


def test_fields_a_client_adds_to_its_request_do_not_change_the_key():
    chat = Chat([{"role": "user", "content": "hi"}])
    chat.tenant_id, chat.lora_name, chat.name, chat.tenant = "ten_x", "x", "x", "ten_x"
    assert routing_key((chat, None, "salt", Meta("r1", "ten_a")), {}) == "ten_a"
    assert routing_key((chat,), {}) is None


def test_calls_without_a_tenant_have_no_key():
    assert routing_key((), {}) is None  # list_models(), ready(), num_unfinished_requests()
    assert routing_key((Chat(),), {}) is None
    assert routing_key((Chat(), None, None, None), {"meta": None}) is None
    assert routing_key((Chat(), None, None, Meta("r1", "")), {}) is None


def test_prompt_text_of_chats_and_completions():
    chat = Chat([{"role": "system", "content": "Be brief."},
                 {"role": "user", "content": [{"type": "text", "text": "Hi"},
                                              {"type": "image_url", "image_url": {}}]}])
    assert prompt_of(chat) == "system: Be brief.\nuser: Hi\n"
    assert prompt_of(Completion("once upon")) == "once upon"
    assert prompt_of(Completion(["a", "b"])) == "a\nb"
    assert prompt_of(Completion([1, 2, 3])) == [1, 2, 3]
    assert prompt_of(Completion([[4, 5], [6]])) == [4, 5]
    assert prompt_of(Completion(None)) is None


def test_route_request_estimates_tokens_and_hashes_prefixes_per_salt():
    system = "You answer questions about invoices. " * 8
    a1 = route_request((Chat([{"role": "system", "content": system},
                              {"role": "user", "content": "q1"}]), None, "salt-a",
                        Meta("r1", "ten_a")), {}, prefix_hashes=True, block_chars=32)
    a2 = route_request((Chat([{"role": "system", "content": system},
                              {"role": "user", "content": "another question"}]), None,
                        "salt-a", Meta("r2", "ten_a")), {}, prefix_hashes=True, block_chars=32)
    b = route_request((Chat([{"role": "system", "content": system},
                             {"role": "user", "content": "q1"}]), None, "salt-b",
                       Meta("r3", "ten_b")), {}, prefix_hashes=True, block_chars=32)
    assert a1.key == "ten_a" and a1.prompt_tokens == len(prompt_of(
        Chat([{"role": "system", "content": system}, {"role": "user", "content": "q1"}]))) // 4
    shared = len(system) // 32 - 1
    assert a1.prefix_hashes[:shared] == a2.prefix_hashes[:shared]
    assert not set(a1.prefix_hashes) & set(b.prefix_hashes)  # salts keep tenants apart
    # Without prefix_hashes nothing is hashed; token-id prompts count ids.
    assert route_request((Completion("x" * 400), None, "s", Meta("r", "t")), {}).prefix_hashes == ()
    ids = route_request((Completion(list(range(100))), None, "s", Meta("r", "t")), {},
                        prefix_hashes=True, block_chars=64)
    assert ids.prompt_tokens == 100 and len(ids.prefix_hashes) == 101 // 16
    assert route_request((), {}) is None


def test_expected_tokens_use_the_requests_max_tokens():
    assert expected_tokens((Chat(max_completion_tokens=40),), {}, 100) == 140
    assert expected_tokens((Completion("x", max_tokens=7),), {}, 100) == 107
    assert expected_tokens((Chat(),), {}, 100, default_output=128) == 228


def test_served_keys_is_an_lru_reported_most_recent_first():
    served = ServedKeys(capacity=3)
    for key in ("a", "b", "a", None, "c", "d"):
        served.touch(key)
    assert served.recent() == ["d", "c", "a"] and "b" not in served
    served.discard("c")
    assert routing_stats(served.recent(), running=2, kv_usage=0.25, max_keys=1) == {
        "held_keys": ["d"], "running": 2, "kv_usage": 0.25}
    assert routing_stats([]) == {"held_keys": []}


def test_the_engines_own_argument_types():
    protocol = pytest.importorskip("loraplex.engine.protocol")
    if not hasattr(protocol, "RequestMeta"):
        pytest.skip("RequestMeta not in loraplex.engine.protocol yet")
    adapter = protocol.AdapterTarget("ten_a/bot@abc", 3, "ten_a", "bot", "abc", "bot")
    meta = protocol.RequestMeta(request_id="r1", tenant_id="ten_a")
    chat = Chat([{"role": "user", "content": "hi"}])
    assert routing_key((chat, adapter, "salt", meta), {}) == "ten_a/bot"
    assert routing_key((chat, None, "salt", meta), {}) == "ten_a"
