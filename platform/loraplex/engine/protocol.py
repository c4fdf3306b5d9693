"""What an Engine replica streams back to the ingress besides OpenAI payloads."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional


@dataclass
class EngineError:
    """A request the engine refused before generating (bad params, unknown model, too long)."""

    status: int
    message: str
    type: str = "BadRequestError"
    param: Optional[str] = None

    def body(self) -> dict:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.status,
            }
        }


@dataclass(frozen=True)
class AdapterTarget:
    """The one adapter version a request runs with, as resolved by the ingress for its tenant."""

    lora_name: str  # tenant/name@sha256: unique per weights, so vLLM's prefix cache never mixes them
    lora_int_id: int  # the catalog row id: the same on every replica
    tenant: str
    name: str
    sha256: str
    requested_as: str  # what the client put in `model`; replies echo it back


@dataclass
class RequestUsage:
    """Tokens the engine really processed for one client request, whatever way it ended.

    Counted from vLLM's RequestOutputs, not from what reached the client, so a stream cut by a
    disconnect is still counted for what was generated.
    """

    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: Optional[str] = None
    replica_id: str = ""
    # The vLLM request ids serving this client request (one per prompt of a batched completion).
    engine_request_ids: list = field(default_factory=list, repr=False)
    _completion_by_output: dict = field(default_factory=dict, repr=False)

    def as_dict(self) -> dict:
        return {
            "prompt_tokens": self.prompt_tokens,
            "cached_prompt_tokens": self.cached_prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "finish_reason": self.finish_reason,
            "replica_id": self.replica_id,
        }
