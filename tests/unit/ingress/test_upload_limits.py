"""POST /v1/adapters bounds the body as it streams: a chunked upload (no Content-Length) over
registry.max_upload_bytes is refused with 413 before more than the bound is read or spooled."""

from __future__ import annotations

import asyncio
import io
import json
import uuid

import pytest
import starlette.formparsers
from starlette.testclient import TestClient

from platform_app import BASE, build_platform_app

LIMIT = 256 * 1024
CHUNK = 16 * 1024


def script(method, call, request):
    yield {"model": request.model, "adapter": call.adapter.lora_name if call.adapter else None}


@pytest.fixture
def platform(tmp_path):
    platform = build_platform_app(tmp_path, script, registry={"max_upload_bytes": LIMIT})
    platform.add_tenant("acme")
    yield platform
    platform.close()


@pytest.fixture
def spooled(monkeypatch):
    """Bytes written to every SpooledTemporaryFile the form parser makes, one entry per file."""
    written: list[int] = []

    class Counting(starlette.formparsers.SpooledTemporaryFile):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self._index = len(written)
            written.append(0)

        def write(self, data):
            written[self._index] += len(data)
            return super().write(data)

    monkeypatch.setattr(starlette.formparsers, "SpooledTemporaryFile", Counting)
    return written


def multipart(archive: bytes, name: str = "style") -> tuple[str, bytes]:
    boundary = uuid.uuid4().hex
    head = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"name\"\r\n\r\n{name}\r\n"
            f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.tar.gz\"\r\n"
            "Content-Type: application/gzip\r\n\r\n").encode()
    return f"multipart/form-data; boundary={boundary}", head + archive + f"\r\n--{boundary}--\r\n".encode()


def asgi_post(app, path: str, headers: dict[str, str], body: bytes, chunk: int = CHUNK):
    """POST `body` to the ASGI app in `chunk`-byte messages with no Content-Length, as a chunked
    upload arrives; returns (status, response body, bytes the app pulled from the stream)."""
    pulled = 0
    sent: list[dict] = []

    async def receive():
        nonlocal pulled
        if pulled >= len(body):
            await asyncio.sleep(3600)  # the app waits for a disconnect only after answering
        piece = body[pulled:pulled + chunk]
        pulled += len(piece)
        return {"type": "http.request", "body": piece, "more_body": pulled < len(body)}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
             "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
             "headers": [(k.lower().encode(), v.encode()) for k, v in
                         {**headers, "transfer-encoding": "chunked"}.items()],
             "client": ("127.0.0.1", 1234), "server": ("testserver", 80)}
    asyncio.run(asyncio.wait_for(app(scope, receive, send), 30))
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    reply = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return status, reply, pulled


def test_chunked_upload_over_the_limit_is_413_before_the_limit_is_spooled(platform, spooled):
    content_type, body = multipart(b"\x1f\x8b" + b"\0" * (4 * LIMIT))
    status, reply, pulled = asgi_post(platform.app, "/v1/adapters",
                                      {"authorization": platform.keys["acme"], "content-type": content_type}, body)
    assert status == 413, reply
    error = json.loads(reply)["error"]
    assert "registry.max_upload_bytes" in error["message"] and error["param"] == "file"
    # Read no further than the chunk that crossed the bound; spooled no more than the bound.
    assert pulled <= LIMIT + CHUNK
    assert spooled and max(spooled) <= LIMIT


def test_chunked_upload_over_the_limit_through_the_test_client(platform, spooled):
    content_type, body = multipart(b"\x1f\x8b" + b"\0" * (2 * LIMIT))
    client = TestClient(platform.app, raise_server_exceptions=False)

    def chunks():
        for i in range(0, len(body), CHUNK):
            yield body[i:i + CHUNK]

    response = client.post("/v1/adapters", content=chunks(),
                           headers={"Authorization": platform.keys["acme"], "Content-Type": content_type})
    assert response.request.headers.get("transfer-encoding") == "chunked"
    assert "content-length" not in response.request.headers
    assert response.status_code == 413, response.text
    assert "registry.max_upload_bytes" in response.json()["error"]["message"]
    assert sum(spooled) <= LIMIT
    # The server keeps serving.
    chat = client.post("/v1/chat/completions", headers={"Authorization": platform.keys["acme"]},
                       json={"model": BASE, "messages": [{"role": "user", "content": "hi"}]})
    assert chat.status_code == 200, chat.text


def test_chunked_upload_under_the_limit_is_stored(platform, spooled):
    archive = platform.adapter_archive(r=4)
    assert len(archive) < LIMIT - 1024, "the test adapter must fit the limit"
    content_type, body = multipart(archive)
    status, reply, pulled = asgi_post(platform.app, "/v1/adapters",
                                      {"authorization": platform.keys["acme"], "content-type": content_type}, body)
    assert status == 201, reply
    assert pulled == len(body)
    client = TestClient(platform.app, raise_server_exceptions=False)
    chat = client.post("/v1/chat/completions", headers={"Authorization": platform.keys["acme"]},
                       json={"model": "style", "messages": [{"role": "user", "content": "hi"}]})
    assert chat.status_code == 200 and chat.json()["adapter"].endswith("style@1:" + json_sha(client, platform))


def json_sha(client, platform) -> str:
    return client.get("/v1/adapters/style", headers={"Authorization": platform.keys["acme"]}).json()["versions"][0]["sha256"]


def test_declared_length_over_the_limit_is_413_before_reading(platform):
    client = TestClient(platform.app, raise_server_exceptions=False)
    response = client.post("/v1/adapters", headers={"Authorization": platform.keys["acme"]}, data={"name": "big"},
                           files={"file": ("a.tar.gz", io.BytesIO(b"\0" * (2 * LIMIT)), "application/gzip")})
    assert response.status_code == 413
    assert "registry.max_upload_bytes" in response.json()["error"]["message"]
