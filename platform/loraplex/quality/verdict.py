"""A run's verdict: its figures against QualityConfig's thresholds, naming every figure that failed."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from loraplex.quality.config import QualityConfig
from loraplex.quality.metrics import RunFigures


@dataclass(frozen=True)
class Failure:
    figure: str  # the report's field name
    value: Optional[float]
    threshold: float
    setting: str  # the config field that set it

    def __str__(self) -> str:
        shown = "none" if self.value is None else f"{self.value:.3f}"
        return f"{self.figure} {shown} (quality.{self.setting} {self.threshold:g})"


@dataclass(frozen=True)
class Verdict:
    passed: bool
    failures: list[Failure] = field(default_factory=list)

    def summary(self) -> str:
        return "pass" if self.passed else "fail: " + "; ".join(str(f) for f in self.failures)


def verdict(figures: RunFigures, config: QualityConfig) -> Verdict:
    t = config.thresholds
    failures: list[Failure] = []

    def at_least(figure: str, value: Optional[float], threshold: float, setting: str) -> None:
        if value is None or value < threshold:
            failures.append(Failure(figure, value, threshold, setting))

    def at_most(figure: str, value: Optional[float], threshold: float, setting: str) -> None:
        if value is None or value > threshold:
            failures.append(Failure(figure, value, threshold, setting))

    if config.min_lines is not None:
        at_least("lines", figures.lines, config.min_lines, "min_lines")
    at_least("exact_match_rate", figures.exact_match_rate, t.min_exact_match_rate, "thresholds.min_exact_match_rate")
    at_least("mean_common_prefix", figures.mean_common_prefix, t.min_mean_common_prefix,
             "thresholds.min_mean_common_prefix")
    at_most("logprob_drop", figures.logprob_drop, t.max_logprob_drop, "thresholds.max_logprob_drop")
    if figures.expected_lines:
        for kind in ("exact", "contains"):
            ref = getattr(figures, f"reference_expected_{kind}")
            cand = getattr(figures, f"candidate_expected_{kind}")
            at_most(f"expected_{kind}_drop", ref - cand, t.max_expected_score_drop,
                    "thresholds.max_expected_score_drop")
    return Verdict(not failures, failures)
