"""One immutable, content-addressed version of a tenant's adapter."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


@dataclass(frozen=True)
class AdapterVersion:
    tenant: str
    name: str
    version: int  # 1, 2, ... per (tenant, name); never reused, even after delete
    sha256: str
    rank: int
    target_modules: list[str]
    base_model: str | None  # the adapter's own claim; the validator checked the real fit
    size_bytes: int
    created_at: str = field(default_factory=utc_now)  # ISO-8601 UTC
    deleted_at: str | None = None

    @property
    def lora_name(self) -> str:
        # vLLM keys its prefix cache by LoRA name: the sha keeps a name bound to one set of weights.
        return f"{self.tenant}/{self.name}@{self.sha256}"

    def to_response(self) -> dict:
        """The body of `POST /v1/adapters` (201) and one entry of the adapter listings."""
        body = asdict(self)
        del body["tenant"], body["deleted_at"]
        return body

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True, indent=2).encode()

    @classmethod
    def from_json(cls, data: bytes) -> "AdapterVersion":
        return cls(**json.loads(data))

    def deleted(self) -> "AdapterVersion":
        return replace(self, deleted_at=utc_now())
