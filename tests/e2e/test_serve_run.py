"""The operator's path: the real `serve run serve_config.yaml` command, then HTTP."""

import secrets
import sys
from pathlib import Path

import httpx
import pytest
from openai import OpenAI

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_process import BASE_URL, serve_run  # noqa: E402

from bench.tenants import new_tenant_key  # noqa: E402

pytestmark = pytest.mark.e2e

ADMIN_TOKEN = secrets.token_urlsafe(16)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    with serve_run("serve_config.yaml", tmp_path_factory.mktemp("serve") / "serve_run.log", ADMIN_TOKEN):
        yield BASE_URL


@pytest.fixture(scope="module")
def api_key(served) -> str:
    return new_tenant_key(BASE_URL, ADMIN_TOKEN, f"e2e-{secrets.token_hex(4)}")


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
