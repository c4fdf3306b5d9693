"""The operator's path: the real `serve run serve_config.yaml` command, then HTTP."""

import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from openai import OpenAI

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
BASE_URL = "http://127.0.0.1:8000"  # serve_config.yaml's http_options
ADMIN_TOKEN = secrets.token_urlsafe(16)


def port_in_use(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    if port_in_use(8000):
        pytest.fail("port 8000 is taken; stop whatever serves there (serve_config.yaml binds it)")
    log_path = tmp_path_factory.mktemp("serve") / "serve_run.log"
    log = open(log_path, "w")
    # A fresh local cluster, as on an operator's first run.
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["LORAPLEX_ADMIN_TOKEN"] = ADMIN_TOKEN
    serve_bin = Path(sys.executable).parent / "serve"
    proc = subprocess.Popen(
        [str(serve_bin), "run", "serve_config.yaml"],
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )
    try:
        deadline = time.time() + 600
        while time.time() < deadline:
            if proc.poll() is not None:
                pytest.fail(f"`serve run` exited with {proc.returncode}:\n{log_path.read_text()[-4000:]}")
            try:
                if httpx.get(f"{BASE_URL}/readyz", timeout=30).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(2)
        else:
            pytest.fail(f"not ready after 600 s:\n{log_path.read_text()[-4000:]}")
        yield BASE_URL
    finally:
        # Ctrl-C, as an operator stops it: serve run shuts Serve and its local Ray down.
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        subprocess.run([str(Path(sys.executable).parent / "ray"), "stop", "--force"], capture_output=True)
        log.close()


@pytest.fixture(scope="module")
def api_key(served) -> str:
    """An operator's first steps: a tenant, then a key for it, over the admin API."""
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    tenant = httpx.post(f"{served}/admin/tenants", json={"name": f"e2e-{secrets.token_hex(4)}"}, headers=admin, timeout=30)
    assert tenant.status_code == 201, tenant.text
    key = httpx.post(f"{served}/admin/tenants/{tenant.json()['id']}/keys", headers=admin, timeout=30)
    assert key.status_code == 201, key.text
    return key.json()["key"]


def test_curl_style_chat_answers_paris(served, api_key):
    response = httpx.post(
        f"{served}/v1/chat/completions",
        headers={"Authorization": f"Bearer {api_key}"},
        json={
            "model": "SmolLM2-135M-Instruct",
            "messages": [{"role": "user", "content": "What is the capital of France?"}],
            "max_tokens": 30,
            "temperature": 0,
        },
        timeout=120,
    )
    assert response.status_code == 200, response.text
    assert "Paris" in response.json()["choices"][0]["message"]["content"]


def test_openai_client_streams_from_serve_run(served, api_key):
    client = OpenAI(base_url=f"{served}/v1", api_key=api_key, timeout=120)
    stream = client.chat.completions.create(
        model="SmolLM2-135M-Instruct",
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=30,
        temperature=0,
        stream=True,
    )
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert "Paris" in text


def test_bad_request_then_still_serving(served, api_key):
    assert httpx.post(f"{served}/v1/chat/completions", content=b"{}", timeout=30).status_code == 401
    auth = {"Authorization": f"Bearer {api_key}"}
    bad = httpx.post(f"{served}/v1/chat/completions", content=b"{oops", headers=auth, timeout=30)
    assert bad.status_code == 400 and bad.json()["error"]["code"] == 400
    assert httpx.get(f"{served}/readyz", timeout=60).status_code == 200
