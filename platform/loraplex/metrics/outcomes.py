"""How a request ended, in the metrics' few words: the ledger's status mapped to `status`.

The usage ledger keeps vLLM's finish reasons and our endings (accounting.record.STATUSES); the
`loraplex_requests_total{status}` label folds them into what an operator alerts on:

    stop, finished      -> ok                 (ended on its own: a stop token or string)
    length              -> length             (cut at max_tokens / the context length)
    client_disconnect   -> client_disconnect  (the client went away; tokens made so far are billed)
    timeout             -> timeout            (the request's deadline passed: 504 / error event)
    error, engine_error -> error              (the engine failed, or the replica was lost)
    aborted             -> error              (vLLM aborted it without the client asking)

Any status this table does not know counts as `error`: a new ending is seen, not hidden.
"""

from __future__ import annotations

OUTCOMES = ("ok", "length", "client_disconnect", "timeout", "error")

STATUS_OF = {
    "stop": "ok",
    "finished": "ok",
    "length": "length",
    "client_disconnect": "client_disconnect",
    "timeout": "timeout",
    "error": "error",
    "engine_error": "error",
    "aborted": "error",
}


def outcome(ledger_status: str | None) -> str:
    return STATUS_OF.get(ledger_status, "error")
