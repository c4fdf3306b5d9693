"""Both sides of the routing-stats contract: what an Engine replica reports, what a router reads."""
from loraplex.routing.served_keys import EngineReport, ServedKeys, routing_stats


def test_served_keys_is_an_lru_reported_most_recent_first():
    served = ServedKeys(capacity=3)
    for key in ("a", "b", "a", None, "c", "d"):
        served.touch(key)
    assert served.recent() == ["d", "c", "a"] and "b" not in served and len(served) == 3
    assert routing_stats(served.recent(), running=2, kv_usage=0.25, max_keys=1) == {
        "held_keys": ["d"], "running": 2, "kv_usage": 0.25}
    assert routing_stats([]) == {"held_keys": []}


def test_the_router_reads_what_the_engine_reports():
    stats = routing_stats(["ten_a/bot", "ten_b"], running=3, waiting=1, kv_usage=0.5)
    assert EngineReport.of(stats) == EngineReport(("ten_a/bot", "ten_b"), 3, 1, 0.5)
    # Every field is optional; malformed ones read as unknown, never as an error.
    assert EngineReport.of({"waiting": 2}) == EngineReport(None, 0, 2, 0.0)
    assert EngineReport.of({"held_keys": ["a", 7], "running": "x", "kv_usage": None,
                            "waiting": -1}) == EngineReport(("a",), 0, 0, 0.0)
    assert EngineReport.of({}) is None and EngineReport.of(None) is None
