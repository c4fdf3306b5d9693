"""QualityConfig: quality runs' bounds, the thresholds a run must meet, and the gate."""

from __future__ import annotations

from typing import Optional

from pydantic import BaseModel, ConfigDict, Field


class QualityThresholds(BaseModel):
    """What a candidate must reach against the reference for a run to pass (docs/quality.md)."""

    model_config = ConfigDict(extra="forbid")

    min_exact_match_rate: float = Field(
        0.4, ge=0, le=1,
        description="Least share of lines whose greedy answer on the candidate equals the reference's token "
        "for token.")
    min_mean_common_prefix: float = Field(
        8.0, ge=0,
        description="Least mean number of tokens the candidate's answers share with the reference's from "
        "their start.")
    max_logprob_drop: float = Field(
        0.1, ge=0,
        description="Most the reference answers' mean log-probability per token may be lower under the "
        "candidate than under the reference (nats per token).")
    max_expected_score_drop: float = Field(
        0.05, ge=0, le=1,
        description="Where lines give expected answers: most the candidate's exact-match or contains score "
        "may be below the reference's (a share of those lines).")


class QualityConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(True, description="Serve /v1/quality/runs and drive quality runs from every Ingress "
                          "replica (they need batches.enabled); false: the routes answer 404 and the gate lets "
                          "every binding through.")
    gate: bool = Field(
        True, description="Refuse (409) an adapter upload bound to a base other than the one its "
        "adapter_config.json names unless a passing quality run for that tenant, adapter and base, or an "
        "operator's override, is on record.")
    max_lines: int = Field(1000, ge=1, description="Most requests one quality file may hold; past it 400.")
    max_tokens: int = Field(
        64, ge=1, description="max_tokens of a line that sets none (every line runs greedy: temperature 0).")
    thresholds: QualityThresholds = Field(default_factory=QualityThresholds,
                                          description="What a run must reach to pass.")
    min_lines: Optional[int] = Field(
        20, ge=1, description="Least lines both models must answer for a run to pass at all (fewer: too few "
        "to judge); null: any number.")
