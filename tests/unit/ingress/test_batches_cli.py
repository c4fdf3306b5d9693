"""`loraplex batches ...` against the real ingress app on a loopback port: create from a JSONL,
watch with a progress bar, print the results; the bar itself as plain logic."""

import asyncio
import json
from datetime import datetime

from live_server import serving
from platform_app import build_platform_app
from loraplex.cli import main, progress_bar
from test_batch_routes import line, reply


def test_create_watch_results_and_list(tmp_path, capsys, monkeypatch):
    platform = build_platform_app(tmp_path, reply)
    platform.add_tenant("acme")
    jsonl = tmp_path / "in.jsonl"
    jsonl.write_text(line("a") + "\n" + line("b") + "\n")
    monkeypatch.setenv("LORAPLEX_API_KEY", platform.keys["acme"].removeprefix("Bearer "))
    try:
        with serving(platform.app) as url:
            assert main(["--url", url, "batches", "create", str(jsonl), "-q"]) == 0
            batch_id = capsys.readouterr().out.strip()
            assert batch_id.startswith("batch_")
            asyncio.run(platform.app.state.batch_runner.run_once())
            assert main(["--url", url, "batches", "watch", batch_id, "--poll-s", "0.01"]) == 0
            out, err = capsys.readouterr()
            assert "2/2 (2 ok, 0 failed) completed" in err and batch_id in out
            assert main(["--url", url, "batches", "results", batch_id]) == 0
            results = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
            assert [r["custom_id"] for r in results] == ["a", "b"]
            assert main(["--url", url, "batches", "results", batch_id, "--errors"]) == 1  # none failed
            assert "no error file" in capsys.readouterr().err
            assert main(["--url", url, "batches", "list"]) == 0
            listed = capsys.readouterr().out
            assert batch_id in listed
            # created_at in ISO UTC like every other table, not epoch seconds (issue 46)
            created = listed.splitlines()[1].split()[4]
            assert datetime.fromisoformat(created).tzinfo is not None, listed
            assert main(["--url", url, "batches", "create", str(tmp_path / "missing.jsonl")]) == 2
    finally:
        platform.close()


def test_the_progress_bar_counts_done_and_failed_lines():
    bar = progress_bar({"status": "in_progress", "request_counts": {"total": 4, "completed": 1, "failed": 1}}, width=8)
    assert bar == "[####....] 2/4 (1 ok, 1 failed) in_progress"
    assert progress_bar({"status": "validating", "request_counts": {"total": 0}}, width=4).startswith("[....] 0/0")
