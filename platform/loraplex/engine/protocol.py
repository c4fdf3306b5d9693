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
    version: int = 0  # the tenant's version number of `name`

    @property
    def label(self) -> str:
        """name@version, as usage records and reports show the adapter."""
        return f"{self.name}@{self.version}"


@dataclass(frozen=True)
class RequestMeta:
    """Who a request is metered to. The ingress fills it in; the Engine replica writes the one
    usage record when the request ends, since only it sees every token, even after a disconnect."""

    request_id: str  # the ledger's idempotency key; also vLLM's request id and the reply's id
    tenant_id: str
    api_key_id: Optional[str] = None
    adapter: Optional[str] = None  # name@version; None for the base model
    arrival_time: float = 0.0  # epoch seconds when the ingress received the request


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
    first_token_time: Optional[float] = None  # epoch seconds of the first completion token
    finish_time: Optional[float] = None  # epoch seconds when the engine stopped for this request
    # How it ended, in the ledger's terms (accounting.record.STATUSES); set when it ends.
    status: Optional[str] = None
    # The vLLM request ids serving this client request (one per prompt of a batched completion).
    engine_request_ids: list = field(default_factory=list, repr=False)
    _completion_by_output: dict = field(default_factory=dict, repr=False)
