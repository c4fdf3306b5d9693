"""Load test, latency-throughput curve and capacity plan against an OpenAI-compatible endpoint
(LoRAPlex with tenant keys, or a bare vLLM server the tool starts): docs/loadtest.md.

    python -m bench loadtest --url http://127.0.0.1:8000 --admin-token $(cat var/admin-token) --sweep 1,2,4,8,16,32
    python -m bench loadtest --start-platform --compare-bare --concurrency 16 --num-requests 32   # vs bare vLLM
    python -m bench loadtest --start-platform --compare-bare --lora-mix base,1,8 --concurrency 16 # multi-LoRA cost
    # all of it in one run: curve, plan, overhead, multi-LoRA and the `vllm bench serve` cross-check
    python -m bench loadtest --start-platform --compare-bare --sweep 1,2,4,8,16 --lora-mix base,1,8 \
        --lora-mix-concurrency 16 --vllm-bench --peak-concurrency 200

The code is in bench/loadtest/; its results dir (--out) keeps results.json, requests.json and
summary.md; --json writes the summary and results.json's content as this entry point's JSON.
"""

from bench.loadtest import cli


def add_arguments(p) -> None:
    cli.add_arguments(p)


def run(args, out) -> int:
    return cli.run(args, out.argv, report_to=out)
