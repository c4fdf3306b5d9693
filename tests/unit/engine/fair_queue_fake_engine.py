"""A fake engine for FairQueue on a fake clock (unit tests only): every dispatched request makes
one token per step, all at once (continuous batching), charged to the queue as it is made (the
prompt with the first token), the way the Engine replica charges streamed tokens. Closed-loop
tenants keep `workers` requests outstanding; a refused one retries after `retry_steps`, like
the benchmark's client after the shipped Retry-After. Open-loop tenants send one every `every`
steps."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import yaml

from loraplex.engine.config import FairQueueConfig
from loraplex.engine.dispatch_limit import FixedLimit
from loraplex.engine.fair_queue import Entry, FairQueue

ROOT = Path(__file__).resolve().parents[3]
STEP_S = 0.25  # one decode step of the fake engine (about TPOT at 8 in flight on the CPU profile)


def shipped_queue() -> tuple[dict, int]:
    """(fair_queue settings, max_num_seqs) of the CPU profile, serve_config.yaml; the dispatch
    limit as the Engine replica resolves it (unset: max_num_seqs)."""
    args = yaml.safe_load((ROOT / "serve_config.yaml").read_text())["applications"][0]["args"]
    queue = dict(args["engine_deployment"]["fair_queue"])
    queue.pop("enabled", None)
    max_num_seqs = args["engine"]["max_num_seqs"]
    queue["dispatch_limit"] = queue.get("dispatch_limit") or max_num_seqs
    return queue, max_num_seqs


@dataclass
class Sender:
    tenant: str
    tokens: int
    weight: float = 1.0
    workers: int = 0  # closed loop: this many outstanding
    every: int = 0  # open loop: one request every `every` steps
    prompt: int = 100


@dataclass
class Run:
    served: dict = field(default_factory=dict)  # tenant -> weighted tokens made (the queue's costs)
    tokens: dict = field(default_factory=dict)  # tenant -> completion tokens made (= slot-steps)
    refused: dict = field(default_factory=dict)
    waits: dict = field(default_factory=dict)  # tenant -> [seconds each request waited in the queue]
    running: list = field(default_factory=list)  # requests in the engine at each step


def run(senders: list[Sender], steps: int, **overrides) -> Run:
    settings, max_num_seqs = shipped_queue()
    settings.update(overrides)
    limit = settings.pop("dispatch_limit")
    config = FairQueueConfig(**settings)
    clock = [0.0]
    # As the Engine replica builds it: vLLM runs max_num_seqs + newcomer_slots (Engine.engine_config).
    q = FairQueue(config, FixedLimit(limit), max_num_seqs + config.newcomer_slots, clock=lambda: clock[0],
                  wall=lambda: clock[0])
    out = Run(*({s.tenant: 0 for s in senders} for _ in range(3)), {s.tenant: [] for s in senders})
    engine: list = []  # [entry, sender, tokens made]
    retries: list = []  # (step, sender)
    step = 0

    def submit(s: Sender) -> None:
        e = Entry(s.tenant, weight=s.weight)
        submitted = clock[0]

        def ready(e):
            if e.state == "running":
                out.waits[s.tenant].append(clock[0] - submitted)
                engine.append([e, s, 0])
            else:
                out.refused[s.tenant] += 1
                if s.workers:
                    retries.append((step + 8, s))  # Retry-After 2 s
        e.ready = ready
        q.submit(e)

    for s in senders:
        for _ in range(s.workers):
            submit(s)
    for step in range(1, steps):
        clock[0] = step * STEP_S
        for due in [r for r in retries if r[0] <= step]:
            retries.remove(due)
            submit(due[1])
        for s in senders:
            if s.every and step % s.every == 0:
                submit(s)
        out.running.append(len(engine))
        done = []
        for r in list(engine):  # a request dispatched in this step (pacing) makes its first next step
            e, s, made = r
            prompt = s.prompt if made == 0 else 0
            r[2] += 1
            q.charge(e.tenant, prompt, 1, e.weight)
            if made == 0:
                q.first_token(e)
            out.served[e.tenant] += config.prompt_token_cost * prompt + config.completion_token_cost
            out.tokens[e.tenant] += 1
            if r[2] >= s.tokens:
                done.append(r)
        for r in done:
            engine.remove(r)
            q.finish(r[0])
            if r[1].workers:
                submit(r[1])
    return out
