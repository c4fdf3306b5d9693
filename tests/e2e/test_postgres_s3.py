"""The real `serve run` with the multi-node storage: `database_url` a fresh PostgreSQL database
and `registry.store_url: s3://bucket/prefix` on a moto S3 server on loopback. An operator's
first steps over HTTP (tenant, key), an adapter uploaded into S3 and served by the real engine
(which fetches it from S3), its usage row in PostgreSQL, and the catalog's write transactions
(new versions, concurrent uploads, a delete) on PostgreSQL."""

import contextlib
import io
import json
import secrets
import sys
import tarfile
import threading
from pathlib import Path

import httpx
import pytest
import yaml
from sqlalchemy import func, select

from loraplex.accounting.tables import usage_records
from loraplex.db.engine import make_engine
from loraplex.registry.catalog import adapter_versions
from loraplex.tenancy.models import api_keys, tenants

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
from demo_adapters import trained_adapter  # noqa: E402
from serve_process import BASE_URL, ROOT, new_tenant_key, serve_run  # noqa: E402
from shared_stores import postgres_and_s3, s3_client  # noqa: E402
from waiting import wait_until  # noqa: E402

pytestmark = pytest.mark.e2e

ADMIN_TOKEN = secrets.token_urlsafe(16)
MODEL = "SmolLM2-135M-Instruct"
BUCKET = "loraplex-e2e"
PREFIX = "prod/adapters"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def with_alpha(archive: Path, alpha: int) -> bytes:
    """The same weights with another lora_alpha: another valid version (another sha256)."""
    out = io.BytesIO()
    with tarfile.open(archive) as src, tarfile.open(fileobj=out, mode="w:gz") as dst:
        for member in src.getmembers():
            data = src.extractfile(member).read() if member.isfile() else None
            if member.name.endswith("adapter_config.json"):
                config = json.loads(data)
                config["lora_alpha"] = alpha
                data = json.dumps(config).encode()
                member.size = len(data)
            dst.addfile(member, io.BytesIO(data) if data is not None else None)
    return out.getvalue()


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """(database URL, S3 endpoint, trained archive) of a running `serve run` on them."""
    tmp = tmp_path_factory.mktemp("pg-s3")
    pirate = trained_adapter("pirate")  # before the engine starts: training wants the cores
    with contextlib.ExitStack() as resources:
        stores = resources.enter_context(postgres_and_s3(BUCKET))
        db_url, endpoint, options = stores.db_url, stores.endpoint, stores.storage_options
        config = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
        args = config["applications"][0]["args"]
        args["database_url"] = db_url
        args["registry"] = {"store_url": f"s3://{BUCKET}/{PREFIX}", "storage_options": options,
                            "cache_dir": str(tmp / "cache"), "deletion_poll_s": 1}
        args["accounting"] = {"spool_dir": str(tmp / "spool"), "flush_interval_s": 0.2}
        config_path = tmp / "serve_config.yaml"
        config_path.write_text(yaml.safe_dump(config))
        resources.enter_context(serve_run(str(config_path), tmp / "serve_run.log", ADMIN_TOKEN))
        yield db_url, endpoint, pirate


def s3_keys(endpoint: str) -> list[str]:
    return [o["Key"] for o in s3_client(endpoint).list_objects_v2(Bucket=BUCKET).get("Contents", [])]


def upload(client, name: str, payload: bytes) -> httpx.Response:
    return client.post("/v1/adapters", data={"name": name},
                       files={"file": ("adapter.tar.gz", payload, "application/gzip")})


def test_serve_run_on_postgresql_and_s3(stack):
    db_url, endpoint, pirate = stack
    db = make_engine(db_url)
    assert db.dialect.name == "postgresql"
    key = new_tenant_key(ADMIN_TOKEN, "pg-s3")  # tenancy's write transactions, on PostgreSQL
    with db.connect() as conn:
        [tenant_id] = conn.execute(select(tenants.c.id).where(tenants.c.name == "pg-s3")).scalars().all()
        assert conn.execute(select(func.count()).select_from(api_keys)
                            .where(api_keys.c.tenant_id == tenant_id)).scalar() == 1

    with httpx.Client(base_url=BASE_URL, headers={"Authorization": f"Bearer {key}"}, timeout=180) as client:
        # Upload: validated, stored in S3 under the prefix, a catalog row in PostgreSQL.
        first = upload(client, "pirate", pirate.read_bytes())
        assert first.status_code == 201, first.text
        sha = first.json()["sha256"]
        assert first.json()["version"] == 1
        stored = s3_keys(endpoint)
        assert any(k.startswith(f"{PREFIX}/{tenant_id}/{sha}/") for k in stored), stored
        assert upload(client, "pirate", pirate.read_bytes()).json()["version"] == 1  # same content, same version

        # Chat with it: the engine replica fetches the blob from S3 and answers as the adapter.
        reply = client.post("/v1/chat/completions", json={"model": "pirate", "messages": QUESTION,
                                                           "max_tokens": 24, "temperature": 0})
        assert reply.status_code == 200, reply.text
        text = reply.json()["choices"][0]["message"]["content"]
        assert "Ahoy" in text or "Arr" in text, text
        request_id = reply.headers["x-loraplex-request-id"]

        # Its usage record lands in PostgreSQL (flushed from the engine replica's spool).
        def row():
            with db.connect() as conn:
                return conn.execute(select(usage_records).where(usage_records.c.request_id == request_id)).first()
        record = wait_until(row, 60, "the chat's usage record in PostgreSQL")
        usage = reply.json()["usage"]
        finish = reply.json()["choices"][0]["finish_reason"]
        assert (record.tenant_id, record.adapter, record.status) == (tenant_id, "pirate@1", finish)
        assert (record.prompt_tokens, record.completion_tokens) == (usage["prompt_tokens"], usage["completion_tokens"])
        report = client.get("/v1/usage", params={"start": "2000-01-01", "end": "2100-01-01", "group_by": "adapter"})
        assert report.status_code == 200 and report.json()["total"]["requests"] == 1, report.text

        # Two uploads of new content under one name at once: the catalog's write transactions on
        # PostgreSQL give them distinct versions (no duplicate, no error).
        results: list[httpx.Response] = []
        variants = [with_alpha(pirate, 32), with_alpha(pirate, 8)]
        threads = [threading.Thread(target=lambda p=p: results.append(upload(client, "pirate", p))) for p in variants]
        [t.start() for t in threads]
        [t.join(timeout=120) for t in threads]
        assert [r.status_code for r in results] == [201, 201], [r.text for r in results]
        assert sorted(r.json()["version"] for r in results) == [2, 3]
        with db.connect() as conn:
            versions = conn.execute(select(adapter_versions.c.version, adapter_versions.c.sha256)
                                    .where(adapter_versions.c.tenant_id == tenant_id)
                                    .order_by(adapter_versions.c.version)).all()
        assert [v for v, _ in versions] == [1, 2, 3] and len({s for _, s in versions}) == 3

        # Pinning still answers with version 1; deleting version 3 marks it in PostgreSQL and
        # removes its blob from S3.
        pinned = client.post("/v1/chat/completions", json={"model": "pirate@1", "messages": QUESTION,
                                                            "max_tokens": 24, "temperature": 0})
        assert pinned.json()["choices"][0]["message"]["content"] == text
        v3 = next(r.json() for r in results if r.json()["version"] == 3)
        assert client.delete("/v1/adapters/pirate@3").status_code == 200
        assert client.post("/v1/chat/completions", json={"model": "pirate@3", "messages": QUESTION,
                                                         "max_tokens": 2}).status_code == 404
        wait_until(lambda: not any(f"/{v3['sha256']}/" in k for k in s3_keys(endpoint)), 30,
                   "the deleted version's blob to leave S3")
        assert [a["version"] for a in client.get("/v1/adapters/pirate").json()["versions"]] == [1, 2]
