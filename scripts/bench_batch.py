#!/usr/bin/env python
"""What a running batch costs an online tenant (issue 36): its TTFT / TPOT p50 and p95 alone vs
with a batch running beside it, side by side in one `serve run`.

    python scripts/bench_batch.py [--concurrency 4] [--requests 32] [--max-tokens 32]
                                  [--batch-lines 200] [--batch-max-tokens 64] [--port 8000] [--out FILE]

One run of the shipped config (serve_config.yaml) with its state in a temp dir and two tenants:
`online` (closed loop of streamed chats at --concurrency, every answer exactly --max-tokens:
ignore_eos, greedy) and `batcher` (one Batch API batch of --batch-lines lines of
--batch-max-tokens each). Phases: warm-up; online alone; then the batch is created, and once its
first lines are done the same online load runs again beside it (the batch is cancelled after).
Prints TTFT and TPOT p50/p95 per phase, the ratio with / alone (the batch's lines wait below
every online request in the fair queue and take only the prompt budget online prompts leave:
docs/operations.md#batch-api-filling-the-valleys), and how many batch lines ran meanwhile (the
valley the batch filled). Run it alone on the shared machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # bench/ sits at the repository root, next to scripts/
sys.path.insert(0, str(ROOT / "platform"))

import httpx  # noqa: E402
import yaml  # noqa: E402

from bench.loadtest.client import Target  # noqa: E402
from bench.loadtest.runner import run_closed  # noqa: E402
from bench.loadtest.stats import summarize  # noqa: E402
from bench.loadtest.workload import RequestSpec, Tenant, Workload  # noqa: E402
from bench.dedicated import seeded_config  # noqa: E402
from bench.serve_run import ServeRun  # noqa: E402

MODEL = "SmolLM2-135M-Instruct"
PROMPTS = ["Tell me about the sea.", "What is the capital of France?", "Describe a ship in a storm.",
           "How do I cook rice?", "Write a short poem about the wind.", "Why is the sky blue?"]


def workload(n: int, max_tokens: int, offset: int) -> Workload:
    # A different number in each phase's prompts: no phase hits the prefix cache of another.
    requests = [RequestSpec(index=i, tenant=0, adapter=None, max_tokens=max_tokens, system=False, ignore_eos=True,
                            user_text=f"{PROMPTS[i % len(PROMPTS)]} ({offset + i})") for i in range(n)]
    return Workload([Tenant("online", "")], [], requests, "bench_batch", exact_lengths=False)


def config(state: Path, port: int):
    """The shipped config with its state in `state`, the two tenants' keys seeded (bench/dedicated.py)."""
    seeded = seeded_config(state, uploads={}, dedicated=[], tenants=("online", "batcher"))
    doc = yaml.safe_load(seeded.config.read_text())
    doc["http_options"]["port"] = port
    doc["applications"][0]["args"]["batches"] = {"poll_s": 0.5}
    seeded.config.write_text(yaml.safe_dump(doc))
    return seeded


class Batch:
    """One batch of the `batcher` tenant over the Batch API."""

    def __init__(self, base_url: str, key: str, lines: int, max_tokens: int):
        self.http = httpx.Client(base_url=f"{base_url}/v1", headers={"Authorization": f"Bearer {key}"}, timeout=60)
        body = "\n".join(json.dumps({"custom_id": f"b{i}", "method": "POST", "url": "/v1/chat/completions",
                                     "body": {"model": MODEL, "max_tokens": max_tokens, "ignore_eos": True,
                                              "messages": [{"role": "user", "content": f"Count to {i}."}]}})
                         for i in range(lines))
        upload = self.http.post("/files", files={"file": ("in.jsonl", body.encode())}, data={"purpose": "batch"})
        upload.raise_for_status()
        created = self.http.post("/batches", json={"input_file_id": upload.json()["id"],
                                                   "endpoint": "/v1/chat/completions", "completion_window": "24h"})
        created.raise_for_status()
        self.id = created.json()["id"]

    def get(self) -> dict:
        got = self.http.get(f"/batches/{self.id}")
        got.raise_for_status()
        return got.json()

    def wait_running(self, timeout_s: float = 300) -> dict:
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            now = self.get()
            if now["status"] != "validating" and now["request_counts"]["completed"] >= 1:
                return now
            time.sleep(0.5)
        raise SystemExit(f"bench_batch: batch {self.id} ran no line in {timeout_s:.0f} s")

    def cancel(self) -> None:
        self.http.post(f"/batches/{self.id}/cancel")


def table(phases: dict[str, dict]) -> str:
    alone = phases["online alone"]
    lines = ["| phase | ok | TTFT p50 (s) | TTFT p95 (s) | TPOT p50 (ms) | TPOT p95 (ms) |",
             "|---|---:|---:|---:|---:|---:|"]
    for name, s in phases.items():
        lines.append(f"| {name} | {s['ok']}/{s['requests']} | {s['ttft_p50']:.3f} | {s['ttft_p95']:.3f} | "
                     f"{s['tpot_p50'] * 1e3:.1f} | {s['tpot_p95'] * 1e3:.1f} |")
    w = phases["online + batch"]
    lines.append(f"| with / alone | | {w['ttft_p50'] / alone['ttft_p50']:.2f}x | {w['ttft_p95'] / alone['ttft_p95']:.2f}x | "
                 f"{w['tpot_p50'] / alone['tpot_p50']:.2f}x | {w['tpot_p95'] / alone['tpot_p95']:.2f}x |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--requests", type=int, default=32, help="online requests per phase")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--batch-lines", type=int, default=200)
    ap.add_argument("--batch-max-tokens", type=int, default=64)
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--out", type=Path, help="also write the table here (markdown)")
    a = ap.parse_args()
    admin = secrets.token_urlsafe(16)
    with tempfile.TemporaryDirectory(prefix="bench-batch-") as tmp:
        state = Path(tmp)
        seeded = config(state, a.port)
        with ServeRun(seeded.config, port=a.port, log_path=state / "serve_run.log", admin_token=admin) as run:
            run.wait_ready()
            target = Target("loraplex", run.base_url, MODEL, keys=[seeded.keys["online"]])
            batcher = seeded.keys["batcher"]
            asyncio.run(run_closed(target, workload(a.concurrency * 2, 8, 90_000), a.concurrency, progress=False))
            phases = {"online alone": summarize(asyncio.run(run_closed(
                target, workload(a.requests, a.max_tokens, 0), a.concurrency, desc="online alone")), a.concurrency)}
            batch = Batch(run.base_url, batcher, a.batch_lines, a.batch_max_tokens)
            before = batch.wait_running()["request_counts"]["completed"]
            results = asyncio.run(run_closed(target, workload(a.requests, a.max_tokens, 10_000), a.concurrency,
                                             desc="online + batch"))
            after = batch.get()
            batch.cancel()
            phases["online + batch"] = summarize(results, a.concurrency)
    ran = after["request_counts"]["completed"] - before
    report = [f"bench_batch: online concurrency {a.concurrency}, {a.requests} requests per phase, {a.max_tokens} "
              f"output tokens each; a batch of {a.batch_lines} lines x {a.batch_max_tokens} tokens beside the "
              "second phase (ignore_eos, greedy), one serve run", "", table(phases), "",
              f"batch lines completed during the online + batch phase: {ran} "
              f"({ran * a.batch_max_tokens / phases['online + batch']['duration_s']:.1f} batch tok/s beside the online "
              f"tenant's {phases['online + batch']['output_tokens_per_s']:.1f}); batch status then: {after['status']}"]
    if ran == 0 or after["status"] != "in_progress":
        report.append("WARNING: the batch did not run beside the whole online phase; raise --batch-lines")
    text = "\n".join(report)
    print(text)
    if a.out:
        a.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
