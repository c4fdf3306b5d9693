"""An upload whose temp space is full (a real tmpfs as the process's temp dir): 503 + Retry-After,
code upload_temp_full, a message naming the temp dir; nothing left behind (no temp file, no blob,
no catalog row); the same upload is stored once there is room again."""

from __future__ import annotations

import tempfile
from datetime import datetime, timedelta, timezone

import pytest
import starlette.formparsers
from starlette.testclient import TestClient

from loraplex.accounting.rejections import rejection_counts
from platform_app import build_platform_app
from small_disk import fill, small_disk


def script(method, call, request):
    yield {"model": request.model}


@pytest.fixture
def platform(tmp_path):
    platform = build_platform_app(tmp_path, script)
    platform.add_tenant("acme")
    yield platform
    platform.close()


def upload(client, platform, archive: bytes):
    return client.post("/v1/adapters", headers={"Authorization": platform.keys["acme"]},
                       files={"file": ("a.tar.gz", archive, "application/gzip")}, data={"name": "style"})


def leftovers(path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


@pytest.mark.parametrize("spooled", [False, True], ids=["unpacking", "spooling the form"])
def test_an_upload_with_no_temp_space_is_a_503_naming_it_and_leaves_nothing(platform, tmp_path, monkeypatch, spooled):
    archive = platform.adapter_archive()
    client = TestClient(platform.app)
    with small_disk(tmp_path / "tmp", "64k") as disk:
        monkeypatch.setattr(tempfile, "tempdir", str(disk))
        if spooled:  # the form parser writes the archive to the temp dir (past 1 MB; here past 1 byte)
            monkeypatch.setattr(starlette.formparsers.MultiPartParser, "spool_max_size", 1)
        fill(disk)
        response = upload(client, platform, archive)
        assert response.status_code == 503, response.text
        error = response.json()["error"]
        assert error["code"] == "upload_temp_full" and str(disk) in error["message"]
        assert response.headers["retry-after"] == "30"
        assert leftovers(disk) == ["filler"]  # no archive, no unpacked file
        monkeypatch.undo()
    store = tmp_path / "store"
    assert not store.exists() or leftovers(store) == []  # no blob
    assert client.get("/v1/adapters", headers={"Authorization": platform.keys["acme"]}).json()["data"] == []
    assert upload(client, platform, archive).status_code == 201  # room again: the same upload is stored


def refusals(platform) -> dict:
    platform.accounting.ledger.flush()
    now = datetime.now(timezone.utc)
    return {(c.tenant_id, c.reason): c.count for c in rejection_counts(
        platform.accounting.db, now - timedelta(hours=1), now + timedelta(hours=1))}


def test_a_full_temp_space_counts_as_the_platforms_refusal_a_bad_archive_does_not(platform, tmp_path, monkeypatch):
    """The availability objective counts 503 refusals (observability/promql.py): a full disk of ours is our
    unavailability, so the upload's 503 is counted as a chat request's is; the tenant's own 4xx is not."""
    client = TestClient(platform.app)
    assert upload(client, platform, b"not an archive").status_code == 400
    with small_disk(tmp_path / "tmp", "64k") as disk:
        monkeypatch.setattr(tempfile, "tempdir", str(disk))
        fill(disk)
        assert upload(client, platform, platform.adapter_archive()).status_code == 503
        monkeypatch.undo()
    assert refusals(platform) == {(platform.tenant_ids["acme"], "503:upload_temp_full"): 1}
