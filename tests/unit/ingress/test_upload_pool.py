"""UploadPool (issue 34): uploads run on their own threads, one tenant holds at most
uploads_per_tenant of them (429 before its body is read), and a cancelled upload's thread is
told to stop while its slot stays held until it has."""

import asyncio
import threading
import time

import pytest
from starlette.testclient import TestClient

from loraplex.errors import StatusError
from loraplex.ingress.upload_pool import UploadPool
from platform_app import build_platform_app


def test_a_tenant_over_its_uploads_gets_429_and_another_tenant_is_not_held():
    pool = UploadPool(workers=2, per_tenant=1)

    async def main():
        started, release = asyncio.Event(), threading.Event()

        async def first():
            async with pool.slot("acme"):
                started.set()
                await pool.run(release.wait)

        task = asyncio.create_task(first())
        try:
            await started.wait()
            with pytest.raises(StatusError) as e:
                async with pool.slot("acme"):
                    pass
            assert e.value.status == 429 and e.value.headers["Retry-After"]
            assert "registry.uploads_per_tenant=1" in e.value.body()["error"]["message"]
            async with pool.slot("globex"):  # another tenant: its own slot, a free worker
                assert (await pool.run(lambda: threading.current_thread().name)).startswith("adapter-upload")
        finally:
            release.set()
        await task
        async with pool.slot("acme"):  # freed once the first is done
            pass

    asyncio.run(main())


def test_a_cancelled_upload_is_told_to_stop_and_keeps_its_slot_until_it_has():
    pool = UploadPool(workers=1, per_tenant=1)
    seen = {}

    def copy(cancelled):
        if not cancelled.wait(5):  # never told to stop
            return
        time.sleep(0.05)  # the copy's last chunk
        seen["stopped"] = True

    async def main():
        async def upload():
            async with pool.slot("acme"):
                await pool.run(copy, cancellable=True)

        task = asyncio.create_task(upload())
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert seen.get("stopped")  # the slot was released only after the thread stopped
        assert not pool.active

    asyncio.run(main())


def test_the_upload_route_runs_on_the_upload_pool_not_the_default_executor(tmp_path):
    def script(method, call, request):
        yield {}

    platform = build_platform_app(tmp_path, script)
    platform.add_tenant("acme")
    threads = []
    from loraplex.registry.registry import AdapterRegistry

    original = AdapterRegistry.upload

    def recording(self, *args, **kwargs):
        threads.append(threading.current_thread().name)
        return original(self, *args, **kwargs)

    AdapterRegistry.upload = recording
    try:
        client = TestClient(platform.app, raise_server_exceptions=False)
        response = client.post("/v1/adapters", headers={"Authorization": platform.keys["acme"]},
                               data={"name": "style"}, files={"file": ("a.tar.gz", platform.adapter_archive())})
    finally:
        AdapterRegistry.upload = original
        platform.close()
    assert response.status_code == 201, response.text
    assert threads and threads[0].startswith("adapter-upload")
