"""Tenant limits through HTTP with the real engine and two ingress replicas sharing the limiter."""

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone

import httpx
import pytest

from loraplex.admission.core import next_month_start
from waiting import wait_until

pytestmark = pytest.mark.integration

APP = "loraplex"


def tenant(admin, name, **limits):
    created = admin.post("/admin/tenants", json={"name": name, "limits": limits})
    assert created.status_code == 201, created.text
    tid = created.json()["id"]
    key = admin.post(f"/admin/tenants/{tid}/keys")
    assert key.status_code == 201, key.text
    return tid, {"Authorization": f"Bearer {key.json()['key']}"}


def chat(base_url, headers, model_name, max_tokens=1, stream=False, timeout=120):
    return httpx.post(f"{base_url}/v1/chat/completions", headers=headers, timeout=timeout, json={
        "model": model_name, "messages": [{"role": "user", "content": "Say hi"}], "max_tokens": max_tokens,
        "temperature": 0, "stream": stream})


def refused(r, code):
    assert r.status_code == 429, r.text
    assert r.json()["error"]["code"] == code, r.text
    return int(r.headers["Retry-After"])


def eventually_200(base_url, headers, model_name, within_s=6.0):
    deadline = time.monotonic() + within_s
    while True:
        r = chat(base_url, headers, model_name)
        if r.status_code == 200 or time.monotonic() > deadline:
            return r
        time.sleep(0.25)


def test_requests_per_minute_429_with_retry_after_then_admitted_again(base_url, admin, model_name):
    _, key = tenant(admin, "limits-rpm", requests_per_minute=6)
    assert [chat(base_url, key, model_name).status_code for _ in range(6)] == [200] * 6
    retry = refused(chat(base_url, key, model_name), "rate_limit_requests")
    assert 1 <= retry <= 10  # one request per 10 s
    time.sleep(retry)
    assert chat(base_url, key, model_name).status_code == 200


def test_tokens_per_minute_429_with_retry_after_then_admitted_again(base_url, admin, model_name):
    _, key = tenant(admin, "limits-tpm", tokens_per_minute=400)  # 151 charged each: two fit
    with ThreadPoolExecutor(3) as pool:
        replies = list(pool.map(lambda _: chat(base_url, key, model_name, max_tokens=150), range(3)))
    codes = sorted(r.status_code for r in replies)
    assert codes == [200, 200, 429], codes
    retry = refused(next(r for r in replies if r.status_code == 429), "rate_limit_tokens")
    assert 1 <= retry <= 25  # at most the 151 tokens missing, at 400/60 per second
    time.sleep(retry + 0.2)
    assert chat(base_url, key, model_name, max_tokens=150).status_code == 200


def test_concurrency_429_then_admitted_when_the_stream_ends_or_the_client_goes(base_url, admin, model_name):
    _, key = tenant(admin, "limits-concurrency", max_concurrent_requests=1)
    started = threading.Event()

    def long_stream(disconnect):
        body = {"model": model_name, "messages": [{"role": "user", "content": "Count to one hundred."}],
                "max_tokens": 80, "temperature": 0, "stream": True, "ignore_eos": True}
        for _ in range(10):
            with httpx.stream("POST", f"{base_url}/v1/chat/completions", headers=key, json=body, timeout=120) as r:
                if r.status_code == 429:
                    # The slot the last request freed may still sit in the other ingress
                    # replica's lease (returned within lease_s, as docs/operations.md says).
                    r.read()
                    time.sleep(int(r.headers["retry-after"]))
                    continue
                assert r.status_code == 200
                for _ in r.iter_bytes():
                    started.set()
                    if disconnect:
                        return
                return

    for disconnect in (False, True):
        started.clear()
        worker = threading.Thread(target=long_stream, args=(disconnect,))
        worker.start()
        assert started.wait(60)
        if not disconnect:
            assert refused(chat(base_url, key, model_name), "concurrency_limit") == 1
        worker.join()
        assert eventually_200(base_url, key, model_name).status_code == 200


def test_monthly_budget_429_until_next_month_and_a_patch_takes_effect_at_once(base_url, admin, model_name):
    tid, key = tenant(admin, "limits-budget", monthly_token_budget=300)
    for _ in range(20):
        r = chat(base_url, key, model_name, max_tokens=20)
        if r.status_code != 200:
            retry = refused(r, "budget_exceeded")
            if retry > 1:
                break
            time.sleep(1.5)  # 1: the other replica's unused lease was in the way (back after lease_s)
    retry = refused(r, "budget_exceeded")
    now = datetime.now(timezone.utc).timestamp()
    assert abs(retry - (next_month_start(now) - now)) < 10
    assert admin.patch(f"/admin/tenants/{tid}", json={"limits": {"monthly_token_budget": 100_000}}).status_code == 200
    # At once on the ingress replica that served the PATCH; on the other within the key cache's
    # documented bound (tenancy.key_cache.refresh_s, 5 s by default: docs/operations.md).
    give_up = time.monotonic() + 5 + 2
    while (code := chat(base_url, key, model_name, max_tokens=20).status_code) != 200 and time.monotonic() < give_up:
        time.sleep(0.5)
    assert code == 200


def test_a_limit_patched_through_the_admin_api_takes_effect_at_once(base_url, admin, model_name):
    tid, key = tenant(admin, "limits-patch")
    assert [chat(base_url, key, model_name).status_code for _ in range(4)] == [200] * 4
    assert admin.patch(f"/admin/tenants/{tid}", json={"limits": {"requests_per_minute": 1}}).status_code == 200
    # At once on the ingress replica that served the PATCH; on the other within the key cache's
    # documented bound (tenancy.key_cache.refresh_s, 5 s), so a request landing there may still pass.
    give_up = time.monotonic() + 5 + 2
    admitted = 0
    while (r := chat(base_url, key, model_name)).status_code == 200 and time.monotonic() < give_up:
        admitted += 1
        time.sleep(0.5)
    refused(r, "rate_limit_requests")
    assert admitted >= 1  # the one request a minute the new limit allows


def test_two_ingress_replicas_admit_no_more_than_the_limit_together(base_url, admin, model_name):
    from loraplex.admission.ray_backend import limiter_stats

    tid, key = tenant(admin, "limits-replicas", requests_per_minute=8)
    with ThreadPoolExecutor(16) as pool:
        # The key verified on both ingress replicas first (Serve spreads these over both): else the
        # replica that created it admits the whole bucket while the other still checks the key.
        models = list(pool.map(lambda _: httpx.get(f"{base_url}/v1/models", headers=key, timeout=60), range(16)))
        assert {r.status_code for r in models} == {200}
        codes = list(pool.map(lambda _: chat(base_url, key, model_name).status_code, range(24)))
    assert set(codes) <= {200, 429}
    assert 1 <= codes.count(200) <= 8, codes
    holders = limiter_stats(APP)["grants"][tid]
    assert len(holders) == 2, holders  # both ingress replicas admitted some, from one shared bucket


def test_refusals_are_counted_in_admin_usage_and_never_billed(base_url, admin, model_name, usage_db):
    from sqlalchemy import text

    tid, key = tenant(admin, "limits-counted", requests_per_minute=1)
    assert chat(base_url, key, model_name).status_code == 200
    refused(chat(base_url, key, model_name), "rate_limit_requests")
    deadline = time.monotonic() + 15
    while True:
        rejections = admin.get("/admin/usage", params={"tenant": tid}).json()["rejections"]
        if rejections or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert {"tenant": tid, "reason": "429:rate_limit_requests", "count": 1} in [
        {k: r[k] for k in ("tenant", "reason", "count")} for r in rejections]  # rows also carry tenant_name
    def billed():  # the served request's record reaches the ledger at the next flush
        with usage_db.connect() as conn:
            return conn.execute(text("SELECT count(*) FROM usage_records WHERE tenant_id = :t"), {"t": tid}).scalar()
    wait_until(lambda: billed() >= 1, 15, "the served request's usage record", interval_s=0.5)
    assert billed() == 1


def test_limiter_lost_fails_open_then_limits_hold_again(base_url, admin, model_name):
    """Last in this file: it kills the shared limiter actor (rebuilt empty on the next call)."""
    import ray

    from loraplex.admission.ray_backend import NAMESPACE, actor_name

    _, key = tenant(admin, "limits-lost", requests_per_minute=1)
    assert chat(base_url, key, model_name).status_code == 200
    refused(chat(base_url, key, model_name), "rate_limit_requests")
    ray.kill(ray.get_actor(actor_name(APP, 0), namespace=NAMESPACE))
    # Fail open: admitted while the limiter is gone or rebuilt (its state starts empty) ...
    assert chat(base_url, key, model_name).status_code == 200
    # ... and the limit holds again once a new limiter actor has the state.
    codes = []
    for _ in range(8):
        codes.append(chat(base_url, key, model_name).status_code)
        if codes[-1] == 429:
            break
        time.sleep(0.5)
    assert codes[-1] == 429, codes
