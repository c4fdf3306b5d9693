"""The quality file and the batch lines a run sends.

A quality file is a Batch API input file (batches/jsonl.py: one request a line, one endpoint for
the whole file) whose lines may carry `expected`: an answer, or a list of acceptable answers. The
line's own `body.model` is replaced by the run's reference and candidate.

A run is two batches. Generation: each line on both models, greedy, with the answer's tokens
(`logprobs`). Scoring: the reference's answer appended to each line's prompt (chat: as the final
assistant message, continued; completions: after the prompt), sent to both models with
`prompt_logprobs: 0` and max_tokens 1: the last (scored prompt tokens - the line's own prompt
tokens) prompt log-probabilities are the reference answer's tokens under that model.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Optional

from loraplex.batches.jsonl import BatchLine, InvalidBatchFile, parse_batch_file
from loraplex.quality.metrics import LineFigures, answer_tail, line_figures

ROLES = ("reference", "candidate")
CHAT = "/v1/chat/completions"
# Sampling fields dropped from a line's body: every run is greedy, one answer per line.
SAMPLING = ("temperature", "top_p", "top_k", "min_p", "n", "best_of", "seed", "stream", "stream_options",
            "logprobs", "top_logprobs", "prompt_logprobs", "echo", "use_beam_search")


@dataclass(frozen=True)
class QualityLine:
    line: BatchLine
    expected: Optional[list[str]]


def parse_quality_file(data: bytes, max_lines: int, max_line_bytes: int) -> list[QualityLine]:
    """The file's lines, or InvalidBatchFile naming the first bad line."""
    lines = parse_batch_file(data, max_lines, max_line_bytes)
    if len({x.url for x in lines}) > 1:
        raise InvalidBatchFile("The file mixes /v1/chat/completions and /v1/completions requests; a quality "
                               "file uses one endpoint.")
    raw = [r for r in data.decode("utf-8").splitlines() if r.strip()]
    out = []
    for number, (text, line) in enumerate(zip(raw, lines), start=1):
        expected = json.loads(text).get("expected")
        if isinstance(expected, str):
            expected = [expected]
        if expected is not None and not (isinstance(expected, list) and expected
                                         and all(isinstance(e, str) for e in expected)):
            raise InvalidBatchFile(f"Line {number}: `expected` must be a string or a non-empty list of strings.")
        if line.url != CHAT and not isinstance(line.body.get("prompt"), str):
            raise InvalidBatchFile(f"Line {number}: a quality file's completions request needs one `prompt` "
                                   "string (its answer is scored after it).")
        out.append(QualityLine(line, expected))
    return out


def _greedy(body: dict, model: str, max_tokens: int) -> dict:
    out = {k: v for k, v in body.items() if k not in SAMPLING}
    out.update(model=model, temperature=0)
    if "max_tokens" not in out and "max_completion_tokens" not in out:
        out["max_tokens"] = max_tokens
    return out


def _jsonl(lines: list[dict]) -> bytes:
    return ("\n".join(json.dumps(x, separators=(",", ":")) for x in lines) + "\n").encode()


def generation_file(lines: list[QualityLine], models: dict[str, str], max_tokens: int) -> bytes:
    """The generation batch's input: each line on each model (custom_id `<role>:<index>`)."""
    out = []
    for q in lines:
        for role in ROLES:
            body = _greedy(q.line.body, models[role], max_tokens)
            body["logprobs"] = True if q.line.url == CHAT else 0
            out.append({"custom_id": f"{role}:{q.line.index}", "method": "POST", "url": q.line.url, "body": body})
    return _jsonl(out)


def scoring_file(lines: list[QualityLine], models: dict[str, str], answers: dict[int, str]) -> Optional[bytes]:
    """The scoring batch's input: the reference's answer (`answers`, by line) after each line's
    prompt, on each model (custom_id `<role>:<index>`). None: no line has an answer to score."""
    out = []
    for q in lines:
        answer = answers.get(q.line.index)
        if not answer:
            continue
        for role in ROLES:
            body = _greedy(q.line.body, models[role], 1)
            body.update(max_tokens=1, prompt_logprobs=0)
            body.pop("max_completion_tokens", None)
            if q.line.url == CHAT:
                body.update(messages=[*body["messages"], {"role": "assistant", "content": answer}],
                            continue_final_message=True, add_generation_prompt=False)
            else:
                body["prompt"] = body["prompt"] + answer
            out.append({"custom_id": f"{role}:{q.line.index}", "method": "POST", "url": q.line.url, "body": body})
    return _jsonl(out) if out else None


@dataclass(frozen=True)
class Answer:
    text: str
    tokens: list[str]
    prompt_tokens: int


def results_by_id(output: bytes) -> dict[str, dict]:
    """An output / error file's lines by custom_id: the response body of a 2xx, else {"error": ...}."""
    out = {}
    for raw in output.decode("utf-8").splitlines():
        if not raw.strip():
            continue
        obj = json.loads(raw)
        response = obj.get("response") or {}
        ok = response.get("status_code") and 200 <= response["status_code"] < 300
        out[obj["custom_id"]] = response.get("body") if ok else {"error": obj.get("error") or response.get("body")}
    return out


def answer_of(body: dict) -> Optional[Answer]:
    """A generation reply's answer (None: an error, or no answer in it)."""
    if not body or "error" in body or not body.get("choices"):
        return None
    choice, prompt_tokens = body["choices"][0], (body.get("usage") or {}).get("prompt_tokens", 0)
    logprobs = choice.get("logprobs") or {}
    if "message" in choice:
        return Answer(choice["message"].get("content") or "",
                      [t["token"] for t in logprobs.get("content") or []], prompt_tokens)
    return Answer(choice.get("text") or "", list(logprobs.get("tokens") or []), prompt_tokens)


def scored_logprobs(body: dict, own_prompt_tokens: int) -> Optional[list[Optional[float]]]:
    """The answer's tokens' log-probabilities from a scoring reply (None: an error or none given)."""
    if not body or "error" in body:
        return None
    entries = body.get("prompt_logprobs")
    if entries is None and body.get("choices"):
        entries = body["choices"][0].get("prompt_logprobs")
    if entries is None:
        return None
    # prompt_logprobs: 0 gives each prompt token's own log-probability, one entry per position
    values = [None if e is None else next(iter(e.values()))["logprob"] for e in entries]
    return answer_tail(values, len(values) - own_prompt_tokens)


def compare(lines: list[QualityLine], generated: dict[str, dict], scored: dict[str, dict]) -> tuple[list[LineFigures], list[dict]]:
    """Figures of every line both models answered, and the problems of the others (by custom_id)."""
    figures, problems = [], []
    for q in lines:
        i = q.line.index
        answers = {role: answer_of(generated.get(f"{role}:{i}")) for role in ROLES}
        missing = [role for role in ROLES if answers[role] is None]
        if missing:
            why = [generated.get(f"{role}:{i}", {}).get("error") for role in missing]
            problems.append({"custom_id": q.line.custom_id, "models": missing, "error": why[0]})
            continue
        ref, cand = answers["reference"], answers["candidate"]
        logprobs = {role: scored_logprobs(scored.get(f"{role}:{i}"), answers[role].prompt_tokens) for role in ROLES}
        figures.append(line_figures(ref.tokens, cand.tokens, ref.text, cand.text, logprobs["reference"],
                                    logprobs["candidate"], q.expected))
    return figures, problems


def reference_answers(lines: list[QualityLine], generated: dict[str, dict]) -> dict[int, str]:
    out = {}
    for q in lines:
        answer = answer_of(generated.get(f"reference:{q.line.index}"))
        if answer is not None and answer.text:
            out[q.line.index] = answer.text
    return out


