"""Two base models behind one ingress (issue 35): a request goes to its base's pool, an adapter
runs on the base it is bound to and is refused on another with its base named, /v1/models lists
both bases with each adapter's parent, and usage records carry the base."""

import io

import pytest
from starlette.testclient import TestClient

from two_bases import SMALL, TINY, build_two_bases


def pool_script(base):
    def script(method, call, request):
        yield {"pool": base, "base_model": call.base_model,
               "adapter": call.adapter.lora_name if call.adapter else None}
    return script


@pytest.fixture
def setup(tmp_path):
    bases = build_two_bases(tmp_path, pool_script, ingress={"ready_cache_s": 0})  # every /readyz probes
    client = TestClient(bases.app, raise_server_exceptions=False)
    archives = {base: path.read_bytes() for base, path in bases.archives.items()}
    yield client, {"Authorization": f"Bearer {bases.key}"}, bases.pools, archives
    bases.close()


def upload(client, headers, name, data, base_model=None):
    form = {"name": name, **({"base_model": base_model} if base_model else {})}
    return client.post("/v1/adapters", headers=headers, data=form,
                       files={"file": ("a.tar.gz", io.BytesIO(data), "application/gzip")})


def chat(client, headers, model):
    return client.post("/v1/chat/completions", headers=headers,
                       json={"model": model, "messages": [{"role": "user", "content": "hi"}]})


def test_each_base_and_each_adapter_runs_on_its_own_pool(setup):
    client, headers, pools, archives = setup
    assert upload(client, headers, "writer", archives[TINY], base_model=TINY).json()["base_model"] == TINY
    assert upload(client, headers, "tagger", archives[SMALL], base_model=SMALL).status_code == 201
    for model, pool in ((SMALL, SMALL), (TINY, TINY), ("writer", TINY), ("writer@1", TINY), ("tagger", SMALL),
                        (f"{TINY}:writer", TINY)):
        r = chat(client, headers, model)
        assert r.status_code == 200, r.text
        assert (r.json()["pool"], r.json()["base_model"]) == (pool, pool), model
    assert [len(p.requests) for p in pools.values()] == [2, 4]


def test_an_adapter_named_with_another_base_is_a_400_naming_its_base(setup):
    client, headers, pools, archives = setup
    upload(client, headers, "writer", archives[TINY], base_model=TINY)
    r = chat(client, headers, f"{SMALL}:writer")
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["code"] == "adapter_base_mismatch" and error["param"] == "model"
    assert f"trained on the base model {TINY}" in error["message"]
    assert all(p.requests == [] for p in pools.values())


def test_uploads_with_an_unknown_base_no_base_or_the_wrong_shapes_are_refused(setup):
    client, headers, _, archives = setup
    r = upload(client, headers, "x", archives[TINY], base_model="gpt-9")
    assert r.status_code == 400 and "gpt-9" in r.json()["error"]["message"] and TINY in r.json()["error"]["message"]
    # Two bases and an archive whose base_model_name_or_path names neither: say which.
    r = upload(client, headers, "x", archives[TINY])
    assert r.status_code == 400 and r.json()["error"]["param"] == "base_model"
    # Tiny's shapes for the 135M base: 422, the validator names the base it checked against.
    r = upload(client, headers, "x", archives[TINY], base_model=SMALL)
    assert r.status_code == 422 and SMALL in r.json()["error"]["message"]
    assert client.get("/v1/adapters", headers=headers).json()["data"] == []


def test_models_lists_every_base_and_each_adapter_with_its_parent(setup):
    client, headers, _, archives = setup
    upload(client, headers, "writer", archives[TINY], base_model=TINY)
    upload(client, headers, "tagger", archives[SMALL], base_model=SMALL)
    data = client.get("/v1/models", headers=headers).json()["data"]
    assert [(m["id"], m.get("parent")) for m in data] == [(SMALL, None), (TINY, None), ("tagger", SMALL),
                                                          ("writer", TINY)]


def test_an_unknown_model_names_every_base(setup):
    client, headers, _, _ = setup
    r = chat(client, headers, "gpt-9")
    assert r.status_code == 404
    r = client.post("/v1/chat/completions", headers=headers, json={"messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 400 and SMALL in r.json()["error"]["message"] and TINY in r.json()["error"]["message"]


def test_readyz_needs_every_pool_to_generate(setup):
    client, _, pools, _ = setup
    assert client.get("/readyz").status_code == 200

    async def broken():
        raise RuntimeError("no replica of tiny-llama")
    pools[TINY].ready = broken
    r = client.get("/readyz")
    assert r.status_code == 503 and r.headers["Retry-After"]


def test_each_base_pins_against_its_own_pools_tier(setup):
    """Pins take room in one pool's CPU tier: each base has its own bound (max_cpu_loras - 1)."""
    client, headers, _, archives = setup
    upload(client, headers, "writer", archives[TINY], base_model=TINY)
    upload(client, headers, "tagger", archives[SMALL], base_model=SMALL)
    admin = {"Authorization": "Bearer two-bases-admin"}
    tenant = client.get("/admin/tenants", headers=admin).json()["data"][0]["id"]
    for name in ("writer", "tagger"):
        r = client.post(f"/admin/tenants/{tenant}/adapters/{name}/pin", headers=admin)
        assert r.status_code == 200 and r.json()["pinned"], r.text
    shown = client.get("/admin/adapters", headers=admin).json()
    assert {p["name"] for p in shown["pinned"]} == {"writer", "tagger"}
    assert set(shown["bases"]) == {SMALL, TINY} and shown["bases"][TINY]["max_pinned"] == 15
