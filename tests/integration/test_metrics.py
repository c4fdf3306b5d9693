"""Per-tenant metrics from every replica, read where Prometheus would scrape them (issue 12).

Two tenants send real traffic (one through its own trained LoRA adapter), a third is refused by
its rate limit, a caller without a valid key by auth; then the Ray node's metrics agent (the one
scrape target of this one-node cluster) must show every `loraplex_*` metric, per-tenant token
counters equal to the ledger's sums for those tenants, and TTFT histograms counting each request.
"""

import sys
import time
from pathlib import Path

import httpx
import pytest
from sqlalchemy import func, select

from loraplex.accounting.tables import usage_records
from loraplex.metrics import catalog as c

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from demo_adapters import trained_adapter  # noqa: E402
from metrics_scrape import label_values, scrape, total  # noqa: E402
from waiting import wait_until  # noqa: E402

pytestmark = pytest.mark.integration

EXPORT_TIMEOUT_S = 90  # Ray exports every 10 s; replicas publish gauges every 5 s
# Over one 128-token KV block on the CPU backend, so a repeat hits the prefix cache.
SYSTEM = "You are a concise assistant. " + " ".join(f"Rule {i}: answer in plain words." for i in range(40))


def tenant(admin, base_url, name: str, **limits) -> tuple[str, httpx.Client]:
    created = admin.post("/admin/tenants", json={"name": name, "limits": limits})
    assert created.status_code == 201, created.text
    tid = created.json()["id"]
    key = admin.post(f"/admin/tenants/{tid}/keys")
    assert key.status_code == 201, key.text
    return tid, httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {key.json()['key']}"}, timeout=180)


def ask(client: httpx.Client, model: str, content: str, stream: bool = False) -> str:
    r = client.post("/v1/chat/completions", json={
        "model": model, "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": content}],
        "max_tokens": 8, "temperature": 0,
        "stream": stream})
    assert r.status_code == 200, r.text
    return r.headers["x-loraplex-request-id"]


def ledger_sums(usage_db, tenant_id: str, request_ids: list[str]) -> dict:
    def rows():
        with usage_db.connect() as conn:
            q = select(func.count(), func.sum(usage_records.c.prompt_tokens),
                       func.sum(usage_records.c.cached_prompt_tokens), func.sum(usage_records.c.completion_tokens)
                       ).where(usage_records.c.tenant_id == tenant_id)
            n, prompt, cached, completion = conn.execute(q).one()
        return n == len(request_ids) and {"requests": n, "prompt": prompt, "cached": cached, "completion": completion}

    return wait_until(rows, 30, f"the ledger rows of {tenant_id}")


def test_every_replica_exports_per_tenant_metrics_that_agree_with_the_ledger(
        base_url, admin, usage_db, model_name, metrics_targets):
    a_id, a = tenant(admin, base_url, "metrics-base")
    b_id, b = tenant(admin, base_url, "metrics-adapter")
    c_id, limited = tenant(admin, base_url, "metrics-limited", requests_per_minute=1)
    with open(trained_adapter("pirate"), "rb") as f:
        up = b.post("/v1/adapters", data={"name": "style"}, files={"file": ("style.tar.gz", f, "application/gzip")})
    assert up.status_code == 201, up.text
    adapter_label = f"style@{up.json()['version']}"

    a_ids = [ask(a, model_name, "What is the capital of France?"),
             ask(a, model_name, "What is the capital of France?"),  # a repeat: cached prompt tokens
             ask(a, model_name, "Name a colour.", stream=True)]
    b_ids = [ask(b, "style", "What is the capital of France?"),
             ask(b, "style", "Say hello.", stream=True),
             ask(b, model_name, "Say hello.")]
    ask(limited, model_name, "hi")
    assert limited.post("/v1/chat/completions", json={
        "model": model_name, "messages": [{"role": "user", "content": "hi"}]}).status_code == 429
    assert httpx.post(f"{base_url}/v1/chat/completions", headers={"Authorization": "Bearer sk-nope"},
                      json={"model": model_name, "messages": []}).status_code == 401
    assert a.post("/v1/chat/completions", json={
        "model": "no-such-adapter", "messages": [{"role": "user", "content": "hi"}]}).status_code == 404

    ledger = {a_id: ledger_sums(usage_db, a_id, a_ids), b_id: ledger_sums(usage_db, b_id, b_ids)}
    assert ledger[a_id]["cached"] > 0  # the repeat hit the prefix cache: the counter is not trivially 0

    def exported():
        samples = scrape(metrics_targets)
        for tid, sums in ledger.items():
            got = {"prompt": total(samples, c.PROMPT_TOKENS.exported, tenant=tid),
                   "cached": total(samples, c.CACHED_PROMPT_TOKENS.exported, tenant=tid),
                   "completion": total(samples, c.COMPLETION_TOKENS.exported, tenant=tid),
                   "requests": total(samples, c.REQUESTS.exported, tenant=tid),
                   "ttft": total(samples, c.TTFT.exported + "_count", tenant=tid)}
            want = {k: sums[k] for k in ("prompt", "cached", "completion", "requests")} | {"ttft": sums["requests"]}
            if got != want:
                return None
        # Each refusal is counted by the ingress replica that made it, and the two publish on
        # their own clocks: wait for all three, not only the first.
        if not (total(samples, c.REFUSALS.exported, tenant=c_id, reason="429:rate_limit_requests")
                and total(samples, c.REFUSALS.exported, tenant=c.UNKNOWN, reason="401")
                and total(samples, c.REFUSALS.exported, tenant=a_id, reason="404")):
            return None
        # Every metric is there, under the name Ray exports it by (a process that started late,
        # like the limiter actor, shows its series at its first export period, not at once).
        # Not the unreachable-step count: it exists only with tenant_scheduler.slo_classes on (off
        # here), from the replica's start (unit/engine/test_engine_metrics.py).
        names = {s.name for s in samples}
        missing = [n for n in (spec.exported + ("_count" if spec.kind == "histogram" else "") for spec in c.ALL
                               if spec is not c.UNREACHABLE_STEPS)
                   if n not in names]
        assert not missing, f"{missing} missing from the scrape"
        return samples

    samples = wait_until(exported, EXPORT_TIMEOUT_S, "the scraped per-tenant counters to equal the ledger's sums "
                         "and every metric in the scrape", interval_s=2)
    # Labels: the tenant id, the adapter's name@version, `base`; the replica that recorded it.
    assert total(samples, c.COMPLETION_TOKENS.exported, tenant=b_id, adapter=adapter_label) > 0
    assert total(samples, c.COMPLETION_TOKENS.exported, tenant=b_id, adapter=c.BASE) > 0
    assert total(samples, c.REQUESTS.exported, tenant=a_id, status="length") + total(
        samples, c.REQUESTS.exported, tenant=a_id, status="ok") == 3
    for tid in (a_id, b_id):
        n = ledger[tid]["requests"]
        assert total(samples, c.QUEUE.exported + "_count", tenant=tid) == n
        assert total(samples, c.E2E.exported + "_count", tenant=tid) == n
        assert 0 < total(samples, c.TPOT.exported + "_count", tenant=tid) <= n
    assert total(samples, c.REFUSALS.exported, tenant=c.UNKNOWN, reason="401") >= 1
    assert total(samples, c.REFUSALS.exported, tenant=a_id, reason="404") == 1
    # One scrape target shows every replica: both ingress replicas and the engine.
    ingress = {s.labels.get("replica") for s in samples
               if s.name == c.ROUTING_DECISIONS.exported and s.labels.get("deployment") == "Ingress"}
    assert len(ingress) == 2, ingress
    assert label_values(samples, c.KV_USAGE.exported, "deployment") == {"Engine"}
    # The adapter was loaded (and timed) on the engine; its routing key was new, then held.
    assert total(samples, c.ADAPTER_LOADS.exported) >= 1
    assert total(samples, c.ADAPTER_LOAD_SECONDS.exported + "_count") >= 1
    assert total(samples, c.ROUTING_DECISIONS.exported, decision="affinity") >= 1
    assert total(samples, c.ROUTING_DECISIONS.exported, decision="new_key") >= 1
    assert total(samples, c.PREFIX_QUERIES.exported) >= total(samples, c.PREFIX_HITS.exported) > 0
    last_flush = total(samples, c.SPOOL_LAST_FLUSH.exported, deployment="Engine")
    assert time.time() - 120 < last_flush <= time.time() + 5
