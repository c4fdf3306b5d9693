"""Bad input gets a clear OpenAI-style 4xx from the real stack, and the server keeps serving."""

import pytest

pytestmark = pytest.mark.integration


def post(client, body, path="/v1/chat/completions", **kwargs):
    if isinstance(body, (bytes, str)):
        return client.post(f"{path}", content=body, timeout=60, **kwargs)
    return client.post(f"{path}", json=body, timeout=60, **kwargs)


def chat(model, content="hi", **extra):
    return {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": 4, **extra}


@pytest.mark.parametrize(
    "make_body, status, needle",
    [
        (lambda m: b'{"model": "x", "messages": [', 400, "not valid JSON"),
        (lambda m: b"[]", 400, "JSON object"),
        (lambda m: chat("no-such-model"), 404, "does not exist"),
        (lambda m: chat(m, max_tokens=-1), 400, "max_tokens"),
        (lambda m: chat(m, content="hello " * 3000), 400, "maximum context length"),
        (lambda m: {"model": m}, 400, "messages"),
        (lambda m: chat(m, temperature=-3), 400, "temperature"),
        (lambda m: chat(m, n=0), 400, "n"),
    ],
    ids=["malformed-json", "not-an-object", "unknown-model", "negative-max-tokens", "prompt-too-long", "no-messages", "bad-temperature", "n-zero"],
)
def test_bad_chat_request_gets_4xx_then_server_still_serves(client, model_name, make_body, status, needle):
    response = post(client, make_body(model_name))
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == status and needle in error["message"]
    ok = post(client, chat(model_name))
    assert ok.status_code == 200


def test_bad_stream_request_is_an_error_body_not_an_event_stream(client, model_name):
    response = post(client, chat("no-such-model", stream=True))
    assert response.status_code == 404
    assert response.headers["content-type"].startswith("application/json")


def test_bad_completion_requests(client, model_name):
    too_long = {"model": model_name, "prompt": "hello " * 3000, "max_tokens": 2}
    assert post(client, too_long, "/v1/completions").status_code == 400
    negative = {"model": model_name, "prompt": "hi", "max_tokens": -5}
    assert post(client, negative, "/v1/completions").status_code == 400
    assert post(client, {"model": model_name, "prompt": "hi", "max_tokens": 2}, "/v1/completions").status_code == 200


def test_unknown_route_is_404_body(client):
    response = client.get("/v1/nothing-here")
    assert response.status_code == 404 and response.json()["error"]["code"] == 404
