"""Every dashboard query and every rule expression runs on a real Prometheus (a throwaway one
scraping itself): a query that does not parse or evaluate fails here, not in Grafana."""
import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/: shared helpers
from prometheus_server import throwaway_prometheus  # noqa: E402

from loraplex.observability.generated import RULES  # noqa: E402
from loraplex.observability.panel_data import (  # noqa: E402
    QueryFailed, empty_panel_queries, instant_query, panel_queries)
from loraplex.observability.served import load_served  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
SERVED = load_served(ROOT / "serve_config.yaml")


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    with throwaway_prometheus(tmp_path_factory.mktemp("prometheus")) as url:
        yield url


def test_every_panel_query_evaluates(prometheus):
    queries = panel_queries(SERVED)
    assert len(queries) >= 30
    for q in queries:
        instant_query(prometheus, q.expr)  # raises QueryFailed with Prometheus's reason


def test_every_rule_expression_evaluates(prometheus):
    rules = [r for g in yaml.safe_load((ROOT / "deploy" / RULES).read_text())["groups"] for r in g["rules"]]
    assert len(rules) == 19  # 16 + one per SLO class with a target (interactive, chat, agent)
    for rule in rules:
        instant_query(prometheus, rule["expr"])


def test_a_broken_query_is_reported(prometheus):
    with pytest.raises(QueryFailed, match="bad_data"):
        instant_query(prometheus, "sum by (tenant) (rate(loraplex_prompt_tokens_total[5m])")


def test_without_the_platform_only_the_reference_lines_have_data(prometheus):
    """empty_panel_queries is what the integration test calls after real traffic; here, with no
    platform scraped, it names every platform query and none of the flat SLO lines."""
    empty = empty_panel_queries(prometheus, SERVED)
    all_queries = panel_queries(SERVED)
    assert {q.expr for q in empty} == {q.expr for q in all_queries if not q.expr.startswith("vector(")}
