"""`python -m bench batch`'s pieces: the phase's workload, the batch's lines, the side-by-side tables."""
from bench import batch_bench as bb
from bench.batch_api import batch_lines, completed_by
from bench.loadtest.workload import Prompt

PROMPTS = [Prompt("Why is the sky blue?", 40, 6), Prompt("Write a poem.", 64, 4)]


def test_phases_share_arrivals_and_lengths_but_no_prompt_prefix():
    alone = bb.online_workload(PROMPTS, [0.5, 2.0], "alone")
    beside = bb.online_workload(PROMPTS, [0.5, 2.0], "with")
    assert [r.arrival_s for r in alone.requests] == [r.arrival_s for r in beside.requests] == [0.5, 2.0]
    assert [r.max_tokens for r in alone.requests] == [40, 64]
    assert all(r.ignore_eos and not r.system for r in alone.requests)
    # the tag comes first: the first prefix-cache block differs across phases and requests
    texts = [r.user_text for r in alone.requests + beside.requests]
    assert len({t[:8] for t in texts}) == 4 and texts[0].endswith("Why is the sky blue?")


def test_batch_lines_are_openai_batch_lines_with_unique_questions():
    lines = batch_lines(PROMPTS, "m", "b")
    assert [x["custom_id"] for x in lines] == ["b-0", "b-1"]
    assert lines[1]["url"] == "/v1/chat/completions" and lines[1]["body"]["max_tokens"] == 64
    assert lines[0]["body"]["messages"][0]["content"].startswith("[b-0] ")


def test_completed_by_reads_the_last_poll_before():
    progress = [(10.0, 0, 0), (15.0, 4, 0), (20.0, 9, 1)]
    assert [completed_by(progress, t) for t in (5, 10, 17, 99)] == [0, 0, 4, 9]


def result(at, ttft, tpot, status="ok"):
    return {"at": at, "ttft": ttft, "tpot": tpot, "status": status}


def phase(name, ttft, tpot, cost, refused=0):
    summary = {"ok": 10, "requests": 10 + refused, "statuses": {"ok": 10, "http_503": refused},
               "ttft_p50": ttft, "ttft_p95": 2 * ttft, "tpot_p50": tpot, "tpot_p95": 2 * tpot,
               "output_tokens_per_s": 30.0}
    results = [result(at, ttft, tpot) for at in (10, 50, 90, 150)]
    return bb.Phase(name, 0.0, 200.0, results, summary, (0.0, 200.0), cost)


COST = {"requests": 10, "tokens": 12000, "peak_tokens_per_s": 120.0, "avg_tokens_per_s": 60.0,
        "utilization": 0.5, "capacity_cost_per_1m": "0.233333", "real_cost_per_1m": "0.466667", "revenue": "0.01"}


def test_side_by_side_gives_each_phase_a_column_and_the_ratios():
    alone = phase("online alone", 0.4, 0.07, COST)
    beside = phase("online + batch", 0.5, 0.077, {**COST, "tokens": 24000, "avg_tokens_per_s": 120.0,
                                                  "utilization": 0.8, "real_cost_per_1m": "0.233333"}, refused=2)
    beside.batch_lines = (300, 1)
    table = bb.side_by_side([alone, beside]).markdown()
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]] for line in table.splitlines()}
    assert rows[""] == ["online alone", "online + batch", "online + batch / online alone"]
    assert rows["online TTFT p95 (s)"] == ["0.800", "1.000", "1.25x"]
    assert rows["online TPOT p95 (ms)"] == ["140.0", "154.0", "1.10x"]
    assert rows["online refused (429 / 503)"] == ["0", "2", ""]
    assert rows["batch lines completed / failed in the window"] == ["-", "300 / 1", ""]
    assert rows["real cost per 1M tokens"] == ["$0.4667", "$0.2333", "0.50x"]
    assert rows["utilization (average / peak)"] == ["50.0 %", "80.0 %", "1.60x"]
    assert rows["utilization against the run's busiest 60 s"] == ["50.0 %", "100.0 %", "2.00x"]


def test_by_part_splits_the_profile_in_quarters():
    alone, beside = phase("a", 0.4, 0.07, COST), phase("b", 0.5, 0.08, COST)
    table = bb.by_part(alone, beside, 200.0, lambda t: 1.0, lambda t: int(t)).markdown()  # a line a second
    rows = table.splitlines()[2:]
    assert len(rows) == 4 and rows[0].startswith("| valley (0-50) | 1.00 | 1 / 1 |")
    assert rows[3].startswith("| valley (150-200) | 1.00 | 1 / 1 |") and rows[3].endswith("| 50 |")
    assert "70 / 80" in rows[1]  # TPOT p50 in ms, alone / with
