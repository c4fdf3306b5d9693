"""Two base models in one `serve run serve_config.multi.yaml` (issue 35), on the real engines: a
tenant's adapter on each base answers through the `openai` client, an adapter named with the
wrong base is a 400 naming its own, /v1/models shows both bases with their adapters, usage is
split by model at each base's price, and load on one base does not slow the other's tenants."""

import concurrent.futures
import secrets
import statistics
import sys
import threading
import time
from decimal import Decimal
from pathlib import Path

import httpx
import openai
import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_process import BASE_URL, ROOT, local_config, new_tenant_key, serve_run  # noqa: E402

from bench.demo_adapters import trained_adapter  # noqa: E402

pytestmark = pytest.mark.e2e

ADMIN_TOKEN = secrets.token_urlsafe(16)
CONFIG = "serve_config.multi.yaml"
FULL, W4 = "SmolLM2-135M-Instruct", "SmolLM2-135M-Instruct-W4A16"


def prices() -> dict:
    plan = yaml.safe_load((ROOT / CONFIG).read_text())["applications"][0]["args"]["accounting"]["pricing"]["plans"]["default"]
    return {FULL: plan, W4: {**plan, **plan["models"][W4]}}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("multi")
    config, _ = local_config(tmp, CONFIG)
    with serve_run(str(config), tmp / "serve_run.log", ADMIN_TOKEN):
        yield BASE_URL


@pytest.fixture(scope="module")
def api_key(served) -> str:
    return new_tenant_key(ADMIN_TOKEN, f"multi-{secrets.token_hex(4)}")


def upload(key: str, name: str, recipe: str, base_model: str) -> httpx.Response:
    return httpx.post(f"{BASE_URL}/v1/adapters", headers={"Authorization": f"Bearer {key}"}, timeout=120,
                      data={"name": name, "base_model": base_model},
                      files={"file": ("a.tar.gz", trained_adapter(recipe).read_bytes(), "application/gzip")})


def test_an_adapter_on_each_base_through_the_openai_client(served, api_key):
    assert upload(api_key, "pirate", "pirate", FULL).json()["base_model"] == FULL
    assert upload(api_key, "banana", "banana", W4).json()["base_model"] == W4
    bad = upload(api_key, "x", "banana", "gpt-9")
    assert bad.status_code == 400 and W4 in bad.json()["error"]["message"]

    client = openai.OpenAI(base_url=f"{served}/v1", api_key=api_key, timeout=120)
    for model in (FULL, W4, "pirate", "banana", f"{W4}:banana"):
        reply = client.chat.completions.create(model=model, max_tokens=12, temperature=0,
                                               messages=[{"role": "user", "content": "What is the capital of France?"}])
        assert reply.choices[0].message.content and reply.model == model, model
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=f"{FULL}:banana", max_tokens=4,
                                       messages=[{"role": "user", "content": "hi"}])
    assert f"trained on the base model {W4}" in str(err.value)

    models = httpx.get(f"{served}/v1/models", headers={"Authorization": f"Bearer {api_key}"}, timeout=30).json()
    parents = {m["id"]: m.get("parent") for m in models["data"]}
    assert parents == {FULL: None, W4: None, "pirate": FULL, "banana": W4}


def test_usage_is_split_by_model_each_at_its_own_price(served, api_key):
    headers = {"Authorization": f"Bearer {api_key}"}
    # The test above ran 2 requests on each base (3 on W4A16 with the base:adapter form), 1 refused.
    rows = {}
    for _ in range(60):  # the Engine replicas' ledgers flush about every second
        usage = httpx.get(f"{served}/v1/usage", params={"group_by": "model"}, headers=headers, timeout=30).json()
        rows = {r["model"]: r for r in usage["rows"]}
        if rows.get(FULL, {}).get("requests") == 2 and rows.get(W4, {}).get("requests") == 3:
            break
        time.sleep(1)
    assert {m: r["requests"] for m, r in rows.items()} == {FULL: 2, W4: 3}
    for model, row in rows.items():
        price = prices()[model]
        expected = (Decimal(row["prompt_tokens"] - row["cached_prompt_tokens"]) * Decimal(price["input"])
                    + Decimal(row["cached_prompt_tokens"]) * Decimal(price["cached_input"])
                    + Decimal(row["completion_tokens"]) * Decimal(price["output"])) / 1_000_000
        assert Decimal(str(row["cost"])) == pytest.approx(expected, abs=Decimal("1e-9")), model


def timed_chat(key: str, model: str) -> float:
    started = time.perf_counter()
    r = httpx.post(f"{BASE_URL}/v1/chat/completions", headers={"Authorization": f"Bearer {key}"}, timeout=120,
                   json={"model": model, "max_tokens": 16, "ignore_eos": True, "temperature": 0,
                         "messages": [{"role": "user", "content": "Name a colour."}]})
    assert r.status_code == 200, r.text
    return time.perf_counter() - started


def p95(xs: list[float]) -> float:
    return statistics.quantiles(xs, n=20)[-1]


def test_load_on_one_base_neither_sheds_nor_slows_the_others_tenants(served):
    """Each pool has its own router, fair queue and cores (cpu_affinity): a flood on the full base
    leaves the 4-bit base's tenant within 1.2x of its p95 alone, with no refusal."""
    light, heavy = new_tenant_key(ADMIN_TOKEN, "light"), new_tenant_key(ADMIN_TOKEN, "heavy")
    timed_chat(light, W4)  # warm
    alone = [timed_chat(light, W4) for _ in range(20)]
    stop, flood_done = threading.Event(), []

    def flood():
        while not stop.is_set():
            r = httpx.post(f"{BASE_URL}/v1/chat/completions", headers={"Authorization": f"Bearer {heavy}"},
                           timeout=300, json={"model": FULL, "max_tokens": 64, "ignore_eos": True,
                                              "messages": [{"role": "user", "content": "Tell me a long story."}]})
            flood_done.append(r.status_code)
    with concurrent.futures.ThreadPoolExecutor(24) as pool:
        floods = [pool.submit(flood) for _ in range(24)]
        time.sleep(5)  # the full base's batch is full
        beside = [timed_chat(light, W4) for _ in range(20)]
        stop.set()
        for f in floods:
            f.result()
    print(f"light tenant on {W4}: p95 alone {p95(alone):.3f} s, beside the flood {p95(beside):.3f} s "
          f"({p95(beside) / p95(alone):.2f}x); flood requests {len(flood_done)}, statuses {set(flood_done)}")
    assert flood_done and set(flood_done) == {200}
    assert p95(beside) <= 1.2 * p95(alone)
