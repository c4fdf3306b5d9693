"""Hostile input on every public route of the ingress (issue 11, item 7).

A property-based fuzz (hypothesis) of the real ingress app: real tenancy, adapter registry and
accounting on SQLite in a tmp dir, a fake engine that refuses what vLLM would. Each example sends
one request built from random and malformed JSON, wrong types, huge numbers (1e308, 2**70, -1,
NaN/Infinity literals), odd or huge unicode (lone surrogates, NUL, RTL marks, 1 MB), unknown
fields, bad headers (Authorization, X-LoRAPlex-Timeout, Content-Type lies) and bad query
parameters, then checks:

- no 5xx (except /readyz's documented 503 when no engine can generate);
- an answer within a bounded time (no hang);
- no traceback or internal path in the reply;
- every error body is OpenAI's `{"error": {"message", "type", "param", "code"}}`;
- the server then serves a normal request.

CI runs a bounded number of examples per route (the whole file in well under a minute);
LORAPLEX_FUZZ_EXAMPLES=2000 runs more by hand. LORAPLEX_FUZZ_URL=http://127.0.0.1:8000 (with
LORAPLEX_ADMIN_TOKEN) sends the same requests to a running platform over HTTP instead.
"""

from __future__ import annotations

import io
import json
import math
import os
import signal
import tarfile
import zipfile
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import quote, urlencode

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient

import loraplex
from loraplex.contract import EngineError
from platform_app import ADMIN_TOKEN, BASE, build_platform_app

EXAMPLES = int(os.environ.get("LORAPLEX_FUZZ_EXAMPLES", "40"))
REMOTE = os.environ.get("LORAPLEX_FUZZ_URL")
REQUEST_TIMEOUT_S = 10.0  # per request: a reply slower than this is a hang
CONTEXT = 8192  # the fake engine's context window
TIMEOUT_HEADER = "X-LoRAPlex-Timeout"

FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=not os.environ.get("LORAPLEX_FUZZ_EXAMPLES"),
                suppress_health_check=list(HealthCheck), print_blob=True)


# -- the fake engine: refuses like vLLM --------------------------------------------------------
def engine_script(method, call, request):
    """What vLLM's serving layer would answer: a 400 for what the engine refuses, else a reply."""
    max_tokens = getattr(request, "max_completion_tokens", None) or request.max_tokens
    if max_tokens is not None and not 0 < max_tokens <= CONTEXT:
        yield EngineError(400, f"max_tokens must be at least 1 and at most {CONTEXT}, got {max_tokens}.",
                          param="max_tokens")
        return
    if call.prompt_tokens + (max_tokens or 0) > CONTEXT:
        yield EngineError(400, f"This model's maximum context length is {CONTEXT} tokens.", param="messages")
        return
    if request.stream:
        yield 'data: {"choices":[{"delta":{"content":"ok"}}]}\n\n'
        yield "data: [DONE]\n\n"
    else:
        yield {"object": "chat.completion", "model": request.model,
               "choices": [{"message": {"role": "assistant", "content": "ok"}}]}


# -- the target: in-process app, or a running platform -----------------------------------------
class Target:
    def __init__(self, client, admin: str, keys: dict[str, str], tenant_ids: dict[str, str],
                 key_ids: dict[str, str], internal_markers: list[str]):
        self.client, self.admin, self.keys = client, admin, keys
        self.tenant_ids, self.key_ids = tenant_ids, key_ids
        self.internal_markers = internal_markers


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    if REMOTE:
        yield remote_target()
        return
    tmp = tmp_path_factory.mktemp("fuzz")
    platform = build_platform_app(tmp, engine_script, registry={"max_upload_bytes": 4 << 20},
                                  calls={"ready": {"replica_id": "fake", "probe_seconds": 0.01}})
    # `probe` serves the normal request after each example: nothing the fuzz sends may touch it.
    # `victim` is what the fuzz may suspend, revoke, re-plan and upload to.
    for name in ("probe", "victim"):
        platform.add_tenant(name)
    client = TestClient(platform.app, raise_server_exceptions=False)
    archive = platform.adapter_archive(r=4)
    for name in ("probe", "victim"):
        reply = client.post("/v1/adapters", headers={"Authorization": platform.keys[name]}, data={"name": "style"},
                            files={"file": ("a.tar.gz", io.BytesIO(archive), "application/gzip")})
        assert reply.status_code == 201, reply.text
    markers = [str(tmp), str(Path(loraplex.__file__).resolve().parent), "site-packages"]
    yield Target(client, f"Bearer {ADMIN_TOKEN}", platform.keys, platform.tenant_ids, platform.key_ids, markers)
    platform.close()


def remote_target() -> Target:
    admin = f"Bearer {os.environ['LORAPLEX_ADMIN_TOKEN']}"
    client = httpx.Client(base_url=REMOTE, timeout=REQUEST_TIMEOUT_S)
    keys, tenant_ids, key_ids = {}, {}, {}
    for name in ("probe", "victim"):
        tenant = client.post("/admin/tenants", headers={"Authorization": admin},
                             json={"name": f"fuzz-{name}-{os.getpid()}"}).json()
        key = client.post(f"/admin/tenants/{tenant['id']}/keys", headers={"Authorization": admin}).json()
        keys[name], tenant_ids[name], key_ids[name] = f"Bearer {key['key']}", tenant["id"], key["id"]
    return Target(client, admin, keys, tenant_ids, key_ids, ["Traceback (most recent call last)", "site-packages"])


# -- hostile values ------------------------------------------------------------------------------
MB = 1 << 20
ODD_STRINGS = [
    "", " ", "\x00", "a\x00b", "\ud800", "\udfff", "x\ud83dy", "\u202eevil\u202c", "\u200f\u200e", "\ufeff",
    "\uffff", "\U0010ffff", "💩" * 100, "e\u0301" * 50, "A" * MB, "é" * (MB // 2), "\n\r\t", "../../etc/passwd",
    "%00", "%2e%2e%2f", "null", "true", "0", "-1", "NaN", "${jndi:ldap://x}", "<script>", "'; DROP TABLE x;--",
    "ten_0000000000000000", "key_0000000000000000", "lpx-" + "0" * 40, BASE, BASE + "\x00", "style", "style@1",
    "style@" + "0" * 64, "style@999999999999999999999", "style@-1", "a/b", "a@b@c",
]
HUGE_NUMBERS = [1e308, -1e308, 2 ** 70, -(2 ** 70), 2 ** 63, 2 ** 63 - 1, -1, 0, -0.0, 0.5, 1e-308, 5e-324,
                math.nan, math.inf, -math.inf, 10 ** 400]
odd_text = st.one_of(st.sampled_from(ODD_STRINGS), st.text(max_size=40),
                     st.text(st.characters(exclude_categories=()), max_size=20))
hostile_number = st.one_of(st.sampled_from(HUGE_NUMBERS), st.integers(), st.floats())
scalar = st.one_of(st.none(), st.booleans(), hostile_number, odd_text)
json_value = st.recursive(scalar, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                          st.dictionaries(odd_text, inner, max_size=4)),
                          max_leaves=12)

# Bodies that are not JSON, or JSON that Python's parser dislikes, sent as raw bytes.
RAW_BODIES = [
    b"", b"{", b"}", b"{\"model\":", b"[", b"null", b"0", b"\"str\"", b"[]", b"{}{}", b"\xff\xfe\x00",
    b"\xef\xbb\xbf{}", "{}".encode("utf-16"), b"{\"a\": NaN}", b"{\"a\": Infinity, \"b\": -Infinity}",
    b"{\"max_tokens\": 1e999}", b"{\"a\": 1" + b"0" * 5000 + b"}", b"{\"a\": \"\\ud800\"}",
    b"{\"a\": \"\\u0000\"}", b"{\"a\": \"\x00\"}", b"[" * 100_000 + b"]" * 100_000, b"{\"a\":" * 50_000,
    b"{\"model\": \"" + BASE.encode() + b"\", \"model\": 5}", b"\x00" * 1000, b"{'model': 1}",
]


def mutate(base: dict, hostile=json_value):
    """A valid body with some fields replaced, dropped or added."""
    return st.builds(_mutated, st.just(base), st.dictionaries(st.sampled_from(sorted(base)), hostile, max_size=3),
                     st.lists(st.sampled_from(sorted(base)), max_size=2),
                     st.dictionaries(odd_text, json_value, max_size=2))


def _mutated(base, replaced, dropped, added):
    body = {**base, **replaced}
    for key in dropped:
        body.pop(key, None)
    return {**body, **added}


def json_body(valid: dict | None, deep: st.SearchStrategy | None = None):
    """What a JSON route gets: (raw bytes or a JSON-able value)."""
    options = [st.sampled_from(RAW_BODIES).map(Raw), json_value, st.binary(max_size=64).map(Raw)]
    if valid is not None:
        options += [st.just(valid), mutate(valid)] * 2
    if deep is not None:
        options += [deep] * 3
    return st.one_of(options)


class Raw(bytes):
    """A body sent as is."""


# -- headers, paths, queries ---------------------------------------------------------------------
header_text = st.text(st.characters(min_codepoint=0x20, max_codepoint=0xFF, exclude_characters="\x7f"), max_size=60)


@st.composite
def authorization(draw, target: Target, usual: str):
    """Mostly the right credential for the route (so the fuzz gets past auth), else garbage."""
    choice = draw(st.sampled_from(["usual"] * 5 + ["victim", "admin", "none", "garbage", "bearer-garbage",
                                                    "scheme", "padded"]))
    if choice == "usual":
        return usual
    if choice == "victim":
        return target.keys["victim"]
    if choice == "admin":
        return target.admin
    if choice == "none":
        return None
    if choice == "bearer-garbage":
        return "Bearer " + draw(header_text)
    if choice == "scheme":
        return draw(st.sampled_from(["Basic ", "bearer", "Bearer", "BEARER  ", "Token "])) + usual.partition(" ")[2]
    if choice == "padded":
        return "  " + usual + "  "
    return draw(header_text)


@st.composite
def headers(draw, target: Target, usual: str, content_type: str | None = "application/json"):
    h = {}
    auth = draw(authorization(target, usual))
    if auth is not None:
        h["Authorization"] = auth
    ct = draw(st.sampled_from([content_type] * 4 + [None, "text/plain", "application/x-www-form-urlencoded",
                                                    "multipart/form-data", "application/json; charset=utf-16",
                                                    "application/json; charset=nope", "*/*", "garbage"]))
    if ct is not None:
        h["Content-Type"] = ct
    if draw(st.booleans()):
        h[TIMEOUT_HEADER] = draw(st.one_of(st.sampled_from(
            ["nan", "NaN", "-1", "0", "-0", "1e999", "inf", "-inf", "Infinity", "", " ", "1e-320", "5", " 5 ",
             "0x10", "1_000", "१", "1" * 400, "5s", "None"]), header_text))
    if draw(st.integers(0, 4)) == 0:
        h[draw(st.sampled_from(["Accept", "X-Request-Id", "Accept-Encoding", "X-Forwarded-For", "Cookie"]))] = \
            draw(header_text)
    return h


def path_segment(known: list[str]):
    return st.one_of(st.sampled_from(known), query_text.filter(bool).map(lambda s: quote(s, safe="", errors="surrogatepass")),
                     st.sampled_from(["%00", "%ff", "%ed%a0%80", "..", "%2e%2e", "a%2Fb", "x" * 5000]))


TIME_VALUES = ["2026-11-01", "2026-11-01T00:00:00Z", "2026-13-01", "2026-02-30", "0001-01-01",
               "0001-01-01T00:00:00+05:00", "9999-12-31", "9999-12-31T23:59:59-05:00", "9999-12-31T23:59:59.999999",
               "2026-11-01T00:00:00+25:00", "2026-11-01T25:00:00", "1e999", "-1", "nan", "now", "", " ",
               "2026" * 500, "2026-11-01 00:00:00 05:00", "20261101", "2026-W45", "2026-11-01T00:00:00+05:00"]
PERIOD_VALUES = ["2026-11", "2026-13", "0000-01", "0001-01", "9999-12", "10000-01", "2026-1", "2026-11-01", "",
                 "-1", "nan", "２０２６-１１", "2026-00", "1970-01"]


@st.composite
def query(draw, params: dict[str, st.SearchStrategy]):
    pairs = []
    for name, values in params.items():
        if draw(st.booleans()):
            pairs.append((name, draw(values)))
    if draw(st.integers(0, 5)) == 0:
        pairs.append((draw(st.sampled_from([*params, "unknown", ""])), draw(query_text)))  # unknown / repeated
    try:
        return "?" + urlencode(pairs, encoding="utf-8", errors="surrogatepass") if pairs else ""
    except UnicodeEncodeError:
        return ""


# Query values: odd text, but no megabyte URLs (clients and proxies refuse those before the app).
query_text = st.one_of(st.sampled_from([s for s in ODD_STRINGS if len(s) < 5000] + ["9" * 4000]),
                       st.text(max_size=40), st.text(st.characters(exclude_categories=()), max_size=20))


def choice_or_junk(valid: list[str]):
    return st.one_of(st.sampled_from(valid), query_text)


# -- requests per route --------------------------------------------------------------------------
CHAT = {"model": BASE, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
COMPLETION = {"model": BASE, "prompt": "hi", "max_tokens": 4}
MESSAGE = {"role": "user", "content": "hi"}


def deep_chat():
    """Valid-looking chat bodies with hostile insides: messages, content parts, sampling params."""
    content = st.one_of(odd_text, json_value, st.lists(st.one_of(
        st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url", "input_audio", "bogus"]),
                               "text": json_value}), json_value), max_size=3))
    message = st.one_of(mutate(MESSAGE), st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "system", "assistant", "tool", "developer", "bogus"]), "content": content}))
    return st.builds(lambda base, msgs, params: {**base, "messages": msgs, **params}, mutate(CHAT, scalar),
                     st.lists(message, max_size=3), sampling_params())


def deep_completion():
    prompt = st.one_of(odd_text, st.lists(st.integers(), max_size=5), st.lists(st.lists(hostile_number, max_size=3),
                                                                             max_size=3), json_value)
    return st.builds(lambda base, p, params: {**base, "prompt": p, **params}, mutate(COMPLETION, scalar), prompt,
                     sampling_params())


def sampling_params():
    names = ["max_tokens", "max_completion_tokens", "n", "temperature", "top_p", "top_k", "seed", "stream", "logprobs",
             "top_logprobs", "stop", "logit_bias", "response_format", "tools", "tool_choice", "stream_options",
             "best_of", "echo", "suffix", "min_tokens", "presence_penalty", "frequency_penalty", "user",
             "cache_salt", "request_id", "priority", "lora_request", "guided_json", "structured_outputs"]
    return st.dictionaries(st.sampled_from(names), json_value, max_size=4)


def admin_limits():
    names = ["requests_per_minute", "tokens_per_minute", "max_concurrent_requests", "monthly_token_budget",
             "priority", "request_per_minute"]
    return st.dictionaries(st.sampled_from(names), st.one_of(hostile_number, scalar), max_size=3)


def tenant_body():
    return st.one_of(
        st.fixed_dictionaries({"name": st.one_of(odd_text, st.from_regex(r"[a-z0-9][a-z0-9._-]{0,63}", fullmatch=True))},
                              optional={"plan": st.one_of(odd_text, hostile_number), "limits": st.one_of(admin_limits(),
                                                                                                         json_value)}),
    )


def tenant_patch():
    return st.fixed_dictionaries({}, optional={"plan": st.one_of(odd_text, hostile_number, st.none()),
                                               "limits": st.one_of(admin_limits(), json_value),
                                               "status": st.one_of(st.sampled_from(["active", "suspended"]), scalar)})


@st.composite
def upload_body(draw, archive_bytes: bytes):
    """A multipart body (or not): a real archive with a hostile name, corrupt or hostile archives."""
    kind = draw(st.sampled_from(["good", "corrupt", "config", "tar-tricks", "zip-tricks", "fields", "raw"]))
    if kind == "raw":
        return draw(st.sampled_from(RAW_BODIES)), None
    name = draw(st.one_of(st.just("fuzzed"), odd_text))
    if kind == "good":
        data = archive_bytes
    elif kind == "corrupt":
        data = draw(st.one_of(st.binary(max_size=256), st.just(archive_bytes[: len(archive_bytes) // 2]),
                              st.binary(max_size=64).map(lambda b: b"\x1f\x8b" + b),
                              st.binary(max_size=64).map(lambda b: b"PK\x03\x04" + b)))
    elif kind == "config":
        config = draw(mutate({"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": 4, "lora_alpha": 8,
                              "target_modules": ["q_proj", "v_proj"], "lora_dropout": 0.0, "bias": "none"}))
        data = tar_of({"adapter_config.json": json.dumps(config).encode(),
                       "adapter_model.safetensors": draw(st.binary(max_size=64))})
    elif kind == "tar-tricks":
        member = draw(st.sampled_from(["../evil", "/abs", "a/../../b", "x" * 300, "dir/", "\x00", "é", "link"]))
        data = tar_of({member: b"x", "adapter_config.json": b"{}"}, symlink=draw(st.booleans()))
    elif kind == "zip-tricks":
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
            z.writestr(draw(st.sampled_from(["../evil", "/abs", "adapter_config.json", "a\\..\\b"])), b"0" * 100_000)
        data = buf.getvalue()
    else:  # odd fields: duplicates, extra files, a file where the name goes
        return multipart([("name", None, name.encode("utf-8", "surrogatepass")), ("file", "a.tgz", archive_bytes),
                          ("file", "b.tgz", b"x"), ("extra", None, b"y")][: draw(st.integers(0, 4))]
                         if draw(st.booleans()) else [("name", "n.txt", b"x"), ("file", None, archive_bytes)])
    fields = [("name", None, name.encode("utf-8", "surrogatepass")), ("file", "a.tar.gz", data)]
    return multipart(draw(st.permutations(fields)))


def tar_of(files: dict[str, bytes], symlink: bool = False) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            if symlink and name != "adapter_config.json":
                info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
                tar.addfile(info)
                continue
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def multipart(parts: list[tuple[str, str | None, bytes]]) -> tuple[bytes, str]:
    boundary = "fuzzboundary7MA4YWxkTrZu0gW"
    out = b""
    for field, filename, data in parts:
        disposition = f'form-data; name="{field}"' + (f'; filename="{filename}"' if filename else "")
        out += f"--{boundary}\r\nContent-Disposition: {disposition}\r\n\r\n".encode() + data + b"\r\n"
    return out + f"--{boundary}--\r\n".encode(), f"multipart/form-data; boundary={boundary}"


# -- sending and checking ------------------------------------------------------------------------
@contextmanager
def time_limit(seconds: float):
    """A reply slower than `seconds` fails the example as a hang (SIGALRM interrupts the wait)."""
    def on_alarm(signum, frame):
        raise TimeoutError(f"no reply within {seconds} s: the request hangs")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def send(target: Target, method: str, url: str, hdrs: dict[str, str], body=None):
    kwargs = {}
    if isinstance(body, bytes):
        kwargs["content"] = body
    elif body is not None:
        kwargs["content"] = json.dumps(body)  # NaN/Infinity literals and \ud800 escapes included
    hdrs = {k: v.encode("utf-8") for k, v in hdrs.items()}  # raw bytes on the wire
    with time_limit(REQUEST_TIMEOUT_S):
        return target.client.request(method, url, headers=hdrs, **kwargs)


def check(target: Target, response, readiness: bool = False) -> None:
    where = f"{response.request.method} {response.request.url.path}"
    status = response.status_code
    assert status < 500 or (readiness and status == 503), f"{where}: {status} {response.text[:2000]}"
    text = response.text
    assert "Traceback (most recent call last)" not in text, f"{where}: traceback in reply: {text[:2000]}"
    for marker in target.internal_markers:
        assert marker not in text, f"{where}: internal path {marker!r} in reply: {text[:2000]}"
    if status >= 400 and not (readiness and status == 503):
        assert response.headers.get("content-type", "").startswith("application/json"), f"{where}: {text[:500]}"
        body = response.json()
        assert isinstance(body, dict) and set(body) == {"error"}, f"{where}: not an OpenAI error body: {text[:500]}"
        error = body["error"]
        assert set(error) == {"message", "type", "param", "code"}, f"{where}: error fields {sorted(error)}"
        assert isinstance(error["message"], str) and error["message"], f"{where}: empty error message"
        assert isinstance(error["type"], str) and error["type"], f"{where}: empty error type"


def still_serves(target: Target) -> None:
    """A normal request right after the hostile one."""
    with time_limit(REQUEST_TIMEOUT_S):
        health = target.client.get("/healthz")
        chat = target.client.post("/v1/chat/completions", headers={"Authorization": target.keys["probe"]}, json=CHAT)
    assert health.status_code == 200, health.text
    assert chat.status_code == 200, chat.text


def exercise(target: Target, method: str, url: str, hdrs: dict[str, str], body=None, readiness=False) -> None:
    response = send(target, method, url, hdrs, body)
    try:
        check(target, response, readiness)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n  sent: {method} {url[:300]} headers={hdrs!r:.300} body={body!r:.300}") from None
    still_serves(target)


# -- the fuzz, one test per route ----------------------------------------------------------------
@FUZZ
@given(data=st.data())
def test_chat_completions(target, data):
    hdrs = data.draw(headers(target, target.keys["probe"]))
    exercise(target, "POST", "/v1/chat/completions", hdrs, data.draw(json_body(CHAT, deep_chat())))


@FUZZ
@given(data=st.data())
def test_completions(target, data):
    hdrs = data.draw(headers(target, target.keys["probe"]))
    exercise(target, "POST", "/v1/completions", hdrs, data.draw(json_body(COMPLETION, deep_completion())))


@FUZZ
@given(data=st.data())
def test_models_and_health(target, data):
    path = data.draw(st.sampled_from(["/v1/models", "/healthz", "/readyz"]))
    hdrs = data.draw(headers(target, target.keys["probe"], content_type=None))
    body = data.draw(st.one_of(st.none(), json_body(None)))
    exercise(target, "GET", path + data.draw(query({"x": query_text})), hdrs, body, readiness=path == "/readyz")


@FUZZ
@given(data=st.data())
def test_adapter_upload(target, data):
    body, content_type = data.draw(upload_body(archive_of(target)))
    hdrs = data.draw(headers(target, target.keys["victim"], content_type=content_type))
    exercise(target, "POST", "/v1/adapters", hdrs, Raw(body))


@FUZZ
@given(data=st.data())
def test_adapter_list_show_delete(target, data):
    method = data.draw(st.sampled_from(["GET", "DELETE"]))
    path = "/v1/adapters" + data.draw(st.one_of(st.just(""), path_segment(["style", "style@1", "fuzzed"]).map(
        lambda s: "/" + s)))
    if method == "DELETE" and path == "/v1/adapters":
        path += "/style"
    hdrs = data.draw(headers(target, target.keys["victim"], content_type=None))
    exercise(target, method, path, hdrs)


@FUZZ
@given(data=st.data())
def test_usage(target, data):
    q = data.draw(query({"start": choice_or_junk(TIME_VALUES), "end": choice_or_junk(TIME_VALUES),
                         "group_by": choice_or_junk(["day", "hour", "adapter", "model", "tenant"]),
                         "format": choice_or_junk(["json", "csv", "jsonl"])}))
    hdrs = data.draw(headers(target, target.keys["probe"], content_type=None))
    exercise(target, "GET", "/v1/usage" + q, hdrs)


@FUZZ
@given(data=st.data())
def test_admin_tenants(target, data):
    known = [target.tenant_ids["victim"], "ten_0000000000000000"]
    op = data.draw(st.sampled_from(["create", "list", "get", "patch"]))
    hdrs = data.draw(headers(target, target.admin))
    if op == "create":
        exercise(target, "POST", "/admin/tenants", hdrs, data.draw(json_body({"name": "fuzz-tenant"}, tenant_body())))
    elif op == "list":
        exercise(target, "GET", "/admin/tenants" + data.draw(query({"x": query_text})), hdrs)
    elif op == "get":
        exercise(target, "GET", "/admin/tenants/" + data.draw(path_segment(known)), hdrs)
    else:
        exercise(target, "PATCH", "/admin/tenants/" + data.draw(path_segment(known)), hdrs,
                 data.draw(json_body({"plan": "pro"}, tenant_patch())))


@FUZZ
@given(data=st.data())
def test_admin_keys(target, data):
    tenants = [target.tenant_ids["victim"], "ten_0000000000000000"]
    op = data.draw(st.sampled_from(["create", "list", "revoke"]))
    hdrs = data.draw(headers(target, target.admin))
    if op == "revoke":
        key = data.draw(path_segment([target.key_ids["victim"], "key_0000000000000000"]))
        exercise(target, "DELETE", "/admin/keys/" + key, hdrs)
    else:
        path = f"/admin/tenants/{data.draw(path_segment(tenants))}/keys"
        exercise(target, "POST" if op == "create" else "GET", path, hdrs,
                 data.draw(st.one_of(st.none(), json_body(None))))


@FUZZ
@given(data=st.data())
def test_admin_usage_and_billing(target, data):
    tenants = [target.tenant_ids["victim"], target.tenant_ids["probe"], "ten_0000000000000000", ""]
    tenant = st.one_of(st.sampled_from(tenants), query_text)
    op = data.draw(st.sampled_from(["usage", "export", "statement", "cost-model"]))
    hdrs = data.draw(headers(target, target.admin, content_type=None))
    period = choice_or_junk(PERIOD_VALUES)
    if op == "usage":
        url = "/admin/usage" + data.draw(query({
            "tenant": tenant, "start": choice_or_junk(TIME_VALUES), "end": choice_or_junk(TIME_VALUES),
            "group_by": choice_or_junk(["day", "hour", "adapter", "model", "tenant"]),
            "format": choice_or_junk(["json", "csv"])}))
    elif op == "export":
        url = "/admin/billing/export" + data.draw(query({"period": period, "tenant": tenant,
                                                          "format": choice_or_junk(["jsonl", "csv", "json"])}))
    elif op == "statement":
        url = (f"/admin/tenants/{data.draw(path_segment(tenants[:3]))}/statement"
               + data.draw(query({"period": period, "format": choice_or_junk(["json", "csv"])})))
    else:
        url = "/admin/cost-model" + data.draw(query({"start": choice_or_junk(TIME_VALUES),
                                                     "end": choice_or_junk(TIME_VALUES)}))
    exercise(target, "GET", url, hdrs)


@FUZZ
@given(data=st.data())
def test_unknown_routes_and_methods(target, data):
    method = data.draw(st.sampled_from(["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "HEAD"]))
    path = data.draw(st.sampled_from(["/v1/chat/completions", "/v1/completions", "/v1/models", "/v1/adapters",
                                      "/v1/usage", "/admin/tenants", "/admin/usage", "/admin/cost-model", "/healthz",
                                      "/readyz", "/", "/v1", "/v2/models", "/admin", "/v1/adapters/a/b",
                                      "//v1/models", "/v1/models/", "/admin/keys/"]))
    hdrs = data.draw(headers(target, target.keys["probe"]))
    response = send(target, method, path, hdrs, None if method in ("GET", "HEAD") else data.draw(json_body(None)))
    if method != "HEAD":  # a HEAD reply has no body to check
        check(target, response, readiness=path == "/readyz")
    else:
        assert response.status_code < 500 or path == "/readyz"
    still_serves(target)


_ARCHIVES: dict[int, bytes] = {}


def archive_of(target: Target) -> bytes:
    """A valid adapter archive (built once)."""
    if id(target) not in _ARCHIVES:
        from registry_builders import SMOLLM2_CONFIG, lora_config, lora_tensors, tar_dir, write_adapter  # noqa
        import tempfile

        from loraplex.registry.model_spec import BaseModelSpec

        spec = BaseModelSpec.from_config(SMOLLM2_CONFIG, BASE)
        with tempfile.TemporaryDirectory() as tmp:
            src = write_adapter(Path(tmp) / "a", lora_config(r=4), lora_tensors(spec, r=4, fill=0.02))
            _ARCHIVES[id(target)] = tar_dir(src, Path(tmp) / "a.tar.gz").read_bytes()
    return _ARCHIVES[id(target)]


# -- the known-hostile catalog, every value on every route it fits (deterministic) -------------
JSON_ROUTES = [("POST", "/v1/chat/completions", "probe"), ("POST", "/v1/completions", "probe"),
               ("POST", "/admin/tenants", "admin"), ("PATCH", "/admin/tenants/{victim}", "admin")]


def test_every_raw_body_on_every_json_route(target):
    for method, path, who in JSON_ROUTES:
        auth = target.admin if who == "admin" else target.keys[who]
        for body in RAW_BODIES:
            exercise(target, method, path.format(victim=target.tenant_ids["victim"]),
                     {"Authorization": auth, "Content-Type": "application/json"}, Raw(body))


def test_every_hostile_number_and_string_in_a_chat(target):
    auth = {"Authorization": target.keys["probe"]}
    fields = ["model", "max_tokens", "max_completion_tokens", "n", "temperature", "top_p", "seed", "logprobs",
              "top_logprobs", "stop", "stream"]
    for value in [*HUGE_NUMBERS, *[s for s in ODD_STRINGS if len(s) < 1000]]:
        for field in fields:
            exercise(target, "POST", "/v1/chat/completions", auth, {**CHAT, field: value})
        exercise(target, "POST", "/v1/chat/completions", auth, {**CHAT, "messages": [{"role": "user", "content": value}]})
        exercise(target, "POST", "/v1/completions", auth, {**COMPLETION, "prompt": value})


def test_every_hostile_query_value(target):
    victim = target.tenant_ids["victim"]
    routes = [("/v1/usage", ["start", "end"], target.keys["probe"]),
              ("/admin/usage", ["start", "end"], target.admin),
              ("/admin/cost-model", ["start", "end"], target.admin)]
    for path, names, auth in routes:
        for name in names:
            for value in TIME_VALUES:
                exercise(target, "GET", f"{path}?{urlencode({name: value})}", {"Authorization": auth})
    for path in ("/admin/billing/export", f"/admin/tenants/{victim}/statement"):
        for value in PERIOD_VALUES:
            exercise(target, "GET", f"{path}?{urlencode({'period': value})}", {"Authorization": target.admin})


def test_every_hostile_timeout_header(target):
    for value in ["nan", "NaN", "-1", "0", "-0", "1e999", "inf", "-inf", "Infinity", "", " ", "1e-320", " 5 ",
                  "0x10", "1_000", "१", "1" * 400, "5s", "None"]:
        exercise(target, "POST", "/v1/chat/completions",
                 {"Authorization": target.keys["probe"], TIMEOUT_HEADER: value}, CHAT)
