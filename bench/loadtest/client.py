"""One streamed chat request, timed as `vllm bench serve` times it.

TTFT: request sent -> first chunk carrying generated text. TPOT: (end-to-end - TTFT) /
(output tokens - 1). Tokens in and out come from the usage chunk (`stream_options.include_usage`),
never from counting chunks (LoRAPlex coalesces several tokens into one SSE item).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Optional

import httpx


@dataclass
class Target:
    """An OpenAI-compatible endpoint and how the workload's tenants / adapters are named there."""

    name: str                                   # "loraplex", "vllm", ...
    base_url: str                               # without /v1
    model: str                                  # the base model's name
    keys: list[Optional[str]] = field(default_factory=list)      # per tenant; None = no header
    adapter_models: dict[int, str] = field(default_factory=dict)  # global adapter index -> model

    def key(self, tenant: int) -> Optional[str]:
        return self.keys[tenant % len(self.keys)] if self.keys else None

    def model_for(self, adapter: Optional[int]) -> str:
        return self.model if adapter is None else self.adapter_models[adapter]


def result_template(spec, target: Target) -> dict:
    return {"index": spec.index, "tenant": spec.tenant, "adapter": spec.adapter,
            "model": target.model_for(spec.adapter), "max_tokens": spec.max_tokens,
            "status": "ok", "http_status": None, "error": None, "request_id": None,
            "start": None, "end": None, "start_epoch": None, "first_token_epoch": None, "end_epoch": None,
            "ttft": None, "tpot": None, "e2e": None,
            "prompt_tokens": None, "cached_prompt_tokens": None, "completion_tokens": None}


async def send(client: httpx.AsyncClient, target: Target, spec, tenants, temperature: float = 0.0) -> dict:
    r = result_template(spec, target)
    body = {"model": r["model"], "messages": spec.messages(tenants), "max_tokens": spec.max_tokens,
            "temperature": temperature, "stream": True, "stream_options": {"include_usage": True}}
    if spec.ignore_eos:
        body["ignore_eos"] = True  # vLLM's extension (also passed through by LoRAPlex)
    key = target.key(spec.tenant)
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    usage = None
    first = None
    r["start_epoch"], r["start"] = time.time(), time.perf_counter()
    try:
        async with client.stream("POST", "/v1/chat/completions", json=body, headers=headers) as resp:
            r["http_status"] = resp.status_code
            r["request_id"] = resp.headers.get("x-loraplex-request-id") or resp.headers.get("x-request-id")
            if resp.status_code != 200:
                r["status"] = f"http_{resp.status_code}"
                r["error"] = (await resp.aread()).decode(errors="replace")[:500]
            else:
                async for line in resp.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    try:
                        chunk = json.loads(data)
                    except json.JSONDecodeError:
                        continue
                    if "error" in chunk:  # an in-stream error event (engine lost, ...)
                        err = chunk["error"]
                        r["status"] = f"stream_error_{err.get('code', '')}" if isinstance(err, dict) else "stream_error"
                        r["error"] = json.dumps(err)[:500]
                        continue
                    if first is None:
                        for ch in chunk.get("choices") or []:
                            delta = ch.get("delta") or {}
                            if delta.get("content") or delta.get("reasoning_content") or ch.get("text"):
                                first = time.perf_counter()
                                r["first_token_epoch"] = time.time()
                                break
                    if chunk.get("usage"):
                        usage = chunk["usage"]
    except (httpx.HTTPError, OSError) as e:
        r["status"] = f"exception_{type(e).__name__}"
        r["error"] = str(e)[:500]
    end = time.perf_counter()
    r["end"], r["end_epoch"] = end, time.time()
    r["e2e"] = end - r["start"]
    if usage:
        r["prompt_tokens"] = usage.get("prompt_tokens")
        r["completion_tokens"] = usage.get("completion_tokens")
        r["cached_prompt_tokens"] = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    elif r["status"] == "ok":
        r["status"] = "no_usage"
        r["error"] = "the stream ended without a usage chunk"
    if first is not None:
        r["ttft"] = first - r["start"]
        n = r["completion_tokens"] or 0
        if n > 1:
            r["tpot"] = (end - first) / (n - 1)
    elif r["status"] == "ok" and (r["completion_tokens"] or 0) > 0:
        r["status"] = "no_text"
    return r
