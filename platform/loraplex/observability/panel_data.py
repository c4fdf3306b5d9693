"""Ask a real Prometheus for every dashboard panel's PromQL: which parse (all must) and which
come back empty. An integration test that drove traffic through the platform calls
`empty_panel_queries(url, served)` and expects []."""
import json
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass

from loraplex.observability.panels import RANGE, RATE, dashboard_rows
from loraplex.observability.served import ServedPlatform


@dataclass(frozen=True)
class PanelQuery:
    panel: str
    legend: str
    expr: str        # with Grafana's variables replaced


class QueryFailed(RuntimeError):
    pass


def panel_queries(served: ServedPlatform, rate_window: str = "1m", range_window: str = "1h") -> list[PanelQuery]:
    """Every target of every panel, with $__rate_interval and $__range set to these windows."""
    concrete = lambda e: e.replace(RATE, rate_window).replace(RANGE, range_window)  # noqa: E731
    return [PanelQuery(p.title, t.legend, concrete(t.expr))
            for row in dashboard_rows(served) for p in row.panels for t in p.targets]


def instant_query(prometheus_url: str, expr: str, timeout_s: float = 10.0) -> list[dict]:
    """The result vector of an instant query; QueryFailed with Prometheus's error if it fails."""
    url = f"{prometheus_url.rstrip('/')}/api/v1/query?{urllib.parse.urlencode({'query': expr})}"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            body = json.load(resp)
    except urllib.error.HTTPError as e:  # 400 bad_data, 422 execution: the body says why
        body = json.load(e)
    if body.get("status") != "success":
        raise QueryFailed(f"{body.get('errorType')}: {body.get('error')} in {expr}")
    return body["data"]["result"]


def empty_panel_queries(prometheus_url: str, served: ServedPlatform, rate_window: str = "1m",
                        range_window: str = "1h") -> list[PanelQuery]:
    """The panel queries that returned no series, or only NaN (a quantile or a ratio of nothing),
    raising QueryFailed on any that failed. rate_window must span at least two scrapes;
    range_window the traffic to look at."""
    return [q for q in panel_queries(served, rate_window, range_window)
            if all(s["value"][1] == "NaN" for s in instant_query(prometheus_url, q.expr))]
