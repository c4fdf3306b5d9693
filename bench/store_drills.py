"""The store drills of `python -m bench drill` (issue 50): a store fails under a steady load and
comes back; what the clients saw per kind of request, the ledger against their own counts, and the
seconds to recover (docs/operations.md, the fault table's drills).

- store-down: the adapter store (moto S3) frozen `--store-down-s` under base-model, cached-adapter,
  uncached-adapter-version requests and uploads;
- spool-full: the usage spool's tmpfs filled, then freed;
- cache-full: the adapter cache's tmpfs filled (requests for versions not yet on the replica), then freed;
- slow-db: every PostgreSQL reply `--slow-db-latency-s` late (tests/delay_proxy.py), then prompt.

They run on a platform the drill starts (bench/drill_platform.py), one drill after the other, each
with its own tenant, so that each one's ledger rows are its own."""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import sys
import time
from dataclasses import dataclass
from typing import Callable

import httpx

from bench.demo_adapters import synthetic_adapter
from bench.drill_platform import DrillPlatform
from bench.fault_tally import Seen, check_ledger, fault_rows
from bench.scenarios.drill import MODEL, REQUESTS, Request, prompts
from bench.steady_load import Kind, SteadyLoad
from bench.tenants import new_tenant

SEEDS = itertools.count(5000)  # every synthetic adapter of a run distinct (another sha256: another version)


class Upload(Request):
    """An adapter upload as a drill request (the same fields a client saw, no usage)."""

    def __init__(self, base_url: str, key: str, name: str, archive: bytes, timeout_s: float):
        super().__init__(base_url, key, "", 0, False, timeout_s=timeout_s)
        self.name, self.archive, self.version = name, archive, None

    def send(self):
        reply = httpx.post(f"{self.base_url}/v1/adapters", headers={"Authorization": f"Bearer {self.key}"},
                           data={"name": self.name}, files={"file": ("a.tar.gz", self.archive, "application/gzip")},
                           timeout=self.timeout_s)
        self.status = reply.status_code
        if reply.status_code == 201:
            self.version = reply.json()["version"]
        else:
            self.refused(reply)


@dataclass
class Fault:
    """One drill: its fault (`on`, `off`), how long, and the words its refusals must name."""

    name: str
    on: Callable[[], None]
    off: Callable[[], None]
    seconds: float
    store_words: tuple[str, ...]


class Drills:
    def __init__(self, platform: DrillPlatform, args):
        self.platform, self.args = platform, args
        self.texts = prompts(64, max_chars=args.prompt_chars)
        self.warmed: list[Seen] = []  # the requests that loaded a drill's cached adapter

    def tenant(self, name: str) -> tuple[str, str]:
        # Concurrency for every request the deadline may hold: a 429 of the plan's limit is not the fault's.
        limits = {"max_concurrent_requests": int(self.args.rate * self.args.deadline_s) + 8}
        return new_tenant(self.platform.base_url, self.platform.admin_token, f"{name}-{int(time.time())}", limits)

    def upload(self, key: str, name: str) -> str:
        """A new synthetic version of `name`, stored before the fault; its `name@version`."""
        reply = Upload(self.platform.base_url, key, name, synthetic_adapter(next(SEEDS)), 120)
        reply.run()
        if reply.status != 201:
            raise SystemExit(f"drill: upload of {name} answered {reply.status}: {reply.message}")
        return f"{name}@{reply.version}"

    def chat(self, key: str, model: str) -> Callable[[int], Request]:
        return lambda i: Request(self.platform.base_url, key, self.texts[i % len(self.texts)], self.args.load_tokens,
                                 False, model=model, timeout_s=self.args.deadline_s)

    def kinds(self, key: str, cached: bool = True, uncached: int = 0, uploads: bool = False) -> list[Kind]:
        """The load's kinds: the base model; an adapter version loaded before the fault; versions not yet
        on the replica (`uncached` of them, one per request, each asked for once); uploads."""
        kinds = [Kind("base model", self.chat(key, MODEL))]
        if cached:
            version = self.upload(key, "warm")
            warm = Request(self.platform.base_url, key, "hi", 2, False, model=version)
            warm.run()  # now on the replica; billed, so in the ledger check
            self.warmed.append(warm.seen("warm-up"))
            kinds.append(Kind("cached adapter", self.chat(key, version)))
        if uncached:
            fresh = iter([self.upload(key, f"cold{i}") for i in range(uncached)])
            kinds.append(Kind("uncached version", lambda i: self.chat(key, next(fresh, MODEL))(i), every=2))
        if uploads:
            kinds.append(Kind("upload", lambda i: Upload(self.platform.base_url, key, "up",
                                                         synthetic_adapter(next(SEEDS)), self.args.deadline_s),
                              every=self.args.upload_every))
        return kinds

    def run(self, fault: Fault, tenant: str, kinds: list[Kind]) -> list[dict]:
        """Steady load: `--before-s` as usual, the fault for its seconds, `--after-s` after it; then the
        table's rows (per kind) with the ledger of `tenant` against the replies."""
        print(f"  {fault.name}: load {self.args.rate:g} req/s, fault for {fault.seconds:g} s", file=sys.stderr)
        load = SteadyLoad(kinds, self.args.rate).start()
        began = time.time()
        time.sleep(self.args.before_s)
        faulted = time.time()
        fault.on()
        try:
            time.sleep(fault.seconds)
        finally:
            fault.off()
        cleared = time.time()
        time.sleep(self.args.after_s)
        seen = load.stop(join_s=self.args.deadline_s + 10)
        ended = time.time()
        billable = [s for s in seen if s.kind != "upload"] + self.warmed
        self.warmed = []
        ledger = self.ledger(tenant, billable)
        caught_up = time.time() - ended
        rows = fault_rows(fault.name, seen, (began, faulted, cleared, ended), self.args.deadline_s,
                          fault.store_words, ledger, caught_up)
        rows[0][REQUESTS] = [dataclasses.asdict(s) for s in seen]  # each request's end: the JSON output
        return rows

    def ledger(self, tenant: str, billable: list[Seen], wait_s: float = 120):
        """The tenant's ledger rows once they hold every served request (or after `wait_s`)."""
        from sqlalchemy import select

        from loraplex.accounting.tables import usage_records
        from loraplex.db.engine import make_engine

        db = make_engine(self.platform.database_url)
        deadline = time.monotonic() + wait_s
        while True:
            with db.connect() as conn:
                found = conn.execute(select(usage_records.c.request_id, usage_records.c.completion_tokens)
                                     .where(usage_records.c.tenant_id == tenant)).all()
            check = check_ledger(billable, {r.request_id: r.completion_tokens for r in found}, len(found))
            if check.lost == 0 or time.monotonic() > deadline:
                db.dispose()
                return check
            time.sleep(1)

    # -- the drills

    def store_down(self) -> list[dict]:
        tenant, key = self.tenant("store-down")
        turns = (self.args.before_s + self.args.store_down_s + self.args.after_s) * self.args.rate / 3.5 + 4
        kinds = self.kinds(key, uncached=int(turns / 2) + 2, uploads=True)
        p = self.platform
        return self.run(Fault(f"adapter store (S3) frozen {self.args.store_down_s:g} s", p.freeze_store,
                              p.thaw_store, self.args.store_down_s, ("adapter store", p.store_url)), tenant, kinds)

    def spool_full(self) -> list[dict]:
        tenant, key = self.tenant("spool-full")
        return self.run(self.disk_fault("usage spool", self.platform.spool_dir), tenant, self.kinds(key))

    def cache_full(self) -> list[dict]:
        tenant, key = self.tenant("cache-full")
        turns = (self.args.before_s + self.args.disk_full_s + self.args.after_s) * self.args.rate / 3
        kinds = self.kinds(key, uncached=int(turns / 2) + 2)
        return self.run(self.disk_fault("adapter cache", self.platform.cache_dir), tenant, kinds)

    def disk_fault(self, what: str, disk) -> Fault:
        from small_disk import fill  # tests/ is on sys.path: bench/drill_platform.py

        filler = disk / "filler"
        return Fault(f"{what} disk full {self.args.disk_full_s:g} s", lambda: fill(disk),
                     lambda: os.remove(filler), self.args.disk_full_s, (str(disk),))

    def slow_db(self) -> list[dict]:
        tenant, key = self.tenant("slow-db")
        proxy = self.platform.proxy
        late = self.args.slow_db_latency_s
        return self.run(Fault(f"database +{late:g} s per reply", lambda: proxy.set_latency(late),
                              lambda: proxy.set_latency(0.0), self.args.slow_db_s, ("database",)), tenant,
                        self.kinds(key))


STORE_DRILLS = {"store-down": Drills.store_down, "spool-full": Drills.spool_full,
                "cache-full": Drills.cache_full, "slow-db": Drills.slow_db}


def add_arguments(parser) -> None:
    parser.add_argument("--rate", type=float, default=1.0, help="store drills: requests/s of the steady load")
    parser.add_argument("--deadline-s", type=float, default=60.0,
                        help="store drills: a request not ended within this is counted hung")
    parser.add_argument("--load-tokens", type=int, default=8,
                        help="store drills: max_tokens of each chat request (the load must stay under capacity)")
    parser.add_argument("--prompt-chars", type=int, default=200, help="store drills: ShareGPT prompts shorter than this")
    parser.add_argument("--before-s", type=float, default=15.0)
    parser.add_argument("--after-s", type=float, default=30.0)
    parser.add_argument("--store-down-s", type=float, default=60.0)
    parser.add_argument("--disk-full-s", type=float, default=30.0)
    parser.add_argument("--slow-db-s", type=float, default=30.0)
    parser.add_argument("--slow-db-latency-s", type=float, default=0.5)
    parser.add_argument("--upload-every", type=int, default=5, help="store-down: an upload every N turns of the load")
    parser.add_argument("--store-timeout-s", type=float, default=5.0, help="the platform's registry.store_timeout_s")
    parser.add_argument("--spool-size", default="4m", help="the usage spool's tmpfs")
    parser.add_argument("--cache-size", default="16m", help="the adapter cache's tmpfs")


def run_store_drills(names: list[str], args) -> list[dict]:
    """Start the platform on the drill's stores, run each named drill, return the table's rows."""
    from bench.drill_platform import drill_platform

    rows = []
    with drill_platform(args.spool_size, args.cache_size, args.store_timeout_s) as platform:
        drills = Drills(platform, args)
        for name in names:
            print(f"drill {name} ...", file=sys.stderr)
            done = STORE_DRILLS[name](drills)
            print(json.dumps([{k: v for k, v in row.items() if k != REQUESTS} for row in done]),
                  file=sys.stderr)  # its figures, should a later drill fail
            rows += done
            time.sleep(5)
    return rows
