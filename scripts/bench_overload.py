#!/usr/bin/env python
"""Overload: the real `serve run` at several times its measured capacity, real ShareGPT prompts.

    python scripts/bench_overload.py [--duration 90] [--max-requests 900] [--overload-factor 3]

It starts `serve run` of a config derived from serve_config.yaml (two Engine replicas with
`num_cpus: 0.5`, `max_num_seqs: 4`, shedding `requests_by_priority: {0: 1, 50: 2, 100: 8}`
(priority 0 refused at 1 request in flight on a replica, 50 at 2, 100 at 8: the middle leaves
batch slots free for the top one) and vLLM's priority scheduling; its own SQLite database, spool and port
in a temporary directory), then, in one run:
1. capacity: a closed-loop ramp (concurrency 1, 2, 4, 8) of priority-100 tenants, so nothing is
   shed; capacity = the highest throughput (requests/s) of the ramp;
2. unloaded latency of the gold tenant (priority 100): its prompt pool, one request at a time,
   then its own overload arrivals (Poisson at its share of the overload rate) with no other tenant;
3. the overload: Poisson arrivals at --overload-factor x capacity for --duration s (at most
   --max-requests), from tenants made through the admin API: gold (priority 100, 8 % of the
   arrivals: about a quarter of capacity), silver (priority 50), capped (priority 50 and a
   `requests_per_minute` limit, set with PATCH once capacity is known, so 429s appear) and
   bronze (priority 0, most of the flood);
4. a table per tenant (offered, admitted, 429, 503, other, latency), gold's p95 under overload
   against its own traffic alone (target <= 2x: what the other tenants cost it) and against one
   request at a time, Retry-After on every 429/503;
5. peak RSS per kind of process of the run's process tree during the overload (psutil, every
   --sample-s), the CPU each kind used, what else used the machine's CPUs meanwhile, and the
   vLLM workers' CPU affinity;
6. no crash: a normal request after the overload, the same Engine replica processes as before,
   /readyz healthy, and the usage ledger (the run's SQLite database) holding exactly one record
   per admitted request and none for a refusal.

Prompts: the first user turn of ShareGPT conversations (bench/sharegpt.py), cut to
--max-prompt-tokens (256); max_tokens is the length of the conversation's answer, capped at
--max-tokens (32), so a request takes a few seconds on the 2-core CPU and the overload sends
enough gold requests for a p95 in a minute. Each request's message starts with
a unique tag so no request reuses another's prompt from the prefix cache (gold's pool is sent
in both phases). Writes nothing but stdout (the serve run log and database are deleted; the
log's tail is printed if the run fails; --serve-log keeps a copy). Takes about 4 minutes. Stop it with Ctrl-C: the
serve run and every process it started are stopped.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import math
import os
import random
import secrets
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Optional

import httpx
import psutil
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # bench/ sits at the repository root, next to scripts/

from bench.sharegpt import first_exchanges, sharegpt_conversations  # noqa: E402

BIN = Path(sys.executable).parent
MODEL = "SmolLM2-135M-Instruct"
RUN_MARK = "LORAPLEX_BENCH_RUN"  # every process of our serve run inherits it: the clean-up kills only those
KV_BYTES_PER_TOKEN = 2 * 30 * 3 * 64 * 4  # SmolLM2-135M: layers x KV heads x head dim, K+V, float32


# -- workload ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Prompt:
    text: str
    prompt_tokens: int  # of the cut question, before the chat template
    max_tokens: int


def build_prompts(model_dir: Path, max_prompt_tokens: int, max_tokens: int, seed: int) -> list[Prompt]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    exchanges = first_exchanges(sharegpt_conversations(3000))
    random.Random(seed).shuffle(exchanges)
    questions = tokenizer([e.question for e in exchanges], add_special_tokens=False)["input_ids"]
    answers = tokenizer([e.answer for e in exchanges], add_special_tokens=False)["input_ids"]
    out = []
    for q, a in zip(questions, answers):
        if len(q) >= 4:
            cut = q[:max_prompt_tokens]
            out.append(Prompt(tokenizer.decode(cut), len(cut), max(1, min(len(a), max_tokens))))
    return out


# -- the serve run -----------------------------------------------------------------------------
def write_config(tmp: Path, args) -> Path:
    config = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
    config["http_options"]["port"] = args.port
    a = config["applications"][0]["args"]
    a["database_url"] = f"sqlite:///{tmp}/loraplex.db"
    a["registry"] = {"store_url": str(tmp / "adapters"), "cache_dir": str(tmp / "cache")}
    a["accounting"] = {"spool_dir": str(tmp / "spool"), "flush_interval_s": 0.2}
    a["engine"]["max_num_seqs"] = 4
    a["engine"]["scheduling_policy"] = "priority"
    # The KV cache by size, not as a share of host RAM (0.25 of 24 GiB per replica).
    a["engine"]["engine_kwargs"] = {"kv_cache_memory_bytes": args.kv_tokens * KV_BYTES_PER_TOKEN}
    a["engine_deployment"].update(
        num_cpus=0.5, shedding={"requests_by_priority": args.shed_ladder},
    )
    # The replica count where an operator sets it: the `deployments:` entry wins over args.
    [engine] = [d for d in config["applications"][0]["deployments"] if d["name"] == "Engine"]
    engine["num_replicas"] = 2
    path = tmp / "serve_config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


class ServeRun:
    """`serve run CONFIG` in its own session, every process of it marked; stop() ends them all."""

    def __init__(self, config: Path, log_path: Path, admin_token: str, base_url: str, extra_env: dict):
        self.log_path, self.base_url = log_path, base_url
        self.mark = uuid.uuid4().hex
        env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # a fresh local cluster
        env.update(extra_env)
        env.update(LORAPLEX_ADMIN_TOKEN=admin_token, **{RUN_MARK: self.mark})
        ours = [str(ROOT / "platform"), str(ROOT)]  # this checkout's package, also in Ray's workers
        env["PYTHONPATH"] = os.pathsep.join(ours + [p for p in env.get("PYTHONPATH", "").split(os.pathsep)
                                                    if p and p not in ours])
        self.log = open(log_path, "w")
        # A process started in the background inherits SIGINT ignored; serve run stops on SIGINT.
        self.proc = subprocess.Popen([str(BIN / "serve"), "run", str(config)], cwd=ROOT, env=env,
                                     stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True,
                                     preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))

    def wait_ready(self, timeout_s: float = 600) -> dict:
        deadline, last = time.time() + timeout_s, None
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"`serve run` exited with {self.proc.returncode}")
            try:
                r = httpx.get(f"{self.base_url}/readyz", timeout=60)
                if r.status_code == 200:
                    return r.json()
                last = r.text[:200]
            except httpx.HTTPError as exc:
                last = repr(exc)
            time.sleep(2)
        raise TimeoutError(f"not ready after {timeout_s:.0f} s: {last}")

    def log_tail(self, chars: int = 4000) -> str:
        self.log.flush()
        return self.log_path.read_text(errors="replace")[-chars:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)  # as an operator stops it: Serve shuts down
            try:
                self.proc.wait(timeout=90)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGTERM)
                try:
                    self.proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                    self.proc.wait()
        for p in marked_processes(self.mark):  # what the run left behind, and nothing else
            try:
                p.kill()
            except psutil.Error:
                pass
        self.log.close()


def marked_processes(mark: str) -> list[psutil.Process]:
    needle = f"{RUN_MARK}={mark}".encode()
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if needle in (entry / "environ").read_bytes().split(b"\0"):
                    out.append(psutil.Process(int(entry.name)))
            except (OSError, psutil.Error):
                pass
    return out


def port_in_use(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


# -- memory ------------------------------------------------------------------------------------
# (what the command line contains, the kind of process), first match wins; Ray workers' titles
# are `ray::<actor or task>` and change while they run a method (`...Engine.handle_request`).
KINDS = (
    ("ServeReplica:", None), ("ServeController", "Serve controller"), ("ProxyActor", "Serve proxy"),
    ("LimiterActor", "limiter actor (Ray)"), ("EngineCore", "vLLM EngineCore"),
    ("VLLM::Worker", "vLLM CPU worker (model, KV cache)"), ("orphan_guard", "orphan guard (Engine)"),
    ("resource_tracker", "multiprocessing resource tracker"), ("dashboard/agent.py", "Ray dashboard agent"),
    ("DashboardAgent", "Ray dashboard agent"), ("runtime_env/agent", "Ray runtime-env agent"),
    ("RuntimeEnvAgent", "Ray runtime-env agent"), ("ray-dashboard-", "Ray dashboard modules"),
    ("dashboard.py", "Ray dashboard"), ("log_monitor", "Ray log monitor"), ("monitor.py", "Ray monitor"),
    ("ray::IDLE", "idle Ray worker"), ("multiprocessing.forkserver", "Ray dashboard modules"),
)


def process_kind(p: psutil.Process, root_pid: int) -> str:
    if p.pid == root_pid:
        return "serve run (driver)"
    try:
        name = p.name()
        if name in ("raylet", "gcs_server"):
            return name
        cmd = f"{' '.join(p.cmdline())} {name}"
    except psutil.Error:
        return "?"
    for needle, kind in KINDS:
        if needle in cmd:
            if kind is None:  # ray::ServeReplica:<app>:<deployment>[.<method>]
                deployment = cmd.split("ServeReplica:")[1].split()[0].split(":")[-1].split(".")[0]
                return f"{deployment} replica (Serve)"
            return kind
    try:  # another program: its script's or binary's name
        argv = p.cmdline()
        script = next((a for a in argv[1:] if not a.startswith("-")), "") if "python" in argv[0] else argv[0]
        return Path(script).name or name
    except (psutil.Error, IndexError):
        return name


def busy_cpu_seconds() -> float:
    t = psutil.cpu_times()
    return sum(t) - t.idle - getattr(t, "iowait", 0.0)


class ProcessSampler(threading.Thread):
    """RSS and CPU time of every process in the serve run's tree, every period_s, while running;
    and the machine's busy CPU time over the same span (to tell what else was running)."""

    def __init__(self, root_pid: int, period_s: float):
        super().__init__(daemon=True)
        self.root_pid, self.period_s = root_pid, period_s
        self.stop_event = threading.Event()
        self.kind: dict[int, str] = {}  # pid -> its kind when last seen
        self.peak_rss: dict[int, int] = {}
        self.cpu_first: dict[int, float] = {}
        self.cpu_last: dict[int, float] = {}
        self.peak_kind_total: dict[str, int] = defaultdict(int)
        self.peak_total = 0
        self.samples = 0
        self.me = psutil.Process()

    def snapshot(self) -> list[tuple[str, psutil.Process, int, float]]:
        try:
            root = psutil.Process(self.root_pid)
            procs = [root] + root.children(recursive=True)
        except psutil.Error:
            return []
        out = []
        for p in procs:
            try:
                with p.oneshot():
                    cpu = p.cpu_times()
                    out.append((process_kind(p, self.root_pid), p, p.memory_info().rss, cpu.user + cpu.system))
            except psutil.Error:
                pass
        return out

    def run(self) -> None:
        self.started, self.busy0 = time.monotonic(), busy_cpu_seconds()
        me = self.me.cpu_times()
        self.me0 = me.user + me.system
        while True:
            snap = self.snapshot()
            totals: dict[str, int] = defaultdict(int)
            for kind, p, rss, cpu in snap:
                self.kind[p.pid] = kind
                self.peak_rss[p.pid] = max(self.peak_rss.get(p.pid, 0), rss)
                self.cpu_first.setdefault(p.pid, cpu)
                self.cpu_last[p.pid] = cpu
                totals[kind] += rss
            for kind, total in totals.items():
                self.peak_kind_total[kind] = max(self.peak_kind_total[kind], total)
            self.peak_total = max(self.peak_total, sum(totals.values()))
            self.samples += 1
            if self.stop_event.wait(self.period_s):
                break
        self.elapsed, self.busy = time.monotonic() - self.started, busy_cpu_seconds() - self.busy0
        me = self.me.cpu_times()
        self.me_cpu = me.user + me.system - self.me0

    def cpu_cores(self, pid: int) -> float:
        """Mean cores a process used over the sampled span."""
        return (self.cpu_last[pid] - self.cpu_first[pid]) / self.elapsed


ENGINE_KINDS = ("Engine replica (Serve)", "vLLM EngineCore", "vLLM CPU worker (model, KV cache)")


def engine_processes(sampler: ProcessSampler) -> set[tuple[str, int, float]]:
    """The Engine replicas' and their EngineCores' processes: (kind, pid, start time)."""
    out = set()
    for kind, p, _, _ in sampler.snapshot():
        if kind in ENGINE_KINDS:
            try:
                out.add((kind, p.pid, p.create_time()))
            except psutil.Error:
                pass
    return out


# -- requests ----------------------------------------------------------------------------------
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


# -- phases ------------------------------------------------------------------------------------
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


# -- checks ------------------------------------------------------------------------------------
def ledger_rows(db_path: Path) -> dict[str, tuple]:
    with sqlite3.connect(db_path, timeout=30) as conn:
        return {r[0]: r[1:] for r in conn.execute(
            "SELECT request_id, tenant_id, status, completion_tokens, replica_id FROM usage_records")}


def rejection_counts(db_path: Path) -> Counter:
    with sqlite3.connect(db_path, timeout=30) as conn:
        return Counter({(t, r): n for t, r, n in conn.execute(
            "SELECT tenant_id, reason, SUM(count) FROM usage_rejections GROUP BY tenant_id, reason")})


def company(ones: list[Result], others: list[Result], replica_of: dict) -> tuple[float, Counter]:
    """How many other admitted requests shared each of `ones`' Engine replica while it ran, on
    average over `ones` (time-weighted within each), in all and per tenant."""
    per_tenant: Counter = Counter()
    for g in ones:
        for o in others:
            if o is not g and replica_of.get(o.request_id) == replica_of.get(g.request_id):
                overlap = min(g.sent + g.latency, o.sent + o.latency) - max(g.sent, o.sent)
                if overlap > 0:
                    per_tenant[o.tenant] += overlap / g.latency / len(ones)
    return sum(per_tenant.values()), per_tenant


def pct(xs: list[float], q: float) -> float:
    """Nearest-rank percentile (nan for none)."""
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[max(0, math.ceil(q * len(xs)) - 1)]


def kind_of_503(message: str) -> str:
    if "in flight on this engine replica" in message:
        return "shed (requests in flight)"
    if "KV cache" in message:
        return "shed (KV cache)"
    if "queue is full" in message:
        return "Serve queue full"
    return f"other 503: {message[:120]}"


def fmt_s(x: float) -> str:
    return "-" if math.isnan(x) else f"{x:.2f}"


def mib(n: int) -> str:
    return f"{n / 2**20:,.0f}"


# -- main --------------------------------------------------------------------------------------
async def bench(args, run: ServeRun, client: Client, db_path: Path, prompts: list[Prompt]) -> int:
    failures: list[str] = []
    out = print
    tenants = {t.name: t for t in (Tenant("gold", 100, args.shares["gold"]),
                                   Tenant("silver", 50, args.shares["silver"]),
                                   Tenant("capped", 50, args.shares["capped"]),
                                   Tenant("bronze", 0, args.shares["bronze"]))}
    ramp_tenants = [Tenant(f"ramp-{i}", 100, 0) for i in range(4)]
    for t in [*tenants.values(), *ramp_tenants]:
        await client.create_tenant(t)
    gold_pool, general = prompts[:args.gold_pool], prompts[args.gold_pool:]
    general_iter = itertools.cycle(general)

    # Warm-up: every replica's first batches (not measured).
    await closed_loop(client, ramp_tenants, general_iter, 8, 4, "warm-up")
    await client.chat(tenants["gold"], general[-1], "warm-up")

    # 1. Capacity: closed-loop ramp.
    out("\n## 1. Capacity: closed-loop ramp (4 tenants of priority 100: nothing is shed)\n")
    out("requests/s: completions while exactly `concurrency` requests were in flight, over that time "
        "(the drain at the end is left out)\n")
    out("| concurrency | requests | seconds | requests/s | completion tok/s | latency p50 s | latency p95 s | not 200 |")
    out("|---|---|---|---|---|---|---|---|")
    capacity, best = 0.0, None
    for c in args.ramp:
        n = max(6, args.ramp_requests_per_slot * c + 4)
        results, seconds, rps = await closed_loop(client, ramp_tenants, general_iter, n, c, f"ramp-{c}")
        ok = [r for r in results if r.status == 200]
        bad = len(results) - len(ok)
        if bad:
            failures.append(f"ramp c={c}: {bad} requests not 200: "
                            f"{Counter((r.status, r.message[:80]) for r in results if r.status != 200)}")
        tokens = rps * statistics.mean(r.completion_tokens for r in ok) if ok else 0.0
        out(f"| {c} | {len(results)} | {seconds:.1f} | {rps:.2f} | {tokens:.1f} "
            f"| {fmt_s(pct([r.latency for r in ok], .5))} | {fmt_s(pct([r.latency for r in ok], .95))} | {bad} |",
            flush=True)
        if rps > capacity:
            capacity, best = rps, c
    rate = args.overload_factor * capacity
    out(f"\ncapacity = {capacity:.2f} requests/s (the ramp's highest throughput, at concurrency {best}); "
        f"open-loop rate = {args.overload_factor:g} x {capacity:.2f} = {rate:.2f} requests/s", flush=True)

    # The capped tenant's limit, through the admin API: a share of what it will offer.
    offered_per_min = rate * tenants["capped"].share * 60
    rpm = args.capped_rpm or max(2, round(offered_per_min * args.capped_fraction))
    await client.set_limits(tenants["capped"], {"requests_per_minute": rpm})

    # 2. Gold unloaded.
    unloaded = []
    for p in gold_pool:
        r = await client.chat(tenants["gold"], p, "unloaded")
        if r.status != 200:
            failures.append(f"gold unloaded: {r.status} {r.message[:100]}")
        else:
            unloaded.append(r.latency)
    out(f"\n## 2. gold unloaded: {len(unloaded)} sequential requests (its pool of {len(gold_pool)} prompts): "
        f"p50 {fmt_s(pct(unloaded, .5))} s, p95 {fmt_s(pct(unloaded, .95))} s", flush=True)
    # Gold's own traffic alone: the same Poisson arrivals it gets in the overload, no other
    # tenant. Gold then shares its replica with its own requests only: what the overload adds
    # on top of that is what the other tenants cost it.
    gold_rate = args.overload_factor * capacity * tenants["gold"].share
    alone_results, _, _ = await open_loop(client, [replace(tenants["gold"], share=1.0)], gold_rate,
                                          args.alone_duration, args.max_requests,
                                          {"gold": itertools.cycle(gold_pool)}, random.Random(args.seed + 1), "alone")
    alone = [r.latency for r in alone_results if r.status == 200]
    if len(alone) != len(alone_results):
        failures.append(f"gold alone: {len(alone_results) - len(alone)} requests not 200")
    out(f"gold alone at its overload arrival rate ({gold_rate:.2f} requests/s, Poisson, {args.alone_duration:g} s, "
        f"{len(alone)} requests): p50 {fmt_s(pct(alone, .5))} s, p95 {fmt_s(pct(alone, .95))} s", flush=True)

    # 3. The overload, memory sampled over the run's process tree.
    sampler = ProcessSampler(run.proc.pid, args.sample_s)
    engines_before = engine_processes(sampler)
    out(f"\n## 3. Overload: Poisson arrivals at {rate:.2f} requests/s for {args.duration:g} s "
        f"(at most {args.max_requests})", flush=True)
    gold_cycle = itertools.cycle(gold_pool)
    prompts_of = {"gold": gold_cycle, **{name: general_iter for name in ("silver", "capped", "bronze")}}
    sampler.start()
    t0 = time.perf_counter()
    results, window, lag = await open_loop(client, list(tenants.values()), rate, args.duration,
                                           args.max_requests, prompts_of, random.Random(args.seed))
    drained = time.perf_counter() - t0
    sampler.stop_event.set()
    sampler.join()
    out(f"offered over {window:.1f} s (last arrival sent {lag * 1000:.0f} ms late); every reply in after "
        f"{drained:.1f} s\n")

    # 4. Per tenant.
    out("| tenant | priority | limit | offered | offered/s | 200 | 200/s | 429 | 503 | other | "
        "200 latency p50 s | 200 latency p99 s | refusal latency p50 ms |")
    out("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    by = defaultdict(list)
    for r in results:
        by[r.tenant].append(r)
    for t in tenants.values():
        rs = by[t.name]
        ok = [r.latency for r in rs if r.status == 200]
        refused = [r.latency for r in rs if r.status in (429, 503)]
        other = [r for r in rs if r.status not in (200, 429, 503)]
        limit = f"{t.limits['requests_per_minute']} req/min" if t.limits.get("requests_per_minute") else "-"
        out(f"| {t.name} | {t.priority} | {limit} | {len(rs)} | {len(rs) / window:.2f} | {len(ok)} | "
            f"{len(ok) / window:.2f} | {sum(r.status == 429 for r in rs)} | {sum(r.status == 503 for r in rs)} | "
            f"{len(other)} | {fmt_s(pct(ok, .5))} | {fmt_s(pct(ok, .99))} | "
            f"{'-' if not refused else f'{pct(refused, .5) * 1000:.0f}'} |")
    all_ok = [r for r in results if r.status == 200]
    out(f"| all | | | {len(results)} | {len(results) / window:.2f} | {len(all_ok)} | {len(all_ok) / window:.2f} | "
        f"{sum(r.status == 429 for r in results)} | {sum(r.status == 503 for r in results)} | "
        f"{sum(r.status not in (200, 429, 503) for r in results)} | {fmt_s(pct([r.latency for r in all_ok], .5))} | "
        f"{fmt_s(pct([r.latency for r in all_ok], .99))} | |")
    out(f"\nadmitted {len(all_ok) / window:.2f} requests/s under overload = "
        f"{len(all_ok) / window / capacity:.0%} of capacity; completion tokens "
        f"{sum(r.completion_tokens for r in all_ok) / drained:.1f}/s over the {drained:.0f} s to the last reply")
    loaded = [r.latency for r in by["gold"] if r.status == 200]
    p95_u, p95_l = pct(unloaded, .95), pct(loaded, .95)
    ratio = p95_l / p95_u if unloaded and loaded else float("nan")
    p95_a = pct(alone, .95)
    ratio_alone = p95_l / p95_a if alone and loaded else float("nan")
    out(f"gold p95: one at a time {fmt_s(p95_u)} s, its own traffic alone {fmt_s(p95_a)} s, under overload "
        f"{fmt_s(p95_l)} s ({len(loaded)} requests): {ratio_alone:.2f}x its own traffic alone (target <= 2x: "
        f"{'MET' if ratio_alone <= 2 else 'MISSED'}), {ratio:.2f}x one at a time; "
        f"p50 {fmt_s(pct(unloaded, .5))} s / {fmt_s(pct(alone, .5))} s -> {fmt_s(pct(loaded, .5))} s")
    refusals = [r for r in results if r.status in (429, 503)]
    missing = [r for r in refusals if not (r.retry_after or "").strip().isdigit()]
    values = Counter(r.retry_after for r in refusals)
    out(f"Retry-After on every 429/503: {'yes' if not missing else 'NO'} "
        f"({len(refusals) - len(missing)}/{len(refusals)}; values {dict(sorted(values.items()))})")
    if missing:
        failures.append(f"{len(missing)} refusals without a Retry-After header")
    kinds = Counter((r.status, r.code if r.status == 429 else kind_of_503(r.message)) for r in refusals)
    out("refusals by kind: " + ", ".join(f"{s} {k}: {n}" for (s, k), n in sorted(kinds.items(), key=str)))
    for (s, k), n in kinds.items():
        if s == 503 and k.startswith("other 503"):
            failures.append(f"{n} x {k}")
    other = [r for r in results if r.status not in (200, 429, 503)]
    for r in other[:10]:
        out(f"  FAILED: {r.tenant} -> {r.status}: {r.message[:200]}")
    if other:
        failures.append(f"{len(other)} overload requests neither 200, 429 nor 503")
    prompt_toks = [r.prompt_tokens for r in all_ok]
    completion = [r.completion_tokens for r in all_ok]
    out(f"admitted requests: prompt {statistics.mean(prompt_toks):.0f} tokens mean (max {max(prompt_toks)}, "
        f"with the chat template), completion {statistics.mean(completion):.1f} tokens mean (max {max(completion)})"
        if all_ok else "no admitted requests")

    # 5. Memory (and CPU).
    out(f"\n## 5. Peak RSS during the overload ({sampler.samples} samples, every {args.sample_s:g} s, "
        f"over the serve run's process tree), and CPU used over the same {sampler.elapsed:.0f} s\n")
    out("| process | count | peak RSS per process MiB | peak RSS of all of this kind MiB | CPU cores (mean) |")
    out("|---|---|---|---|---|")
    pids_of: dict[str, list[int]] = defaultdict(list)
    for pid, kind in sampler.kind.items():
        pids_of[kind].append(pid)
    tree_cpu = 0.0
    for kind in sorted(pids_of, key=lambda k: -sampler.peak_kind_total[k]):
        cores = sum(sampler.cpu_cores(pid) for pid in pids_of[kind])
        tree_cpu += cores
        out(f"| {kind} | {len(pids_of[kind])} | {mib(max(sampler.peak_rss[pid] for pid in pids_of[kind]))} | "
            f"{mib(sampler.peak_kind_total[kind])} | {cores:.2f} |")
    out(f"| **whole tree** | {len(sampler.kind)} | | **{mib(sampler.peak_total)}** | **{tree_cpu:.2f}** |")
    out("(RSS counts pages shared between processes, e.g. forked workers' libraries, in each.)")
    busy, me = sampler.busy / sampler.elapsed, sampler.me_cpu / sampler.elapsed
    out(f"machine's CPUs busy {busy:.2f} of {os.cpu_count()} cores: the serve run {tree_cpu:.2f}, this load generator "
        f"{me:.2f}, other processes {max(0.0, busy - tree_cpu - me):.2f}")
    workers = [pid for pid, kind in sampler.kind.items() if kind == ENGINE_KINDS[2]]
    affinity = []
    for pid in workers:
        try:
            affinity.append(sorted(psutil.Process(pid).cpu_affinity()))
        except psutil.Error:
            pass
    out(f"vLLM CPU workers' CPU affinity: {affinity} (machine: {sorted(psutil.Process().cpu_affinity())})")

    # 6. No crash.
    out("\n## 6. After the overload", flush=True)
    after = await client.chat(tenants["gold"], general[0], "after")
    out(f"a normal gold request: {after.status} in {after.latency:.2f} s")
    if after.status != 200:
        failures.append(f"the request after the overload got {after.status}: {after.message[:200]}")
    ready = await client.http.get("/readyz", timeout=60)
    body = ready.json() if ready.headers.get("content-type", "").startswith("application/json") else {}
    out(f"/readyz: {ready.status_code}, Engine replicas healthy {body.get('healthy_replicas')}/{body.get('replicas')}")
    if ready.status_code != 200 or body.get("healthy_replicas") != 2:
        failures.append(f"/readyz after the overload: {ready.status_code} {ready.text[:200]}")
    engines_after = engine_processes(sampler)
    same = engines_before == engines_after and {k for k, _, _ in engines_before} == set(ENGINE_KINDS)
    out(f"Engine replica, EngineCore and vLLM worker processes (pid, start time): {len(engines_before)} before, "
        f"{len(engines_after)} after, {'the same' if same else 'CHANGED'} "
        f"(pids {sorted(p for _, p, _ in engines_before)} -> {sorted(p for _, p, _ in engines_after)})")
    if not same:
        failures.append("Engine replica processes changed: a replica restarted")

    # The ledger: one record per admitted request (every phase), none for a refusal.
    admitted = {r.request_id: r for r in client.results if r.status == 200}
    refused_ids = {r.request_id for r in client.results if r.status in (429, 503) and r.request_id}
    deadline = time.time() + 30
    while True:
        rows = ledger_rows(db_path)
        if set(admitted) <= set(rows) or time.time() > deadline:
            break
        await asyncio.sleep(0.5)
    missing_records = set(admitted) - set(rows)
    extra = set(rows) - set(admitted)
    tenant_ids = {t.id: t.name for t in [*tenants.values(), *ramp_tenants]}
    wrong = [i for i, r in admitted.items() if i in rows and (tenant_ids.get(rows[i][0]) != r.tenant
                                                               or rows[i][2] != r.completion_tokens)]
    billed_refusals = refused_ids & set(rows)
    overload_ids = {r.request_id for r in all_ok}
    replicas_overload = Counter(rows[i][3] for i in overload_ids if i in rows)
    out(f"usage ledger: {len(rows)} records for {len(admitted)} admitted requests (all phases; "
        f"{len(overload_ids)} in the overload); missing {len(missing_records)}, without an admitted reply "
        f"{len(extra)}, tenant or completion tokens differing from the reply {len(wrong)}, refusals with a "
        f"record {len(billed_refusals)} (of {len(refused_ids)})")
    out(f"overload requests per Engine replica (ledger): {dict(replicas_overload)}")
    replica_of = {i: row[3] for i, row in rows.items()}
    gold_unloaded = [r for r in client.results if r.tenant == "gold" and r.phase == "unloaded" and r.status == 200]
    gold_loaded = [r for r in all_ok if r.tenant == "gold"]
    n_u, _ = company(gold_unloaded, list(admitted.values()), replica_of)
    n_l, by_tenant = company(gold_loaded, list(admitted.values()), replica_of)
    out(f"gold's company: while a gold request ran, other requests on its Engine replica: {n_u:.2f} unloaded, "
        f"{n_l:.2f} under overload (" + ", ".join(f"{t} {n:.2f}" for t, n in sorted(by_tenant.items())) + ")")
    if missing_records or extra or wrong or billed_refusals:
        failures.append("the usage ledger does not hold exactly one record per admitted request")
    # Refusals are counted (never billed): the platform's count against what the client saw.
    seen = Counter()
    for r in client.results:
        if r.status == 429:
            seen[(r.tenant, f"429:{r.code}")] += 1
        elif r.status == 503:  # as the ingress records the reason (openai_routes)
            kind = kind_of_503(r.message)
            seen[(r.tenant, "503:shed" if kind.startswith("shed") else
                  "503:queue_full" if kind == "Serve queue full" else "503")] += 1
    deadline = time.time() + 20
    while True:
        counted = Counter({(tenant_ids.get(t, t), reason): n for (t, reason), n in rejection_counts(db_path).items()})
        if counted == seen or time.time() > deadline:
            break
        await asyncio.sleep(0.5)
    out(f"refusals counted by the platform (usage_rejections) {'match' if counted == seen else 'DIFFER FROM'} "
        f"the client's: {dict(sorted(counted.items()))}")
    if counted != seen:
        out(f"  client saw: {dict(sorted(seen.items()))}")
        failures.append("the platform's refusal counts differ from the client's")

    out("\n" + ("NO FAILURES" if not failures else "FAILURES:\n  " + "\n  ".join(failures)))
    return 1 if failures else 0


def parse_ladder(text: str) -> dict[int, int]:
    return {int(p): int(n) for p, n in (part.split(":") for part in text.split(","))}


def parse_shares(text: str) -> dict[str, float]:
    shares = {k: float(v) for k, v in (part.split("=") for part in text.split(","))}
    if set(shares) != {"gold", "silver", "capped", "bronze"}:
        raise argparse.ArgumentTypeError("--shares names gold, silver, capped and bronze")
    total = sum(shares.values())
    return {k: v / total for k, v in shares.items()}


def interrupted(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--duration", type=float, default=90, help="seconds of open-loop arrivals")
    ap.add_argument("--alone-duration", type=float, default=60,
                    help="seconds of gold's own arrivals alone (its latency without the other tenants)")
    ap.add_argument("--max-requests", type=int, default=900, help="at most this many open-loop arrivals")
    ap.add_argument("--overload-factor", type=float, default=3.0, help="open-loop rate / measured capacity")
    ap.add_argument("--shares", type=parse_shares, default=parse_shares("gold=0.08,silver=0.12,capped=0.15,bronze=0.65"),
                    help="each tenant's share of the arrivals")
    ap.add_argument("--capped-rpm", type=int, default=None,
                    help="capped's requests_per_minute (default: --capped-fraction of what it offers)")
    ap.add_argument("--capped-fraction", type=float, default=0.25)
    ap.add_argument("--ramp", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2, 4, 8])
    ap.add_argument("--ramp-requests-per-slot", type=int, default=2,
                    help="requests per level = this x concurrency + 4 (at least 6)")
    ap.add_argument("--gold-pool", type=int, default=12, help="gold's prompts: each once unloaded, cycled under load")
    ap.add_argument("--max-prompt-tokens", type=int, default=256)
    ap.add_argument("--max-tokens", type=int, default=32, help="cap of max_tokens (else the ShareGPT answer's length)")
    ap.add_argument("--shed-ladder", type=parse_ladder, default=parse_ladder("0:1,50:2,100:8"),
                    help="engine_deployment.shedding.requests_by_priority as priority:requests,...")
    ap.add_argument("--kv-tokens", type=int, default=8192, help="KV cache per Engine replica, in tokens")
    ap.add_argument("--sample-s", type=float, default=0.5, help="RSS sampling period")
    ap.add_argument("--port", type=int, default=8100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                    type=lambda kv: tuple(kv.split("=", 1)),
                    help="an environment variable for the serve run and every process it starts (repeatable), "
                         "e.g. VLLM_CPU_OMP_THREADS_BIND=nobind")
    ap.add_argument("--serve-log", type=Path, default=None,
                    help="keep a copy of the serve run's log there (default: it is deleted)")
    args = ap.parse_args()

    if port_in_use(args.port):
        sys.exit(f"port {args.port} is taken; pick another with --port")
    # SIGTERM as Ctrl-C: the finally below stops the serve run either way.
    signal.signal(signal.SIGTERM, interrupted)
    started = time.time()
    model_dir = ROOT / "models" / MODEL
    prompts = build_prompts(model_dir, args.max_prompt_tokens, args.max_tokens, args.seed)
    print(f"# Overload benchmark: {time.strftime('%Y-%m-%d %H:%M:%S')}, load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}, {os.cpu_count()} CPUs, "
          f"{psutil.virtual_memory().total / 2**30:.0f} GiB\n")
    print(f"platform: serve run of serve_config.yaml with 2 Engine replicas (num_cpus 0.5, max_num_seqs 4, "
          f"KV cache {args.kv_tokens} tokens each, float32), 1 ingress; shedding requests_by_priority={args.shed_ladder} "
          f"per replica; vLLM scheduling_policy=priority"
          + (f"; environment {' '.join(f'{k}={v}' for k, v in args.env)}" if args.env else ""))
    print(f"prompts: {len(prompts)} first user turns of ShareGPT conversations, cut to {args.max_prompt_tokens} tokens "
          f"(mean {statistics.mean(p.prompt_tokens for p in prompts):.0f}); max_tokens = the answer's length capped at "
          f"{args.max_tokens} (mean {statistics.mean(p.max_tokens for p in prompts):.1f}); temperature 0; "
          f"non-streaming chat completions", flush=True)

    admin_token = secrets.token_urlsafe(16)
    base_url = f"http://127.0.0.1:{args.port}"
    with tempfile.TemporaryDirectory(prefix="bench-overload-") as tmp_dir:
        tmp = Path(tmp_dir)
        run = ServeRun(write_config(tmp, args), tmp / "serve_run.log", admin_token, base_url, dict(args.env))
        code = 1
        try:
            t0 = time.time()
            run.wait_ready()
            print(f"serve run ready in {time.time() - t0:.0f} s", flush=True)

            async def go():
                client = Client(base_url, admin_token)
                try:
                    return await bench(args, run, client, tmp / "loraplex.db", prompts)
                finally:
                    await client.http.aclose()

            code = asyncio.run(go())
        except BaseException as exc:
            print(f"\nthe run stopped: {exc!r}\n--- serve run log (tail) ---\n{run.log_tail()}", flush=True)
            if not isinstance(exc, Exception):
                raise
        finally:
            t0 = time.time()
            run.stop()
            if args.serve_log:
                args.serve_log.write_bytes((tmp / "serve_run.log").read_bytes())
            print(f"\nserve run stopped in {time.time() - t0:.0f} s; whole run {time.time() - started:.0f} s", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
