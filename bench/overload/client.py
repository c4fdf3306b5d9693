"""The overload's HTTP client (tenants through the admin API, timed chat requests) and its two
load loops: closed (a fixed number in flight) and open (Poisson arrivals)."""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from dataclasses import dataclass, field
from typing import Optional

import httpx

from bench.overload.workload import MODEL, Prompt


@dataclass
class Result:
    tenant: str
    phase: str
    status: Optional[int]  # None: no HTTP answer (connection error, timeout)
    latency: float
    request_id: Optional[str] = None
    retry_after: Optional[str] = None
    code: object = None
    message: str = ""
    completion_tokens: int = 0
    prompt_tokens: int = 0
    sent: float = 0.0  # perf_counter when sent


@dataclass
class Tenant:
    name: str
    priority: int
    share: float
    id: str = ""
    key: str = ""
    limits: dict = field(default_factory=dict)


class Client:
    def __init__(self, base_url: str, admin_token: str):
        self.base_url = base_url
        self.admin = {"Authorization": f"Bearer {admin_token}"}
        self.http = httpx.AsyncClient(base_url=base_url, timeout=httpx.Timeout(240, connect=30),
                                      limits=httpx.Limits(max_connections=1000, max_keepalive_connections=200))
        self.tag = itertools.count(1)
        self.results: list[Result] = []

    async def create_tenant(self, t: Tenant) -> None:
        r = await self.http.post("/admin/tenants", json={"name": t.name, "limits": {"priority": t.priority}},
                                 headers=self.admin)
        r.raise_for_status()
        t.id, t.limits = r.json()["id"], r.json()["limits"]
        k = await self.http.post(f"/admin/tenants/{t.id}/keys", headers=self.admin)
        k.raise_for_status()
        t.key = k.json()["key"]

    async def set_limits(self, t: Tenant, limits: dict) -> None:
        r = await self.http.patch(f"/admin/tenants/{t.id}", json={"limits": limits}, headers=self.admin)
        r.raise_for_status()
        t.limits = r.json()["limits"]

    async def chat(self, t: Tenant, prompt: Prompt, phase: str) -> Result:
        body = {"model": MODEL, "max_tokens": prompt.max_tokens, "temperature": 0,
                "messages": [{"role": "user", "content": f"[{next(self.tag)}] {prompt.text}"}]}
        started = time.perf_counter()
        try:
            r = await self.http.post("/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {t.key}"})
        except httpx.HTTPError as exc:
            res = Result(t.name, phase, None, time.perf_counter() - started, message=repr(exc))
        else:
            res = Result(t.name, phase, r.status_code, time.perf_counter() - started,
                         request_id=r.headers.get("x-loraplex-request-id"), retry_after=r.headers.get("retry-after"))
            try:
                data = r.json()
            except ValueError:
                data = {"error": {"message": r.text[:300]}}
            if r.status_code == 200:
                res.completion_tokens = data["usage"]["completion_tokens"]
                res.prompt_tokens = data["usage"]["prompt_tokens"]
            else:
                err = data.get("error") if isinstance(data, dict) else None
                err = err if isinstance(err, dict) else {"message": str(data)[:300]}
                res.code, res.message = err.get("code"), str(err.get("message"))
        res.sent = started
        self.results.append(res)
        return res


async def closed_loop(client: Client, tenants: list[Tenant], prompts, n: int, concurrency: int, phase: str):
    """n requests, `concurrency` at a time. Returns the results, the whole time, and the
    steady-state throughput: the completions up to the one that let the last request start, over
    that time (exactly `concurrency` in flight all along; the drain at the end is left out)."""
    todo = iter(range(n))
    out: list[Result] = []
    done_at: list[float] = []

    async def worker():
        for i in todo:
            out.append(await client.chat(tenants[i % len(tenants)], next(prompts), phase))
            done_at.append(time.perf_counter() - started)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    steady = n - concurrency
    ok = sum(r.status == 200 for r in out)
    rate = steady / done_at[steady - 1] if steady > 0 and ok == n else ok / (time.perf_counter() - started)
    return out, time.perf_counter() - started, rate


async def open_loop(client: Client, tenants: list[Tenant], rate: float, duration: float, max_requests: int,
                    prompts_of: dict, rng: random.Random, phase: str = "overload"):
    """Poisson arrivals at `rate`, each from a tenant drawn by share; returns (results, window s)."""
    schedule, t = [], 0.0
    weights = [x.share for x in tenants]
    while len(schedule) < max_requests:
        t += rng.expovariate(rate)
        if t > duration:
            break
        schedule.append((t, rng.choices(tenants, weights)[0]))
    window = duration if len(schedule) < max_requests else schedule[-1][0]
    tasks = []
    started = time.perf_counter()
    for at, tenant in schedule:
        delay = started + at - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(client.chat(tenant, next(prompts_of[tenant.name]), phase)))
    lag = time.perf_counter() - started - schedule[-1][0] if schedule else 0.0
    return await asyncio.gather(*tasks), window, lag
