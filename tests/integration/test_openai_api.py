"""The OpenAI routes through Ray Serve with the real vLLM engine on the default model."""

import json

import httpx
import pytest
from openai import OpenAI

pytestmark = pytest.mark.integration

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def sse_events(text: str) -> list[str]:
    """The `data:` payloads of an SSE body; also checks OpenAI's framing (blank line between)."""
    assert text.endswith("\n\n")
    events = []
    for block in text.strip("\n").split("\n\n"):
        assert block.startswith("data: "), block
        events.append(block[len("data: "):])
    return events


def test_chat_answers_paris(client, model_name):
    response = client.post(
        "/v1/chat/completions",
        json={"model": model_name, "messages": QUESTION, "max_tokens": 30, "temperature": 0},
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert "Paris" in body["choices"][0]["message"]["content"]
    usage = body["usage"]
    assert usage["prompt_tokens"] > 0 and usage["completion_tokens"] > 0
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert "cached_tokens" in usage["prompt_tokens_details"]


def test_chat_stream_is_openai_sse_with_usage_chunk(client, model_name):
    response = client.post(
        "/v1/chat/completions",
        json={
            "model": model_name,
            "messages": QUESTION,
            "max_tokens": 20,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    )
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    events = sse_events(response.text)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert "Paris" in text
    usage_chunk = chunks[-1]
    assert usage_chunk["choices"] == [] and usage_chunk["usage"]["completion_tokens"] > 0
    # Without include_usage no chunk carries usage, as with OpenAI.
    plain = client.post(
        "/v1/chat/completions",
        json={"model": model_name, "messages": QUESTION, "max_tokens": 5, "stream": True},
    )
    assert all("usage" not in json.loads(e) or json.loads(e)["usage"] is None for e in sse_events(plain.text)[:-1])


def test_stream_and_non_stream_count_the_same_prompt_tokens(client, model_name):
    body = {"model": model_name, "messages": QUESTION, "max_tokens": 3, "temperature": 0}
    non_stream = client.post("/v1/chat/completions", json=body).json()
    streamed = client.post(
        "/v1/chat/completions",
        json={**body, "stream": True, "stream_options": {"include_usage": True}},
    )
    usage = json.loads(sse_events(streamed.text)[-2])["usage"]
    assert usage["prompt_tokens"] == non_stream["usage"]["prompt_tokens"]


def test_completions_non_stream_and_stream(client, model_name):
    body = {"model": model_name, "prompt": "The capital of France is", "max_tokens": 5, "temperature": 0}
    response = client.post("/v1/completions", json=body)
    assert response.status_code == 200
    assert response.json()["object"] == "text_completion"
    assert response.json()["usage"]["completion_tokens"] == 5
    streamed = client.post("/v1/completions", json={**body, "stream": True})
    events = sse_events(streamed.text)
    assert events[-1] == "[DONE]" and len(events) >= 2


def test_repeated_prompt_hits_prefix_cache(client, model_name):
    system = "You are a meticulous assistant. " * 40  # several KV blocks of shared prefix
    body = {
        "model": model_name,
        "messages": [{"role": "system", "content": system}, *QUESTION],
        "max_tokens": 2,
    }
    client.post("/v1/chat/completions", json=body)
    again = client.post("/v1/chat/completions", json=body).json()
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] > 0


def test_v1_routes_need_a_valid_key(base_url, model_name):
    body = {"model": model_name, "messages": QUESTION, "max_tokens": 2}
    missing = httpx.post(f"{base_url}/v1/chat/completions", json=body, timeout=30)
    assert missing.status_code == 401 and missing.json()["error"]["code"] == 401
    wrong = httpx.post(
        f"{base_url}/v1/chat/completions", json=body, headers={"Authorization": "Bearer lpx-nope"}, timeout=30
    )
    assert wrong.status_code == 401
    assert httpx.get(f"{base_url}/v1/models", timeout=30).status_code == 401


def test_models_lists_the_base_model(client, model_name):
    body = client.get("/v1/models").json()
    assert body["object"] == "list"
    assert model_name in [m["id"] for m in body["data"]]


def test_health_and_readiness(client, admin):
    assert client.get("/healthz").json() == {"status": "ok"}
    ready = client.get("/readyz")
    assert ready.status_code == 200 and ready.json() == {"status": "ready"}  # public: the status alone
    details = admin.get("/admin/readyz")
    assert details.status_code == 200
    body = details.json()
    assert body["status"] == "ready" and body["healthy_replicas"] == body["replicas"] == 1
    assert body["probe"]["probe_seconds"] > 0


def test_official_openai_client_streams(base_url, api_key, model_name):
    client = OpenAI(base_url=f"{base_url}/v1", api_key=api_key, timeout=120)
    stream = client.chat.completions.create(
        model=model_name,
        messages=QUESTION,
        max_tokens=20,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    pieces, usage = [], None
    for chunk in stream:
        if chunk.choices:
            pieces.append(chunk.choices[0].delta.content or "")
        if chunk.usage:
            usage = chunk.usage
    assert "Paris" in "".join(pieces)
    assert usage is not None and usage.completion_tokens > 0
    models = client.models.list()
    assert model_name in [m.id for m in models.data]
