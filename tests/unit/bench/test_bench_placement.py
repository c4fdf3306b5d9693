"""bench/placement.py: the config `python -m bench placement` runs, its Zipf adapter workload, its
figures (per adapter, placement, replica counters) and the issue's targets."""
import collections
from collections import Counter
from pathlib import Path

import pytest
import yaml

from bench import placement as pl
from bench.loadtest import workload as wl
from bench.processes import ROOT

SHIPPED = yaml.safe_load((ROOT / "serve_config.yaml").read_text())


def test_the_config_is_the_shipped_one_with_two_fractional_replicas_and_the_policy(tmp_path):
    from loraplex.config import PlatformConfig

    doc = pl.placement_config(SHIPPED, policy="residency_aware", state=tmp_path, port=8300, model="/m")
    app = doc["applications"][0]
    cfg = PlatformConfig.from_args(app["args"])
    assert cfg.engine_deployment.routing.policy == "residency_aware"
    assert cfg.engine_deployment.routing.make_policy().name == "residency_aware"
    assert {d["name"]: d["num_replicas"] for d in app["deployments"]}["Engine"] == 2
    assert 2 * cfg.engine_deployment.num_cpus + cfg.ingress.num_cpus <= 2.0  # both fit on the 2 cores
    shipped_engine = SHIPPED["applications"][0]["args"]["engine"]
    assert (cfg.engine.max_loras, cfg.engine.max_cpu_loras) == (shipped_engine["max_loras"], shipped_engine["max_cpu_loras"])
    assert cfg.engine.engine_kwargs == {"kv_cache_memory_bytes": 1 << 30}
    assert str(tmp_path) in cfg.database_url and doc["http_options"]["port"] == 8300
    assert SHIPPED["applications"][0]["args"]["engine"]["model"] != "/m"  # the shipped dict is untouched
    today = pl.placement_config(SHIPPED, policy="tenant_affinity", state=tmp_path, port=8300, model="/m")
    assert PlatformConfig.from_args(today["applications"][0]["args"]).engine_deployment.routing.make_policy().name \
        == "tenant_affinity"


def test_every_request_is_on_an_adapter_of_its_own_tenant_with_zipf_demand():
    prompts = [wl.Prompt(f"q{i}", 8, 2) for i in range(20_000)]
    w = pl.zipf_adapter_workload(prompts, adapters=8, zipf=1.1, system=[f"s{t}" for t in range(8)], seed=3,
                                 source="t", exact_lengths=False)
    assert len(w.adapters) == 8 and all(t.adapters == [k] for k, t in enumerate(w.tenants))
    assert all(r.adapter == r.tenant and r.ignore_eos for r in w.requests)
    per = collections.Counter(r.adapter for r in w.requests)
    for k, p in enumerate(wl.zipf_weights(8, 1.1)):
        assert per[k] / len(prompts) == pytest.approx(p, abs=0.01)
    again = pl.zipf_adapter_workload(prompts, adapters=8, zipf=1.1, system=["s"], seed=3, source="t", exact_lengths=False)
    assert [r.adapter for r in again.requests] == [r.adapter for r in w.requests]  # same seed, same list


def result(i, adapter, ttft, prompt=100, cached=50, status="ok"):
    return {"index": i, "adapter": adapter, "ttft": ttft, "prompt_tokens": prompt, "cached_prompt_tokens": cached,
            "status": status, "request_id": f"req-{i}"}


RESULTS = [result(0, 0, 1.0), result(1, 0, 3.0, cached=100), result(2, 1, 2.0, cached=0),
           result(3, 1, 9.0, status="http_503")]


def test_per_adapter_figures_and_tenant_hit_rates_count_only_successful_requests():
    per = pl.per_adapter(RESULTS)
    assert per[0]["ok"] == 2 and per[0]["ttft_p50"] == pytest.approx(2.0) and per[0]["hit"] == pytest.approx(0.75)
    assert per[1] == {"requests": 2, "ok": 1, "ttft_p50": 2.0, "ttft_p95": 2.0, "hit": 0.0}
    assert pl.hit_rate(RESULTS) == pytest.approx(150 / 300)


def test_placement_counts_each_adapters_requests_per_replica_from_the_ledger():
    where = {"req-0": "repA", "req-1": "repB", "req-2": "repA", "req-3": "repA"}
    assert pl.placement(RESULTS, where) == {"repA": Counter({0: 1, 1: 1}), "repB": Counter({0: 1})}


def test_the_metrics_agent_is_found_through_the_raylets_session_dir(tmp_path):
    (tmp_path / "metrics_export_port_abc").write_text("45877")
    lines = ["python worker.py", f"raylet --node-ip-address=192.0.2.2 --session_dir={tmp_path} --metrics_export_port=0"]
    assert pl.metrics_target(lines) == "192.0.2.2:45877"
    assert pl.metrics_target(["python worker.py"]) is None
    (tmp_path / "metrics_export_port_abc").write_text("0")
    assert pl.metrics_target(lines) is None


def test_adapter_counters_per_replica_count_room_making_evictions_not_deletes():
    samples = [("ray_loraplex_adapter_loads_total", {"replica": "r1"}, 8.0),
               ("ray_loraplex_adapter_evictions_total", {"replica": "r1", "reason": "lru"}, 2.0),
               ("ray_loraplex_adapter_evictions_total", {"replica": "r1", "reason": "bytes"}, 1.0),
               ("ray_loraplex_adapter_evictions_total", {"replica": "r1", "reason": "deleted"}, 5.0),
               ("ray_loraplex_adapter_loads_total", {"replica": "r2"}, 3.0),
               ("ray_loraplex_adapter_loads_total", {}, 99.0)]
    assert pl.adapter_counters(samples) == {"r1": {"loads": 8, "evictions": 3}, "r2": {"loads": 3, "evictions": 0}}


def variant(tok_s, ttft_p50, hits):
    results = [result(i, a, ttft_p50, cached=int(100 * h)) for i, (a, h) in enumerate(hits.items())]
    summary = {"ok": len(results), "requests": len(results), "output_tokens_per_s": tok_s, "ttft_p50": ttft_p50,
               "ttft_p95": ttft_p50}
    return pl.variant_summary(results, summary, {r["request_id"]: "repA" for r in results},
                              {"repA": {"loads": 4, "evictions": 1}}, [{"replica_id": "repA", "slot_loads": 7}])


def test_verdict_and_tables_against_the_issues_targets():
    today = variant(10.0, 4.0, {0: 0.80, 1: 0.60})
    new = variant(13.0, 2.0, {0: 0.80, 1: 0.55})
    v = pl.verdict(today, new)
    assert v["ttft_met"] and v["tok_met"] and v["hit_met"] and v["worst_hit_points"] == pytest.approx(-5.0)
    worse = pl.verdict(today, variant(12.9, 2.1, {0: 0.80, 1: 0.54}))
    assert not (worse["ttft_met"] or worse["tok_met"] or worse["hit_met"])
    text = "\n".join(t.markdown() for t in pl.tables({"today": today, "residency": new}))
    assert "| today | 2/2 | 10.0 | 4.00 |" in text and "| residency | 2/2 | 13.0 | 2.00 |" in text
    assert "| a1 | 1/1 | 4.00 / 4.00 | 0.600 | 1/1 | 2.00 / 2.00 | 0.550 |" in text
    assert "| today | r0 (repA) | a0:1 a1:1 | 4 | 1 | 7 |" in text
    assert "MISSED" not in pl.verdict_lines(today, new)[0]
