"""Two tenants hot-load their own trained LoRA adapters while the platform serves (issue 3)."""

import sys
import tarfile
import time
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit" / "registry"))
from demo_adapters import trained_adapter  # noqa: E402
from registry_builders import tar_entries  # noqa: E402
from tenant_keys import new_tenant_key  # noqa: E402

pytestmark = pytest.mark.integration

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="session")
def pirate_archive() -> Path:
    return trained_adapter("pirate")


@pytest.fixture(scope="session")
def banana_archive() -> Path:
    return trained_adapter("banana")


@pytest.fixture(scope="session")
def acme(base_url, admin):
    key = new_tenant_key(admin, "acme")
    with httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {key}"}, timeout=180) as c:
        yield c


@pytest.fixture(scope="session")
def globex(base_url, admin):
    key = new_tenant_key(admin, "globex")
    with httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {key}"}, timeout=180) as c:
        yield c


def upload(client, name: str, archive: Path) -> httpx.Response:
    with open(archive, "rb") as f:
        return client.post("/v1/adapters", data={"name": name}, files={"file": (archive.name, f, "application/gzip")})


def answer(client, model: str) -> str:
    response = client.post(
        "/v1/chat/completions", json={"model": model, "messages": QUESTION, "max_tokens": 24, "temperature": 0}
    )
    assert response.status_code == 200, response.text
    assert response.json()["model"] == model  # the client's name, never tenant/name@sha
    return response.json()["choices"][0]["message"]["content"]


def replica_id(engine_handle) -> str:
    return engine_handle.ready.remote().result()["replica_id"]


def test_tenants_hot_load_their_own_adapters_without_restart(
    acme, globex, pirate_archive, banana_archive, model_name, engine_handle
):
    replica_before = replica_id(engine_handle)
    base_before = answer(acme, model_name)
    assert "Paris" in base_before

    # Both tenants call their adapter "style": names are per tenant.
    a = upload(acme, "style", pirate_archive)
    assert a.status_code == 201, a.text
    assert {"name", "version", "sha256", "rank", "target_modules", "base_model", "size_bytes", "created_at"} <= set(a.json())
    b = upload(globex, "style", banana_archive)
    assert b.status_code == 201, b.text
    assert a.json()["version"] == b.json()["version"] == 1

    assert "Ahoy" in answer(acme, "style") or "Arr" in answer(acme, "style")
    assert "BANANA" in answer(globex, "style")
    assert answer(acme, "style@1") == answer(acme, "style")
    # The base model is untouched by either adapter being loaded.
    assert answer(acme, model_name) == base_before
    assert answer(globex, model_name) == base_before

    # Another tenant's adapter, by name or by its exact sha, is as missing as a made-up one.
    assert upload(acme, "pirate", pirate_archive).status_code == 201
    for ref in ["pirate", f"style@{a.json()['sha256']}", "nothing"]:
        missing = globex.post("/v1/chat/completions", json={"model": ref, "messages": QUESTION, "max_tokens": 2})
        assert missing.status_code == 404, ref
        assert missing.json()["error"]["code"] == 404

    acme_models = [m["id"] for m in acme.get("/v1/models").json()["data"]]
    globex_models = [m["id"] for m in globex.get("/v1/models").json()["data"]]
    assert acme_models == [model_name, "pirate", "style"]
    assert globex_models == [model_name, "style"]
    assert [a["name"] for a in acme.get("/v1/adapters").json()["data"]] == ["pirate", "style"]

    assert replica_id(engine_handle) == replica_before, "the engine replica must not restart"


def test_same_content_is_the_same_version_and_streams_under_the_clients_name(acme, pirate_archive):
    again = upload(acme, "style", pirate_archive)
    assert again.status_code == 201 and again.json()["version"] == 1
    streamed = acme.post(
        "/v1/chat/completions",
        json={"model": "style", "messages": QUESTION, "max_tokens": 8, "stream": True},
    )
    assert streamed.status_code == 200
    assert '"model":"style"' in streamed.text and "@" not in streamed.text


def test_delete_stops_new_requests_and_frees_every_replica(acme, pirate_archive, engine_handle):
    assert upload(acme, "doomed", pirate_archive).status_code == 201
    answer(acme, "doomed")  # loaded on the replica now
    assert any(name.endswith("/doomed@" + name.rsplit("@", 1)[1]) for name in engine_handle.loaded_adapters.remote().result())
    deleted = acme.delete("/v1/adapters/doomed")
    assert deleted.status_code == 200 and deleted.json()["deleted"][0]["version"] == 1
    gone = acme.post("/v1/chat/completions", json={"model": "doomed", "messages": QUESTION, "max_tokens": 2})
    assert gone.status_code == 404
    assert acme.delete("/v1/adapters/doomed").status_code == 404
    deadline = time.time() + 15
    while time.time() < deadline:
        if not any("/doomed@" in n for n in engine_handle.loaded_adapters.remote().result()):
            break
        time.sleep(0.5)
    else:
        pytest.fail("the deleted adapter is still loaded on the engine replica")


def bad_archive_cases(tmp: Path, good: Path) -> list[tuple[str, bytes, int]]:
    """(case, archive bytes, expected status). Built from a real trained archive."""
    with tarfile.open(good) as tar:
        members = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}

    def tar_of(entries) -> bytes:
        return tar_entries(tmp / "case.tar.gz", entries).read_bytes()

    link = tarfile.TarInfo("adapter_model.safetensors")
    link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
    config = members["adapter_config.json"]
    weights = members["adapter_model.safetensors"]
    big_rank = config.replace(b'"r": 8', b'"r": 64')
    return [
        ("not-an-archive", b"this is not a tarball", 400),
        ("path-traversal", tar_of([("../../evil.json", config), ("adapter_config.json", config)]), 400),
        ("absolute-path", tar_of([("/tmp/evil.json", config)]), 400),
        ("symlink", tar_of([("adapter_config.json", config), link]), 400),
        ("no-config", tar_of([("adapter_model.safetensors", weights)]), 422),
        ("pickle-weights", tar_of([("adapter_config.json", config), ("adapter_model.bin", b"\x80\x04pickle")]), 422),
        ("corrupt-safetensors", tar_of([("adapter_config.json", config), ("adapter_model.safetensors", b"garbage")]), 422),
        ("rank-over-max", tar_of([("adapter_config.json", big_rank), ("adapter_model.safetensors", weights)]), 422),
    ]


def test_bad_archives_get_clear_4xx_and_server_keeps_serving(acme, pirate_archive, model_name, tmp_path):
    for case, payload, status in bad_archive_cases(tmp_path, pirate_archive):
        response = acme.post(
            "/v1/adapters", data={"name": "bad"}, files={"file": ("bad.tar.gz", payload, "application/gzip")}
        )
        assert response.status_code == status, f"{case}: {response.status_code} {response.text}"
        assert response.json()["error"]["message"], case
    assert acme.get("/v1/adapters/bad").status_code == 404
    for form, status in [({}, 400), ({"name": "x"}, 400)]:
        assert acme.post("/v1/adapters", data=form).status_code == status
    assert "Paris" in answer(acme, model_name)
