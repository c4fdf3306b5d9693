"""`loraplex quality run|show|list|override` against the real ingress app with two bases (fake
engines, tests/unit/ingress/fake_engine.py) on a loopback port."""

import asyncio

from live_server import serving
from loraplex.cli import main
from test_quality_routes import SMALL, TINY, line, setup
from two_bases import ADMIN_TOKEN


def test_run_show_list_and_override(tmp_path, capsys, monkeypatch):
    platform, client, auth = setup(tmp_path)
    jsonl = tmp_path / "mine.jsonl"
    jsonl.write_text(line(0, "What is the capital of France?", expected="Paris") + "\n" + line(1, "A city?") + "\n")
    monkeypatch.setenv("LORAPLEX_API_KEY", platform.key)
    try:
        with serving(platform.app) as url:
            assert main(["--url", url, "quality", "run", str(jsonl), "--reference", SMALL, "--candidate", TINY,
                         "-q"]) == 0
            run_id = capsys.readouterr().out.strip()
            assert run_id.startswith("qrun_")
            state = platform.app.state
            for _ in range(3):
                asyncio.run(state.quality_runner.run_once())
                for _ in range(20):
                    if not asyncio.run(state.batch_runner.run_once()):
                        break
            assert main(["--url", url, "quality", "show", run_id]) == 0
            out = capsys.readouterr().out
            assert "exact_match_rate" in out and ">= 0.4" in out and "logprob_drop" in out and "<= 0.1" in out
            assert "verdict: fail: mean_common_prefix 1.000" in out and ">= None" not in out
            assert main(["--url", url, "quality", "list"]) == 0
            assert run_id in capsys.readouterr().out
            assert main(["--url", url, "quality", "run", str(jsonl), "--reference", SMALL, "--candidate", SMALL]) == 1
            assert "400" in capsys.readouterr().err
            assert main(["--url", url, "--admin-token", ADMIN_TOKEN, "quality", "override", platform.tenant_id,
                         "--adapter", "pirate", "--to-base", TINY, "--reason", "accepted"]) == 0
            assert "accepted" in capsys.readouterr().out
    finally:
        platform.close()
