"""A quality file (docs/quality.md) of ShareGPT's first questions: the input of the quality runs
whose figures docs/benchmarks.md shows.

    python scripts/quality_sharegpt.py --n 200 --max-tokens 32 > var/quality-sharegpt.jsonl

Each line is a Batch API chat request (its `model` is replaced by the run's reference and
candidate); questions over --max-chars characters are skipped, as python -m bench base_models skips
prompts over its token bound.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))


def main() -> None:
    from sharegpt import first_exchanges, sharegpt_conversations

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=200, help="lines (default 200)")
    p.add_argument("--max-tokens", type=int, default=32, help="each answer's max_tokens (default 32)")
    p.add_argument("--max-chars", type=int, default=1500, help="longest question kept (default 1500)")
    args = p.parse_args()
    written = 0
    for ex in first_exchanges(sharegpt_conversations(20 * args.n)):
        if len(ex.question) > args.max_chars:
            continue
        print(json.dumps({"custom_id": f"sharegpt-{written}", "method": "POST", "url": "/v1/chat/completions",
                          "body": {"model": "replaced", "max_tokens": args.max_tokens,
                                   "messages": [{"role": "user", "content": ex.question}]}}))
        written += 1
        if written == args.n:
            return
    raise SystemExit(f"only {written} ShareGPT questions fit {args.max_chars} characters")


if __name__ == "__main__":
    main()
