"""Capacity per SLO class (bench/loadtest/slo_classes.py): each tenant's class, each class's
targets from the config, each class's capacity against its own targets; the table; tenants made
in their class."""
import json

import httpx
import pytest

from bench.loadtest import report, targets, workload as wl
from bench.loadtest.slo_classes import class_slos, per_class, tenant_classes
from bench.loadtest.stats import SLO

CLASSES = {"slo": {"classes": {"interactive": {"ttft_p95_s": 1.0, "tpot_p95_s": 0.3},
                               "chat": {"ttft_p95_s": 2.5, "tpot_p95_s": 0.3}, "batch": {}},
                   "default_class": "chat"}}


def result(tenant: int, ttft: float, tpot: float = 0.1, status: str = "ok") -> dict:
    end = ttft + 10 * tpot
    return {"tenant": tenant, "status": status, "start": 0.0, "end": end, "e2e": end, "ttft": ttft, "tpot": tpot,
            "prompt_tokens": 10, "completion_tokens": 11, "start_epoch": 1e6, "first_token_epoch": 1e6 + ttft,
            "end_epoch": 1e6 + end}


def test_classes_are_cycled_over_the_tenants():
    assert tenant_classes(["interactive", "chat"], 5) == {0: "interactive", 1: "chat", 2: "interactive", 3: "chat",
                                                          4: "interactive"}
    assert tenant_classes([], 3) == {}


def test_each_class_has_its_own_targets_from_the_config():
    slos = class_slos(CLASSES, ["interactive", "chat", "batch", "chat"], 0.01)
    assert slos == {"interactive": SLO(1.0, 0.3, 0.01), "chat": SLO(2.5, 0.3, 0.01), "batch": SLO(None, None, 0.01)}
    # Without classes the top-level figures are the one class.
    assert class_slos({"slo": {"ttft_p95_s": 2.0, "tpot_p95_s": 0.2}}, ["standard"], 0.0) == {"standard": SLO(2.0, 0.2)}
    with pytest.raises(SystemExit, match="agent"):
        class_slos(CLASSES, ["agent"], 0.0)


def test_each_class_has_its_own_capacity_against_its_own_targets():
    classes = {0: "interactive", 1: "chat", 2: "batch"}
    slos = class_slos(CLASSES, classes.values(), 0.0)
    # TTFTs grow with the level: 0.5 s at 1, 1.5 s at 2, 2.0 s at 4, 3.0 s at 8 (the batch tenant's a failure there).
    levels = [{"level": n, "results": [result(t, ttft) for t in classes] if n < 8 else
               [result(0, ttft), result(1, ttft), result(2, ttft, status="http_503")]}
              for n, ttft in ((1, 0.5), (2, 1.5), (4, 2.0), (8, 3.0))]
    got = per_class(levels, classes, slos, window_s=1.0)
    assert {n: c["capacity"] for n, c in got.items()} == {"interactive": 1, "chat": 4, "batch": 4}
    assert got["chat"]["tenants"] == [1] and [s["requests"] for s in got["chat"]["levels"]] == [1, 1, 1, 1]
    assert not got["interactive"]["all_levels_met"]
    # One SLO for all (the chat figures) would give every class the chat tenant's 4.
    table = report.class_capacity_table(got)
    assert "| interactive | 0 | 1.00 | 300.0 | 1 | 0.50 | 100.0 | 1 |" in table
    assert "| batch | 2 | - | - | 4 |" in table


def test_tenants_are_made_in_their_class(monkeypatch):
    made = []

    def handle(request: httpx.Request):
        if request.url.path == "/admin/tenants":
            made.append(request.read())
            return httpx.Response(201, json={"id": f"ten_{len(made)}"})
        return httpx.Response(201, json={"key": "lpx-k"})

    real = httpx.Client
    monkeypatch.setattr(httpx, "Client", lambda **kw: real(transport=httpx.MockTransport(handle), **kw))
    w = wl.Workload([wl.Tenant("tenant-0", "s", []), wl.Tenant("tenant-1", "s", [])], [], [], "t", True)
    targets.platform_target("http://x", "base", w, admin_token="adm", slo_classes={0: "interactive", 1: "chat"})
    assert [b'"slo_class":"interactive"' in m for m in made] == [True, False]
    assert b'"slo_class":"chat"' in made[1]
    made.clear()
    targets.platform_target("http://x", "base", w, admin_token="adm")
    assert not any(b"slo_class" in m for m in made)


def test_the_load_test_reports_a_capacity_per_class(tmp_path, monkeypatch):
    """--tenant-classes end to end over a fake target: tenants made in their classes, each class's
    capacity in results.json and summary.md (the even tenants' TTFT is 0.3 s x the concurrency, the
    odd one's 0.5 s x)."""
    from bench.loadtest import cli

    made = {}

    def fake_target(base_url, model, workload, **kw):
        made.update(kw)
        return cli.Target("loraplex", base_url, model, keys=["lpx-fake-key"] * len(workload.tenants))

    async def fake_closed(target, w, concurrency, **kw):
        return [result(s.tenant, (0.3 if s.tenant % 2 == 0 else 0.5) * concurrency) for s in w.requests]

    monkeypatch.setattr(targets, "platform_target", fake_target)
    monkeypatch.setattr(cli, "run_closed", fake_closed)
    cli.main(["--url", "http://x", "--admin-token", "admin-token-x", "--sweep", "1,2,4,8", "--fixed-lengths", "16,8",
              "--tenants", "3", "--adapter-share", "0", "--num-requests", "12", "--no-progress",
              "--tenant-classes", "interactive,chat", "--out", str(tmp_path)])
    assert made["slo_classes"] == {0: "interactive", 1: "chat", 2: "interactive"}
    plan = json.loads((tmp_path / "results.json").read_text())["plan"]["loraplex"]
    assert {n: c["capacity"] for n, c in plan["classes"].items()} == {"interactive": 2, "chat": 4}
    assert plan["capacity"] == 4  # the config's one slo: (TTFT 2.5 s) for all
    assert "| interactive | 0, 2 | 1.00 | 300.0 | 2 |" in (tmp_path / "summary.md").read_text()
