"""Bound a request body as it streams in, whatever the client declared.

A chunked body has no Content-Length, so a check of the header alone lets it through; the
bound must count the bytes the ASGI `receive` stream hands over. `limited(request, ...)` gives
a Request over the same scope whose `receive` raises the given StatusError as soon as the
body passes `max_bytes`, before that chunk reaches any parser (so nothing past the bound is
ever buffered or spooled).
"""

from __future__ import annotations

from typing import Callable

from starlette.requests import Request
from starlette.types import Message

from loraplex.errors import StatusError


def limited(request: Request, max_bytes: int, too_large: Callable[[], StatusError]) -> Request:
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > max_bytes:
        raise too_large()  # refused before a byte of the body is read
    receive = request.receive
    received = 0

    async def bounded_receive() -> Message:
        nonlocal received
        message = await receive()
        if message["type"] == "http.request":
            received += len(message.get("body", b""))
            if received > max_bytes:
                raise too_large()
        return message

    return Request(request.scope, bounded_receive)
