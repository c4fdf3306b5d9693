"""The batch lines a quality run sends, and what it reads back, for both endpoints."""

import json

import pytest

from loraplex.batches.jsonl import InvalidBatchFile
from loraplex.quality.lines import (
    answer_of, generation_file, parse_quality_file, results_by_id, scored_logprobs, scoring_file,
)

COMPLETIONS = "/v1/completions"


def quality_file(*bodies, url=COMPLETIONS, **extra):
    return "\n".join(json.dumps({"custom_id": f"c{i}", "method": "POST", "url": url, "body": b, **extra})
                     for i, b in enumerate(bodies)).encode()


def test_completions_lines_run_greedy_then_score_the_reference_answer_after_the_prompt():
    lines = parse_quality_file(quality_file({"model": "m", "prompt": "2+2=", "temperature": 0.9, "n": 3}),
                               10, 10_000)
    models = {"reference": "full", "candidate": "int4"}
    gen = [json.loads(x) for x in generation_file(lines, models, 16).decode().splitlines()]
    assert [(g["custom_id"], g["body"]["model"]) for g in gen] == [("reference:0", "full"), ("candidate:0", "int4")]
    assert gen[0]["body"] == {"model": "full", "prompt": "2+2=", "temperature": 0, "max_tokens": 16, "logprobs": 0}
    score = [json.loads(x) for x in scoring_file(lines, models, {0: "4"}).decode().splitlines()]
    assert score[1]["body"] == {"model": "int4", "prompt": "2+2=4", "temperature": 0, "max_tokens": 1,
                                "prompt_logprobs": 0}
    assert scoring_file(lines, models, {}) is None  # no answer to score


def test_reading_completions_replies():
    reply = {"choices": [{"text": " 4", "logprobs": {"tokens": [" 4"], "token_logprobs": [-0.1]}}],
             "usage": {"prompt_tokens": 4}}
    answer = answer_of(reply)
    assert answer.text == " 4" and answer.tokens == [" 4"] and answer.prompt_tokens == 4
    scored = {"choices": [{"text": ".", "prompt_logprobs": [None, {"5": {"logprob": -1.0}}, {"6": {"logprob": -2.0}},
                                                             {"7": {"logprob": -3.0}}, {"8": {"logprob": -0.5}}]}]}
    assert scored_logprobs(scored, 4) == [-0.5]  # 5 scored tokens less the prompt's 4: the answer's one
    assert scored_logprobs({"error": {"message": "x"}}, 4) is None
    assert answer_of({"error": {}}) is None


def test_output_and_error_files_by_custom_id():
    out = results_by_id(b'{"custom_id":"reference:0","response":{"status_code":200,"body":{"choices":[]}}}\n'
                        b'{"custom_id":"candidate:0","response":{"status_code":404,"body":{"error":{"message":"no"}}}}\n')
    assert out["reference:0"] == {"choices": []} and "error" in out["candidate:0"]


def test_a_completions_line_needs_one_prompt_string():
    with pytest.raises(InvalidBatchFile, match="one `prompt`"):
        parse_quality_file(quality_file({"model": "m", "prompt": ["a", "b"]}), 10, 10_000)


def test_expected_is_a_string_or_a_list_of_strings():
    lines = parse_quality_file(quality_file({"model": "m", "prompt": "x"}, expected="y"), 10, 10_000)
    assert lines[0].expected == ["y"]
    with pytest.raises(InvalidBatchFile, match="Line 1: `expected`"):
        parse_quality_file(quality_file({"model": "m", "prompt": "x"}, expected=[]), 10, 10_000)
