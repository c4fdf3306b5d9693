"""A real Prometheus scrapes the platform (issue 12): started before the traffic, with the alert
rules the serve config generates, it sees per-tenant token counters equal to the ledger's, TTFT
histograms counting each request, evaluates every rule without error, and every dashboard panel
gets data except those counting events this test does not provoke."""

import sys
from pathlib import Path

import pytest

from loraplex.observability import names
from loraplex.observability.panel_data import empty_panel_queries, instant_query
from loraplex.observability.served import load_served

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from demo_adapters import trained_adapter  # noqa: E402
from prometheus_server import throwaway_prometheus  # noqa: E402
from test_metrics import ask, ledger_sums, tenant  # noqa: E402
from waiting import wait_until  # noqa: E402

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
# Panels of events no request here causes: vLLM preemptions, adapter evictions, shed requests.
NOT_PROVOKED = (names.PREEMPTIONS, names.ADAPTER_EVICTIONS, names.SHED_REASONS)


def value(url: str, expr: str) -> float:
    result = instant_query(url, expr)
    return float(result[0]["value"][1]) if result else 0.0


def test_a_real_prometheus_scrapes_the_platform_and_every_panel_and_rule_works(
        base_url, admin, usage_db, model_name, metrics_targets, tmp_path):
    served = load_served(ROOT / "serve_config.yaml")
    with throwaway_prometheus(tmp_path, targets=metrics_targets,
                              rule_files=[ROOT / "deploy" / "prometheus" / "rules.yml"]) as url:
        tid, client = tenant(admin, base_url, "prometheus-scraped")
        sent: list[str] = []
        # Two rounds, each seen by Prometheus before the next: rate() counts only increases
        # between samples, and a series first scraped with all its traffic in it has none.
        for round_ in range(2):
            with open(trained_adapter("pirate"), "rb") as f:  # an adapter load per round, timed
                up = client.post("/v1/adapters", data={"name": f"scraped-{round_}"},
                                 files={"file": ("scraped.tar.gz", f, "application/gzip")})
            assert up.status_code == 201, up.text
            sent += [ask(client, model_name, f"Name a colour. {round_} {i}", stream=i % 2 == 1) for i in range(2)]
            sent.append(ask(client, f"scraped-{round_}", "Say hello."))
            assert client.post("/v1/chat/completions", json={  # a refusal, by reason
                "model": "no-such-adapter", "messages": [{"role": "user", "content": "hi"}]}).status_code == 404
            ledger = ledger_sums(usage_db, tid, sent)

            def counted():
                got = {
                    "prompt": value(url, f'sum({names.PROMPT_TOKENS}{{tenant="{tid}"}})'),
                    "completion": value(url, f'sum({names.COMPLETION_TOKENS}{{tenant="{tid}"}})'),
                    "requests": value(url, f'sum({names.REQUESTS}{{tenant="{tid}"}})'),
                    "ttft": value(url, f'sum({names.TTFT}_count{{tenant="{tid}"}})'),
                }
                want = {"prompt": ledger["prompt"], "completion": ledger["completion"],
                        "requests": ledger["requests"], "ttft": ledger["requests"]}
                seen["prometheus, ledger"] = (got, want)
                return got == want

            seen: dict = {}
            try:
                wait_until(counted, 120, "Prometheus's per-tenant counters to equal the ledger's", interval_s=2)
            except AssertionError as exc:  # what differed, and whether the scrapes succeeded
                scrapes = [instant_query(url, q) for q in ("up", "scrape_duration_seconds")]
                raise AssertionError(f"{exc}; {seen}; scrapes: {scrapes}") from None

        rules = instant_rules(url)
        assert rules and all(r["health"] == "ok" for r in rules), [r for r in rules if r["health"] != "ok"]

        # Rates over 10 minutes: the whole test, however long the export lag made it.
        def empty_panels():
            return [(q.panel, q.legend, q.expr) for q in empty_panel_queries(url, served, rate_window="10m")
                    if not any(m in q.expr for m in NOT_PROVOKED)]
        try:
            wait_until(lambda: not empty_panels(), 60, "every panel to get data", interval_s=3)
        except AssertionError:
            raise AssertionError(f"panels without data: {empty_panels()}") from None


def instant_rules(url: str) -> list[dict]:
    import json
    import urllib.request

    with urllib.request.urlopen(f"{url}/api/v1/rules", timeout=10) as resp:
        groups = json.load(resp)["data"]["groups"]
    return [rule for group in groups for rule in group["rules"]]
