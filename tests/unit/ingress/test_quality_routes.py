"""/v1/quality/runs and the gate on the real ingress app with two bases (SQLite, a local store) over
fake engines (tests/unit/ingress/fake_engine.py: no vLLM): a run goes through the Batch API's
runner (a generation batch, then a scoring batch) and its report has the figures and the verdict;
bad input gets a clear 4xx; an adapter uploaded to a base other than the one it names is a 409
naming the run to do, until a passing run or an operator's override is on record."""

import asyncio
import json

from starlette.testclient import TestClient

from loraplex.registry.model_spec import BaseModelSpec
from two_bases import ADMIN_TOKEN, CONFIGS, SMALL, TINY, build_two_bases
from registry_builders import lora_config, lora_tensors, tar_dir, write_adapter

CHAT = "/v1/chat/completions"
PROMPT_TOKENS = 5
# The fake models: SMALL answers "Paris" to everything; TINY agrees on "capital" prompts only, and
# finds SMALL's answers much less likely (-1.0 per token against -0.2).
ANSWERS = {SMALL: lambda q: ["Par", "is"], TINY: lambda q: ["Par", "is"] if "capital" in q else ["Ly", "on"]}
ANSWER_LOGPROB = {SMALL: -0.2, TINY: -1.0}


def fake_model(base):
    """A pool's fake engine: greedy replies with their tokens (`logprobs`), and scoring replies
    (`prompt_logprobs: 0`) whose prompt's last tokens are the appended answer's."""
    def script(method, call, request):
        if request.prompt_logprobs == 0:  # scoring: the line's prompt, then the reference's answer
            answer_tokens = 2
            entries = [None] + [{"1": {"logprob": -0.05}}] * (PROMPT_TOKENS - 1) + \
                [{"2": {"logprob": ANSWER_LOGPROB[base]}}] * answer_tokens
            yield {"id": call.request_id, "object": "chat.completion", "model": request.model,
                   "choices": [{"index": 0, "message": {"role": "assistant", "content": "."}, "finish_reason": "length"}],
                   "prompt_logprobs": entries,
                   "usage": {"prompt_tokens": PROMPT_TOKENS + answer_tokens, "completion_tokens": 1, "total_tokens": 8}}
            return
        if not (request.temperature == 0 and request.logprobs):  # a quality line runs greedy with its tokens
            from loraplex.contract import EngineError
            yield EngineError(400, "the fake model expected a greedy request with logprobs")
            return
        tokens = ANSWERS[base](request.messages[-1]["content"])
        yield {"id": call.request_id, "object": "chat.completion", "model": request.model,
               "choices": [{"index": 0, "message": {"role": "assistant", "content": "".join(tokens)},
                            "logprobs": {"content": [{"token": t, "logprob": -0.1, "top_logprobs": []} for t in tokens]},
                            "finish_reason": "stop"}],
               "usage": {"prompt_tokens": PROMPT_TOKENS, "completion_tokens": len(tokens), "total_tokens": 7}}
    return script


def line(i, content, expected=None, url=CHAT):
    obj = {"custom_id": f"q{i}", "method": "POST", "url": url,
           "body": {"model": SMALL, "messages": [{"role": "user", "content": content}], "max_tokens": 8}}
    if expected is not None:
        obj["expected"] = expected
    return json.dumps(obj)


def setup(tmp_path, **quality):
    platform = build_two_bases(tmp_path, script_for=fake_model, quality={"min_lines": None, **quality})
    return platform, TestClient(platform.app, raise_server_exceptions=False), {"Authorization": f"Bearer {platform.key}"}


def upload_file(client, auth, text):
    r = client.post("/v1/files", headers=auth, data={"purpose": "batch"}, files={"file": ("q.jsonl", text.encode())})
    assert r.status_code == 200, r.text
    return r.json()["id"]


def drive(platform, client, auth, run_id):
    """The quality runner and the batch runner, in turn, until the run ends."""
    state = platform.app.state
    for _ in range(6):
        asyncio.run(state.quality_runner.run_once())
        for _ in range(20):  # bounded: a line retried forever must fail the test, not hang it
            if not asyncio.run(state.batch_runner.run_once()):
                break
        run = client.get(f"/v1/quality/runs/{run_id}", headers=auth).json()
        if run["status"] in ("completed", "failed"):
            return run
    raise AssertionError(f"the run did not end: {run}")


def test_a_run_reports_agreement_logprobs_expected_scores_and_the_verdict(tmp_path):
    platform, client, auth = setup(tmp_path)
    try:
        file_id = upload_file(client, auth, "\n".join([
            line(0, "What is the capital of France?", expected="Paris"),
            line(1, "Where is the Louvre?", expected=["Paris", "paris, france"]),
            line(2, "Name a city."),
            line(3, "Where do I live?")]))
        created = client.post("/v1/quality/runs", headers=auth,
                              json={"input_file_id": file_id, "reference": SMALL, "candidate": TINY})
        assert created.status_code == 201, created.text
        assert created.json()["object"] == "quality.run" and created.json()["status"] == "queued"
        run = drive(platform, client, auth, created.json()["id"])
        assert run["status"] == "completed", run
        assert run["result_counts"] == {"total": 4, "compared": 4, "errored": 0}
        f = run["figures"]
        assert f["exact_match_rate"] == 0.25 and f["mean_common_prefix"] == 0.5
        assert abs(f["reference_logprob"] - -0.2) < 1e-9 and abs(f["candidate_logprob"] - -1.0) < 1e-9
        assert abs(f["logprob_drop"] - 0.8) < 1e-9
        assert f["expected_lines"] == 2 and f["reference_expected_exact"] == 1.0
        assert f["candidate_expected_exact"] == 0.5 and f["candidate_expected_contains"] == 0.5
        assert run["passed"] is False
        assert "logprob_drop 0.800 (quality.thresholds.max_logprob_drop 0.1)" in run["verdict"]
        assert "exact_match_rate 0.250" in run["verdict"]
        assert len(run["batch_ids"]) == 2  # generation, then scoring: both run by the Batch API's runner
        models = [r.model for m, _, r in platform.pools[TINY].requests + platform.pools[SMALL].requests]
        assert sorted(set(models)) == [SMALL, TINY]
        listed = client.get("/v1/quality/runs", headers=auth).json()["data"]
        assert [r["id"] for r in listed] == [run["id"]]
    finally:
        platform.close()


def test_bad_input_gets_a_clear_4xx(tmp_path):
    platform, client, auth = setup(tmp_path)
    try:
        good = upload_file(client, auth, line(0, "hi"))
        broken = client.post("/v1/files", headers=auth, data={"purpose": "batch"},
                             files={"file": ("q.jsonl", (line(0, "hi") + "\n{broken").encode())})
        assert broken.status_code == 400 and "Line 2" in broken.json()["error"]["message"]

        def create(**body):
            return client.post("/v1/quality/runs", headers=auth, json={
                "input_file_id": good, "reference": SMALL, "candidate": TINY, **body})

        unknown = create(candidate="no-such-model")
        assert unknown.status_code == 404 and "no-such-model" in unknown.json()["error"]["message"]
        same = create(candidate=SMALL)
        assert same.status_code == 400 and "same model" in same.json()["error"]["message"]
        assert create(input_file_id="file-" + "0" * 32).status_code == 404
        assert create(reference=None).status_code == 400
        bad_expected = upload_file(client, auth, line(0, "hi", expected=7))
        r = create(input_file_id=bad_expected)
        assert r.status_code == 400 and "`expected`" in r.json()["error"]["message"]
        mixed = upload_file(client, auth, line(0, "hi") + "\n" + json.dumps(
            {"custom_id": "c", "method": "POST", "url": "/v1/completions", "body": {"model": SMALL, "prompt": "x"}}))
        r = create(input_file_id=mixed)
        assert r.status_code == 400 and "one endpoint" in r.json()["error"]["message"]
        other = client.get("/v1/quality/runs/qrun_nope", headers=auth)
        assert other.status_code == 404
        # a tenant's own batch may not pose as a quality run's (which may run an adapter on another base)
        b = client.post("/v1/batches", headers=auth, json={"input_file_id": good, "endpoint": CHAT,
                                                          "completion_window": "24h",
                                                          "metadata": {"loraplex_quality_run": "x"}})
        assert b.status_code == 400 and "reserved" in b.json()["error"]["message"]
    finally:
        platform.close()


def claims_small(tmp_path):
    """An adapter whose config says it was trained on SMALL, with TINY's shapes (so TINY accepts it)."""
    spec = BaseModelSpec.from_config(CONFIGS[TINY], TINY)
    src = write_adapter(tmp_path / "claims-small", lora_config(r=4, base_model_name_or_path=f"models/{SMALL}"),
                        lora_tensors(spec, r=4, fill=0.01))
    return tar_dir(src, tmp_path / "claims-small.tar.gz").read_bytes()


def test_gate_refuses_an_adapter_on_another_base_until_an_override(tmp_path):
    platform, client, auth = setup(tmp_path)
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    archive = claims_small(tmp_path)

    def upload():
        return client.post("/v1/adapters", headers=auth, data={"name": "pirate", "base_model": TINY},
                           files={"file": ("a.tar.gz", archive, "application/gzip")})
    try:
        refused = upload()
        assert refused.status_code == 409, refused.text
        err = refused.json()["error"]
        assert err["code"] == "quality_run_required"
        assert f"--reference pirate --candidate {TINY}:pirate" in err["message"]
        assert client.get("/v1/adapters", headers=auth).json()["data"] == []  # nothing stored
        bad = client.post("/admin/quality/overrides", headers=admin,
                          json={"tenant_id": platform.tenant_id, "adapter": "pirate", "to_base": TINY})
        assert bad.status_code == 400 and "reason" in bad.json()["error"]["message"]
        ok = client.post("/admin/quality/overrides", headers=admin, json={
            "tenant_id": platform.tenant_id, "adapter": "pirate", "to_base": TINY, "reason": "customer accepted"})
        assert ok.status_code == 201
        assert client.post("/admin/quality/overrides", headers=auth, json={}).status_code == 401
        assert upload().status_code == 201
        listed = client.get(f"/admin/quality/overrides?tenant_id={platform.tenant_id}", headers=admin).json()
        assert [o["reason"] for o in listed["data"]] == ["customer accepted"]
    finally:
        platform.close()


def test_gate_lets_through_after_a_passing_run_of_that_adapter(tmp_path):
    # thresholds any run passes: what is checked is that a passing run on record clears the gate
    platform, client, auth = setup(tmp_path, thresholds={"min_exact_match_rate": 0, "min_mean_common_prefix": 0,
                                                         "max_logprob_drop": 10})
    archive = claims_small(tmp_path)
    small_archive = platform.archives[SMALL].read_bytes()
    try:
        assert client.post("/v1/adapters", headers=auth, data={"name": "pirate", "base_model": SMALL},
                           files={"file": ("a.tar.gz", small_archive, "application/gzip")}).status_code == 201
        file_id = upload_file(client, auth, line(0, "What is the capital of France?"))
        created = client.post("/v1/quality/runs", headers=auth, json={
            "input_file_id": file_id, "reference": "pirate", "candidate": f"{TINY}:pirate"})
        assert created.status_code == 201, created.text
        run = drive(platform, client, auth, created.json()["id"])
        assert run["passed"] is True, run
        # the candidate ran the adapter on TINY's pool (a quality batch may cross bases; a request may not)
        assert any(c.adapter and c.base_model == TINY for _, c, _ in platform.pools[TINY].requests)
        assert client.delete("/v1/adapters/pirate", headers=auth).status_code in (200, 204)
        moved = client.post("/v1/adapters", headers=auth, data={"name": "pirate", "base_model": TINY},
                            files={"file": ("a.tar.gz", archive, "application/gzip")})
        assert moved.status_code == 201, moved.text
        # another adapter of the same tenant is not cleared by pirate's run
        other = client.post("/v1/adapters", headers=auth, data={"name": "parrot", "base_model": TINY},
                            files={"file": ("a.tar.gz", archive, "application/gzip")})
        assert other.status_code == 409
    finally:
        platform.close()


def test_a_run_whose_batch_is_cancelled_fails_saying_so(tmp_path):
    platform, client, auth = setup(tmp_path)
    try:
        file_id = upload_file(client, auth, line(0, "What is the capital of France?"))
        run = client.post("/v1/quality/runs", headers=auth,
                          json={"input_file_id": file_id, "reference": SMALL, "candidate": TINY}).json()
        asyncio.run(platform.app.state.quality_runner.run_once())  # its generation batch now exists
        batch_id = client.get(f"/v1/quality/runs/{run['id']}", headers=auth).json()["batch_ids"][0]
        assert client.post(f"/v1/batches/{batch_id}/cancel", headers=auth).status_code == 200
        run = drive(platform, client, auth, run["id"])
        assert run["status"] == "failed" and run["error"]["code"] == "batch_cancelled", run
        assert batch_id in run["error"]["message"] and run["passed"] is None
    finally:
        platform.close()


def test_a_run_whose_file_is_deleted_fails_saying_so(tmp_path):
    platform, client, auth = setup(tmp_path)
    try:
        file_id = upload_file(client, auth, line(0, "What is the capital of France?"))
        run = client.post("/v1/quality/runs", headers=auth,
                          json={"input_file_id": file_id, "reference": SMALL, "candidate": TINY}).json()
        assert client.delete(f"/v1/files/{file_id}", headers=auth).status_code == 200
        run = drive(platform, client, auth, run["id"])
        assert run["status"] == "failed" and run["error"]["code"] == "invalid_input_file", run
        assert file_id in run["error"]["message"]
    finally:
        platform.close()


def test_max_lines_bounds_a_quality_file_and_the_gate_can_be_off(tmp_path):
    platform, client, auth = setup(tmp_path, max_lines=1, gate=False)
    try:
        two = upload_file(client, auth, line(0, "a") + "\n" + line(1, "b"))
        r = client.post("/v1/quality/runs", headers=auth, json={"input_file_id": two, "reference": SMALL,
                                                                "candidate": TINY})
        assert r.status_code == 400 and "more than 1 requests" in r.json()["error"]["message"]
        moved = client.post("/v1/adapters", headers=auth, data={"name": "pirate", "base_model": TINY},
                            files={"file": ("a.tar.gz", claims_small(tmp_path), "application/gzip")})
        assert moved.status_code == 201, moved.text  # quality.gate false: no run needed
    finally:
        platform.close()
