"""A batch input file, checked line by line before anything is stored: OpenAI's Batch API format,
one request a line: {"custom_id": str, "method": "POST", "url": <endpoint>, "body": {...}}.

Every problem found is a 400 at upload naming the line and the fix, so a batch never starts on a
file that cannot run. What only the run can tell (the `model` an adapter the tenant does not
have, a body vLLM refuses) becomes that line's entry in the batch's error file instead.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

ENDPOINTS = ("/v1/chat/completions", "/v1/completions")
MAX_CUSTOM_ID = 512


class InvalidBatchFile(ValueError):
    """The file cannot run as a batch; the message names the line (1-based) and the fix."""


@dataclass(frozen=True)
class BatchLine:
    index: int  # 0-based position among the file's requests: with the batch id, the line's request id
    custom_id: str
    url: str
    body: dict[str, Any]


def parse_batch_file(data: bytes, max_lines: int, max_line_bytes: int) -> list[BatchLine]:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidBatchFile(f"The file is not UTF-8 (byte {exc.start}); save it as UTF-8 JSONL.") from None
    lines: list[BatchLine] = []
    seen: set[str] = set()
    for number, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        if len(raw.encode()) > max_line_bytes:
            raise InvalidBatchFile(f"Line {number} is over {max_line_bytes} bytes (batches.max_line_bytes); "
                                   "shorten its prompt.")
        if len(lines) >= max_lines:
            raise InvalidBatchFile(f"The file has more than {max_lines} requests (batches.max_lines); "
                                   "split it into several batches.")
        line = parse_line(raw, number, len(lines))
        if line.custom_id in seen:
            raise InvalidBatchFile(f"Line {number}: custom_id {line.custom_id!r} is used twice; give each "
                                   "request its own custom_id (results are matched by it).")
        seen.add(line.custom_id)
        lines.append(line)
    if not lines:
        raise InvalidBatchFile("The file has no requests; send one JSON object a line.")
    return lines


def parse_line(raw: str, number: int, index: int) -> BatchLine:
    try:
        obj = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise InvalidBatchFile(f"Line {number} is not valid JSON ({exc}); send one JSON object a line.") from None
    if not isinstance(obj, dict):
        raise InvalidBatchFile(f"Line {number} is not a JSON object; send "
                               '{"custom_id": ..., "method": "POST", "url": ..., "body": {...}}.')
    custom_id, method, url, body = obj.get("custom_id"), obj.get("method"), obj.get("url"), obj.get("body")
    if not isinstance(custom_id, str) or not custom_id or len(custom_id) > MAX_CUSTOM_ID:
        raise InvalidBatchFile(f"Line {number}: `custom_id` must be a non-empty string of at most "
                               f"{MAX_CUSTOM_ID} characters.")
    if method != "POST":
        raise InvalidBatchFile(f"Line {number}: `method` must be \"POST\", got {method!r}.")
    if url not in ENDPOINTS:
        raise InvalidBatchFile(f"Line {number}: the endpoint {url!r} is not served in batches; use one of "
                               f"{', '.join(ENDPOINTS)}.")
    if not isinstance(body, dict):
        raise InvalidBatchFile(f"Line {number}: `body` must be a JSON object (the request to {url}).")
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise InvalidBatchFile(f"Line {number}: `body.model` is missing; name the base model or one of your "
                               "adapters.")
    return BatchLine(index, custom_id, url, body)


def endpoints_of(lines: list[BatchLine]) -> set[str]:
    return {line.url for line in lines}
