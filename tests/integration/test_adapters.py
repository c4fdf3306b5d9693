"""Two tenants hot-load their own trained LoRA adapters while the platform serves (issue 3)."""

import json
import sys
import tarfile
import threading
import time
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select

from loraplex.accounting.tables import usage_records

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit" / "registry"))
from demo_adapters import trained_adapter  # noqa: E402
from registry_builders import tar_entries  # noqa: E402
from tenant_keys import new_tenant_key  # noqa: E402
from waiting import wait_until  # noqa: E402

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


def is_pirate(text: str) -> bool:
    return "Ahoy" in text or "Arr" in text


def test_a_pinned_version_answers_with_its_own_weights(acme, pirate_archive, banana_archive):
    """Two different versions of one name: `name@1` (and its sha) keep answering as version 1,
    while `name` and `name@2` answer as version 2."""
    v1 = upload(acme, "pinned", pirate_archive)
    assert v1.status_code == 201 and v1.json()["version"] == 1, v1.text
    assert is_pirate(answer(acme, "pinned"))
    v2 = upload(acme, "pinned", banana_archive)
    assert v2.status_code == 201 and v2.json()["version"] == 2, v2.text
    assert v2.json()["sha256"] != v1.json()["sha256"]

    latest, second, first = answer(acme, "pinned"), answer(acme, "pinned@2"), answer(acme, "pinned@1")
    assert "BANANA" in latest and "BANANA" in second and latest == second
    assert is_pirate(first) and "BANANA" not in first, first
    assert answer(acme, f"pinned@{v1.json()['sha256']}") == first
    assert answer(acme, f"pinned@{v2.json()['sha256']}") == latest
    versions = [v["version"] for v in acme.get("/v1/adapters/pinned").json()["versions"]]
    assert sorted(versions) == [1, 2]


def test_more_adapters_than_vllm_keeps_are_evicted_and_reloaded(acme, pirate_archive, banana_archive):
    """The session's engine keeps max_loras = max_cpu_loras = 4 adapters (and ~6 MB of them):
    six in turn evict the least recently used, and an evicted one loads again
    with its own weights (each name is its own version, so each is its own vLLM slot)."""
    archives = [pirate_archive, banana_archive] * 3
    names = [f"lru-{i}" for i in range(len(archives))]
    for name, archive in zip(names, archives):
        assert upload(acme, name, archive).status_code == 201
    first = [answer(acme, name) for name in names]
    assert all(is_pirate(a) and "BANANA" not in a for a in first[0::2]), first
    assert all("BANANA" in a for a in first[1::2]), first
    # lru-0 and lru-1 were evicted by lru-4 and lru-5: answering again reloads them.
    assert [answer(acme, name) for name in names] == first


def tenant_id(admin, name: str) -> str:
    return next(t["id"] for t in admin.get("/admin/tenants").json()["data"] if t["name"] == name)


def test_a_pinned_adapter_survives_an_eviction_storm(acme, admin, pirate_archive, banana_archive, engine_handle,
                                                    model_name, base_url):
    """The session's engine keeps 4 adapters in its CPU tier and ~6 MB of them (about three):
    `keeper` is pinned, then eight other adapters go through. vLLM's LRU and the byte budget evict
    them in turn; keeper stays in the CPU tier, pinned, and answers with its own weights; the
    tier never holds more bytes than its budget; vLLM's GPU slots are listed (worker extension)."""
    assert upload(acme, "keeper", pirate_archive).status_code == 201
    acme_id = tenant_id(admin, "acme")
    pinned = admin.post(f"/admin/tenants/{acme_id}/adapters/keeper/pin")
    assert pinned.status_code == 200 and pinned.json()["pinned"], pinned.text
    keeper = f"{acme_id}/keeper@{pinned.json()['version']}:{pinned.json()['sha256']}"
    try:
        wait_until(lambda: keeper in engine_handle.adapter_residency.remote().result()["pinned"], 15,
                   "the replica to load and pin keeper")
        assert [v["name"] for v in admin.get("/admin/adapters").json()["pinned"]] == ["keeper"]
        storm = [f"storm-{i}" for i in range(8)]
        for name, archive in zip(storm, [banana_archive, pirate_archive] * 4):
            assert upload(acme, name, archive).status_code == 201
        evicted = set()
        for name in storm:
            assert short_answer(acme, name).status_code == 200
            tier = engine_handle.adapter_residency.remote().result()
            assert keeper in tier["cpu"] and keeper in tier["pinned"], tier
            assert tier["cpu_bytes"] <= 6_000_000 and len(tier["cpu"]) <= 4, tier
            assert tier["known_slots"] and 1 <= len(tier["slots"]) <= 4, tier
            evicted |= {n for n in storm[:storm.index(name)] if not any(f"/{n}@" in c for c in tier["cpu"])}
        assert len(evicted) >= 4, f"no storm: only {sorted(evicted)} left the CPU tier"
        assert is_pirate(answer(acme, "keeper"))
        # The base model is untouched by the storm, also in a batch with an adapter's request while
        # every slot holds an adapter (vLLM's CPU ops gave it the last slot's: cpu_lora_ops).
        assert "Paris" in answer(acme, model_name)
        stream = Stream(base_url, acme.headers, "keeper", 64)
        stream.start()
        wait_until(lambda: len(stream.events) >= 2 or not stream.is_alive(), 120, "keeper's stream to start")
        assert stream.is_alive(), "keeper's stream ended before the base request could share its batch"
        assert "Paris" in answer(acme, model_name)
        stream.join(timeout=420)
        stats = engine_handle.record_routing_stats.remote().result()["adapters"]
        assert f"{acme_id}/keeper" in stats["cpu"] and stats["max_loras"] == 4
    finally:
        assert admin.delete(f"/admin/tenants/{acme_id}/adapters/keeper/pin").status_code == 200
    wait_until(lambda: keeper not in engine_handle.adapter_residency.remote().result()["pinned"], 15,
               "the replica to unpin keeper")


def test_delete_stops_new_requests_and_frees_every_replica(acme, pirate_archive, engine_handle):
    assert upload(acme, "doomed", pirate_archive).status_code == 201
    answer(acme, "doomed")  # loaded on the replica now
    assert any(name.endswith("/doomed@" + name.rsplit("@", 1)[1]) for name in engine_handle.loaded_adapters.remote().result())
    deleted = acme.delete("/v1/adapters/doomed")
    assert deleted.status_code == 200 and deleted.json()["deleted"][0]["version"] == 1
    gone = acme.post("/v1/chat/completions", json={"model": "doomed", "messages": QUESTION, "max_tokens": 2})
    assert gone.status_code == 404
    assert acme.delete("/v1/adapters/doomed").status_code == 404
    wait_until(lambda: not any("/doomed@" in n for n in engine_handle.loaded_adapters.remote().result()), 15,
               "the replica to free the deleted adapter")


def short_answer(client, model: str) -> httpx.Response:
    return client.post("/v1/chat/completions",
                       json={"model": model, "messages": QUESTION, "max_tokens": 6, "temperature": 0})


def loaded_versions(engine_handle, name: str) -> list[str]:
    return [n for n in engine_handle.loaded_adapters.remote().result() if f"/{name}@" in n]


def test_the_same_weights_uploaded_again_after_a_delete_are_a_new_servable_version(acme, pirate_archive,
                                                                                     engine_handle):
    """Upload, serve, delete, upload the same archive again: a new version (2, a new catalog id
    and vLLM name) that answers by name, number and sha at once, on a replica that has seen the
    delete (it refuses the deleted id for good) and, in the second round, on one that has not
    yet (the re-upload is served within the replicas' deletion poll)."""
    first = upload(acme, "phoenix", pirate_archive)
    assert first.status_code == 201 and first.json()["version"] == 1, first.text
    pirate = answer(acme, "phoenix")
    assert is_pirate(pirate)
    assert acme.delete("/v1/adapters/phoenix").status_code == 200
    wait_until(lambda: not loaded_versions(engine_handle, "phoenix"), 15, "the replica to free the deleted adapter")

    again = upload(acme, "phoenix", pirate_archive)
    assert again.status_code == 201, again.text
    assert (again.json()["version"], again.json()["sha256"]) == (2, first.json()["sha256"])
    for ref in ["phoenix", "phoenix@2", f"phoenix@{again.json()['sha256']}"]:
        assert answer(acme, ref) == pirate, ref
    assert short_answer(acme, "phoenix@1").status_code == 404  # the deleted version stays deleted
    listed = [(m["id"], m["version"]) for m in acme.get("/v1/models").json()["data"] if m["id"] == "phoenix"]
    assert listed == [("phoenix", 2)]

    # Second round, fast: delete and upload again, then serve before the replica's next poll.
    assert acme.delete("/v1/adapters/phoenix").status_code == 200
    third = upload(acme, "phoenix", pirate_archive)
    assert third.status_code == 201 and third.json()["version"] == 3, third.text
    reply = short_answer(acme, "phoenix")
    assert reply.status_code == 200, reply.text
    # Through the replica's deletion polls: version 2 is freed, version 3 keeps answering.
    wait_until(lambda: len(loaded_versions(engine_handle, "phoenix")) == 1, 15, "version 2 to be freed")
    assert loaded_versions(engine_handle, "phoenix")[0].split("/", 1)[1].startswith("phoenix@3:")
    for ref in ["phoenix", "phoenix@3", f"phoenix@{third.json()['sha256']}"]:
        assert answer(acme, ref) == pirate, ref


class Stream(threading.Thread):
    """One long streamed chat request: the SSE events its client received."""

    def __init__(self, base_url: str, headers, model: str, max_tokens: int):
        super().__init__(daemon=True)
        self.args = (base_url, dict(headers), model, max_tokens)
        self.events: list[str] = []
        self.request_id = None
        self.failure = None

    def run(self):
        base_url, headers, model, max_tokens = self.args
        body = {"model": model, "messages": [{"role": "user", "content": "Tell me a very long story."}],
                "max_tokens": max_tokens, "ignore_eos": True, "stream": True,
                "stream_options": {"include_usage": True}}
        try:
            with httpx.stream("POST", f"{base_url}/v1/chat/completions", json=body, headers=headers,
                              timeout=180) as reply:
                assert reply.status_code == 200, reply.read()
                self.request_id = reply.headers["x-loraplex-request-id"]
                self.events.extend(line for line in reply.iter_lines() if line.startswith("data: "))
        except Exception as exc:  # noqa: BLE001 - reported by the test
            self.failure = exc


def test_delete_while_a_stream_runs_on_it(acme, base_url, pirate_archive, engine_handle, usage_db):
    """DELETE during a running request on the adapter: the stream finishes normally and is billed
    in full, new requests 404 at once, and the replica frees the adapter once the stream ends."""
    max_tokens = 150  # outlasts the 2.5 s watched after the DELETE at any speed this CPU reaches
    assert upload(acme, "busy", pirate_archive).status_code == 201
    stream = Stream(base_url, acme.headers, "busy", max_tokens)
    stream.start()
    wait_until(lambda: len(stream.events) >= 5 or not stream.is_alive(), 120, "the stream's first tokens")
    assert stream.is_alive() and stream.failure is None, (stream.failure, stream.events[-3:])
    assert any("/busy@" in n for n in engine_handle.loaded_adapters.remote().result())

    deleted = acme.delete("/v1/adapters/busy")
    assert deleted.status_code == 200, deleted.text
    deleted_at = time.monotonic()
    gone = acme.post("/v1/chat/completions", json={"model": "busy", "messages": QUESTION, "max_tokens": 2})
    assert gone.status_code == 404, gone.text
    # Through two of the replicas' deletion polls (deletion_poll_s = 1): the running stream keeps
    # its adapter loaded; it is not cut.
    while time.monotonic() < deleted_at + 2.5:
        assert stream.is_alive(), "the stream ended within 2.5 s of the DELETE: make it longer"
        assert any("/busy@" in n for n in engine_handle.loaded_adapters.remote().result()), \
            "the adapter was freed under a running request"
        time.sleep(0.25)

    stream.join(timeout=420)
    assert not stream.is_alive() and stream.failure is None, stream.failure
    assert stream.events[-1] == "data: [DONE]"
    chunks = [json.loads(e.removeprefix("data: ")) for e in stream.events[:-1]]
    assert not any("error" in c for c in chunks), chunks[-3:]
    assert chunks[-1]["usage"]["completion_tokens"] == max_tokens
    finish = [c["choices"][0]["finish_reason"] for c in chunks if c.get("choices")]
    assert finish[-1] == "length"

    def record():
        with usage_db.connect() as conn:
            return conn.execute(select(usage_records).where(usage_records.c.request_id == stream.request_id)).first()
    row = wait_until(record, 30, "the usage record of the stream")
    assert (row.status, row.completion_tokens, row.adapter) == ("length", max_tokens, "busy@1")

    wait_until(lambda: not any("/busy@" in n for n in engine_handle.loaded_adapters.remote().result()), 15,
               "the replica to free the deleted adapter")
    assert acme.post("/v1/chat/completions",
                     json={"model": "busy", "messages": QUESTION, "max_tokens": 2}).status_code == 404


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
    from safetensors.numpy import load, save
    untrained = save({k: v * 0 if ".lora_B." in k else v for k, v in load(weights).items()})
    return [
        ("not-an-archive", b"this is not a tarball", 400),
        ("path-traversal", tar_of([("../../evil.json", config), ("adapter_config.json", config)]), 400),
        ("absolute-path", tar_of([("/tmp/evil.json", config)]), 400),
        ("symlink", tar_of([("adapter_config.json", config), link]), 400),
        ("no-config", tar_of([("adapter_model.safetensors", weights)]), 422),
        ("pickle-weights", tar_of([("adapter_config.json", config), ("adapter_model.bin", b"\x80\x04pickle")]), 422),
        ("corrupt-safetensors", tar_of([("adapter_config.json", config), ("adapter_model.safetensors", b"garbage")]), 422),
        ("rank-over-max", tar_of([("adapter_config.json", big_rank), ("adapter_model.safetensors", weights)]), 422),
        ("untrained-zero-b", tar_of([("adapter_config.json", config), ("adapter_model.safetensors", untrained)]), 422),
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
