"""The quality run's figures on fixed token sequences and log-probabilities."""

import pytest

from loraplex.quality.metrics import (
    answer_tail, common_prefix, exact_match, expected_contains, expected_exact, line_figures, mean_logprob,
    run_figures,
)


def test_exact_match_is_token_for_token():
    assert exact_match(["The", " cat", " sat"], ["The", " cat", " sat"])
    assert not exact_match(["The", " cat", " sat"], ["The", " cat", " sat", "."])  # a longer answer differs
    assert not exact_match(["The", " cat"], ["The", " dog"])


def test_common_prefix_counts_tokens_until_the_first_difference():
    assert common_prefix(["a", "b", "c", "d"], ["a", "b", "x", "d"]) == 2  # the match after a difference is not counted
    assert common_prefix(["a", "b"], ["a", "b", "c"]) == 2
    assert common_prefix(["x"], ["a"]) == 0
    assert common_prefix([], ["a"]) == 0


def test_mean_logprob_per_token():
    assert mean_logprob([-1.0, -2.0, -3.0]) == pytest.approx(-2.0)
    assert mean_logprob([]) is None
    with pytest.raises(ValueError):
        mean_logprob([-1.0, None])


def test_answer_tail_is_the_last_answer_tokens_of_the_scored_prompt():
    # the scored prompt: 3 tokens of the request's prompt (the first has no log-probability), 2 of the answer
    scored = [None, -0.5, -0.7, -0.1, -0.3]
    assert answer_tail(scored, 2) == [-0.1, -0.3]
    assert answer_tail(scored, 0) == []
    with pytest.raises(ValueError):
        answer_tail(scored, 6)


def test_expected_answers_exact_and_contains_ignore_case_and_spacing():
    assert expected_exact("  Paris ", ["paris"])
    assert not expected_exact("Paris, France", ["Paris"])
    assert expected_contains("It is Paris, France.", ["paris"])
    assert not expected_contains("It is Lyon.", ["Paris", "paris"])


def test_line_and_run_figures():
    same = line_figures(["P", "aris"], ["P", "aris"], "Paris", "Paris", [-0.1, -0.1], [-0.2, -0.4], ["Paris"])
    differ = line_figures(["P", "aris"], ["L", "yon"], "Paris", "Lyon", [-0.1, -0.3], [-2.0, -3.0], ["Paris"])
    unscored = line_figures(["a"], ["a"], "a", "a", None, None)
    assert same.exact_match and same.common_prefix == 2 and same.candidate_logprob == pytest.approx(-0.3)
    assert not differ.exact_match and differ.common_prefix == 0
    assert differ.reference_expected_contains and not differ.candidate_expected_contains
    assert unscored.reference_expected_exact is None

    run = run_figures([same, differ, unscored])
    assert run.lines == 3
    assert run.exact_match_rate == pytest.approx(2 / 3)
    assert run.mean_common_prefix == pytest.approx(1.0)
    # log-probabilities over the scored lines only, the same lines for both models
    assert run.reference_logprob == pytest.approx((-0.1 + -0.2) / 2)
    assert run.candidate_logprob == pytest.approx((-0.3 + -2.5) / 2)
    assert run.logprob_drop == pytest.approx(run.reference_logprob - run.candidate_logprob)
    assert run.expected_lines == 2
    assert run.reference_expected_exact == 1.0 and run.candidate_expected_exact == 0.5
    assert run.reference_expected_contains == 1.0 and run.candidate_expected_contains == 0.5


def test_run_figures_of_no_lines_are_none():
    run = run_figures([])
    assert run.lines == 0 and run.exact_match_rate is None and run.logprob_drop is None


def test_logprob_means_compare_the_same_lines():
    # a line the candidate could not score is left out of the reference's mean too
    both = line_figures(["a"], ["a"], "a", "a", [-0.2], [-0.4])
    reference_only = line_figures(["b"], ["b"], "b", "b", [-5.0], None)
    run = run_figures([both, reference_only])
    assert run.reference_logprob == pytest.approx(-0.2) and run.candidate_logprob == pytest.approx(-0.4)
