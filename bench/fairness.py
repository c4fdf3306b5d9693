"""The fair-queue benchmark's pieces (python -m bench fairness is the CLI): tenants on a running
platform, closed- and open-loop senders over bench.loadtest.client.send, the scenarios of issue
20, Jain's index against the max-min fair allocation, and the queue's own cost with a fake engine.

Requests are ShareGPT openings (bench/sharegpt.py), the question cut to `prompt_chars`; each
message starts with a unique tag so no request reuses another's prompt from the prefix cache.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass
from typing import Optional

import httpx

from bench.loadtest.client import Target, send
from bench.percentile import percentile
from bench.sharegpt import first_exchanges, sharegpt_conversations
from bench.tenants import new_tenant_key


# -- workload ----------------------------------------------------------------------------------
class Prompts:
    """ShareGPT questions cut to `prompt_chars`; `documents`: document-length prompts instead,
    consecutive conversations' openings (question and answer) joined to `prompt_chars` (~4 chars a
    token) under a one-line instruction, as a tenant summarising documents sends them."""

    def __init__(self, prompt_chars: int = 400, seed: int = 0, documents: bool = False):
        exchanges = first_exchanges(sharegpt_conversations(2000))
        random.Random(seed).shuffle(exchanges)
        if not documents:
            self.texts = [e.question[:prompt_chars] for e in exchanges if len(e.question) >= 20]
        else:
            self.texts, doc = [], ""
            for e in exchanges:
                doc += f"{e.question}\n{e.answer}\n"
                if len(doc) >= prompt_chars:
                    self.texts.append("Summarize this document in one sentence.\n\n" + doc[:prompt_chars])
                    doc = ""
        self._next = itertools.cycle(self.texts)

    def next(self) -> str:
        return f"[{uuid.uuid4().hex[:8]}] {next(self._next)}"


@dataclass
class Spec:
    """One request, in the shape bench.loadtest.client.send reads."""

    index: int
    tenant: int
    max_tokens: int
    text: str
    adapter: Optional[int] = None
    ignore_eos: bool = True  # every request makes exactly max_tokens: comparable service

    def messages(self, tenants) -> list[dict]:
        return [{"role": "user", "content": self.text}]


class Platform:
    """A running LoRAPlex (admin token) and the tenants made for one phase."""

    def __init__(self, base_url: str, admin_token: str, model: str):
        self.base_url, self.admin_token, self.model = base_url, admin_token, model
        self._index = itertools.count()

    def tenants(self, specs: list[dict]) -> Target:
        """Make tenants [{"name", "plan"?, "priority"?}], one key each; a Target with their keys."""
        target = Target("loraplex", self.base_url, self.model)
        run = uuid.uuid4().hex[:6]
        for s in specs:
            limits = {"priority": s["priority"]} if s.get("priority") else None
            target.keys.append(new_tenant_key(self.base_url, self.admin_token, f"fair-{run}-{s['name']}", limits,
                                              plan=s.get("plan", "default")))
        return target

    def spec(self, tenant: int, max_tokens: int, prompts: Prompts) -> Spec:
        return Spec(next(self._index), tenant, max_tokens, prompts.next())


def parse_variant(name: str, named: dict[str, tuple[dict, dict]]) -> tuple[str, dict, dict, dict]:
    """A variant's name -> (its base name, fair_queue overrides, engine overrides, environment of
    the app's replicas). The base is one of `named` ({name: (fair_queue, engine) overrides}, e.g.
    "off", "on", "old") or on@N: the queue at dispatch_limit N (or `adaptive`). Suffixes: +paceK
    max_prefilling_per_tenant K (0: none); +tokK the engine's max_num_batched_tokens K; +sched0 /
    +sched1 the tenant scheduler off / on; +mpK VLLM_ENABLE_V1_MULTIPROCESSING=K (1: vLLM's own
    worker process on CPU, engine/cpu_backend.py)."""
    base, *extras = name.split("+")
    fixed = base.removeprefix("on@")
    queue, engine = named.get(base) or ({"enabled": True, "dispatch_limit": fixed if fixed == "adaptive" else int(fixed)}, {})
    queue, engine, env = dict(queue), dict(engine), {}
    for extra in extras:
        if extra.startswith("pace"):
            queue["max_prefilling_per_tenant"] = int(extra[4:]) or None
        elif extra.startswith("tok"):
            engine["max_num_batched_tokens"] = int(extra[3:])
        elif extra in ("sched0", "sched1"):
            engine["tenant_scheduler"] = {"enabled": extra == "sched1"}
        elif extra in ("mp0", "mp1"):
            env["VLLM_ENABLE_V1_MULTIPROCESSING"] = extra[2:]
        else:
            raise SystemExit(f"variant {name}: unknown suffix +{extra} (use +paceK, +tokK, +sched0/1 or +mp0/+mp1)")
    return base, queue, engine, env


GRACE_S = 45.0  # after a phase's end, how long its requests may still run before they are cut


async def send_until(client, target: Target, spec: Spec, cut_at: float) -> dict:
    """send(), cut (client gone, status "cut": neither served nor refused) at `cut_at`."""
    try:
        return await asyncio.wait_for(send(client, target, spec, None), max(cut_at - time.monotonic(), 0.1))
    except asyncio.TimeoutError:
        return {"index": spec.index, "tenant": spec.tenant, "status": "cut", "http_status": None, "e2e": None,
                "ttft": None, "tpot": None, "completion_tokens": None, "prompt_tokens": None, "error": None}


async def closed_loop(client, platform: Platform, target: Target, tenant: int, concurrency: int,
                      max_tokens: int, prompts: Prompts, until: float, out: list, retry_after_s: float = 2.0) -> None:
    """`concurrency` workers sending back to back until `until` (monotonic); a refused request's
    worker waits `retry_after_s` (the shipped Retry-After) before its next one."""
    async def worker():
        while time.monotonic() < until:
            r = await send_until(client, target, platform.spec(tenant, max_tokens, prompts), until + GRACE_S)
            out.append(r)
            if r["status"] != "ok":
                await asyncio.sleep(retry_after_s)
    await asyncio.gather(*(worker() for _ in range(concurrency)))


async def open_loop(client, platform: Platform, target: Target, tenant: int, rate: float, max_tokens: int,
                    prompts: Prompts, until: float, out: list, poisson: bool = True, seed: int = 0) -> None:
    """Arrivals at `rate`/s (Poisson, or evenly spaced) until `until`; waits for every reply."""
    rng = random.Random(seed + tenant)
    tasks = []
    while True:
        gap = rng.expovariate(rate) if poisson else 1.0 / rate
        if time.monotonic() + gap >= until:
            break
        await asyncio.sleep(gap)
        tasks.append(asyncio.create_task(
            send_until(client, target, platform.spec(tenant, max_tokens, prompts), until + GRACE_S)))
    out.extend(await asyncio.gather(*tasks))


async def sample_dispatch_limit(client, platform: Platform, until: float, out: list, period_s: float = 5.0) -> None:
    """The Engine replicas' dispatch limits (GET /admin/replicas) every period until `until`."""
    headers = {"Authorization": f"Bearer {platform.admin_token}"}
    while time.monotonic() < until:
        try:
            r = await client.get("/admin/replicas", headers=headers)
            out.extend(x["dispatch_limit"] for x in r.json()["data"] if x.get("dispatch_limit") is not None)
        except (httpx.HTTPError, ValueError, KeyError):
            pass
        await asyncio.sleep(period_s)


def http_client(base_url: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=base_url, timeout=600,
                             limits=httpx.Limits(max_connections=400, max_keepalive_connections=400))


# -- summaries ---------------------------------------------------------------------------------
def tenant_summary(results: list[dict], tenant: int, window_s: float, until_epoch: float | None = None,
                   costs: tuple[float, float] = (1.0, 2.0)) -> dict:
    """One tenant's figures in a phase. `service`: weighted tokens served, `costs` (prompt,
    completion) per token as the fair queue counts them. `window_service`: those served before `until_epoch` (the end of the phase's arrivals), each request's completion
    tokens spread evenly from its first token to its end: after the arrivals stop, the tenants
    drain their queues at different speeds, so counting the drain would blur the shares."""
    mine = [r for r in results if r["tenant"] == tenant]
    ok = [r for r in mine if r["status"] == "ok"]
    refused = [r for r in mine if r["http_status"] in (429, 503)]
    reasons = defaultdict(int)
    for r in refused:
        reasons[refusal_reason(r)] += 1
    return {
        "sent": len(mine), "ok": len(ok), "refused": len(refused), "reasons": dict(reasons),
        "cut": sum(r["status"] == "cut" for r in mine),
        "failed": len(mine) - len(ok) - len(refused),
        "p50": percentile([r["e2e"] for r in ok], 50), "p95": percentile([r["e2e"] for r in ok], 95),
        "ttft_p95": percentile([r["ttft"] for r in ok], 95),
        "out_tokens": sum(r["completion_tokens"] or 0 for r in ok),
        "service": sum(costs[0] * (r["prompt_tokens"] or 0) + costs[1] * (r["completion_tokens"] or 0) for r in ok),
        "out_tok_s": sum(r["completion_tokens"] or 0 for r in ok) / window_s,
        "window_service": None if until_epoch is None else sum(served_before(r, until_epoch, *costs) for r in ok),
        "window_out_tokens": None if until_epoch is None else sum(served_before(r, until_epoch, 0, 1) for r in ok),
        "window_prompt_tokens": None if until_epoch is None else sum(served_before(r, until_epoch, 1, 0) for r in ok),
        "ttft_p50": percentile([r.get("ttft") for r in ok], 50),
        "tpot_p95": percentile([r["tpot"] for r in ok if r.get("tpot") is not None], 95),
    }


def served_before(r: dict, until_epoch: float, prompt_cost: float = 1.0, completion_cost: float = 2.0) -> float:
    """Weighted tokens (prompt + 2 x completion by default) of one finished request served
    before until_epoch."""
    first, end = r.get("first_token_epoch"), r.get("end_epoch")
    if first is None or end is None or first > until_epoch:
        return 0.0
    n = r["completion_tokens"] or 0
    share = 1.0 if end <= until_epoch or end <= first else (until_epoch - first) / (end - first)
    return prompt_cost * (r["prompt_tokens"] or 0) + completion_cost * n * share


def refusal_reason(r: dict) -> str:
    text = (r.get("error") or "").lower()
    if r["http_status"] == 429:
        return "429"
    if "share" in text:
        return "fair_share"
    if "deadline" in text:
        return "queue_deadline"
    if "queue is full" in text:
        return "queue_full"
    return "shed"


def within_slo(results: list[dict], tenant: int, ttft_s: float, tpot_s: float) -> tuple[int, int]:
    """(requests of the tenant served within both SLO targets, requests it sent): a refused, cut
    or failed request is not within them."""
    mine = [r for r in results if r["tenant"] == tenant and r["status"] != "cut"]
    good = [r for r in mine if r["status"] == "ok" and r["ttft"] is not None and r["ttft"] <= ttft_s
            and (r["tpot"] or 0) <= tpot_s]
    return len(good), len(mine)


def goodput(results: list[dict], window_s: float, ttft_s: float, tpot_s: float) -> tuple[float, float]:
    """(output tokens/s of requests within both SLO targets, output tokens/s of all ok ones)."""
    ok = [r for r in results if r["status"] == "ok"]
    good = [r for r in ok if r["ttft"] is not None and r["ttft"] <= ttft_s and (r["tpot"] or 0) <= tpot_s]
    return (sum(r["completion_tokens"] or 0 for r in good) / window_s,
            sum(r["completion_tokens"] or 0 for r in ok) / window_s)


def max_min_fair(demands: list[float], capacity: float) -> list[float]:
    """Water-filling: every tenant gets min(its demand, the level that spends the capacity)."""
    alloc = [0.0] * len(demands)
    left, active = capacity, sorted(range(len(demands)), key=lambda i: demands[i])
    while active:
        share = left / len(active)
        i = active[0]
        if demands[i] <= share:
            alloc[i] = demands[i]
            left -= demands[i]
            active.pop(0)
        else:
            for j in active:
                alloc[j] = share
            break
    return alloc


def jain(served: list[float], fair: list[float]) -> float:
    """Jain's index of served / fair share (1.0: every tenant got exactly its max-min share)."""
    x = [s / f for s, f in zip(served, fair) if f > 0]
    return sum(x) ** 2 / (len(x) * sum(v * v for v in x)) if x and any(x) else 0.0


def zipf_rates(n: int, total: float, s: float = 1.0) -> list[float]:
    w = [1 / (i + 1) ** s for i in range(n)]
    return [total * x / sum(w) for x in w]


# -- the queue's own cost ------------------------------------------------------------------------
async def queue_cost_us(requests: int = 20000, tenants: int = 20, limit: int = 8, backlog: int = 24) -> dict:
    """µs per request of the Engine replica's fair-queue glue and FairQueue (the real code: the
    Engine's _wait_for_slot / _charge / _slot_freed) over an instant fake engine, against the
    same loop without the queue: `backlog` requests waiting behind `limit` running."""
    from loraplex.config import PlatformConfig
    from loraplex.contract import EngineCall, RequestUsage
    from loraplex.engine.deployment import Engine

    config = PlatformConfig.from_args({"engine_deployment": {"fair_queue": {
        "dispatch_limit": limit, "max_queued": backlog + tenants, "newcomer_slots": 0}}})
    replica = Engine.__new__(Engine)  # only the queue: no vLLM, no ledger (a fake-engine run)
    replica.fair_queue = Engine._fair_queue(config)
    calls = [EngineCall(request_id=str(i), tenant_id=f"ten_{i % tenants}", priority=0, deadline=time.time() + 3600)
             for i in range(requests)]

    async def one(call, queued: bool):
        if queued:
            entry = await replica._wait_for_slot(call)
        await asyncio.sleep(0)  # the instant engine: one step
        if queued:
            usage = RequestUsage(prompt_tokens=100, completion_tokens=50, status="stop",
                                 first_token_time=time.time(), finish_time=time.time())
            replica._charge(entry, usage, [0, 0])
            replica._slot_freed(entry, usage)

    async def run(queued: bool) -> float:
        started = time.perf_counter()
        for i in range(0, requests, limit + backlog):
            await asyncio.gather(*(one(c, queued) for c in calls[i:i + limit + backlog]))
        return (time.perf_counter() - started) / requests * 1e6

    off = await run(False)
    on = await run(True)
    return {"off_us": off, "on_us": on, "queue_us": on - off, "requests": requests, "tenants": tenants}
