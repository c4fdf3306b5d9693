"""No KV block is shared across tenants: each tenant's prompts are hashed with its own cache_salt
(docs/adapters.md). On the session's real engine, one replica, prefix caching on."""

import secrets

import httpx
import pytest
from tenant_keys import new_tenant_key

pytestmark = pytest.mark.integration


def long_system_prompt() -> str:
    # A fresh prefix (nothing else in the session can have cached it), well over 600 tokens:
    # several of the CPU backend's 128-token KV blocks.
    nonce = secrets.token_hex(8)
    rules = " ".join(f"Rule {i}: reply in plain words, cite the manual section {i}, and never guess." for i in range(60))
    return f"Session {nonce}. You are the support assistant of a freight company. {rules}"


def test_a_prompt_cached_for_one_tenant_is_not_a_hit_for_another(base_url, admin, model_name, engine_handle):
    system = long_system_prompt()
    body = {"model": model_name, "max_tokens": 1, "temperature": 0,
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": "Where is my parcel?"}]}
    keys = {name: new_tenant_key(admin, f"kv-{name}") for name in ("a", "b")}

    def ask(tenant: str) -> dict:
        reply = httpx.post(f"{base_url}/v1/chat/completions", json=body, timeout=120,
                           headers={"Authorization": f"Bearer {keys[tenant]}"})
        assert reply.status_code == 200, reply.text
        return reply.json()["usage"]

    def hits() -> float:
        # vLLM's own prefix-cache counters in the replica (tokens); the session has one replica.
        counters = engine_handle.engine_counters.remote().result()
        return counters["prefix_cache_hits"], counters["prefix_cache_queries"]

    first = ask("a")
    assert first["prompt_tokens"] >= 600, first
    assert first["prompt_tokens_details"]["cached_tokens"] == 0, first  # a fresh prefix
    hits_0, _ = hits()
    second = ask("a")
    hits_1, queries_1 = hits()
    cached = second["prompt_tokens_details"]["cached_tokens"]
    assert cached >= 512, second  # the same tenant reuses its blocks
    assert hits_1 - hits_0 >= cached  # and vLLM counted the hits

    # Tenant B, the very same prompt: vLLM looks it up and finds nothing, because B's salt
    # differs (without the salt reaching vLLM this would hit as A's second request did).
    other = ask("b")
    hits_2, queries_2 = hits()
    assert other["prompt_tokens"] == first["prompt_tokens"]
    assert other["prompt_tokens_details"]["cached_tokens"] == 0, other
    assert queries_2 - queries_1 >= other["prompt_tokens"] - 1  # the lookup happened
    assert hits_2 - hits_1 == 0  # and found none of A's blocks

    # A's blocks were not evicted meanwhile: A still hits, and B now hits its own.
    assert ask("a")["prompt_tokens_details"]["cached_tokens"] >= 512
    assert ask("b")["prompt_tokens_details"]["cached_tokens"] >= 512
