import json
from dataclasses import dataclass, fields
from datetime import datetime, timezone

# How a request that reached the engine ended. Rejections before the engine are not records.
STATUSES = frozenset({
    "finished", "length", "stop", "aborted", "client_disconnect", "timeout", "error",
    "engine_error",  # the engine failed or was lost mid-request: billed for the tokens the client got
})
_TIME_FIELDS = ("arrival_time", "first_token_time", "finish_time")


def as_utc(t: datetime | float | None) -> datetime | None:
    """Epoch seconds (what vLLM reports) or an aware datetime -> aware UTC datetime."""
    if t is None:
        return None
    if isinstance(t, (int, float)):
        return datetime.fromtimestamp(t, timezone.utc)
    if t.tzinfo is None:
        raise ValueError(f"naive datetime {t!r}: pass UTC-aware datetimes or epoch seconds")
    return t.astimezone(timezone.utc)


@dataclass
class UsageRecord:
    """One request that reached the engine; exactly one per request_id ends up in the ledger."""

    request_id: str
    tenant_id: str
    base_model: str
    prompt_tokens: int
    completion_tokens: int
    status: str
    arrival_time: datetime
    finish_time: datetime
    cached_prompt_tokens: int = 0
    api_key_id: str | None = None
    adapter: str | None = None  # "name@version"; None for the base model
    first_token_time: datetime | None = None
    ttft: float | None = None  # seconds; derived from the timestamps when not given
    replica_id: str | None = None
    path: str | None = None  # which path served an adapter request: "lora" or "merged"; None: base model
    batch: bool = False  # a Batch API line: priced at the plan's batch price, reported apart
    # Prompt tokens replicas prefilled again because the request moved off a lost replica
    # (ingress/migration.py): the platform's cost, never billed.
    migrated_prompt_tokens: int = 0

    def __post_init__(self):
        for name in _TIME_FIELDS:
            setattr(self, name, as_utc(getattr(self, name)))
        if not self.request_id or not self.tenant_id:
            raise ValueError("request_id and tenant_id are required")
        if self.status not in STATUSES:
            raise ValueError(f"status {self.status!r} not in {sorted(STATUSES)}")
        if min(self.prompt_tokens, self.cached_prompt_tokens, self.completion_tokens, self.migrated_prompt_tokens) < 0:
            raise ValueError("token counts must be >= 0")
        if self.cached_prompt_tokens > self.prompt_tokens:
            raise ValueError("cached_prompt_tokens > prompt_tokens")
        if self.ttft is None and self.first_token_time is not None:
            self.ttft = (self.first_token_time - self.arrival_time).total_seconds()

    def to_json(self) -> str:
        d = self.row()
        for name in _TIME_FIELDS:
            if d[name] is not None:
                d[name] = d[name].isoformat()
        return json.dumps(d, separators=(",", ":"))

    @classmethod
    def from_dict(cls, d: dict) -> "UsageRecord":
        d = {k: v for k, v in d.items() if k in _FIELD_NAMES}
        for name in _TIME_FIELDS:
            if isinstance(d.get(name), str):
                d[name] = datetime.fromisoformat(d[name])
        return cls(**d)

    def row(self) -> dict:
        """Column values for the usage_records table (asdict() deep-copies: 10x slower)."""
        return {name: getattr(self, name) for name in _FIELD_NAMES}


_FIELD_NAMES = tuple(f.name for f in fields(UsageRecord))
