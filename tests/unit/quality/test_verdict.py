"""A run's verdict against the thresholds, naming the figure that failed."""

from loraplex.quality.config import QualityConfig
from loraplex.quality.metrics import RunFigures
from loraplex.quality.verdict import verdict

GOOD = dict(lines=200, exact_match_rate=0.55, mean_common_prefix=22.0, reference_logprob=-0.30,
            candidate_logprob=-0.32)


def figures(**changes):
    return RunFigures(**{**GOOD, **changes})


def failed(result):
    return [f.figure for f in result.failures]


def test_close_candidate_passes():
    result = verdict(figures(), QualityConfig())
    assert result.passed and result.summary() == "pass"


def test_the_int4_figures_fail_on_exact_match_and_prefix():
    # the 4-bit base's measured agreement (docs/benchmarks.md): 0 % exact, 3.6 tokens of common prefix
    result = verdict(figures(exact_match_rate=0.0, mean_common_prefix=3.6), QualityConfig())
    assert not result.passed
    assert failed(result) == ["exact_match_rate", "mean_common_prefix"]
    assert "exact_match_rate 0.000 (quality.thresholds.min_exact_match_rate 0.4)" in result.summary()


def test_logprob_drop_past_threshold_fails():
    result = verdict(figures(candidate_logprob=-0.5), QualityConfig())
    assert failed(result) == ["logprob_drop"]
    assert verdict(figures(candidate_logprob=-0.39), QualityConfig()).passed  # drop 0.09 <= 0.1


def test_too_few_lines_fail():
    assert failed(verdict(figures(lines=5), QualityConfig())) == ["lines"]
    assert verdict(figures(lines=5), QualityConfig(min_lines=None)).passed


def test_expected_answers_drop_fails():
    worse = figures(expected_lines=10, reference_expected_exact=0.8, candidate_expected_exact=0.8,
                    reference_expected_contains=0.9, candidate_expected_contains=0.7)
    assert failed(verdict(worse, QualityConfig())) == ["expected_contains_drop"]
    same = figures(expected_lines=10, reference_expected_exact=0.8, candidate_expected_exact=0.8,
                   reference_expected_contains=0.9, candidate_expected_contains=0.9)
    assert verdict(same, QualityConfig()).passed


def test_thresholds_come_from_config():
    loose = QualityConfig.model_validate({"thresholds": {"min_exact_match_rate": 0.0, "min_mean_common_prefix": 0}})
    assert verdict(figures(exact_match_rate=0.0, mean_common_prefix=3.6), loose).passed


def test_missing_figures_fail():
    assert "logprob_drop" in failed(verdict(figures(reference_logprob=None), QualityConfig()))
