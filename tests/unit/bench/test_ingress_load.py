"""bench/ingress/load.py's summary: only complete replies count, requests/s over first send to
last token, TTFT percentiles from bench.percentile."""
from types import SimpleNamespace

from bench.ingress.load import summary
from bench.stream.client import chat_request


def reply(sent, first, last, tokens=8, finished=True, status=200):
    return SimpleNamespace(sent=sent, first=first, last=last, tokens=tokens, finished=finished, status=status)


def test_summary_counts_complete_replies_only():
    protos = [reply(0.0, 0.1, 0.2), reply(0.0, 0.3, 0.5), reply(0.0, None, None, tokens=0, finished=False),
              reply(0.1, 0.2, 0.3, tokens=5, finished=True),  # cut short: not a complete reply
              reply(0.1, None, None, tokens=0, status=503)]  # refused at once (overload)
    s = summary(protos, 8, 0.0, 10.0)
    assert (s["sent"], s["ok"], s["failed"], s["refused"]) == (5, 2, 3, 1)
    assert s["rps"] == 2 / 0.5
    assert round(s["ttft_p50_ms"], 6) == 200.0 and s["offered_rps"] == 10.0


def test_the_request_is_a_streamed_chat_with_the_key():
    raw = chat_request(8000, "lpx-k", "m", 8)
    assert raw.startswith(b"POST /v1/chat/completions HTTP/1.1") and b"Bearer lpx-k" in raw
    assert b'"max_tokens": 8' in raw and b'"stream": true' in raw
