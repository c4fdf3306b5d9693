"""BatchConfig: the Batch API's bounds and its runner's pace."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class BatchConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(True, description="Serve /v1/files and /v1/batches and run batches from every Ingress "
                          "replica; false: the routes answer 404 and no batch runs.")
    max_file_bytes: int = Field(
        50 * 1024 * 1024, ge=1,
        description="Largest batch input file (purpose=batch) an upload may be; past it 413 naming this setting.")
    max_lines: int = Field(50_000, ge=1, description="Most requests (JSONL lines) one batch input file may hold; "
                           "past it the upload gets 400.")
    max_line_bytes: int = Field(1024 * 1024, ge=1, description="Largest one JSONL line may be; past it the upload "
                                "gets 400 naming the line.")
    completion_window_s: int = Field(
        24 * 3600, ge=1,
        description="How long a batch may run (OpenAI's `24h` completion window): lines not done by then are "
        "written to the error file with code batch_expired, and the batch ends `expired`.")
    lines_in_flight: int = Field(
        4, ge=1,
        description="Lines one Ingress replica's runner sends to the engine at once.")
    lease_s: float = Field(
        30.0, gt=0,
        description="How long a runner's claim on a batch lasts without renewal (renewed every lease_s / 3): "
        "after an Ingress replica dies, another one takes its batches over within this.")
    slice_s: float = Field(
        60.0, gt=0,
        description="Longest a runner works one batch before it leaves it (its lines in flight finish) and claims "
        "the batch worked least recently.")
    poll_s: float = Field(2.0, gt=0, description="How often an idle runner looks for a batch to claim.")
    retry_s: float = Field(
        2.0, gt=0,
        description="Least wait before a line refused before it ran (overload, shed, queue full, budget) is sent "
        "again (longer if the refusal's Retry-After says so, up to 60 s).")
    line_timeout_s: float = Field(
        3600.0, gt=0,
        description="Deadline of one line once sent (its wait in the fair queue included); a line past it is "
        "written to the error file (status timeout, billed for what was generated).")
