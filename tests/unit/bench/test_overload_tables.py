"""bench/overload's tables on made-up results: every column computes (the script needs the real
serve run and ~4 minutes, so these run its table code where CI can), percentiles are bench's."""
import itertools
from types import SimpleNamespace

from bench.overload.checks import company, fmt_s, kind_of_503
from bench.overload.client import Result, Tenant
from bench.overload.phases import Overload
from bench.overload.process_tree import ProcessSampler
from bench.overload.report import memory_table, tenant_table


def overload_of(results):
    tenants = {t.name: t for t in (Tenant("gold", 100, 0.1, limits={}),
                                   Tenant("bronze", 0, 0.9, limits={"requests_per_minute": 6}))}
    o = Overload(SimpleNamespace(sample_s=0.05), None, tenants, [], [], [], itertools.cycle([]))
    o.results, o.window, o.drained, o.capacity = results, 10.0, 12.0, 2.0
    o.unloaded, o.alone = [1.0, 1.2, 1.4], [1.5, 2.0]
    return o


def test_tenant_table_prints_each_tenant_and_flags_missing_retry_after(capsys):
    results = [Result("gold", "overload", 200, 2.0 + i / 10, completion_tokens=5, prompt_tokens=9) for i in range(5)]
    results += [Result("bronze", "overload", 429, 0.01, retry_after="3", code="rate_limit_exceeded"),
                Result("bronze", "overload", 503, 0.02, retry_after=None, message="KV cache is full")]
    o = overload_of(results)
    tenant_table(o)
    text = capsys.readouterr().out
    assert "| gold | 100 | - | 5 | 0.50 | 5 |" in text
    assert "| bronze | 0 | 6 req/min | 2 |" in text
    assert "gold p95: one at a time 1.38 s" in text  # linear: 1.2 + 0.9 * 0.2
    assert o.failures == ["1 refusals without a Retry-After header"]


def test_memory_table_over_a_sampled_tree(capsys):
    import os
    sampler = ProcessSampler(os.getpid(), 0.05)
    sampler.start()
    sampler.stop_event.set()
    sampler.join()
    o = overload_of([])
    o.sampler = sampler
    memory_table(o)
    assert "| **whole tree** |" in capsys.readouterr().out


def test_checks_helpers():
    a = Result("gold", "overload", 200, 2.0, request_id="a", sent=0.0)
    b = Result("bronze", "overload", 200, 2.0, request_id="b", sent=1.0)
    n, per = company([a], [a, b], {"a": "r1", "b": "r1"})
    assert n == 0.5 and per == {"bronze": 0.5}
    assert kind_of_503("the KV cache is full") == "shed (KV cache)"
    assert fmt_s(None) == fmt_s(float("nan")) == "-"
