"""A client that disconnects mid-stream makes the engine stop generating for it at once."""

import httpx
import pytest
from waiting import wait_until

pytestmark = pytest.mark.integration


def unfinished(engine_handle) -> int:
    return engine_handle.num_unfinished_requests.remote().result()


def test_disconnect_mid_stream_aborts_engine_request(base_url, api_key, model_name, engine_handle):
    # Idle first (a health probe may run for a moment: wait, do not demand an exact count now).
    wait_until(lambda: unfinished(engine_handle) == 0, 30, "an idle engine")
    body = {
        "model": model_name,
        "messages": [{"role": "user", "content": "Tell me a very long story about dragons."}],
        "max_tokens": 1900,
        "ignore_eos": True,  # would generate for a long time if not aborted
        "stream": True,
    }
    headers = {"Authorization": f"Bearer {api_key}"}
    with httpx.Client(timeout=120, headers=headers) as client:
        with client.stream("POST", f"{base_url}/v1/chat/completions", json=body) as response:
            assert response.status_code == 200
            # next() rather than a for/break: closing httpx's line iterator would already drop
            # the connection, and we want to see the request running first.
            lines = response.iter_lines()
            received = 0
            while received < 3:
                received += next(lines).startswith("data: ")
            # Ours is running (>= 1: a health probe may run beside it).
            assert unfinished(engine_handle) >= 1, "the request should still be generating"
    # Leaving the `with` closed the connection mid-stream. Generating the rest would take
    # many seconds; the abort must land well before that.
    wait_until(lambda: unfinished(engine_handle) == 0, 3, "the engine to stop generating after the client left",
               interval_s=0.05)
    # The engine is free and serving.
    ok = httpx.post(
        f"{base_url}/v1/chat/completions",
        json={"model": model_name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
        headers=headers,
        timeout=60,
    )
    assert ok.status_code == 200
