"""scripts/hostile_client.py end to end against the ingress app on a real loopback server (a fake
engine, real tenancy): it makes its tenants, runs every attack of bench/hostile/capacity.py and
prints per attack what the attacker got (each refusal's status and message) and the bystander."""

import asyncio
import importlib.util
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ingress"))
from live_server import serving  # noqa: E402

from loraplex.config import PlatformConfig  # noqa: E402
from loraplex.contract import EngineChunk  # noqa: E402
from loraplex.db.engine import make_engine  # noqa: E402
from loraplex.ingress.app import build_ingress_app  # noqa: E402
from loraplex.tenancy.tenancy import Tenancy  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
BASE = "SmolLM2-135M-Instruct"


class InstantEngine:
    async def generate(self, call, request):
        yield EngineChunk(json.dumps({"id": call.request_id}).encode(), 7, 0, 1, final=True)

    async def base_models(self):
        return {"object": "list", "data": [{"id": BASE}]}

    async def ready(self):
        return {"replica_id": "fake", "probe_seconds": 0.0}

    async def replica_status(self):
        return {"replica_id": "fake"}


def load_script():
    spec = importlib.util.spec_from_file_location("hostile_client", ROOT / "scripts" / "hostile_client.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_hostile_client_prints_each_attacks_refusals_and_the_bystander(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("LORAPLEX_ADMIN_TOKEN", "admin")
    config = PlatformConfig.from_args({
        "engine": {"model": str(tmp_path / BASE)}, "database_url": f"sqlite:///{tmp_path}/db.sqlite",
        "tenancy": {"admin_token": "admin"}, "ingress": {"body_timeout_s": 0.5},
    })
    tenancy = Tenancy.from_config(config.tenancy, make_engine(config.database_url))
    script = load_script()
    out = tmp_path / "tables.md"
    with serving(build_ingress_app(InstantEngine(), config, tenancy=tenancy)) as url:  # slow_bodies: 300 connections
        assert asyncio.run(script.main(script.parse(["--url", url, "--bystander-requests", "30",
                                                     "--only", "wide_requests,slow_bodies",
                                                     "--out", str(out)]))) == 0
    printed = capsys.readouterr().out
    assert printed.count("| alone |") == 2 and out.read_text().count("###") == 2
    wide = printed[printed.index("### wide_requests"):printed.index("### slow_bodies")]
    for cap in ("max_n (4)", "max_prompts_per_request (8)", "max_tokens_per_request (256)",
                "max_sequences_per_request (8)", "max_concurrent_requests (4)"):
        assert f"| 400 This request asks for" in wide and cap in wide, (cap, wide)
    slow = printed[printed.index("### slow_bodies"):]
    assert "| 429 Too many requests in flight: max_concurrent_requests is 4" in slow, slow
    assert "| 408 The request body did not arrive within 0.5 s" in slow, slow
    assert "| under attack | 30 | 0 |" in wide and "| under attack | 30 | 0 |" in slow
