"""The generated Grafana dashboard is well-formed: unique ids, panels that do not overlap, every
query on the `datasource` variable, and the SLO lines at the configured targets."""
from pathlib import Path

from loraplex.config import PlatformConfig
from loraplex.observability.dashboard import dashboard
from loraplex.observability.served import ServedPlatform, load_served

ROOT = Path(__file__).resolve().parents[3]


def _panels(served):
    return [p for p in dashboard(served)["panels"] if p["type"] != "row"]


def test_panels_are_well_formed_and_do_not_overlap():
    board = dashboard(load_served(ROOT / "serve_config.yaml"))
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    cells = set()
    for p in board["panels"]:
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not mine & cells, p["title"]
        cells |= mine
        if p["type"] == "row":
            continue
        refs = [t["refId"] for t in p["targets"]]
        assert refs and len(refs) == len(set(refs)), p["title"]
        assert all(t["datasource"]["uid"] == "${datasource}" for t in p["targets"])
    assert board["templating"]["list"][0]["name"] == "datasource"


def test_slo_lines_follow_the_config():
    served = ServedPlatform("loraplex", PlatformConfig.from_args({"slo": {"ttft_p95_s": 0.75, "tpot_p95_s": 0.075}}))
    by_title = {p["title"]: p for p in _panels(served)}
    assert {"expr": "vector(0.75)", "legend": "SLO (P95)"} in [
        {"expr": t["expr"], "legend": t["legendFormat"]} for t in by_title["Time to first token"]["targets"]]
    assert "vector(0.075)" in [t["expr"] for t in by_title["Time per output token"]["targets"]]


def test_cost_is_in_the_price_books_currency():
    served = ServedPlatform("loraplex", PlatformConfig.from_args({"accounting": {"pricing": {"currency": "EUR"}}}))
    cost = [p for p in _panels(served) if p["title"].startswith("Cost per hour")][0]
    assert cost["fieldConfig"]["defaults"]["unit"] == "currencyEUR" and "(EUR)" in cost["title"]
