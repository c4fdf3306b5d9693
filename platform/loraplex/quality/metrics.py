"""The figures a quality run reports, from fixed token sequences and log-probabilities.

Per line: does the candidate's greedy answer equal the reference's (exact match), how many
tokens they share from the start (common prefix), the mean log-probability per token of the
reference's answer under each model (how likely the candidate finds what the reference says),
and, where the line gave expected answers, whether each model's answer equals / contains one.
Per run: the mean of each over the lines that have it.
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import fmean
from typing import Optional, Sequence


def exact_match(reference: Sequence[str], candidate: Sequence[str]) -> bool:
    """The two greedy answers are the same token sequence."""
    return list(reference) == list(candidate)


def common_prefix(reference: Sequence[str], candidate: Sequence[str]) -> int:
    """Tokens the two answers share from their first token on."""
    n = 0
    for a, b in zip(reference, candidate):
        if a != b:
            break
        n += 1
    return n


def mean_logprob(logprobs: Sequence[Optional[float]]) -> Optional[float]:
    """Mean log-probability per token; None for an empty answer. A token vLLM gives no figure
    for (None: the first prompt token) cannot be in an answer's tail, so it is an error here."""
    if not logprobs:
        return None
    if any(x is None for x in logprobs):
        raise ValueError("a token of the answer has no log-probability")
    return fmean(logprobs)


def answer_tail(prompt_logprobs: Sequence[Optional[float]], answer_tokens: int) -> list[Optional[float]]:
    """The answer's share of a scoring request's prompt log-probabilities: the prompt was the
    request's own prompt followed by the reference's answer, so the answer is its last
    `answer_tokens` tokens (scoring prompt tokens less the request's prompt tokens)."""
    if answer_tokens <= 0:
        return []
    if answer_tokens > len(prompt_logprobs):
        raise ValueError(f"the answer has {answer_tokens} tokens but the scored prompt {len(prompt_logprobs)}")
    return list(prompt_logprobs[-answer_tokens:])


def normalize(text: str) -> str:
    """What exact-match and contains compare: case and surrounding or repeated whitespace ignored."""
    return " ".join(text.split()).casefold()


def expected_exact(answer: str, expected: Sequence[str]) -> bool:
    return any(normalize(answer) == normalize(e) for e in expected)


def expected_contains(answer: str, expected: Sequence[str]) -> bool:
    return any(normalize(e) in normalize(answer) for e in expected)


@dataclass(frozen=True)
class LineFigures:
    """One line's comparison. Log-probabilities None: the line's scoring failed or its reference
    answer was empty; expected scores None: the line gave no expected answer."""

    exact_match: bool
    common_prefix: int
    reference_logprob: Optional[float]
    candidate_logprob: Optional[float]
    reference_expected_exact: Optional[bool] = None
    candidate_expected_exact: Optional[bool] = None
    reference_expected_contains: Optional[bool] = None
    candidate_expected_contains: Optional[bool] = None


def line_figures(reference_tokens: Sequence[str], candidate_tokens: Sequence[str],
                 reference_text: str, candidate_text: str,
                 reference_logprobs: Optional[Sequence[Optional[float]]],
                 candidate_logprobs: Optional[Sequence[Optional[float]]],
                 expected: Optional[Sequence[str]] = None) -> LineFigures:
    """`*_logprobs`: the reference answer's tokens' log-probabilities under each model (None: not
    scored)."""
    given = bool(expected)
    return LineFigures(
        exact_match=exact_match(reference_tokens, candidate_tokens),
        common_prefix=common_prefix(reference_tokens, candidate_tokens),
        reference_logprob=mean_logprob(reference_logprobs) if reference_logprobs is not None else None,
        candidate_logprob=mean_logprob(candidate_logprobs) if candidate_logprobs is not None else None,
        reference_expected_exact=expected_exact(reference_text, expected) if given else None,
        candidate_expected_exact=expected_exact(candidate_text, expected) if given else None,
        reference_expected_contains=expected_contains(reference_text, expected) if given else None,
        candidate_expected_contains=expected_contains(candidate_text, expected) if given else None,
    )


@dataclass(frozen=True)
class RunFigures:
    """A run's figures: means over the lines compared (rates in 0..1; None where no line had one)."""

    lines: int  # lines compared (both models answered)
    exact_match_rate: Optional[float]
    mean_common_prefix: Optional[float]
    reference_logprob: Optional[float]  # the reference answers' mean token log-probability under the reference
    candidate_logprob: Optional[float]  # ... and under the candidate, over the same lines
    expected_lines: int = 0  # lines that gave expected answers
    reference_expected_exact: Optional[float] = None
    candidate_expected_exact: Optional[float] = None
    reference_expected_contains: Optional[float] = None
    candidate_expected_contains: Optional[float] = None

    @property
    def logprob_drop(self) -> Optional[float]:
        """How much less likely, per token, the candidate finds the reference's answers (nats)."""
        if self.reference_logprob is None or self.candidate_logprob is None:
            return None
        return self.reference_logprob - self.candidate_logprob


def _rate(values: list) -> Optional[float]:
    return fmean(float(v) for v in values) if values else None


def run_figures(lines: Sequence[LineFigures]) -> RunFigures:
    scored = [x for x in lines if x.reference_logprob is not None and x.candidate_logprob is not None]
    expected = [x for x in lines if x.reference_expected_exact is not None]
    return RunFigures(
        lines=len(lines),
        exact_match_rate=_rate([x.exact_match for x in lines]),
        mean_common_prefix=_rate([x.common_prefix for x in lines]),
        # over the same lines for both, so the two means compare the same answers
        reference_logprob=_rate([x.reference_logprob for x in scored]),
        candidate_logprob=_rate([x.candidate_logprob for x in scored]),
        expected_lines=len(expected),
        reference_expected_exact=_rate([x.reference_expected_exact for x in expected]),
        candidate_expected_exact=_rate([x.candidate_expected_exact for x in expected]),
        reference_expected_contains=_rate([x.reference_expected_contains for x in expected]),
        candidate_expected_contains=_rate([x.candidate_expected_contains for x in expected]),
    )
