"""Two base models behind one ingress (issue 35): a request goes to its base's pool, an adapter
runs on the base it is bound to and is refused on another with its base named, /v1/models lists
both bases with each adapter's parent, and usage records carry the base."""

import io
import json
import sys
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from fake_engine import FakeEngineClient
from loraplex.accounting.accounting import Accounting
from loraplex.config import PlatformConfig
from loraplex.db.engine import make_engine
from loraplex.ingress.app import build_ingress_app
from loraplex.ingress.engine_pools import PooledEngineClient
from loraplex.registry.model_spec import BaseModelSpec
from loraplex.registry.registry import build_registry
from loraplex.tenancy.service import Tenancy, TenantService

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "registry"))
from registry_builders import SMOLLM2_CONFIG, lora_config, lora_tensors, tar_dir, write_adapter  # noqa: E402

SMALL, TINY = "SmolLM2-135M-Instruct", "tiny-llama"
TINY_CONFIG = {**SMOLLM2_CONFIG, "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 4,
               "num_attention_heads": 4, "num_key_value_heads": 2}


def pool_script(base):
    def script(method, call, request):
        yield {"pool": base, "base_model": call.base_model,
               "adapter": call.adapter.lora_name if call.adapter else None}
    return script


@pytest.fixture
def setup(tmp_path):
    for name, cfg in ((SMALL, SMOLLM2_CONFIG), (TINY, TINY_CONFIG)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(cfg))
    config = PlatformConfig.from_args({
        "models": [{"engine": {"model": str(tmp_path / SMALL)}}, {"engine": {"model": str(tmp_path / TINY)}}],
        "database_url": f"sqlite:///{tmp_path}/db.sqlite",
        "registry": {"store_url": str(tmp_path / "store"), "cache_dir": str(tmp_path / "cache")},
        "ingress": {"ready_cache_s": 0},  # every /readyz probes
    })
    db = make_engine(config.database_url)
    service = TenantService(db)
    pools = {base: FakeEngineClient(pool_script(base), calls={
        "base_models": {"object": "list", "data": [{"id": base, "object": "model", "parent": None}]},
        "ready": {"replica_id": base}}) for base in (SMALL, TINY)}
    accounting = Accounting.start(config.accounting.model_copy(update={"spool_dir": str(tmp_path / "spool")}),
                                  db, "ingress-test", plan_of=service.plan_of)
    client = TestClient(build_ingress_app(PooledEngineClient(pools), config, tenancy=Tenancy(service, admin_token="admin"),
                                          registry=build_registry(config, db), accounting=accounting),
                        raise_server_exceptions=False)
    tenant = service.create_tenant("acme")
    headers = {"Authorization": f"Bearer {service.issue_key(tenant.id)[1]}"}
    archives = {}
    for name, cfg in ((SMALL, SMOLLM2_CONFIG), (TINY, TINY_CONFIG)):
        spec = BaseModelSpec.from_config(cfg, name)
        src = write_adapter(tmp_path / f"for-{name}", lora_config(r=4, base_model_name_or_path="my/run"),
                            lora_tensors(spec, r=4))
        archives[name] = tar_dir(src, tmp_path / f"for-{name}.tar.gz").read_bytes()
    yield client, headers, pools, archives
    accounting.close()


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
