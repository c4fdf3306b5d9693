"""The `loraplex` CLI's main() against a real uvicorn server on a loopback port."""

import json
import socket

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Route

from fake_engine import FakeEngineClient
from live_server import serving
from loraplex.cli import main
from loraplex.config import PlatformConfig
from loraplex.db.engine import make_engine
from loraplex.ingress.app import build_ingress_app
from loraplex.tenancy.service import TenantService
from loraplex.tenancy.tenancy import Tenancy

ADMIN = "cli-admin-token"


@pytest.fixture
def url(tmp_path, monkeypatch):
    for name in ("LORAPLEX_URL", "LORAPLEX_ADMIN_TOKEN", "LORAPLEX_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    db = make_engine(f"sqlite:///{tmp_path}/cli.db")
    engine = FakeEngineClient(lambda method, request, *context: iter(()))
    app = build_ingress_app(engine, PlatformConfig.from_args(None), tenancy=Tenancy(TenantService(db), ADMIN))
    with serving(app) as url:
        yield url
    db.dispose()


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_admin_commands_end_to_end(url, capsys, monkeypatch):
    monkeypatch.setenv("LORAPLEX_URL", url)
    code, out, _ = run(capsys, "--admin-token", ADMIN, "--json", "tenants", "create", "acme", "--plan", "pro",
                       "--limits", '{"requests_per_minute": 60}')
    assert code == 0
    tenant = json.loads(out)
    assert tenant["name"] == "acme" and tenant["limits"]["requests_per_minute"] == 60

    monkeypatch.setenv("LORAPLEX_ADMIN_TOKEN", ADMIN)
    code, out, _ = run(capsys, "tenants", "list")
    assert code == 0
    header, row = out.strip().splitlines()
    assert header.split()[:4] == ["ID", "NAME", "PLAN", "STATUS"]
    assert row.split()[:4] == [tenant["id"], "acme", "pro", "active"] and "requests_per_minute=60" in row

    code, out, _ = run(capsys, "keys", "create", tenant["id"])
    assert code == 0 and "shown only this once" in out
    key = next(word for word in out.split() if word.startswith("lpx-"))

    code, out, _ = run(capsys, "keys", "list", tenant["id"], "--json")
    listed = json.loads(out)["data"]
    assert code == 0 and len(listed) == 1 and key not in out and key.startswith(listed[0]["prefix"])

    code, out, _ = run(capsys, "tenants", "update", tenant["id"], "--suspend", "--limits", '{"priority": 4}')
    assert code == 0 and "suspended" in out and "priority=4" in out
    code, out, _ = run(capsys, "tenants", "update", tenant["id"], "--reactivate", "--json")
    assert json.loads(out)["status"] == "active"

    code, out, _ = run(capsys, "keys", "revoke", listed[0]["id"])
    assert code == 0 and out.startswith(f"revoked {listed[0]['id']}")
    code, out, _ = run(capsys, "keys", "list", tenant["id"])
    assert listed[0]["id"] in out and "REVOKED_AT" in out


def test_quiet_create_prints_only_the_id_and_the_key(url, capsys, monkeypatch):
    """The README's flow: TENANT=$(loraplex tenants create acme -q), then
    export LORAPLEX_API_KEY=$(loraplex keys create $TENANT -q): each output is the one value."""
    monkeypatch.setenv("LORAPLEX_URL", url)
    monkeypatch.setenv("LORAPLEX_ADMIN_TOKEN", ADMIN)
    code, out, _ = run(capsys, "tenants", "create", "acme", "-q")
    tenant_id = out.strip()
    assert code == 0 and out == tenant_id + "\n" and tenant_id.startswith("ten_")
    code, out, _ = run(capsys, "--json", "tenants", "list")
    assert [t["id"] for t in json.loads(out)["data"]] == [tenant_id]

    code, out, _ = run(capsys, "keys", "create", tenant_id, "--quiet")
    key = out.strip()
    assert code == 0 and out == key + "\n" and key.startswith("lpx-")
    code, out, _ = run(capsys, "--json", "keys", "list", tenant_id)
    assert [k["prefix"] for k in json.loads(out)["data"] if key.startswith(k["prefix"])]  # the issued key itself


def test_server_errors_print_the_message_and_exit_nonzero(url, capsys):
    code, out, err = run(capsys, "--url", url, "tenants", "list", "--admin-token", "wrong")
    assert code == 1 and out == "" and err.startswith("error: 401 Invalid admin token")
    assert run(capsys, "--url", url, "--admin-token", ADMIN, "tenants", "create", "acme")[0] == 0
    code, _, err = run(capsys, "--url", url, "--admin-token", ADMIN, "tenants", "create", "acme")
    assert code == 1 and "409" in err and "already exists" in err
    code, _, err = run(capsys, "--url", url, "--admin-token", ADMIN, "keys", "revoke", "key_missing")
    assert code == 1 and "404" in err


def test_local_mistakes_exit_2_without_a_request(url, capsys):
    code, _, err = run(capsys, "--url", url, "tenants", "list")
    assert code == 2 and "LORAPLEX_ADMIN_TOKEN" in err
    code, _, err = run(capsys, "--url", url, "adapters", "list")
    assert code == 2 and "LORAPLEX_API_KEY" in err
    code, _, err = run(capsys, "--url", url, "--admin-token", ADMIN, "tenants", "update", "ten_x")
    assert code == 2 and "nothing to update" in err
    with pytest.raises(SystemExit) as e:
        main(["tenants", "create", "acme", "--limits", "{bad"])
    assert e.value.code == 2


def test_unreachable_server_is_a_clear_error(capsys):
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there now
    code, _, err = run(capsys, "--url", f"http://127.0.0.1:{port}", "--admin-token", ADMIN, "tenants", "list")
    assert code == 1 and "cannot reach LoRAPlex" in err


def test_tenant_commands_send_the_contract_requests(tmp_path, capsys):
    """adapters and usage hit the tenant routes of the REST contract with the API key."""
    seen = []

    async def record(request: Request):
        entry = {"method": request.method, "path": request.url.path, "query": dict(request.query_params),
                 "auth": request.headers.get("authorization")}
        if request.method == "POST":
            form = await request.form()
            entry["form"] = {k: (v if isinstance(v, str) else (v.filename, await v.read())) for k, v in form.items()}
        seen.append(entry)
        if request.url.path == "/v1/usage":
            if request.query_params.get("format") == "csv":
                return PlainTextResponse("day,prompt_tokens,cached_prompt_tokens,completion_tokens,requests,cost\n")
            return JSONResponse({"data": [{"day": "2026-11-01", "prompt_tokens": 5, "cost": "0.01"}],
                                 "total": {"prompt_tokens": 5, "cost": "0.01"}})
        if request.method == "GET":
            return JSONResponse({"object": "list", "data": [
                {"name": "bot", "versions": [{"name": "bot", "version": 1, "sha256": "ab", "rank": 8}]}]})
        if request.method == "DELETE":
            return JSONResponse({"deleted": True})
        return JSONResponse({"name": "bot", "version": 1, "sha256": "ab", "rank": 8}, status_code=201)

    app = Starlette(routes=[Route("/v1/adapters", record, methods=["GET", "POST"]),
                            Route("/v1/adapters/{ref}", record, methods=["DELETE"]),
                            Route("/v1/usage", record), Route("/admin/usage", record)])
    archive = tmp_path / "bot.tar.gz"
    archive.write_bytes(b"archive-bytes")
    with serving(app) as url:
        base = ["--url", url, "--api-key", "lpx-k"]
        code, out, _ = run(capsys, *base, "adapters", "upload", "bot", str(archive))
        assert code == 0 and "bot" in out
        code, out, _ = run(capsys, *base, "adapters", "list")
        assert code == 0 and out.splitlines()[1].split()[:3] == ["bot", "1", "ab"]
        assert run(capsys, *base, "adapters", "delete", "bot@1")[0] == 0
        code, out, _ = run(capsys, *base, "usage", "--start", "2026-11-01", "--group-by", "day")
        assert code == 0 and "2026-11-01" in out and "TOTAL" in out
        code, out, _ = run(capsys, *base, "usage", "--format", "csv")
        assert code == 0 and out.startswith("day,prompt_tokens")
        code, _, _ = run(capsys, "--url", url, "--admin-token", "adm", "usage", "--admin", "--tenant", "ten_1")
        assert code == 0
    assert [(s["method"], s["path"]) for s in seen] == [
        ("POST", "/v1/adapters"), ("GET", "/v1/adapters"), ("DELETE", "/v1/adapters/bot@1"),
        ("GET", "/v1/usage"), ("GET", "/v1/usage"), ("GET", "/admin/usage")]
    assert seen[0]["form"] == {"name": "bot", "file": ("bot.tar.gz", b"archive-bytes")}
    assert all(s["auth"] == "Bearer lpx-k" for s in seen[:5]) and seen[5]["auth"] == "Bearer adm"
    assert seen[3]["query"] == {"start": "2026-11-01", "group_by": "day"}
    assert seen[5]["query"] == {"tenant": "ten_1"}


def test_upload_binds_to_the_base_model_given_and_lists_and_usage_name_it(tmp_path, capsys, monkeypatch):
    """Two bases (issue 35): `adapters upload --base-model` binds the version to that base (the
    archive names neither base, so without it the server refuses), `adapters list` shows each
    version's base and `usage --group-by model` one row per base."""
    from two_bases import SMALL, TINY, build_two_bases

    for name in ("LORAPLEX_URL", "LORAPLEX_ADMIN_TOKEN", "LORAPLEX_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    setup = build_two_bases(tmp_path)
    try:
        with serving(setup.app) as url:
            base = ["--url", url, "--api-key", setup.key]
            code, _, err = run(capsys, *base, "adapters", "upload", "writer", str(setup.archives[TINY]))
            assert code == 1 and "base_model" in err and TINY in err  # the server asks which base
            code, out, _ = run(capsys, *base, "adapters", "upload", "writer", str(setup.archives[TINY]),
                               "--base-model", TINY)
            assert code == 0 and TINY in out.splitlines()[1].split()
            code, out, _ = run(capsys, *base, "adapters", "upload", "tagger", str(setup.archives[SMALL]),
                               "--base-model", SMALL)
            assert code == 0
            code, out, _ = run(capsys, *base, "adapters", "list")
            header, *rows = out.splitlines()
            at = header.split().index("BASE_MODEL")
            assert sorted((row.split()[0], row.split()[at]) for row in rows) == [("tagger", SMALL), ("writer", TINY)]

            setup.add_usage(SMALL, 10, 2)
            setup.add_usage(TINY, 7, 3, adapter="writer@1")
            setup.add_usage(TINY, 1, 1)
            code, out, _ = run(capsys, *base, "usage", "--group-by", "model")
            rows = [line.split() for line in out.splitlines()]
            assert code == 0 and rows[0][:4] == ["MODEL", "PROMPT_TOKENS", "CACHED_PROMPT_TOKENS", "COMPLETION_TOKENS"]
            assert [r[:4] for r in rows[1:4]] == [[SMALL, "10", "0", "2"], [TINY, "8", "0", "4"], ["TOTAL", "18", "0", "6"]]
    finally:
        setup.close()
