"""A request's deadline (X-LoRAPlex-Timeout, at most ingress.request_timeout_s) aborts the
engine request when it passes: 504 or an error event, and a `timeout` usage record for the
tokens it produced."""

import json
import time

import httpx
import pytest

from test_usage_metering import records
from waiting import wait_until

pytestmark = pytest.mark.integration

LONG = {"messages": [{"role": "user", "content": "Tell me a very long story about dragons."}],
        "max_tokens": 1900, "ignore_eos": True}


def test_a_stream_past_its_deadline_is_cut_with_an_error_event_and_billed_as_timeout(
        base_url, api_key, model_name, engine_handle, usage_db):
    headers = {"Authorization": f"Bearer {api_key}", "X-LoRAPlex-Timeout": "4"}
    started = time.time()
    with httpx.stream("POST", f"{base_url}/v1/chat/completions", headers=headers, timeout=60,
                      json={"model": model_name, "stream": True, **LONG}) as reply:
        assert reply.status_code == 200
        request_id = reply.headers["x-loraplex-request-id"]
        events = [line.removeprefix("data: ") for line in reply.iter_lines() if line.startswith("data: ")]
    ended = time.time() - started
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert error["code"] == 504 and "deadline" in error["message"]
    tokens_seen = len(events) - 3  # less the role chunk, the error event and [DONE]
    assert tokens_seen > 0 and 3.5 < ended < 30
    # The engine stopped for it: nothing of it runs on the replica any more.
    wait_until(lambda: engine_handle.num_unfinished_requests.remote().result() == 0, 10, "the abort")
    row = records(usage_db, [request_id])[request_id]
    assert row["status"] == "timeout" and row["completion_tokens"] >= tokens_seen


def test_a_plain_request_past_its_deadline_is_a_504(client, model_name, engine_handle, usage_db):
    reply = client.post("/v1/chat/completions", headers={"X-LoRAPlex-Timeout": "2"},
                        json={"model": model_name, **LONG})
    assert reply.status_code == 504, reply.text
    assert reply.json()["error"]["type"] == "timeout_error"
    wait_until(lambda: engine_handle.num_unfinished_requests.remote().result() == 0, 10, "the abort")
    request_id = reply.headers["x-loraplex-request-id"]
    ok = client.post("/v1/chat/completions", json={"model": model_name, "max_tokens": 2,
                                                   "messages": [{"role": "user", "content": "hi"}]})
    assert ok.status_code == 200  # and the engine serves on
    assert records(usage_db, [request_id])[request_id]["status"] == "timeout"
