"""Replicas SIGKILLed mid-stream on the real engine (issue 48).

An Engine replica: its streams move to the other replica and finish as one uninterrupted reply (a
normal finish reason, no error event, the text of a run without the kill), each billed once for
what its client received; vLLM's EngineCore of the killed replica goes with it
(engine/orphan_guard.py).

An Ingress replica: the engine requests it was streaming are aborted within 2 s (not generated to
their end for no one: engine/caller_watch.py) and billed for what was generated; new requests flow
through the other Ingress replica.

On the pool of engine_pool.py (two Engine replicas and one Ingress replica, two for the Ingress
drill; deployed as `serve deploy` does). The Ingress, proxy and controller kills are drills
(`-m drill`, docs/testing.md#drills): CI runs the Engine replica's.
With `ingress.max_migrations: 0` the cut streams end with the error event and this test fails
(engine_pool.MAX_MIGRATIONS; see docs/operations.md).
"""

import json
import os
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select

from loraplex.accounting.tables import usage_records
from loraplex.db.engine import make_engine
from engine_pool import deploy_whole, replicas, wait_whole
from process_tree import alive, descendants
from tenant_keys import ADMIN_TOKEN, new_tenant_key
from waiting import wait_until

pytestmark = pytest.mark.integration

STREAMS = 6
MAX_TOKENS = 96


def engine_replicas() -> list[dict]:
    return replicas("Engine")


@pytest.fixture(scope="module")
def two_engines(engine_pool):
    """(base_url, state dir): the pool with its two Engine replicas and its Ingress replica running."""
    deploy_whole(engine_pool[1])
    return engine_pool


class Stream(threading.Thread):
    """One greedy chat stream (usage in every chunk): what its client received."""

    def __init__(self, base_url: str, key: str, i: int, max_tokens: int = MAX_TOKENS):
        super().__init__(daemon=True)
        self.base_url, self.key, self.i, self.max_tokens = base_url, key, i, max_tokens
        self.text, self.finish, self.errors, self.usage = "", None, [], None
        self.tokens = 0  # completion tokens so far, from the per-chunk usage
        self.request_id, self.failure = None, None

    def run(self):
        body = {"model": "SmolLM2-135M-Instruct", "max_tokens": self.max_tokens, "temperature": 0, "stream": True,
                "messages": [{"role": "user", "content": f"Write a short story about a robot named R{self.i}."}],
                "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
        try:
            with httpx.stream("POST", f"{self.base_url}/v1/chat/completions", json=body, timeout=300,
                              headers={"Authorization": f"Bearer {self.key}"}) as reply:
                self.request_id = reply.headers["x-loraplex-request-id"]
                for line in reply.iter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    event = json.loads(line.removeprefix("data: "))
                    if "error" in event:
                        self.errors.append(event["error"])
                        continue
                    if event.get("usage"):
                        self.usage = event["usage"]
                        self.tokens = self.usage["completion_tokens"]
                    for choice in event["choices"]:
                        self.text += choice["delta"].get("content") or ""
                        self.finish = choice["finish_reason"] or self.finish
        except Exception as exc:  # a bare cut or a hang
            self.failure = exc


def run_streams(base_url: str, keys: list[str], kill=None, max_tokens: int = MAX_TOKENS,
                under_way: int = STREAMS) -> list[Stream]:
    """STREAMS streams; `kill()` once `under_way` of them have their first tokens (a stream the
    router queued behind a full replica starts only when another ends)."""
    streams = [Stream(base_url, keys[i % len(keys)], i, max_tokens) for i in range(STREAMS)]
    for s in streams:
        s.start()
    if kill is not None:
        wait_until(lambda: sum(s.tokens >= 8 for s in streams) >= under_way or any(s.failure for s in streams),
                   300, f"{under_way} streams' first tokens")
        kill()
    for s in streams:
        s.join(timeout=600)
        assert not s.is_alive(), "a stream hung"
    return streams


@pytest.fixture(scope="module")
def keys(two_engines) -> list[str]:
    with httpx.Client(base_url=two_engines[0], headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
                      timeout=60) as admin:
        return [new_tenant_key(admin, f"migrate-{t}") for t in range(2)]


def usage_rows(state, ids: list[str], streams: list | None = None) -> dict:
    db = make_engine(f"sqlite:///{state}/loraplex.db")

    def rows():
        with db.connect() as conn:
            return {r.request_id: r for r in conn.execute(
                select(usage_records).where(usage_records.c.request_id.in_(ids)))}

    def all_rows():
        found = rows()
        return found if len(found) == len(ids) else None
    try:
        return wait_until(all_rows, 60, f"one usage record for each of {len(ids)} requests")
    except AssertionError as exc:
        missing = set(ids) - set(rows())
        raise AssertionError(f"{exc}; none for {sorted(missing, key=str)}; streams "
                             f"{[(s.i, s.request_id, s.finish, s.failure, s.tokens) for s in streams or []]}") from None


def test_streams_on_a_killed_engine_replica_finish_on_the_other_billed_once(two_engines, keys):
    base_url, state = two_engines
    unkilled = run_streams(base_url, keys)
    assert all(s.finish == "length" and not s.errors and s.failure is None for s in unkilled)

    killed = {}

    def kill_one_replica():
        # The replica holding the most streams (the router may have put them all on one): its
        # in_flight as /admin/replicas reports it (asked now, or from its last routing stats).
        with httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=60) as admin:
            load = {r["replica_id"]: r.get("in_flight", 0) for r in admin.get("/admin/replicas").json()["data"]}
        running = [r for r in engine_replicas() if r["state"] == "RUNNING"]
        replica = max(running, key=lambda r: load.get(r["replica_id"], -1))
        pid = replica["pid"]
        killed["pid"], killed["core"] = pid, [c for c in descendants(pid) if "orphan_guard" not in
                                              Path(f"/proc/{c}/cmdline").read_bytes().decode(errors="replace")]
        os.kill(pid, signal.SIGKILL)

    streams = run_streams(base_url, keys, kill=kill_one_replica)
    report = [(s.i, s.finish, s.errors, s.failure, s.tokens) for s in streams]
    assert all(s.failure is None for s in streams), report
    assert all(not s.errors for s in streams), report  # no error event: the cut streams moved
    assert all(s.finish == "length" and s.usage["completion_tokens"] == MAX_TOKENS for s in streams), report
    same = [s.text == u.text for s, u in zip(streams, unkilled)]
    # Greedy on CPU: a different batch on the new replica can tip a near tie; never more than one here.
    assert sum(same) >= STREAMS - 1, [(s.text, u.text) for s, u, ok in zip(streams, unkilled, same) if not ok]
    # vLLM's EngineCore of the killed replica dies with it (the orphan guard).
    assert killed["core"]
    wait_until(lambda: not any(alive(c) for c in killed["core"]), 30, "the killed replica's EngineCore to die")

    rows = usage_rows(state, [s.request_id for s in streams], streams)
    for s in streams:  # billed once: the prompt as the client's usage says, every token it received
        row = rows[s.request_id]
        assert (row.status, row.prompt_tokens, row.completion_tokens) == (
            "length", s.usage["prompt_tokens"], s.usage["completion_tokens"]), (s.i, row)
    moved = [r for r in rows.values() if r.migrated_prompt_tokens > 0]
    print(f"\nengine kill: {len(moved)}/{STREAMS} streams moved, {sum(same)}/{STREAMS} texts equal to the unkilled "
          f"run, finish reasons {sorted({s.finish for s in streams})}, error events {sum(len(s.errors) for s in streams)}, "
          f"migrated_prompt_tokens {[r.migrated_prompt_tokens for r in moved]}")
    assert moved, "the kill should have moved at least one stream"
    assert all(r.migrated_prompt_tokens > r.prompt_tokens for r in moved)  # the prompt and the text so far


@pytest.mark.drill
def test_an_ingress_replica_killed_mid_stream_leaves_no_engine_request_running(two_engines, keys):
    base_url, state = two_engines
    deploy_whole(state, ingresses=2)  # a second Ingress replica to kill; a killed Engine replica replaced
    killed_at = {}

    def kill_one_ingress():
        pid = next(r for r in replicas("Ingress") if r["state"] == "RUNNING")["pid"]
        os.kill(pid, signal.SIGKILL)
        killed_at["t"] = time.time()

    # Killed once 4 streams run: the two Engine replicas hold 8 (max_num_seqs 4), but the router
    # may queue a sixth behind a full one, and the others would finish while it waits.
    streams = run_streams(base_url, keys, kill=kill_one_ingress, max_tokens=200, under_way=4)
    # Cut: the connection broke, or Serve's proxy ended the reply early (no finish reason, no [DONE]).
    cut = [s for s in streams if s.failure is not None or s.finish is None]
    assert cut, ("some streams should have gone through the killed Ingress replica",
                 [(s.i, s.finish, s.failure, s.tokens) for s in streams])
    assert all(s.finish == "length" for s in streams if s not in cut)
    # A stream still queued at the kill had no headers yet (they leave with its first tokens): its
    # engine call left the queue with its caller, unbilled (unit/engine/test_engine_fair_queue.py).
    cut = [s for s in cut if s.request_id is not None]
    assert cut, [(s.i, s.finish, s.failure, s.tokens) for s in streams]
    rows = usage_rows(state, [s.request_id for s in cut], streams)
    for s in cut:  # aborted within 2 s of the kill, billed for what was generated by then
        row = rows[s.request_id]
        stopped = row.finish_time.timestamp() - killed_at["t"]
        assert row.status == "client_disconnect" and stopped < 2.0, (s.i, row.status, stopped)
        assert s.tokens <= row.completion_tokens < 200
    print(f"\ningress kill: {len(cut)}/{STREAMS} streams cut; their engine requests stopped "
          f"{[round(rows[s.request_id].finish_time.timestamp() - killed_at['t'], 2) for s in cut]} s after the kill, "
          f"billed {[rows[s.request_id].completion_tokens for s in cut]} tokens for {[s.tokens for s in cut]} received")
    # New requests flow through the other Ingress replica 5 s after the kill.
    time.sleep(max(killed_at["t"] + 5 - time.time(), 0))
    with httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {keys[0]}"}, timeout=120) as client:
        codes = [client.post("/v1/chat/completions", json={
            "model": "SmolLM2-135M-Instruct", "max_tokens": 2,
            "messages": [{"role": "user", "content": f"hi {i}"}]}).status_code for i in range(10)]
    assert codes == [200] * 10


@pytest.mark.drill
def test_the_serve_proxy_killed_mid_stream_leaves_no_engine_request_running(two_engines, keys):
    """Serve's HTTP proxy is to an Ingress replica what an Ingress replica is to an Engine replica:
    the caller of its requests. Killed, its connections break; the Ingress replicas must stop
    reading their engine streams for no one (and the engine stop generating them), billed for what
    was generated; Serve starts a new proxy and the platform answers again."""
    from ray._private.state import actors
    from ray.serve.context import _get_global_client

    base_url, state = two_engines
    deploy_whole(state)
    killed_at = {}

    def kill_the_proxy():
        [proxy] = _get_global_client().get_serve_details()["proxies"].values()  # one node: one proxy
        os.kill(actors(actor_id=proxy["actor_id"])["Pid"], signal.SIGKILL)
        killed_at["t"] = time.time()

    streams = run_streams(base_url, keys, kill=kill_the_proxy, max_tokens=200, under_way=4)
    cut = [s for s in streams if s.request_id is not None]  # every stream went through the proxy
    assert cut and all(s.failure is not None or s.finish is None for s in cut), \
        [(s.i, s.finish, s.failure, s.tokens) for s in streams]
    rows = usage_rows(state, [s.request_id for s in cut], streams)
    stopped = {s.i: round(rows[s.request_id].finish_time.timestamp() - killed_at["t"], 2) for s in cut}
    print(f"\nproxy kill: {len(cut)}/{STREAMS} streams cut; their engine requests stopped {stopped} s after the "
          f"kill, billed {[rows[s.request_id].completion_tokens for s in cut]} tokens for "
          f"{[s.tokens for s in cut]} received, statuses {sorted({rows[s.request_id].status for s in cut})}")
    for s in cut:  # aborted soon after the kill, billed for what was generated by then
        row = rows[s.request_id]
        assert row.status == "client_disconnect" and stopped[s.i] < 5.0, (s.i, row.status, stopped[s.i])
        assert s.tokens <= row.completion_tokens < 200

    def answers() -> bool:  # Serve starts a new proxy on the same port
        reply = httpx.post(f"{base_url}/v1/chat/completions", headers={"Authorization": f"Bearer {keys[0]}"},
                           timeout=30, json={"model": "SmolLM2-135M-Instruct", "max_tokens": 2,
                                             "messages": [{"role": "user", "content": "hi"}]})
        return reply.status_code == 200
    wait_until(answers, 120, "a new Serve proxy to answer", interval_s=1)
    print(f"proxy kill: answered again {time.time() - killed_at['t']:.1f} s after the kill")


@pytest.mark.drill
def test_a_killed_serve_controller_replaces_no_replica_and_cuts_no_stream(two_engines, keys):
    """Serve's controller killed mid-stream: Ray restarts it, and it recovers the running replicas
    (asking each, among other things, for its log file: serve_log.py). The streams finish as
    without the kill, none moved, and every replica is the one from before. With the replicas' log
    handler closed by vLLM's logging setup, the recovering controller replaced every Engine
    replica and their streams hit their deadlines (`python -m bench drill --drills controller`)."""
    from ray._private.state import actors
    from ray.serve.context import _get_global_client

    base_url, state = two_engines
    deploy_whole(state)
    before = {d: {r["replica_id"] for r in replicas(d)} for d in ("Engine", "Ingress")}
    killed_at = {}

    def kill_the_controller():
        [pid] = [a["Pid"] for a in actors().values()
                 if a["ActorClassName"] == "ServeController" and a["State"] == "ALIVE"]
        os.kill(pid, signal.SIGKILL)
        killed_at["t"] = time.time()

    streams = run_streams(base_url, keys, kill=kill_the_controller, under_way=4)
    assert all(s.finish == "length" and not s.errors and s.failure is None for s in streams), \
        [(s.i, s.finish, s.errors, s.failure, s.tokens) for s in streams]
    rows = usage_rows(state, [s.request_id for s in streams], streams)
    assert not [r.request_id for r in rows.values() if r.migrated_prompt_tokens], "a stream moved"

    def recovered():  # the restarted controller answers, and has had time to check every replica
        _get_global_client().get_serve_details()
        return time.time() - killed_at["t"] > 20
    wait_until(recovered, 120, "the Serve controller to answer again", interval_s=1)
    wait_whole()
    assert {d: {r["replica_id"] for r in replicas(d)} for d in ("Engine", "Ingress")} == before
