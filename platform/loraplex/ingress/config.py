"""IngressDeploymentConfig: the Ingress replicas' resources and the bounds of a generation request."""

from __future__ import annotations

from typing import Optional

from pydantic import BaseModel, ConfigDict, Field


class IngressDeploymentConfig(BaseModel):
    """The HTTP front door: OpenAI, tenant and admin routes."""

    model_config = ConfigDict(extra="forbid")

    num_replicas: int = Field(
        1, gt=0,
        description="Ingress replicas when the app is built (in a serve config, scale with `deployments:` "
        "instead).",
    )
    num_cpus: float = Field(0.5, ge=0, description="Logical CPUs Ray reserves per replica.")
    max_ongoing_requests: int = Field(
        256, gt=0,
        description="Generation requests (streams until their end) in progress per replica; one more gets 503 + "
        "Retry-After at once (refusal `503:ingress_busy`).",
    )
    max_request_body_bytes: int = Field(
        1 << 20, gt=0, description="Bigger JSON bodies on /v1 generation routes get 413."
    )
    ready_cache_s: float = Field(
        3.0, ge=0,
        description="GET /readyz runs its real probe at most once per this many seconds per ingress replica, "
        "answering from the last result in between; 0: every call probes.",
    )
    body_timeout_s: float = Field(
        10.0, gt=0,
        description="A generation request's body must arrive within this long of its first read, else 408 "
        "(refusal `408:body_timeout`).",
    )
    max_body_reads_per_tenant: Optional[int] = Field(
        64, gt=0,
        description="Request bodies one tenant may have arriving at once on one ingress replica; one more gets "
        "429 + Retry-After (code `body_reads`); null: unbounded.",
    )
    request_timeout_s: float = Field(
        300.0, gt=0,
        description="Deadline of a generation request from its arrival, when its engine request is aborted (504 "
        "or a stream's error event, billed as `timeout`); X-LoRAPlex-Timeout may only shorten it.",
    )
    idempotency_window_s: float = Field(
        600.0, ge=0,
        description="How long a generation request with an Idempotency-Key keeps its reply for a retry of the "
        "same tenant, key and body (billed once); 0: the header is ignored.",
    )
    max_migrations: int = Field(
        2, ge=0,
        description="Times a generation request may move to another Engine replica when its replica is lost "
        "mid-request (docs/operations.md, fault table); 0: off.",
    )
